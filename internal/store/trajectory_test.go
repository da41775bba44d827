package store

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/model"
)

// TestTrajectoryBound: past its bound a sandbox's trajectory drops the outputs of its oldest
// finished steps (marked), keeps every step and step ID, never drops a running step's output,
// and its stored size is charged to its project's disk usage while it is live, and no longer
// once it is not.
func TestTrajectoryBound(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		s.SetTrajectoryLimit(64 << 10)
		p := mustProject(t, s, "traj")
		sb := newRecord(p.ID, 0.5)
		sb.Limits.DiskBytes = 1 << 20
		if err := s.AdmitSandbox(ctx, sb, nil); err != nil {
			t.Fatal(err)
		}
		diskUsage := func() int64 {
			q, err := s.GetQuota(ctx, "traj")
			if err != nil {
				t.Fatal(err)
			}
			return q.Usage.DiskBytes
		}
		out := strings.Repeat("x", 10<<10)
		running := &model.TrajectoryEntry{StepID: "long", Kind: "exec", State: model.StepRunning,
			Output: []model.Event{{Type: "stdout", Data: []byte(out)}}}
		if _, err := s.BeginStep(ctx, sb.ID, running); err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			e := &model.TrajectoryEntry{StepID: "s" + string(rune('a'+i)), Kind: "exec", State: model.StepDone,
				Output: []model.Event{{Type: "stdout", Data: []byte(out)}}, Exit: &model.Exit{Code: i}}
			if _, err := s.BeginStep(ctx, sb.ID, e); err != nil {
				t.Fatal(err)
			}
		}
		steps, err := s.ListSteps(ctx, sb.ID, 0, 100, "")
		if err != nil || len(steps) != 21 {
			t.Fatalf("steps = %d, %v; want all 21 kept", len(steps), err)
		}
		var total, dropped int64
		for i, st := range steps {
			total += int64(len(mustJSON(t, &st)))
			if st.OutputDropped {
				dropped++
				if len(st.Output) != 0 || st.Exit == nil || st.StepID == "" {
					t.Errorf("dropped step %d: %+v; want no output, its exit and step ID kept", st.Seq, st)
				}
				if i > 0 && !steps[i-1].OutputDropped && steps[i-1].State != model.StepRunning {
					t.Errorf("step %d dropped before the older step %d", st.Seq, steps[i-1].Seq)
				}
			}
		}
		if steps[0].OutputDropped || len(steps[0].Output) == 0 {
			t.Errorf("the running step's output was dropped")
		}
		if dropped == 0 || total > 64<<10+4<<10 {
			t.Fatalf("%d steps dropped, %d bytes stored; want the trajectory near its 64 KiB bound", dropped, total)
		}
		if steps[20].OutputDropped {
			t.Errorf("the newest step's output was dropped")
		}
		if got := diskUsage(); got <= 1<<20 || got > 1<<20+64<<10+4<<10 {
			t.Errorf("project disk usage = %d; want the disk limit plus the stored trajectory", got)
		}
		sb.State = model.StateStopped
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if got := diskUsage(); got != 0 {
			t.Errorf("project disk usage after the sandbox stopped = %d, want 0", got)
		}
		if err := s.RecountUsage(ctx); err != nil || diskUsage() != 0 {
			t.Errorf("after a recount: usage %d, err %v", diskUsage(), err)
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
