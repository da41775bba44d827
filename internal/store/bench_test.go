package store

import (
	"context"
	"testing"

	"github.com/corral-dev/corral/internal/model"
)

// BenchmarkStep measures appending and completing one trajectory step (two writes), the cost
// every exec pays for the log.
func BenchmarkStep(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, b.TempDir()+"/corral.db")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for b.Loop() {
		e := &model.TrajectoryEntry{Kind: "exec", State: model.StepRunning, Request: map[string]any{"argv": []string{"true"}}}
		if _, err := s.BeginStep(ctx, "sb-x", e); err != nil {
			b.Fatal(err)
		}
		e.State = model.StepDone
		if err := s.UpdateStep(ctx, "sb-x", e); err != nil {
			b.Fatal(err)
		}
	}
}
