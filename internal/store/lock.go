package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"hash/fnv"
	"time"
)

// Lock is a lock one process of a cluster holds at a time, for work that must run once however
// many server replicas there are (the webhook dispatcher): a PostgreSQL advisory lock held by a
// connection of its own. The holder's connection ending (its process killed, the database
// restarted) releases it for the next waiter; Lost tells the holder.
type Lock struct {
	c    *sql.Conn // nil on SQLite: one process owns the store
	lost chan struct{}
	stop chan struct{}
	done chan struct{}
}

// lockCheckEvery is how often a held lock's connection is checked, and how often a waiter
// tries again.
const lockCheckEvery = 2 * time.Second

// lockKey is name's advisory lock key. Keys under 1<<16 are left to fixed uses (the migration
// lock, 7070).
func lockKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("corral-lock/" + name))
	return int64(h.Sum64() | 1<<62)
}

// Lock waits until this process holds the cluster-wide lock name, or ctx ends. On SQLite it is
// held at once.
func (s *Store) Lock(ctx context.Context, name string) (*Lock, error) {
	l := &Lock{lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	if !s.db.pg {
		close(l.done)
		return l, nil
	}
	key := lockKey(name)
	for {
		// A database that is away is waited for as a holder is.
		if c := s.tryLock(ctx, key); c != nil {
			l.c = c
			go l.watch()
			return l, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the %s lock: %w", name, ctx.Err())
		case <-time.After(lockCheckEvery):
		}
	}
}

// tryLock takes a connection and tries key on it; it returns the connection when it holds the
// lock, nil otherwise.
func (s *Store) tryLock(ctx context.Context, key int64) *sql.Conn {
	c, err := s.db.DB.Conn(ctx)
	if err != nil {
		return nil
	}
	var held bool
	if err := c.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&held); err != nil || !held {
		if err != nil {
			discard(c)
		}
		c.Close()
		return nil
	}
	return c
}

// discard keeps c out of the pool when it is closed: its session may hold a lock that must end
// with it.
func discard(c *sql.Conn) {
	c.Raw(func(any) error { return driver.ErrBadConn })
}

// watch checks the holding connection until Release; a failed check means the lock may be
// another's now.
func (l *Lock) watch() {
	defer close(l.done)
	t := time.NewTicker(lockCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), lockCheckEvery)
		err := l.c.PingContext(ctx)
		cancel()
		if err != nil {
			// Whether the session still holds the lock or not, it must end with the
			// connection, never wait in the pool holding it.
			close(l.lost)
			discard(l.c)
			l.c.Close()
			return
		}
	}
}

// Lost is closed when the lock was lost (its connection broke): the holder stops its work and
// waits for the lock again.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Release gives the lock up. Call it once.
func (l *Lock) Release() {
	close(l.stop)
	<-l.done
	if l.c == nil {
		return
	}
	select {
	case <-l.lost: // the connection is gone already
	default:
		// The connection goes with the session and its locks, rather than back to the pool.
		discard(l.c)
		l.c.Close()
	}
}
