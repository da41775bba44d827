package agentrpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Quiescing: some runtimes can save a sandbox only when no process in it holds a socket that
// reaches the host. gVisor's checkpoint refuses a bound host socket ("cannot save endpoint with
// bound host socket"), and the agent's listener is one. Before such a checkpoint the edge asks the
// agent to quiesce: the agent stops accepting, closes its listener and every connection (running
// commands keep running and keep their output; clients re-attach later), replies, and closes the
// quiescing connection last. It then waits in Config.Relisten until the host says the sandbox may
// be reached again (after the restore, or when the pause was abandoned) and accepts on the new
// listener. Only an agent started with a Relisten function quiesces; others refuse with
// errdefs.ErrInvalid.

// quiesceReq is a quiesce in progress: the Serve loop closes accepting once it has seen the
// listener close, so that the quiescing connection replies only when no listener is left.
type quiesceReq struct {
	accepting chan struct{} // closed by Serve once Accept has returned for the closed listener
}

// quiesce runs opQuiesce for connection c.
func (s *Server) quiesce(c *conn) error {
	if s.cfg.Relisten == nil {
		return errdefs.Invalid("op", "this agent cannot quiesce (it serves an inherited socket)")
	}
	s.mu.Lock()
	if s.quiescing != nil {
		s.mu.Unlock()
		return errdefs.Conflict("agent is already quiescing")
	}
	q := &quiesceReq{accepting: make(chan struct{})}
	s.quiescing = q
	ln := s.ln
	s.mu.Unlock()
	ln.Close()
	select {
	case <-q.accepting:
	case <-time.After(5 * time.Second):
		return errors.New("quiesce: the accept loop did not stop")
	}
	s.mu.Lock()
	others := make([]net.Conn, 0, len(s.live))
	for nc := range s.live {
		if nc != c.nc {
			others = append(others, nc)
		}
	}
	s.mu.Unlock()
	for _, nc := range others {
		nc.Close()
	}
	return c.reply(reply{})
}

// relisten is called by Serve after a quiesce closed the listener: it waits for Relisten's new
// listener and clears the quiesce.
func (s *Server) relisten(ctx context.Context, q *quiesceReq) (net.Listener, error) {
	close(q.accepting)
	ln, err := s.cfg.Relisten(ctx)
	if err != nil {
		return nil, fmt.Errorf("relisten: %w", err)
	}
	s.mu.Lock()
	s.ln, s.quiescing = ln, nil
	s.mu.Unlock()
	return ln, nil
}

// trackConn records a live connection (for quiesce); the returned func forgets it.
func (s *Server) trackConn(nc net.Conn) func() {
	s.mu.Lock()
	s.live[nc] = struct{}{}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.live, nc)
		s.mu.Unlock()
	}
}

// ListenPath listens on a unix socket at path (mode 0600), removing a stale socket file first.
// Closing the listener removes the file.
func ListenPath(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return ln, nil
}

// WaitForMarker returns a Relisten function for an agent whose socket lives at sock in a directory
// the host shares with it: it polls for the file marker (which the host creates when the sandbox
// may be reached again), removes it and listens on sock again.
func WaitForMarker(sock, marker string, poll time.Duration) func(context.Context) (net.Listener, error) {
	return func(ctx context.Context) (net.Listener, error) {
		t := time.NewTicker(poll)
		defer t.Stop()
		for {
			if _, err := os.Lstat(marker); err == nil {
				if err := os.Remove(marker); err != nil {
					return nil, err
				}
				return ListenPath(sock)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-t.C:
			}
		}
	}
}

// Quiesce asks the agent to close its listener and connections (see quiesce above). It returns
// once the agent has closed this connection too, so that no socket to the host is left open in
// the sandbox.
func (c *Client) Quiesce(ctx context.Context) error {
	cc, err := c.dial(ctx, &request{Op: opQuiesce})
	if err != nil {
		return err
	}
	defer cc.close()
	if err := cc.f.flush(); err != nil {
		return cc.fail(err)
	}
	if _, err := cc.readReply(); err != nil {
		return err
	}
	// The agent closes its end after the reply; wait for that.
	var b [1]byte
	for {
		if _, err := cc.nc.Read(b[:]); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("agent quiesce: %w", ctx.Err())
			}
			return nil
		}
	}
}
