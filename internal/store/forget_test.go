package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/model"
)

// TestForgetEnded: records of sandboxes of every node that ended before the cutoff go, with
// their trajectories; live ones, recently ended ones and a record made live again stay; a record
// that ended before the ended_ns column existed is found through its document.
func TestForgetEnded(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		now := time.Now().UTC()
		put := func(id, node, state string, ended time.Time) {
			t.Helper()
			sb := &Sandbox{Sandbox: model.Sandbox{ID: id, Node: node, State: state, CreatedAt: now.Add(-72 * time.Hour),
				ExpiresAt: now.Add(time.Hour), EndedAt: ended}}
			if err := s.PutSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
			if _, err := s.BeginStep(ctx, id, &model.TrajectoryEntry{Kind: "exec", State: model.StepDone}); err != nil {
				t.Fatal(err)
			}
		}
		put("sb-n1-old", "n1", model.StateStopped, now.Add(-48*time.Hour))
		put("sb-lost-old", "lost", model.StateFailed, now.Add(-30*time.Hour)) // a node that never came back
		put("sb-n1-recent", "n1", model.StateStopped, now.Add(-time.Hour))
		put("sb-n2-live", "n2", model.StateRunning, time.Time{})
		put("sb-n2-premigration", "n2", model.StateFailed, now.Add(-50*time.Hour))
		if _, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET ended_ns = 0 WHERE id = 'sb-n2-premigration'`); err != nil {
			t.Fatal(err)
		}
		n, err := s.ForgetEnded(ctx, now.Add(-24*time.Hour))
		if err != nil || n != 3 {
			t.Fatalf("ForgetEnded = %d, %v; want 3", n, err)
		}
		list, err := s.ListSandboxes(ctx, SandboxFilter{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range list {
			ids = append(ids, sb.ID)
		}
		if len(ids) != 2 || !slices.Contains(ids, "sb-n1-recent") || !slices.Contains(ids, "sb-n2-live") {
			t.Errorf("left %v, want sb-n1-recent and sb-n2-live", ids)
		}
		for _, id := range []string{"sb-n1-old", "sb-lost-old", "sb-n2-premigration"} {
			if steps, err := s.ListSteps(ctx, id, 0, 10, ""); err != nil || len(steps) != 0 {
				t.Errorf("trajectory of %s after it was forgotten: %d steps, %v", id, len(steps), err)
			}
		}
		if steps, err := s.ListSteps(ctx, "sb-n1-recent", 0, 10, ""); err != nil || len(steps) != 1 {
			t.Errorf("trajectory of a kept record: %d steps, %v", len(steps), err)
		}
		if n, err := s.ForgetEnded(ctx, now.Add(-24*time.Hour)); err != nil || n != 0 {
			t.Errorf("again: %d, %v", n, err)
		}
	})
}
