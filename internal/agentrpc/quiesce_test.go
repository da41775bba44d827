package agentrpc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// TestQuiesce: a quiesced agent has no listener and no connection left, keeps its commands
// running, and serves again once the marker appears; a second quiesce works the same way.
func TestQuiesce(t *testing.T) {
	var sock, marker string
	c, _ := startServer(t, func(cfg *Config) {
		dir, err := os.MkdirTemp("", "q")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		sock, marker = filepath.Join(dir, "agent.sock"), filepath.Join(dir, "resume")
		cfg.Relisten = WaitForMarker(sock, marker, time.Millisecond)
	})
	ctx := testCtx(t)
	// startServer listens on its own path; move to ours through one quiesce cycle.
	info, err := c.Start(ctx, ExecRequest{Argv: []string{"sh", "-c", "sleep 0.3; echo done"}})
	if err != nil {
		t.Fatal(err)
	}
	// An attached stream is cut by the quiesce; the command is not.
	st, err := c.Attach(ctx, info.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Quiesce(ctx); err != nil {
		t.Fatalf("Quiesce: %v", err)
	}
	if _, err := st.Next(); err == nil {
		t.Errorf("attached stream survived the quiesce")
	}
	if _, err := c.Ping(ctx); err == nil {
		t.Fatalf("old socket still answers")
	}
	nc := NewClient(sock)
	if _, err := nc.Ping(ctx); err == nil {
		t.Fatalf("answers before the marker exists")
	}
	time.Sleep(400 * time.Millisecond) // the command finishes while quiesced
	for range 2 {
		if err := os.WriteFile(marker, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "agent listening again", 5*time.Second, func() bool { _, err := nc.Ping(ctx); return err == nil })
		if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("marker not consumed: %v", err)
		}
		res := drain(t, mustAttach(t, nc, info.ID))
		if res.stdout.String() != "done\n" || res.exit == nil || res.exit.Code != 0 {
			t.Errorf("command across the quiesce: %+v", res)
		}
		if err := nc.Quiesce(ctx); err != nil {
			t.Fatalf("Quiesce again: %v", err)
		}
	}
	os.WriteFile(marker, nil, 0o600) // let Serve's cleanup find a listener
	waitFor(t, "agent listening again", 5*time.Second, func() bool { _, err := nc.Ping(ctx); return err == nil })
}

func mustAttach(t *testing.T, c *Client, id string) *Stream {
	t.Helper()
	st, err := c.Attach(context.Background(), id, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestQuiesceRefused: an agent on an inherited socket cannot quiesce.
func TestQuiesceRefused(t *testing.T) {
	c, _ := startServer(t, nil)
	if err := c.Quiesce(testCtx(t)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Quiesce: %v, want invalid", err)
	}
	if _, err := c.Ping(testCtx(t)); err != nil {
		t.Fatalf("Ping after refused quiesce: %v", err)
	}
}
