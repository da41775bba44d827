package agentrpc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain makes the test binary a child subreaper, so orphaned grandchildren of test commands
// reparent to it as they would to the agent as PID 1, and the reaper's handling of them is tested.
// Like the agent (Harden), it marks the descriptors it inherited close-on-exec.
//
// The package's tests must not start processes with os/exec: the reaper owns wait4 for the whole
// process while a Server runs.
func TestMain(m *testing.M) {
	// A calls server (TestCallPrepEnd) starts spare call helpers by re-executing this binary.
	if len(os.Args) > 1 && os.Args[1] == CallInitArg {
		os.Exit(CallInit())
	}
	unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	if err := closeOnExecInherited(); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// startServer runs a Server on a real unix socket in a temporary directory until the test ends.
func startServer(t testing.TB, mutate func(*Config)) (*Client, *Server) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C"}}
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := NewServer(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return NewClient(sock), srv
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// result is everything a stream delivered.
type result struct {
	stdout, stderr bytes.Buffer
	events         []Event
	exit           *Exit
}

type eventSource interface {
	Next() (Event, error)
}

// drain reads events until io.EOF.
func drain(t testing.TB, s eventSource) *result {
	t.Helper()
	r := &result{}
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			return r
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		r.events = append(r.events, ev)
		switch ev.Type {
		case EventStdout:
			r.stdout.Write(ev.Data)
		case EventStderr:
			r.stderr.Write(ev.Data)
		case EventExit:
			r.exit = ev.Exit
		}
	}
}

// run executes req and returns its complete output.
func run(t testing.TB, c *Client, req ExecRequest) *result {
	t.Helper()
	s, err := c.Exec(testCtx(t), req)
	if err != nil {
		t.Fatalf("Exec %q: %v", req.Argv, err)
	}
	defer s.Close()
	r := drain(t, s)
	if r.exit == nil {
		t.Fatalf("Exec %q: stream ended without exit", req.Argv)
	}
	return r
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func needRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
}
