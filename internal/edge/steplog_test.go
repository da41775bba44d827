package edge

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/model"
)

// TestStepWriter: entries of execs without a step ID reach the store in order, running then
// finished, every one after a flush; a start and end queued together are one insert; entries
// queued after close are written at once.
func TestStepWriter(t *testing.T) {
	e, st := newTestEdge(t, newFakeRuntime())
	ctx := context.Background()
	const sb = "sb-test-aaaaaaaaaaaaaaaa"

	// Start and end queued back to back (a fast exec), many concurrently.
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			entry := &model.TrajectoryEntry{Kind: "exec", Request: fmt.Sprint(i), State: model.StepRunning}
			e.queueStepBegin(sb, entry)
			entry.Output = append(entry.Output, model.Event{Type: "stdout", Data: []byte(fmt.Sprint(i))})
			entry.Exit = &model.Exit{Code: i}
			e.finishStep(sb, entry, model.StepDone, "")
		})
	}
	wg.Wait()
	// A long one: running on record until it ends.
	long := &model.TrajectoryEntry{Kind: "exec", Request: "long", State: model.StepRunning}
	e.queueStepBegin(sb, long)
	e.flushSteps(ctx)
	steps, err := st.ListSteps(ctx, sb, 0, 100, "")
	if err != nil || len(steps) != 51 {
		t.Fatalf("after flush: %d steps, %v; want 51", len(steps), err)
	}
	for i, s := range steps {
		if s.Seq != int64(i+1) {
			t.Errorf("step %d has seq %d", i, s.Seq)
		}
		if i < 50 && (s.State != model.StepDone || s.Exit == nil || len(s.Output) != 1 || string(s.Output[0].Data) != fmt.Sprint(s.Exit.Code)) {
			t.Errorf("step %d = %+v, want done with its output and exit", i, s)
		}
	}
	if last := steps[50]; last.State != model.StepRunning || last.Request != "long" {
		t.Errorf("long step = %+v, want running", last)
	}
	long.Exit = &model.Exit{Code: 7}
	e.finishStep(sb, long, model.StepDone, "")
	e.flushSteps(ctx)
	steps, _ = st.ListSteps(ctx, sb, 50, 100, "")
	if len(steps) != 1 || steps[0].State != model.StepDone || steps[0].Exit == nil || steps[0].Exit.Code != 7 {
		t.Errorf("long step after its end = %+v, want done, exit 7", steps)
	}

	// After close: written before the call returns.
	e.steps.close()
	late := &model.TrajectoryEntry{Kind: "exec", Request: "late", State: model.StepRunning}
	e.queueStepBegin(sb, late)
	e.finishStep(sb, late, model.StepFailed, "boom")
	steps, _ = st.ListSteps(ctx, sb, 51, 100, "")
	if len(steps) != 1 || steps[0].State != model.StepFailed || steps[0].Error != "boom" {
		t.Errorf("entry after close = %+v, want failed with its error", steps)
	}
}

// TestStepWriterGathers: a command's start and end queued a moment apart are one store write,
// made after the wait; a flush does not wait for it.
func TestStepWriterGathers(t *testing.T) {
	e, st := newTestEdge(t, newFakeRuntime())
	e.steps.batchWait = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const sb = "sb-test-bbbbbbbbbbbbbbbb"
	entry := &model.TrajectoryEntry{Kind: "exec", Request: "true", State: model.StepRunning}
	e.queueStepBegin(sb, entry)
	time.Sleep(5 * time.Millisecond) // the command runs
	entry.Exit = &model.Exit{}
	e.finishStep(sb, entry, model.StepDone, "")
	e.flushSteps(ctx)
	if ctx.Err() != nil {
		t.Fatal("flush waited for the batch")
	}
	steps, err := st.ListSteps(ctx, sb, 0, 10, "")
	if err != nil || len(steps) != 1 || steps[0].State != model.StepDone {
		t.Fatalf("steps = %+v, %v; want one, done", steps, err)
	}
	e.steps.mu.Lock()
	batches := e.steps.batches
	e.steps.mu.Unlock()
	if batches != 1 {
		t.Errorf("%d store writes, want 1 (start and end together)", batches)
	}
}

// TestStepOrder: an exec's entry, still gathering when a file call returns after it, goes in
// the log before the file call's, which is appended at once.
func TestStepOrder(t *testing.T) {
	e, st := newTestEdge(t, newFakeRuntime())
	e.steps.batchWait = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const id = "sb-test-cccccccccccccccc"
	entry := &model.TrajectoryEntry{Kind: "exec", Request: "true", State: model.StepRunning}
	e.queueStepBegin(id, entry)
	entry.Exit = &model.Exit{}
	e.finishStep(id, entry, model.StepDone, "")
	e.recordFileCall(&sandbox{id: id}, "write_file", "/f", nil, time.Now())
	if ctx.Err() != nil {
		t.Fatal("the file call waited for the batch")
	}
	steps, err := st.ListSteps(ctx, id, 0, 10, "")
	if err != nil || len(steps) != 2 {
		t.Fatalf("steps = %+v, %v; want two", steps, err)
	}
	if steps[0].Kind != "exec" || steps[1].Kind != "write_file" {
		t.Errorf("log order %s, %s; want exec, write_file", steps[0].Kind, steps[1].Kind)
	}
}
