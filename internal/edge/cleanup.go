package edge

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// A delete (and an expired TTL or idle timeout, which end a sandbox the same way, with their own
// reason) answers once the sandbox can no longer run anything and no longer counts against a
// quota; the rest of its teardown (runc/runsc state, unmounts, loop devices, cgroups, network
// namespace, veth and nftables rules, layer references) is a cleanup that runs here, off the
// request's path:
//
//  1. Delete records the sandbox as state "deleting" with its outcome (Stopping: stopped,
//     deleted) in one store write. "deleting" is not a live state, so its quota and the node's
//     admission are released by that write, and a restart finds the record (reconcile).
//  2. Delete kills every process of the sandbox (Runtime.Kill), takes it out of the live set
//     (data-plane calls now fail with a conflict) and answers with the deleting record.
//  3. A cleanup worker removes the rest (Runtime.Delete and the edge's own state) and records the
//     end: state "stopped", reason "deleted", and only then the deleted event. GET shows
//     "deleting" until then.
//
// At most cleanupWorkers cleanups run at once; more wait in a queue. Close finishes the queue
// before it returns; a cleanup that a crash cut short, or one still queued when the process
// died, is finished by reconcile at the next start (the record is still "deleting").

// cleanupWorkers bounds the teardowns that run at once: each is mostly syscalls (unmounts,
// cgroup removal, netlink) and a runc or runsc process, so a few keep the disk and CPU busy
// without starving the sandboxes still running.
const cleanupWorkers = 2

// cleanupJob is the state a deleted sandbox's teardown needs once it has left the live set.
type cleanupJob struct {
	rec    *store.Sandbox
	net    *sandboxNet
	unheld map[string]bool
}

// cleaner runs cleanupJobs on at most cleanupWorkers goroutines. Its goroutines start on
// demand and end when the queue is empty; closed makes later jobs run on the caller.
type cleaner struct {
	mu      sync.Mutex
	queue   []cleanupJob // protected by mu
	running int          // workers now running; protected by mu
	// active holds the sandboxes whose cleanup is queued or running; protected by mu.
	active map[string]bool
	closed bool      // protected by mu
	idle   sync.Cond // signalled when running drops to 0; uses mu
}

// enqueue hands j to a worker (starting one when fewer than cleanupWorkers run). After close it
// runs j on the caller instead, so a delete during shutdown still completes.
func (e *Edge) enqueueCleanup(j cleanupJob) {
	c := &e.cleanups
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		e.cleanup(j)
		return
	}
	c.queue = append(c.queue, j)
	if c.active == nil {
		c.active = map[string]bool{}
	}
	c.active[j.rec.ID] = true
	if c.running < cleanupWorkers {
		c.running++
		go e.cleanupWorker()
	}
	c.mu.Unlock()
}

// cleanupWorker runs queued cleanups until the queue is empty.
func (e *Edge) cleanupWorker() {
	c := &e.cleanups
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.running--
			if c.running == 0 {
				c.idle.Broadcast()
			}
			c.mu.Unlock()
			return
		}
		j := c.queue[0]
		c.queue[0] = cleanupJob{}
		c.queue = c.queue[1:]
		c.mu.Unlock()
		e.cleanup(j)
		c.mu.Lock()
		delete(c.active, j.rec.ID)
		c.mu.Unlock()
	}
}

// closeCleanups waits for the queued and running cleanups, then makes later ones run on their
// callers.
func (e *Edge) closeCleanups() {
	c := &e.cleanups
	c.mu.Lock()
	c.closed = true
	for c.running > 0 {
		c.idle.Wait()
	}
	c.mu.Unlock()
}

// cleanupWaitOnFull bounds how long a create refused for room waits for pending cleanups
// before it is refused after all.
const cleanupWaitOnFull = 30 * time.Second

// cleanupsPending reports whether a deleted sandbox's cleanup is queued or running.
func (e *Edge) cleanupsPending() bool {
	e.cleanups.mu.Lock()
	defer e.cleanups.mu.Unlock()
	return len(e.cleanups.active) > 0
}

// WaitCleanups returns once every cleanup queued or running when it was called has ended (or
// ctx ends). What needs a deleted sandbox's host state gone waits on it: deleting a layer's
// blob, which a deleting sandbox may still have mounted.
func (e *Edge) WaitCleanups(ctx context.Context) error {
	c := &e.cleanups
	c.mu.Lock()
	ids := make([]string, 0, len(c.active))
	for id := range c.active {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for {
		c.mu.Lock()
		left := slices.ContainsFunc(ids, func(id string) bool { return c.active[id] })
		c.mu.Unlock()
		if !left {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond): // polling with a deadline: cleanups are short
		}
	}
}

// cleanup removes what a killed sandbox left on the host and records its end. A failure of the
// runtime's teardown leaves the record in "deleting", so the next start tries again.
func (e *Edge) cleanup(j cleanupJob) {
	ctx := context.Background()
	rec := j.rec
	if err := e.rt.Delete(ctx, rec.ID); err != nil {
		e.log.Error("remove a deleted sandbox; the next start of corral tries again", "sandbox", rec.ID, "err", err)
		return
	}
	e.detachNetwork(rec.ID, j.net)
	e.releaseLayers(rec, j.unheld)
	rec.NetSlot = nil
	state, reason := model.StateStopped, model.ReasonDeleted
	if rec.Stopping != nil {
		state, reason = rec.Stopping.State, rec.Stopping.Reason
	}
	e.finish(ctx, rec, state, reason)
	e.log.Info("sandbox stopped", "sandbox", rec.ID, "state", state, "reason", reason)
}
