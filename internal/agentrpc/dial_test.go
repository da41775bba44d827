package agentrpc

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// TestDial: a stream to a port on the agent's loopback carries bytes both ways, including bytes
// written before the server answers and a half-close; nothing listening and a bad port are
// clear errors.
func TestDial(t *testing.T) {
	c, _ := startServer(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			s, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer s.Close()
				// Upper-cases lines until the client half-closes, then says bye.
				r := bufio.NewScanner(s)
				for r.Scan() {
					io.WriteString(s, strings.ToUpper(r.Text())+"\n")
				}
				io.WriteString(s, "bye\n")
			}()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	conn, err := c.Dial(ctx, port)
	cancel() // the connection outlives the dial's context
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "one\ntwo\n"); err != nil {
		t.Fatal(err)
	}
	conn.(interface{ CloseWrite() error }).CloseWrite()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "ONE\nTWO\nbye\n" {
		t.Fatalf("read %q, %v", got, err)
	}

	// Nothing listening.
	free, _ := net.Listen("tcp", "127.0.0.1:0")
	freePort := free.Addr().(*net.TCPAddr).Port
	free.Close()
	if _, err := c.Dial(context.Background(), freePort); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("dial a closed port: %v, want unavailable", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := c.Dial(context.Background(), p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("dial port %d: %v, want invalid", p, err)
		}
	}
}
