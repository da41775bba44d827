package store

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/model"
)

// TestStmtCache: reads through the read handle's prepared statements see every committed write,
// concurrently, and the cache keeps one statement per query, no more than its bound.
func TestStmtCache(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, dsn(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			id := fmt.Sprintf("sb-n1-%d", i)
			for j, st := range []string{model.StateRunning, model.StatePaused, model.StateStopped} {
				sb := &Sandbox{Sandbox: model.Sandbox{ID: id, Node: "n1", State: st}, Lower: []string{"sha256:00"}}
				if err := s.PutSandbox(ctx, sb); err != nil {
					t.Error(err)
					return
				}
				got, err := s.GetSandbox(ctx, id)
				if err != nil || got.State != st {
					t.Errorf("write %d of %s: read %+v, %v; want state %s", j, id, got, err, st)
				}
			}
		})
	}
	wg.Wait()
	c := s.rdb.stmts
	c.mu.Lock()
	n := len(c.stmts)
	c.mu.Unlock()
	if n == 0 || n > 4 {
		t.Errorf("cache holds %d statements after one kind of read, want 1-4", n)
	}
	// Past the bound, reads run unprepared and still answer.
	c.mu.Lock()
	for i := range stmtCacheMax {
		c.stmts[fmt.Sprint("filler ", i)] = nil
	}
	c.mu.Unlock()
	if got, err := s.GetSandbox(ctx, "sb-n1-0"); err != nil || got.State != model.StateStopped {
		t.Errorf("read with a full cache: %+v, %v", got, err)
	}
	c.mu.Lock()
	for i := range stmtCacheMax {
		delete(c.stmts, fmt.Sprint("filler ", i))
	}
	c.mu.Unlock()
}
