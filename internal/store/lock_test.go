package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/store/pgtest"
)

// TestLock: one holder at a time across stores (replicas); a released lock, or one whose holder's
// connection died, goes to the next waiter, and the holder that lost it is told.
func TestLock(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDB(t) // skips where PostgreSQL is missing
	open := func() *Store {
		st, err := Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	a, b := open(), open()
	la, err := a.Lock(ctx, "dispatch")
	if err != nil {
		t.Fatal(err)
	}
	wait := func(st *Store, d time.Duration) (*Lock, error) {
		cctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return st.Lock(cctx, "dispatch")
	}
	if _, err := wait(b, 3*time.Second); err == nil {
		t.Fatal("a second replica took a held lock")
	}
	other, err := b.Lock(ctx, "other")
	if err != nil {
		t.Fatalf("a lock of another name: %v", err)
	}
	other.Release()
	la.Release()
	lb, err := wait(b, 10*time.Second)
	if err != nil {
		t.Fatalf("after the holder released it: %v", err)
	}
	// The holder's session ends (a database restart, a network cut): it is told, and the lock
	// is free for the others.
	if _, err := a.db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = ?`, uint32(lockKey("dispatch"))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lb.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the holder was not told it lost the lock")
	}
	lb.Release()
	la, err = wait(a, 10*time.Second)
	if err != nil {
		t.Fatalf("after the holder's connection died: %v", err)
	}
	la.Release()

	// SQLite: one process owns the store, the lock is held at once.
	lite, err := Open(ctx, filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	l, err := lite.Lock(ctx, "dispatch")
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}
