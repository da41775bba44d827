package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store/pgtest"
)

func TestTransientClassification(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{sql.ErrNoRows, false},
		{context.Canceled, false},
		{fmt.Errorf("look up token: %w", context.DeadlineExceeded), false},
		{errdefs.NotFound("x"), false},
		{&pgconn.PgError{Code: "23505"}, false},
		{&pgconn.PgError{Code: "40001"}, false}, // a serialisation failure reruns the transaction, but is not a broken connection
		{fmt.Errorf("look up token: %w", io.ErrUnexpectedEOF), true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{syscall.ECONNREFUSED, true},
		{sql.ErrConnDone, true},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if err := unavailable(io.ErrUnexpectedEOF); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("unavailable(EOF) = %v", err)
	}
	if err := unavailable(sql.ErrNoRows); err != sql.ErrNoRows {
		t.Fatalf("unavailable changed a statement's error: %v", err)
	}
}

// TestPostgresRestartUnderLoad restarts PostgreSQL, cutting every pooled connection, while reads
// and transactions run: none fails (each is tried again on a new connection), no acknowledged
// write is lost, and while the database stays down calls end as ErrUnavailable, not as an
// anonymous error.
func TestPostgresRestartUnderLoad(t *testing.T) {
	c, err := pgtest.Start()
	if errors.Is(err, pgtest.ErrNotInstalled) {
		t.Skip("PostgreSQL is not installed (scripts/setup.sh installs it)")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	url, err := c.CreateDB("restart")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now().UTC()
	put := func(id string) error {
		return s.PutSandbox(ctx, &Sandbox{Sandbox: model.Sandbox{ID: id, Node: "n1", State: model.StateStopped,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, Lower: []string{"sha256:00"}})
	}
	if err := put("sb-n1-first"); err != nil {
		t.Fatal(err)
	}

	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []error
		acked    []string
		n        atomic.Int64
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				if _, err := s.GetSandbox(ctx, "sb-n1-first"); err != nil {
					mu.Lock()
					failures = append(failures, fmt.Errorf("read: %w", err))
					mu.Unlock()
				}
				id := fmt.Sprintf("sb-n1-w%d-%d", w, i)
				if err := put(id); err != nil {
					mu.Lock()
					failures = append(failures, fmt.Errorf("write %s: %w", id, err))
					mu.Unlock()
					continue
				}
				mu.Lock()
				acked = append(acked, id)
				mu.Unlock()
				n.Add(1)
			}
		}()
	}
	for n.Load() < 50 {
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.RestartFast(); err != nil {
		t.Fatal(err)
	}
	before := n.Load()
	deadline := time.Now().Add(30 * time.Second)
	for n.Load() < before+50 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	for _, err := range failures {
		// A commit cut mid-way cannot be known to have landed: it is the one failure allowed,
		// and it must say so as ErrUnavailable.
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("a call failed with a non-retryable error across a restart: %v", err)
		}
	}
	t.Logf("%d calls across the restart, %d failed (cut commits)", n.Load(), len(failures))
	if len(failures) > 4 {
		t.Errorf("%d calls failed across a restart (want at most one cut commit per worker): %v", len(failures), failures)
	}
	if n.Load() < before+50 {
		t.Fatalf("the store did not recover within 30s of the restart (%d calls before, %d after)", before, n.Load()-before)
	}
	for _, id := range acked {
		if _, err := s.GetSandbox(ctx, id); err != nil {
			t.Fatalf("acknowledged write %s lost: %v", id, err)
		}
	}

	// Down for good: reads and writes end as ErrUnavailable within the retry bound.
	c.Stop()
	start := time.Now()
	if _, err := s.GetSandbox(ctx, "sb-n1-first"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("read with the database down: %v", err)
	}
	if err := put("sb-n1-late"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("write with the database down: %v", err)
	}
	t.Logf("database down: two calls gave up after %s", time.Since(start).Round(time.Millisecond))
}
