package edge

import (
	"context"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/store"
)

// What live sandboxes did, sent to cfg.Activity (a cluster's servers, over the node channel)
// instead of written to the store: the periodic batch of what changed (sendActivity, every
// flush), and a queue for what happens once in a sandbox's life (its create, first exec, TTL
// extension, final counters, end), sent within activityBatchWait of the first entry, in one
// batch, off the path of the request that caused it. The servers apply every entry so that
// order does not matter (times and counters move forward only; a usage row is made from the
// record when first needed), so a failed batch is simply sent again.

const (
	// activityBatchWait is how long a queued entry waits for others to share its batch.
	activityBatchWait = 200 * time.Millisecond
	// activityRetry is how long a failed batch waits before it is sent again.
	activityRetry = time.Second
	// maxQueuedActivity bounds the queue through an outage of the servers: past it the oldest
	// entries are dropped (logged), the report then missing what they said.
	maxQueuedActivity = 100_000
)

// activityQueue holds the entries waiting for the next batch.
type activityQueue struct {
	mu      sync.Mutex
	pending []store.Activity // protected by mu
	dropped int              // protected by mu; dropped since last logged
	kick    chan struct{}    // capacity 1: something is pending
	done    chan struct{}    // closed when activityLoop returns
}

func newActivityQueue() activityQueue {
	return activityQueue{kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// queueActivity sends a with the next queued batch (cfg.Activity must be set).
func (e *Edge) queueActivity(a store.Activity) {
	q := &e.activity
	q.mu.Lock()
	if len(q.pending) >= maxQueuedActivity {
		q.pending = q.pending[1:]
		q.dropped++
	}
	q.pending = append(q.pending, a)
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// takeActivity empties the queue and returns what it held.
func (e *Edge) takeActivity() []store.Activity {
	q := &e.activity
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dropped > 0 {
		e.log.Warn("the servers were unreachable for long: sandbox activity dropped from the report", "entries", q.dropped)
		q.dropped = 0
	}
	acts := q.pending
	q.pending = nil
	return acts
}

// requeueActivity puts back the entries of a failed batch, ahead of those queued since.
func (e *Edge) requeueActivity(acts []store.Activity) {
	if len(acts) == 0 {
		return
	}
	q := &e.activity
	q.mu.Lock()
	q.pending = append(acts, q.pending...)
	if over := len(q.pending) - maxQueuedActivity; over > 0 {
		q.pending = q.pending[over:]
		q.dropped += over
	}
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// activityLoop sends the queued entries until the edge stops (Close sends what is left).
func (e *Edge) activityLoop() {
	defer close(e.activity.done)
	wait := func(d time.Duration) bool {
		select {
		case <-e.stop:
			return false
		case <-time.After(d):
			return true
		}
	}
	for {
		select {
		case <-e.stop:
			return
		case <-e.activity.kick:
		}
		if !wait(activityBatchWait) {
			return
		}
		acts := e.takeActivity()
		if len(acts) == 0 {
			continue
		}
		if err := e.cfg.Activity.RecordActivity(context.Background(), acts); err != nil {
			e.log.Warn("record sandbox activity; sending it again", "entries", len(acts), "err", err)
			e.requeueActivity(acts)
			if !wait(activityRetry) {
				return
			}
		}
	}
}
