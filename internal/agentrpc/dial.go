package agentrpc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Dial: a TCP connection to a port on the sandbox's own loopback, made by the agent inside and
// carried over the agent's connection. After the agent's reply the connection carries the
// stream's bytes both ways, unframed, until either side closes. It reaches a server inside
// whatever the tier (a container's namespace, gVisor's network stack, a VM's guest), including
// one bound to 127.0.0.1 only.

// portDialTimeout bounds the agent's connect inside the sandbox.
const portDialTimeout = 5 * time.Second

// Dial connects to port on the sandbox's loopback. ctx bounds the connect only: the connection
// lives until it is closed. Nothing listening there is errdefs.ErrUnavailable.
func (c *Client) Dial(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Invalid("port", "%d: want 1-65535", port)
	}
	cc, err := c.dial(ctx, &request{Op: opDial, Port: port})
	if err != nil {
		return nil, err
	}
	if err := cc.f.flush(); err != nil {
		cc.close()
		return nil, cc.fail(err)
	}
	if _, err := cc.readReply(); err != nil {
		cc.close()
		return nil, err
	}
	cc.stop() // from here the connection outlives ctx
	return &portConn{Conn: cc.nc, r: cc.f.r}, nil
}

// portConn is the agent connection once it carries a port's stream: reads start with what the
// framer buffered past the reply.
type portConn struct {
	net.Conn
	r *bufio.Reader
}

func (p *portConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// CloseWrite half-closes the stream: the agent passes the end on to the port.
func (p *portConn) CloseWrite() error {
	if hc, ok := p.Conn.(interface{ CloseWrite() error }); ok {
		return hc.CloseWrite()
	}
	return fmt.Errorf("half-close over %T: not supported", p.Conn)
}

// dialPort serves opDial: connect inside, answer, then copy both ways until one side ends.
func (s *Server) dialPort(ctx context.Context, c *conn, port int) error {
	if port < 1 || port > 65535 {
		return errdefs.Invalid("port", "%d: want 1-65535", port)
	}
	d := net.Dialer{Timeout: portDialTimeout}
	tcp, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("nothing answers on port %d: %v: %w", port, err, errdefs.ErrUnavailable)
	}
	defer tcp.Close()
	if err := c.reply(reply{}); err != nil {
		return nil // the client is gone
	}
	var once sync.Once
	done := make(chan struct{})
	end := func() { once.Do(func() { close(done) }) }
	go func() {
		// Client → port: the framer's reader first holds anything sent right behind the request.
		io.Copy(tcp, c.f.r)
		if t, ok := tcp.(*net.TCPConn); ok {
			t.CloseWrite()
		} else {
			end()
		}
	}()
	go func() {
		io.Copy(c.nc, tcp)
		end()
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}
