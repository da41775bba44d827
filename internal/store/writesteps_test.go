package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/model"
)

// TestWriteSteps: appends and rewrites in one transaction, in order; one that fails leaves
// nothing of the batch.
func TestWriteSteps(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		const sb = "sb-n1-steps"
		a := &model.TrajectoryEntry{Kind: "exec", State: model.StepRunning}
		b := &model.TrajectoryEntry{Kind: "exec", State: model.StepDone}
		if err := s.WriteSteps(ctx, []StepWrite{{Sandbox: sb, Entry: a}, {Sandbox: sb, Entry: b}}); err != nil {
			t.Fatal(err)
		}
		if a.Seq != 1 || b.Seq != 2 {
			t.Fatalf("seqs %d, %d; want 1, 2", a.Seq, b.Seq)
		}
		a.State = model.StepDone
		c := &model.TrajectoryEntry{Kind: "exec", State: model.StepRunning}
		if err := s.WriteSteps(ctx, []StepWrite{{Sandbox: sb, Entry: a, Update: true}, {Sandbox: sb, Entry: c}}); err != nil {
			t.Fatal(err)
		}
		// The second write rewrites a step that does not exist: the first is undone with it.
		d := &model.TrajectoryEntry{Kind: "exec", State: model.StepRunning}
		if err := s.WriteSteps(ctx, []StepWrite{{Sandbox: sb, Entry: d}, {Sandbox: sb, Entry: &model.TrajectoryEntry{Seq: 99, State: model.StepDone}, Update: true}}); err == nil {
			t.Error("a batch rewriting a missing step succeeded")
		}
		steps, err := s.ListSteps(ctx, sb, 0, 100, "")
		if err != nil || len(steps) != 3 {
			t.Fatalf("steps %+v, %v; want 3", steps, err)
		}
		for i, want := range []string{model.StepDone, model.StepDone, model.StepRunning} {
			if steps[i].Seq != int64(i+1) || steps[i].State != want {
				t.Errorf("step %d = seq %d %s, want seq %d %s", i, steps[i].Seq, steps[i].State, i+1, want)
			}
		}
	})
}

// TestNodeSteps: a node's trajectory writes are applied in order, all or none, only while its
// incarnation holds the node; an append whose step ID a step has already writes nothing and
// names that step.
func TestNodeSteps(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		if _, err := s.Register(ctx, Node{Name: "n1", URL: "https://127.0.0.1:1"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		const sb = "sb-n1-nodesteps"
		a := &model.TrajectoryEntry{Kind: "exec", StepID: "s1", State: model.StepRunning}
		b := &model.TrajectoryEntry{Kind: "exec", State: model.StepDone}
		res, err := s.NodeSteps(ctx, "n1", 1, []StepWrite{{Sandbox: sb, Entry: a}, {Sandbox: sb, Entry: b}})
		if err != nil || len(res) != 2 || res[0].Seq != 1 || res[1].Seq != 2 || res[0].Existing != nil {
			t.Fatalf("first writes: %+v, %v", res, err)
		}
		// The same step ID again: the step it names, nothing written; a rewrite beside it is.
		again := &model.TrajectoryEntry{Kind: "exec", StepID: "s1", State: model.StepRunning}
		a.State = model.StepDone
		res, err = s.NodeSteps(ctx, "n1", 1, []StepWrite{{Sandbox: sb, Entry: again}, {Sandbox: sb, Entry: a, Update: true}})
		if err != nil || res[0].Existing == nil || res[0].Existing.Seq != 1 || res[0].Seq != 0 || res[1].Seq != 1 {
			t.Fatalf("a step ID recorded already: %+v, %v", res, err)
		}
		// A fenced incarnation writes nothing.
		if _, err := s.Register(ctx, Node{Name: "n1", URL: "https://127.0.0.1:1"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := s.NodeSteps(ctx, "n1", 1, []StepWrite{{Sandbox: sb, Entry: &model.TrajectoryEntry{Kind: "exec"}}}); !errors.Is(err, ErrFenced) {
			t.Errorf("steps of a fenced incarnation: %v, want ErrFenced", err)
		}
		// One write that fails undoes the batch.
		if _, err := s.NodeSteps(ctx, "n1", 2, []StepWrite{{Sandbox: sb, Entry: &model.TrajectoryEntry{Kind: "exec"}},
			{Sandbox: sb, Entry: &model.TrajectoryEntry{Seq: 99}, Update: true}}); err == nil {
			t.Error("a batch rewriting a missing step succeeded")
		}
		steps, err := s.ListSteps(ctx, sb, 0, 100, "")
		if err != nil || len(steps) != 2 || steps[0].State != model.StepDone || steps[0].StepID != "s1" {
			t.Fatalf("steps %+v, %v; want the two first written, the first done", steps, err)
		}
	})
}
