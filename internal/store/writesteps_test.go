package store

import (
	"context"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestWriteSteps: appends and rewrites in one transaction, in order; one that fails leaves
// nothing of the batch.
func TestWriteSteps(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		const sb = "sb-n1-steps"
		a := &corral.TrajectoryEntry{Kind: "exec", State: corral.StepRunning}
		b := &corral.TrajectoryEntry{Kind: "exec", State: corral.StepDone}
		if err := s.WriteSteps(ctx, []StepWrite{{Sandbox: sb, Entry: a}, {Sandbox: sb, Entry: b}}); err != nil {
			t.Fatal(err)
		}
		if a.Seq != 1 || b.Seq != 2 {
			t.Fatalf("seqs %d, %d; want 1, 2", a.Seq, b.Seq)
		}
		a.State = corral.StepDone
		c := &corral.TrajectoryEntry{Kind: "exec", State: corral.StepRunning}
		if err := s.WriteSteps(ctx, []StepWrite{{Sandbox: sb, Entry: a, Update: true}, {Sandbox: sb, Entry: c}}); err != nil {
			t.Fatal(err)
		}
		// The second write rewrites a step that does not exist: the first is undone with it.
		d := &corral.TrajectoryEntry{Kind: "exec", State: corral.StepRunning}
		if err := s.WriteSteps(ctx, []StepWrite{{Sandbox: sb, Entry: d}, {Sandbox: sb, Entry: &corral.TrajectoryEntry{Seq: 99, State: corral.StepDone}, Update: true}}); err == nil {
			t.Error("a batch rewriting a missing step succeeded")
		}
		steps, err := s.ListSteps(ctx, sb, 0, 100, "")
		if err != nil || len(steps) != 3 {
			t.Fatalf("steps %+v, %v; want 3", steps, err)
		}
		for i, want := range []string{corral.StepDone, corral.StepDone, corral.StepRunning} {
			if steps[i].Seq != int64(i+1) || steps[i].State != want {
				t.Errorf("step %d = seq %d %s, want seq %d %s", i, steps[i].Seq, steps[i].State, i+1, want)
			}
		}
	})
}
