package edge

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
)

// stepWriter records the trajectory entries of execs and commands that carry no step ID off
// their path: the exec streams its start and its exit without waiting for the store, and one
// goroutine writes the entries in the order they were queued. It waits batchWait after the first
// entry of a batch (a flush or close does not wait): a short command's start and end are then
// written as one insert (one transaction instead of two), after the exec's answer rather than
// beside it.
//
// An entry with a step ID is recorded synchronously, as before it runs (a retry after a crash
// must find it); one without is a log line, and a crash may lose the last ones queued. Readers
// of the trajectory call flush first, so a client sees every exec that returned to it.
//
// Lifecycle: the goroutine starts with the first entry queued and ends in close, after
// writing what was queued; entries queued after close are written by the caller.
//
// Concurrency: the fields but seqs are protected by mu.
type stepWriter struct {
	mu      sync.Mutex
	started bool
	closed  bool
	queue   []stepOp
	wake    chan struct{} // capacity 1
	urgent  chan struct{} // capacity 1: a flush or close is queued, write without waiting
	done    chan struct{} // closed when the goroutine ends

	// batchWait is how long the goroutine lets entries gather before it writes them
	// (stepBatchWait; tests set their own before the first entry).
	batchWait time.Duration
	// pending counts the entries queued or being written: an entry appended at once
	// (appendStep) waits for them, so the log keeps the order in which calls returned.
	pending int
	// batches counts the store writes made (for tests).
	batches int

	// seqs maps a live entry to the sequence number the store gave it: the goroutine's while
	// it runs, then protected by mu.
	seqs map[*model.TrajectoryEntry]int64
}

// stepBatchWait is stepWriter's wait for more entries before it writes. An exec of `true`
// takes about 2 ms here, so its start and end fall in one batch; a store write beside the exec
// added 0.5 ms to its round trip on a 2-CPU host. A crash may lose these 10 ms of entries too.
const stepBatchWait = 10 * time.Millisecond

// stepOp is one queued write, or a barrier (flush).
type stepOp struct {
	sandbox string
	key     *model.TrajectoryEntry // the live entry: it names the step between its writes
	entry   model.TrajectoryEntry  // a copy, as it was when queued
	begin   bool                   // append (else: rewrite the appended step)
	barrier chan struct{}          // set on a flush: closed once everything before is written
}

// queueStepBegin queues the append of entry (a step with no StepID) to sandbox's trajectory.
func (e *Edge) queueStepBegin(sandbox string, entry *model.TrajectoryEntry) {
	e.steps.push(e, stepOp{sandbox: sandbox, key: entry, entry: *entry, begin: true})
}

// queueStepUpdate queues the rewrite of entry, appended earlier with queueStepBegin.
func (e *Edge) queueStepUpdate(sandbox string, entry *model.TrajectoryEntry) {
	e.steps.push(e, stepOp{sandbox: sandbox, key: entry, entry: *entry})
}

// flushPendingSteps is flushSteps when entries are queued or being written, so that an entry
// appended at once goes after them: the store numbers entries as they are inserted.
func (e *Edge) flushPendingSteps(ctx context.Context) {
	e.steps.mu.Lock()
	pending := e.steps.pending > 0
	e.steps.mu.Unlock()
	if pending {
		e.flushSteps(ctx)
	}
}

// flushSteps waits until every entry queued before the call is in the store, or ctx ends.
func (e *Edge) flushSteps(ctx context.Context) {
	ch := make(chan struct{})
	if !e.steps.push(e, stepOp{barrier: ch}) {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// push queues op, starting the goroutine if needed. After close it writes op itself and
// reports false.
func (w *stepWriter) push(e *Edge, op stepOp) bool {
	w.mu.Lock()
	if w.closed {
		// The goroutine has ended (close waited for it): write here, under mu.
		if op.barrier == nil {
			w.seqsInit()
			e.writeSteps([]stepOp{op}, w.seqs)
		}
		w.mu.Unlock()
		return false
	}
	if !w.started {
		w.started = true
		w.wake, w.urgent = make(chan struct{}, 1), make(chan struct{}, 1)
		w.done = make(chan struct{})
		if w.batchWait == 0 {
			w.batchWait = stepBatchWait
		}
		w.seqsInit()
		go e.stepWriterLoop()
	}
	w.queue = append(w.queue, op)
	if op.barrier == nil {
		w.pending++
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	if op.barrier != nil {
		select {
		case w.urgent <- struct{}{}:
		default:
		}
	}
	return true
}

func (w *stepWriter) seqsInit() {
	if w.seqs == nil {
		w.seqs = map[*model.TrajectoryEntry]int64{}
	}
}

// close writes what is queued and ends the goroutine.
func (w *stepWriter) close() {
	w.mu.Lock()
	w.closed = true
	started := w.started
	w.mu.Unlock()
	if started {
		for _, ch := range []chan struct{}{w.wake, w.urgent} {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		<-w.done
	}
}

// stepWriterLoop writes queued entries until close.
func (e *Edge) stepWriterLoop() {
	w := &e.steps
	defer close(w.done)
	for {
		<-w.wake
		w.gather()
		for {
			// At most nodeproto.MaxSteps at a time: one call of a cluster's edge to the servers.
			w.mu.Lock()
			n := min(len(w.queue), nodeproto.MaxSteps)
			ops := w.queue[:n:n]
			if w.queue = w.queue[n:]; len(w.queue) == 0 {
				w.queue = nil
			}
			closed := w.closed
			w.mu.Unlock()
			if len(ops) == 0 {
				if closed {
					return
				}
				break
			}
			w.mu.Lock()
			w.batches++ // before the write: it releases the flushes among ops
			w.mu.Unlock()
			written := e.writeSteps(ops, w.seqs)
			w.mu.Lock()
			w.pending -= written
			w.mu.Unlock()
		}
	}
}

// gather waits batchWait for more entries, or until a flush or close is queued.
func (w *stepWriter) gather() {
	w.mu.Lock()
	now := w.closed || slices.ContainsFunc(w.queue, func(op stepOp) bool { return op.barrier != nil })
	w.mu.Unlock()
	if now {
		select { // the flush's signal, so it does not cut the next batch's wait short
		case <-w.urgent:
		default:
		}
		return
	}
	t := time.NewTimer(w.batchWait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.urgent:
	}
}

// writeSteps applies ops in order, in one transaction (store.WriteSteps). A begin whose final
// update is in the same batch is written once, as that update. Should the batch fail, each write
// is tried on its own, so one bad entry loses only itself. It returns how many of ops were
// entries (not flushes), written or given up.
func (e *Edge) writeSteps(ops []stepOp, seqs map[*model.TrajectoryEntry]int64) int {
	last := map[*model.TrajectoryEntry]int{} // the last op of each step in this batch
	for i, op := range ops {
		if op.barrier == nil {
			last[op.key] = i
		}
	}
	type pending struct {
		key   *model.TrajectoryEntry
		write store.StepWrite
	}
	var batch, after []pending // after: updates of steps begun (unmerged) in this batch
	begun := map[*model.TrajectoryEntry]bool{}
	skip := make([]bool, len(ops))
	var barriers []chan struct{}
	for i, op := range ops {
		switch {
		case skip[i]:
			continue
		case op.barrier != nil:
			barriers = append(barriers, op.barrier)
			continue
		}
		entry := op.entry
		if op.begin {
			if j := last[op.key]; j > i && ops[j].entry.State != model.StepRunning {
				// Its end is queued too: append the finished entry, once.
				entry = ops[j].entry
				for k := i + 1; k <= j; k++ {
					if ops[k].key == op.key {
						skip[k] = true
					}
				}
			}
			entry.Seq = 0
			begun[op.key] = true
			batch = append(batch, pending{op.key, store.StepWrite{Sandbox: op.sandbox, Entry: &entry}})
			continue
		}
		p := pending{op.key, store.StepWrite{Sandbox: op.sandbox, Entry: &entry, Update: true}}
		if begun[op.key] {
			after = append(after, p)
			continue
		}
		seq, ok := seqs[op.key]
		if !ok {
			continue // its append failed, or it was never queued
		}
		entry.Seq = seq
		batch = append(batch, p)
	}
	write := func(ps []pending, together bool) {
		ws := make([]store.StepWrite, len(ps))
		for i, p := range ps {
			ws[i] = p.write
		}
		failed := make([]bool, len(ps))
		if together && len(ws) > 1 {
			err := e.traj.WriteSteps(context.Background(), ws)
			switch {
			case errors.Is(err, errdefs.ErrUnavailable):
				// It may have been written (an answer that broke off, a commit cut short):
				// one by one could write every step twice. They are lost instead.
				e.log.Error("record trajectory steps: the store or the servers are unavailable; these steps are not recorded", "steps", len(ws), "err", err)
				for i := range failed {
					failed[i] = true
				}
				together = true
			case err != nil:
				e.log.Warn("record trajectory steps together; writing them one by one", "steps", len(ws), "err", err)
				together = false
			}
		}
		if !together || len(ws) == 1 {
			for i, w := range ws {
				if err := e.traj.WriteSteps(context.Background(), []store.StepWrite{w}); err != nil {
					e.log.Error("record trajectory step", "sandbox", w.Sandbox, "err", err)
					failed[i] = true
				}
			}
		}
		for i, p := range ps {
			switch {
			case failed[i]:
				if !p.write.Update {
					delete(seqs, p.key)
				}
			case p.write.Entry.State != model.StepRunning:
				delete(seqs, p.key) // finished: no more writes
			default:
				seqs[p.key] = p.write.Entry.Seq
			}
		}
	}
	if len(batch) > 0 {
		write(batch, true)
	}
	for _, p := range after {
		seq, ok := seqs[p.key]
		if !ok {
			continue
		}
		p.write.Entry.Seq = seq
		write([]pending{p}, false)
	}
	for _, b := range barriers {
		close(b)
	}
	return len(ops) - len(barriers)
}
