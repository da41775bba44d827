package edge

import (
	"context"
	"sync"

	corral "github.com/corral-dev/corral/sdk/go"
)

// stepWriter records the trajectory entries of execs and commands that carry no step ID off
// their path: the exec streams its start and its exit without waiting for the store, and one
// goroutine writes the entries in the order they were queued. When a command's start and end
// are both waiting, they are written as one insert (one transaction instead of two).
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
	done    chan struct{} // closed when the goroutine ends

	// seqs maps a live entry to the sequence number the store gave it: the goroutine's while
	// it runs, then protected by mu.
	seqs map[*corral.TrajectoryEntry]int64
}

// stepOp is one queued write, or a barrier (flush).
type stepOp struct {
	sandbox string
	key     *corral.TrajectoryEntry // the live entry: it names the step between its writes
	entry   corral.TrajectoryEntry  // a copy, as it was when queued
	begin   bool                    // append (else: rewrite the appended step)
	barrier chan struct{}           // set on a flush: closed once everything before is written
}

// queueStepBegin queues the append of entry (a step with no StepID) to sandbox's trajectory.
func (e *Edge) queueStepBegin(sandbox string, entry *corral.TrajectoryEntry) {
	e.steps.push(e, stepOp{sandbox: sandbox, key: entry, entry: *entry, begin: true})
}

// queueStepUpdate queues the rewrite of entry, appended earlier with queueStepBegin.
func (e *Edge) queueStepUpdate(sandbox string, entry *corral.TrajectoryEntry) {
	e.steps.push(e, stepOp{sandbox: sandbox, key: entry, entry: *entry})
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
		w.wake = make(chan struct{}, 1)
		w.done = make(chan struct{})
		w.seqsInit()
		go e.stepWriterLoop()
	}
	w.queue = append(w.queue, op)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
}

func (w *stepWriter) seqsInit() {
	if w.seqs == nil {
		w.seqs = map[*corral.TrajectoryEntry]int64{}
	}
}

// close writes what is queued and ends the goroutine.
func (w *stepWriter) close() {
	w.mu.Lock()
	w.closed = true
	started := w.started
	w.mu.Unlock()
	if started {
		select {
		case w.wake <- struct{}{}:
		default:
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
		for {
			w.mu.Lock()
			ops := w.queue
			w.queue = nil
			closed := w.closed
			w.mu.Unlock()
			if len(ops) == 0 {
				if closed {
					return
				}
				break
			}
			e.writeSteps(ops, w.seqs)
		}
	}
}

// writeSteps applies ops in order. A begin whose final update is in the same batch is written
// once, as that update.
func (e *Edge) writeSteps(ops []stepOp, seqs map[*corral.TrajectoryEntry]int64) {
	last := map[*corral.TrajectoryEntry]int{} // the last op of each step in this batch
	for i, op := range ops {
		if op.barrier == nil {
			last[op.key] = i
		}
	}
	skip := make([]bool, len(ops))
	for i, op := range ops {
		switch {
		case skip[i]:
			continue
		case op.barrier != nil:
			close(op.barrier)
			continue
		}
		ctx := context.Background()
		if op.begin {
			entry := op.entry
			if j := last[op.key]; j > i && ops[j].entry.State != corral.StepRunning {
				// Its end is queued too: append the finished entry, once.
				entry = ops[j].entry
				for k := i + 1; k <= j; k++ {
					if ops[k].key == op.key {
						skip[k] = true
					}
				}
			}
			entry.Seq = 0
			if _, err := e.store.BeginStep(ctx, op.sandbox, &entry); err != nil {
				e.log.Error("record trajectory step", "sandbox", op.sandbox, "err", err)
				continue
			}
			if entry.State == corral.StepRunning {
				seqs[op.key] = entry.Seq
			}
			continue
		}
		seq, ok := seqs[op.key]
		if !ok {
			continue // its append failed, or it was never queued
		}
		entry := op.entry
		entry.Seq = seq
		if entry.State != corral.StepRunning {
			delete(seqs, op.key)
		}
		if err := e.store.UpdateStep(ctx, op.sandbox, &entry); err != nil {
			e.log.Error("record trajectory step", "sandbox", op.sandbox, "seq", seq, "err", err)
		}
	}
}
