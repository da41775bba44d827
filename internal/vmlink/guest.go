package vmlink

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"
)

// Guest timings.
const (
	// noHostPoll is how long the guest waits before it reads again after a read found no host
	// connected (virtio-serial then returns EOF at once instead of blocking); after
	// noHostPatience without a host, slowNoHostPoll, to keep an abandoned VM idle.
	noHostPoll     = 20 * time.Millisecond
	slowNoHostPoll = 100 * time.Millisecond
	noHostPatience = 2 * time.Second
	// ackTimeout bounds the write of an ACK on a port with deadlines. A host that does not take
	// it in time has gone; its next attempt brings a new SYNC.
	ackTimeout = 5 * time.Second
	// maxOpenBackoff is the longest wait between two failed opens of the port.
	maxOpenBackoff = time.Second
)

// deadliner is a port whose blocked reads and writes can be released without closing it: an
// *os.File that Go's poller manages (see OpenDevice).
type deadliner interface {
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// Listen returns the guest's end of the link: a listener whose Accept yields the streams the host
// opens, session after session. open opens the port (OpenPort's result, or a fake in tests); it is
// called again whenever the port failed, always from the listener's one goroutine.
//
// One goroutine, owned by the listener and ended by Close, runs the sessions: it opens the port,
// waits for a host (reads return EOF while none is connected: it polls every 20 ms, every 100 ms
// after 2 s), reads the host's SYNC, answers the ACK and serves yamux until the session breaks;
// then it starts over.
// Ending a session must release a write that blocks on the port (virtio-serial blocks writes while
// no host is connected): when the port has deadlines (an *os.File in Go's poller, as OpenDevice
// returns) both deadlines are set in the past and the port stays open; otherwise the port is
// closed and opened again (a write blocked in the kernel then stays blocked until a host
// connects).
//
// When a session ends on a yamux protocol error, the bytes it read last are searched for a SYNC:
// a host that reconnected before the guest noticed the old host was gone (after a resume, the
// guest may never see the port's host side close) has its SYNC read, and answered, at once.
func Listen(open func() (io.ReadWriteCloser, error), log *slog.Logger) net.Listener {
	l := &listener{open: open, log: orDiscard(log), streams: make(chan net.Conn), done: make(chan struct{})}
	l.wg.Add(1)
	go l.run()
	return l
}

// listener is Listen's net.Listener.
//
// Lock order: mu is a leaf.
type listener struct {
	open    func() (io.ReadWriteCloser, error) // immutable
	log     *slog.Logger                       // immutable
	streams chan net.Conn                      // the streams of the current session, to Accept
	done    chan struct{}                      // closed by Close
	once    sync.Once
	wg      sync.WaitGroup

	mu sync.Mutex
	// Protected by mu:
	port io.ReadWriteCloser // the open port, or nil
	sess *yamux.Session     // the current session, or nil
}

// Accept returns the next stream the host opened, or net.ErrClosed after Close.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.streams:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close ends the current session, closes the port and waits for the listener's goroutine.
func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.mu.Lock()
		port, sess := l.port, l.sess
		l.mu.Unlock()
		if sess != nil {
			sess.Close()
		}
		if port != nil {
			port.Close()
		}
		l.wg.Wait()
	})
	return nil
}

// Addr names the port.
func (l *listener) Addr() net.Addr { return portAddr{} }

type portAddr struct{}

// Network is "virtio-serial".
func (portAddr) Network() string { return "virtio-serial" }

// String names the link.
func (portAddr) String() string { return "corral-vmlink" }

func (l *listener) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// wait sleeps d and reports whether the listener is still open.
func (l *listener) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.done:
		return false
	}
}

// openPort opens the port, retrying until it opens or the listener is closed.
func (l *listener) openPort() (io.ReadWriteCloser, bool) {
	backoff := 10 * time.Millisecond
	for {
		port, err := l.open()
		if err == nil {
			l.mu.Lock()
			if l.closed() {
				l.mu.Unlock()
				port.Close()
				return nil, false
			}
			l.port = port
			l.mu.Unlock()
			return port, true
		}
		l.log.Warn("vmlink: open port", "err", err)
		if !l.wait(backoff) {
			return nil, false
		}
		backoff = min(2*backoff, maxOpenBackoff)
	}
}

func (l *listener) dropPort(port io.ReadWriteCloser) {
	l.mu.Lock()
	if l.port == port {
		l.port = nil
	}
	l.mu.Unlock()
	port.Close()
}

// run serves sessions until Close.
func (l *listener) run() {
	defer l.wg.Done()
	var port io.ReadWriteCloser
	var br *bufio.Reader
	var dl deadliner
	var pending []byte        // a SYNC line the last session read, to be answered first
	var noHostSince time.Time // when reads started to find no host; zero while one is there
	for !l.closed() {
		if port == nil {
			var ok bool
			if port, ok = l.openPort(); !ok {
				return
			}
			br = bufio.NewReader(port)
			dl = nil
			if d, ok := port.(deadliner); ok && d.SetReadDeadline(time.Time{}) == nil && d.SetWriteDeadline(time.Time{}) == nil {
				dl = d
			}
		}
		nonce, err := readSync(&byteReader{pending: pending, r: br})
		pending = nil
		if errors.Is(err, io.EOF) {
			// No host is connected.
			poll := noHostPoll
			if noHostSince.IsZero() {
				noHostSince = time.Now()
			} else if time.Since(noHostSince) > noHostPatience {
				poll = slowNoHostPoll
			}
			if !l.wait(poll) {
				return
			}
			continue
		}
		noHostSince = time.Time{}
		if err != nil {
			if l.closed() {
				return
			}
			l.log.Warn("vmlink: read port", "err", err)
			l.dropPort(port)
			port = nil
			l.wait(noHostPoll)
			continue
		}
		if dl != nil {
			dl.SetWriteDeadline(time.Now().Add(ackTimeout))
		}
		_, err = io.WriteString(port, ackPrefix+nonce+"\n")
		if dl != nil {
			dl.SetWriteDeadline(time.Time{})
		}
		if err != nil {
			if l.closed() {
				return
			}
			l.log.Debug("vmlink: send ack", "err", err)
			if dl == nil {
				l.dropPort(port)
				port = nil
			}
			continue
		}
		tail := &tailReader{r: br}
		serr := l.serve(&sessionConn{r: tail, port: port, dl: dl})
		if l.closed() {
			return
		}
		l.log.Debug("vmlink: session ended", "err", serr)
		if dl != nil {
			dl.SetReadDeadline(time.Time{})
			dl.SetWriteDeadline(time.Time{})
		} else {
			l.dropPort(port)
			port = nil
		}
		if errors.Is(serr, yamux.ErrInvalidVersion) || errors.Is(serr, yamux.ErrInvalidMsgType) {
			pending = tail.syncLine()
		}
	}
}

// serve runs one yamux session on conn, handing its streams to Accept, and returns why it ended.
func (l *listener) serve(conn *sessionConn) error {
	sess, err := yamux.Server(conn, muxConfig(l.log, false))
	if err != nil { // only for an invalid configuration
		conn.Close()
		return err
	}
	l.mu.Lock()
	if l.closed() {
		l.mu.Unlock()
		sess.Close()
		return net.ErrClosed
	}
	l.sess = sess
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.sess = nil
		l.mu.Unlock()
		sess.Close() // returns once yamux's goroutines no longer use the port
	}()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return err
		}
		select {
		case l.streams <- st:
		case <-l.done:
			st.Close()
			return net.ErrClosed
		}
	}
}

// sessionConn is the port as one yamux session sees it. Closing it ends the session's I/O on the
// port: with deadlines the port stays open for the next session.
type sessionConn struct {
	r    io.Reader
	port io.ReadWriteCloser
	dl   deadliner // nil: the port has no deadlines
	once sync.Once
}

// Read reads the port through the session's reader.
func (c *sessionConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Write writes the port.
func (c *sessionConn) Write(p []byte) (int, error) { return c.port.Write(p) }

// Close releases the session's blocked I/O: deadlines in the past, or the port closed.
func (c *sessionConn) Close() error {
	c.once.Do(func() {
		if c.dl == nil {
			c.port.Close()
			return
		}
		past := time.Unix(1, 0)
		c.dl.SetReadDeadline(past)
		c.dl.SetWriteDeadline(past)
	})
	return nil
}

// tailReader remembers the last bytes read through it. It is used by one goroutine at a time.
type tailReader struct {
	r    io.Reader
	tail []byte // at most tailSize bytes
}

// tailSize holds a SYNC line with room to spare.
const tailSize = 4 * (len(syncPrefix) + nonceLen + 1)

// Read reads and remembers.
func (t *tailReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		t.tail = append(t.tail, p[:n]...)
		if len(t.tail) > tailSize {
			t.tail = append(t.tail[:0], t.tail[len(t.tail)-tailSize:]...)
		}
	}
	return n, err
}

// syncLine returns the tail from its last SYNC prefix on, or nil when it has none.
func (t *tailReader) syncLine() []byte {
	i := bytes.LastIndex(t.tail, []byte(syncPrefix))
	if i < 0 {
		return nil
	}
	return bytes.Clone(t.tail[i:])
}

// Where the guest's kernel lists virtio-serial ports and their device nodes.
const (
	portsDir = "/sys/class/virtio-ports"
	devDir   = "/dev"
)

// OpenPort returns an open function for Listen: it opens the virtio-serial port named name
// (QEMU's virtserialport name=), found through /sys/class/virtio-ports/vport*/name because the
// guest has no udev to make /dev/virtio-ports/<name> links.
func OpenPort(name string) func() (io.ReadWriteCloser, error) {
	return func() (io.ReadWriteCloser, error) {
		path, err := PortDevice(name)
		if err != nil {
			return nil, err
		}
		return OpenDevice(path)
	}
}

// PortDevice returns the device node (/dev/vportNpM) of the virtio-serial port named name.
func PortDevice(name string) (string, error) {
	dev, err := findPort(portsDir, name)
	if err != nil {
		return "", err
	}
	return filepath.Join(devDir, dev), nil
}

// findPort returns the entry of dir (a /sys/class/virtio-ports) whose name file holds name.
func findPort(dir, name string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("find port %s: %w", name, err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return e.Name(), nil
		}
	}
	return "", fmt.Errorf("find port %s: no such virtio-serial port: %w", name, os.ErrNotExist)
}

// OpenDevice opens the character device at path for Listen. os.OpenFile puts a device that
// implements poll (virtio-serial ports do) into non-blocking mode under Go's poller, so the
// returned file supports deadlines, and neither a blocked Read nor a blocked Write holds the
// descriptor inside the kernel: both return when a deadline passes or the file is closed. A
// device that cannot be polled stays in blocking mode, without deadlines.
func OpenDevice(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY, 0)
}
