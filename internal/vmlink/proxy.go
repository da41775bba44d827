package vmlink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// DefaultConnectTimeout bounds one (re)connection of a Proxy: the dial and the handshake.
const DefaultConnectTimeout = 5 * time.Second

// ProxyConfig configures a Proxy.
type ProxyConfig struct {
	// ListenPath is the unix socket the Proxy serves (created with mode 0600, a stale socket
	// there is replaced, removed on Close).
	ListenPath string
	// ChardevPath is QEMU's socket for the guest's virtio-serial port.
	ChardevPath string
	// ConnectTimeout bounds one (re)connection to the guest: the dial, which is not retried (no
	// socket or a refused one means no VM), and the handshake, which is (a VM that is stopped or
	// still booting answers late). Default DefaultConnectTimeout.
	ConnectTimeout time.Duration
}

// Validate reports the first field that is out of range.
func (c *ProxyConfig) Validate() error {
	switch {
	case c.ListenPath == "":
		return errdefs.Invalid("listen_path", "must be set")
	case c.ChardevPath == "":
		return errdefs.Invalid("chardev_path", "must be set")
	case c.ConnectTimeout < 0:
		return errdefs.Invalid("connect_timeout", "must not be negative")
	}
	return nil
}

// Proxy forwards the connections accepted on a unix socket, each over a stream of the current
// session to a VM's agent, so that internal/agentrpc's Client (one connection per call) can talk
// to the agent in the guest as it does to a container's.
//
// It connects on demand: the first connection accepted while there is no live session starts a
// connect (one at a time; connections accepted meanwhile wait for it), and a session that breaks
// (the VM paused or stopped, QEMU gone, a missed keepalive) is replaced by the next connection
// that needs one. So a Proxy outlives its VM's QEMU processes: after a resume in a new process
// the next call reconnects. A connection that finds no VM to reach (the connect fails) is closed
// at once, which the client reports as errdefs.ErrUnavailable; streams of a session that breaks
// fail the same way.
//
// Goroutines: one accepts until Close; one per accepted connection ends when either end of the
// forwarded connection closes, or on Close. Lock order: mu is a leaf.
type Proxy struct {
	cfg ProxyConfig  // immutable
	log *slog.Logger // immutable
	ln  net.Listener // immutable

	ctx    context.Context // ends on Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex
	// Protected by mu:
	sess       *Session              // the current session, or nil
	connecting chan struct{}         // closed when the connect in progress ends; nil when none is
	connErr    error                 // the result of the last connect that failed
	conns      map[net.Conn]struct{} // accepted connections still open
	closed     bool
}

// NewProxy is StartProxy with the default timeouts.
func NewProxy(listenPath, chardevPath string, log *slog.Logger) (*Proxy, error) {
	return StartProxy(ProxyConfig{ListenPath: listenPath, ChardevPath: chardevPath}, log)
}

// StartProxy listens on cfg.ListenPath and serves it until Close. It does not connect to the VM
// until a connection arrives.
func StartProxy(cfg ProxyConfig, log *slog.Logger) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("vmlink proxy: %w", err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	ln, err := listenUnix(cfg.ListenPath)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{cfg: cfg, log: orDiscard(log), ln: ln, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// listenUnix listens on a unix socket at path with mode 0600, replacing a stale socket file.
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("vmlink proxy: listen: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("vmlink proxy: chmod %s: %w", path, err)
	}
	return ln, nil
}

// Close stops accepting, removes the socket file, closes every forwarded connection and the
// session, and waits for the Proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	sess := p.sess
	p.sess = nil
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	if sess != nil {
		sess.Close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	backoff := time.Millisecond
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			p.log.Warn("vmlink proxy: accept", "err", err)
			if !sleep(p.ctx, backoff) {
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		if !p.track(c) {
			c.Close()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			p.forward(c)
		}()
	}
}

// track records c as open; it reports false once the Proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// forward carries c over a new stream of the current session until either end closes.
func (p *Proxy) forward(c net.Conn) {
	var st net.Conn
	// A second try when the session turns out to have broken just now: a new one replaces it.
	for try := 0; st == nil; try++ {
		sess, err := p.session()
		if err != nil {
			p.log.Debug("vmlink proxy: no link to the guest", "err", err)
			return
		}
		ctx, cancel := context.WithTimeout(p.ctx, p.cfg.ConnectTimeout)
		st, err = sess.Open(ctx)
		cancel()
		if err != nil {
			p.log.Debug("vmlink proxy: open stream", "err", err)
			select {
			case <-sess.Done():
				if try == 0 {
					continue
				}
			default:
			}
			return
		}
	}
	// The agent's protocol never half-closes: the first end to finish ends both.
	done := make(chan struct{}, 2)
	go func() { io.Copy(st, c); done <- struct{}{} }()
	go func() { io.Copy(c, st); done <- struct{}{} }()
	<-done
	c.Close()
	st.Close()
	<-done
}

// session returns the current session, connecting when there is none (or it broke). Callers
// that arrive while a connect is in progress share its result.
func (p *Proxy) session() (*Session, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, errdefs.Unavailable("vmlink proxy: closed")
		}
		if s := p.sess; s != nil {
			select {
			case <-s.Done():
				p.sess = nil
			default:
				p.mu.Unlock()
				return s, nil
			}
		}
		wait := p.connecting
		if wait == nil {
			break
		}
		p.mu.Unlock()
		<-wait
		p.mu.Lock()
		if p.sess == nil && p.connErr != nil {
			err := p.connErr
			p.mu.Unlock()
			return nil, err
		}
	}
	done := make(chan struct{})
	p.connecting = done
	p.mu.Unlock()

	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.ConnectTimeout)
	s, err := connect(ctx, p.cfg.ChardevPath, false, p.log)
	cancel()

	p.mu.Lock()
	defer p.mu.Unlock()
	p.connecting = nil
	close(done)
	if err != nil {
		p.connErr = err
		return nil, err
	}
	if p.closed {
		s.Close()
		return nil, errdefs.Unavailable("vmlink proxy: closed")
	}
	p.sess, p.connErr = s, nil
	p.log.Debug("vmlink proxy: connected to the guest")
	return s, nil
}
