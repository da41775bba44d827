package vmlink

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Handshake attempts on the host: the first waits firstAttempt for the guest's ACK, each further
// one twice as long as the one before, up to maxAttempt. A new attempt is a new connection with a
// new nonce: it recovers from a SYNC the guest never saw (sent while its port was closed, or
// swallowed by a session the guest still thought alive) without waiting for a keepalive.
const (
	firstAttempt = time.Second
	maxAttempt   = 8 * time.Second
)

// Session is the host's end of one handshaken link: a yamux client session on a connection to
// QEMU's chardev socket. It is safe for concurrent use.
type Session struct {
	mux *yamux.Session
}

// Connect dials QEMU's chardev socket at path and handshakes with the guest, retrying (a refused
// or missing socket, a guest that does not answer yet) until ctx ends: QEMU accepts at once, but
// the guest answers only once its agent runs. The error is ctx's when ctx ended first, else
// errdefs.ErrUnavailable.
func Connect(ctx context.Context, path string) (*Session, error) {
	return connect(ctx, path, true, nil)
}

// connect is Connect; without retryDial a failed dial fails at once (nothing listens: the VM is
// not running), while handshake attempts are still retried until ctx ends.
func connect(ctx context.Context, path string, retryDial bool, log *slog.Logger) (*Session, error) {
	log = orDiscard(log)
	attempt := firstAttempt
	backoff := 10 * time.Millisecond
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("vmlink: connect %s: %w", path, ctx.Err())
			}
			if !retryDial {
				return nil, errdefs.Unavailable("vmlink: connect %s: %v", path, err)
			}
			if !sleep(ctx, backoff) {
				return nil, fmt.Errorf("vmlink: connect %s: %w", path, ctx.Err())
			}
			backoff = min(2*backoff, 250*time.Millisecond)
			continue
		}
		deadline := time.Now().Add(attempt)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		br, err := handshakeHost(ctx, conn, deadline)
		if err == nil {
			mux, err := yamux.Client(&bufferedConn{Conn: conn, r: br}, muxConfig(log, true))
			if err != nil { // only for an invalid configuration
				conn.Close()
				return nil, fmt.Errorf("vmlink: %w", err)
			}
			return &Session{mux: mux}, nil
		}
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("vmlink: connect %s: %w", path, ctx.Err())
		}
		log.Debug("vmlink: handshake failed, trying again", "path", path, "err", err)
		if errors.Is(err, io.EOF) && !sleep(ctx, backoff) { // QEMU hung up: do not spin
			return nil, fmt.Errorf("vmlink: connect %s: %w", path, ctx.Err())
		}
		attempt = min(2*attempt, maxAttempt)
	}
}

// handshakeHost sends a SYNC on conn and waits until deadline (or until ctx ends) for its ACK. It
// returns the reader to go on with: bytes after the ACK are the guest's first yamux frames.
func handshakeHost(ctx context.Context, conn net.Conn, deadline time.Time) (*bufio.Reader, error) {
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	nonce := newNonce()
	if _, err := io.WriteString(conn, syncPrefix+nonce+"\n"); err != nil {
		return nil, fmt.Errorf("send sync: %w", err)
	}
	br := bufio.NewReader(conn)
	if err := awaitLine(br, []byte(ackPrefix+nonce+"\n"), maxJunk); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = errors.New("the guest did not answer in time")
		}
		return nil, fmt.Errorf("await ack: %w", err)
	}
	if !stop() {
		return nil, ctx.Err()
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return br, nil
}

// bufferedConn is a net.Conn whose reads go through r (which holds what the handshake read ahead).
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

// Read reads through the handshake's reader.
func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Open opens a new stream to the guest's agent. It fails with errdefs.ErrUnavailable once the
// session is closed, and with ctx's error when ctx ends first.
func (s *Session) Open(ctx context.Context) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	type result struct {
		st  *yamux.Stream
		err error
	}
	// OpenStream blocks only while 256 streams wait for the guest to accept theirs.
	ch := make(chan result, 1)
	go func() {
		st, err := s.mux.OpenStream()
		ch <- result{st, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, errdefs.Unavailable("vmlink: open stream: %v", r.err)
		}
		return r.st, nil
	case <-ctx.Done():
		go func() { // ends when OpenStream returns, at the latest when the session closes
			if r := <-ch; r.st != nil {
				r.st.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// Close ends the session: its streams fail and the connection to QEMU is closed.
func (s *Session) Close() error { return s.mux.Close() }

// Done is closed when the session has ended, by Close or because the link broke.
func (s *Session) Done() <-chan struct{} { return s.mux.CloseChan() }

// sleep waits d or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
