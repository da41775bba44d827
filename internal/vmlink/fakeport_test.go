package vmlink

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeChardev stands in for QEMU and the guest kernel's virtio-serial port, as
// docs/microvm-notes.md §3 describes them:
//   - the host side is a unix socket that takes one client at a time (further clients wait in
//     the backlog until the current one leaves);
//   - the guest side (openPort) opens once at a time; a read returns EOF at once while no host
//     is connected, and a write blocks until a host is connected and the queue has room;
//   - bytes the guest queued and no host took yet are delivered to the next host (stale bytes);
//     input the guest has not read yet survives a host's disconnect and is discarded when the
//     guest closes the port;
//   - with quietDisconnect, a host that leaves is not seen by the guest at all (the port stays
//     "connected" until the next host arrives), as when a host reconnects before the guest
//     looked, or after a restore.
//
// hold stops delivery to the host, as a host that does not read.
type fakeChardev struct {
	t    *testing.T
	path string

	mu sync.Mutex
	// Protected by mu:
	ln              net.Listener
	host            net.Conn // the adopted client, or nil
	connected       bool     // what the guest sees
	quietDisconnect bool
	in              []byte // host to guest, not read yet
	out             []byte // guest to host, not delivered yet
	hold            bool
	open            bool // the guest has the port open
	stale           int  // bytes delivered to a host that were queued before it connected
	clients         int  // hosts adopted so far
	stopped         bool
	changed         chan struct{} // closed and replaced on every change

	wg sync.WaitGroup
}

// outCap is the guest-to-host queue: what the virtqueue and QEMU buffer.
const outCap = 64 << 10

func newFakeChardev(t *testing.T, path string) *fakeChardev {
	t.Helper()
	f := &fakeChardev{t: t, path: path, changed: make(chan struct{})}
	f.listen()
	t.Cleanup(f.stop)
	return f
}

// signalLocked wakes every waiter. Preconditions: mu held.
func (f *fakeChardev) signalLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeChardev) listen() {
	ln, err := net.Listen("unix", f.path)
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.ln = ln
	f.mu.Unlock()
	f.wg.Add(1)
	go f.accept(ln)
}

func (f *fakeChardev) accept(ln net.Listener) {
	defer f.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		for f.host != nil && !f.stopped {
			ch := f.changed
			f.mu.Unlock()
			<-ch
			f.mu.Lock()
		}
		if f.stopped {
			f.mu.Unlock()
			c.Close()
			return
		}
		f.host, f.connected = c, true
		f.clients++
		queued := len(f.out)
		f.signalLocked()
		f.mu.Unlock()
		f.wg.Add(2)
		go f.read(c)
		go f.pump(c, queued)
	}
}

// disconnect drops host c.
func (f *fakeChardev) disconnect(c net.Conn) {
	f.mu.Lock()
	if f.host == c {
		f.host = nil
		if !f.quietDisconnect {
			f.connected = false
		}
		f.signalLocked()
	}
	f.mu.Unlock()
	c.Close()
}

func (f *fakeChardev) read(c net.Conn) {
	defer f.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			f.mu.Lock()
			if f.host == c {
				f.in = append(f.in, buf[:n]...)
				f.signalLocked()
			}
			f.mu.Unlock()
		}
		if err != nil {
			f.disconnect(c)
			return
		}
	}
}

func (f *fakeChardev) pump(c net.Conn, stale int) {
	defer f.wg.Done()
	for {
		f.mu.Lock()
		for f.host == c && (len(f.out) == 0 || f.hold) {
			ch := f.changed
			f.mu.Unlock()
			<-ch
			f.mu.Lock()
		}
		if f.host != c {
			f.mu.Unlock()
			return
		}
		chunk := append([]byte(nil), f.out[:min(len(f.out), 16<<10)]...)
		f.out = f.out[len(chunk):]
		if stale > 0 {
			d := min(stale, len(chunk))
			f.stale += d
			stale -= d
		}
		f.signalLocked()
		f.mu.Unlock()
		if _, err := c.Write(chunk); err != nil {
			f.mu.Lock()
			f.out = append(chunk, f.out...)
			f.mu.Unlock()
			f.disconnect(c)
			return
		}
	}
}

// restart is a new QEMU process: the socket goes away with its client and comes back.
func (f *fakeChardev) restart() {
	f.mu.Lock()
	ln, host := f.ln, f.host
	f.mu.Unlock()
	ln.Close()
	if host != nil {
		f.disconnect(host)
	}
	f.listen()
}

func (f *fakeChardev) setHold(hold bool) {
	f.mu.Lock()
	f.hold = hold
	f.signalLocked()
	f.mu.Unlock()
}

func (f *fakeChardev) setQuietDisconnect(q bool) {
	f.mu.Lock()
	f.quietDisconnect = q
	f.mu.Unlock()
}

func (f *fakeChardev) staleDelivered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stale
}

func (f *fakeChardev) queued() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.out)
}

func (f *fakeChardev) stop() {
	f.mu.Lock()
	f.stopped = true
	ln, host := f.ln, f.host
	f.signalLocked()
	f.mu.Unlock()
	ln.Close()
	if host != nil {
		f.disconnect(host)
	}
	f.wg.Wait()
}

// openPort is the guest's open function.
func (f *fakeChardev) openPort() (io.ReadWriteCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.open {
		return nil, &os.PathError{Op: "open", Path: "vport0p1", Err: syscall.EBUSY}
	}
	f.open = true
	return &fakePort{f: f}, nil
}

// fakePort is the guest's open port.
type fakePort struct {
	f *fakeChardev
	// Protected by f.mu:
	closed       bool
	rdead, wdead time.Time
}

// waitLocked waits for a change or deadline. Preconditions: f.mu held; it is held again on return.
func (p *fakePort) waitLocked(deadline time.Time) {
	ch := p.f.changed
	p.f.mu.Unlock()
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ch:
	case <-timeout:
	}
	p.f.mu.Lock()
}

func expired(d time.Time) bool { return !d.IsZero() && !time.Now().Before(d) }

func (p *fakePort) Read(b []byte) (int, error) {
	f := p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		switch {
		case p.closed:
			return 0, os.ErrClosed
		case len(f.in) > 0:
			n := copy(b, f.in)
			f.in = f.in[n:]
			return n, nil
		case !f.connected:
			return 0, io.EOF
		case expired(p.rdead):
			return 0, os.ErrDeadlineExceeded
		}
		p.waitLocked(p.rdead)
	}
}

func (p *fakePort) Write(b []byte) (int, error) {
	f := p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	written := 0
	for {
		switch {
		case p.closed:
			return written, os.ErrClosed
		case expired(p.wdead):
			return written, os.ErrDeadlineExceeded
		case f.connected && len(f.out) < outCap:
			n := min(len(b), outCap-len(f.out))
			f.out = append(f.out, b[:n]...)
			b = b[n:]
			written += n
			f.signalLocked()
			if len(b) == 0 {
				return written, nil
			}
			continue
		}
		p.waitLocked(p.wdead)
	}
}

func (p *fakePort) Close() error {
	f := p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.closed {
		return os.ErrClosed
	}
	p.closed = true
	f.open = false
	f.in = nil
	f.signalLocked()
	return nil
}

func (p *fakePort) SetReadDeadline(t time.Time) error {
	p.f.mu.Lock()
	p.rdead = t
	p.f.signalLocked()
	p.f.mu.Unlock()
	return nil
}

func (p *fakePort) SetWriteDeadline(t time.Time) error {
	p.f.mu.Lock()
	p.wdead = t
	p.f.signalLocked()
	p.f.mu.Unlock()
	return nil
}
