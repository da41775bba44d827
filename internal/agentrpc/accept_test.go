package agentrpc

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// brokenListener fails every Accept with err, counting the calls.
type brokenListener struct {
	err   error
	calls int
}

func (l *brokenListener) Accept() (net.Conn, error) {
	l.calls++
	return nil, &net.OpError{Op: "accept", Net: "unix", Err: l.err}
}
func (l *brokenListener) Close() error   { return nil }
func (l *brokenListener) Addr() net.Addr { return &net.UnixAddr{Name: "broken", Net: "unix"} }

// TestServeFailsFastOnPermanentAcceptError: a descriptor that is not a listening socket (EINVAL,
// as gVisor gives for a donated listening socket) ends Serve with the error instead of retrying
// forever, while a passing shortage (EMFILE) is retried.
func TestServeFailsFastOnPermanentAcceptError(t *testing.T) {
	srv, err := NewServer(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln := &brokenListener{err: syscall.EINVAL}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background(), ln) }()
	select {
	case err := <-done:
		if !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("Serve = %v, want the EINVAL from accept", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve kept retrying an accept that can never succeed")
	}

	srv2, _ := NewServer(Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	busy := &brokenListener{err: syscall.EMFILE}
	srv2.Serve(ctx, busy)
	if busy.calls < 2 {
		t.Fatalf("EMFILE was not retried (%d accept calls)", busy.calls)
	}
}
