package store

import (
	"context"
	"database/sql"
	"sync"
)

// stmtCache keeps the store's reads prepared on SQLite's read-only handle. The SQLite driver parses
// and plans every statement it is given, and the store runs the same few dozen again and again
// (each API request authenticates with two reads; each exec writes its trajectory): a statement
// is prepared once per connection and reused. Only the read handle has one: the writer's single
// connection is held by each transaction, so preparing on it from inside one would wait for
// itself. PostgreSQL's driver keeps its own cache, so its handles have none. Statements beyond stmtCacheMax (queries built with varying lists) run
// unprepared.
//
// Concurrency: the map is protected by mu; a *sql.Stmt is safe for concurrent use.
type stmtCache struct {
	db *sql.DB

	mu    sync.Mutex
	stmts map[string]*sql.Stmt // protected by mu
}

// stmtCacheMax bounds the statements kept per handle.
const stmtCacheMax = 512

// get returns q prepared, or nil when it is not kept (the cache is full, or preparing failed:
// the caller then runs q unprepared and sees the error there).
func (c *stmtCache) get(ctx context.Context, q string) *sql.Stmt {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	st, ok := c.stmts[q]
	full := len(c.stmts) >= stmtCacheMax
	c.mu.Unlock()
	if ok || full {
		return st
	}
	// Prepared without mu held (it waits for a connection); a racing prepare of the same q is
	// closed.
	st, err := c.db.PrepareContext(context.WithoutCancel(ctx), q)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.stmts[q]; ok {
		st.Close()
		return old
	}
	if c.stmts == nil {
		c.stmts = map[string]*sql.Stmt{}
	}
	c.stmts[q] = st
	return st
}

// close closes the kept statements.
func (c *stmtCache) close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.stmts {
		st.Close()
	}
	c.stmts = nil
}
