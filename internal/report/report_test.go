package report

import (
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
)

func TestPercentile(t *testing.T) {
	for _, c := range []struct {
		v    []float64
		p    float64
		want float64
	}{
		{nil, 50, 0},
		{[]float64{3}, 99, 3},
		{[]float64{5, 1, 4, 2, 3}, 50, 3},
		{[]float64{5, 1, 4, 2, 3}, 99, 5},
		{[]float64{1, 2, 3, 4}, 50, 2},
	} {
		if got := Percentile(c.v, c.p); got != c.want {
			t.Errorf("Percentile(%v, %g) = %g, want %g", c.v, c.p, got, c.want)
		}
	}
}

func TestCompute(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rows := []store.Usage{
		{ID: "a", Tier: "container", Environment: "py", CreatedAt: t0, FirstExecAt: t0.Add(time.Second), EndedAt: t0.Add(time.Minute),
			Reason: corral.ReasonDeleted, Actions: 500, Blocked: 1, Tokens: 1000},
		{ID: "b", Tier: "container", Environment: "py", CreatedAt: t0, FirstExecAt: t0.Add(3 * time.Second), EndedAt: t0.Add(2 * time.Minute),
			Reason: corral.ReasonTTLExpired, TTLExtended: true, Actions: 500, Blocked: 3, Tokens: 3000},
		{ID: "c", Tier: "microvm", CreatedAt: t0, FirstExecAt: t0.Add(2 * time.Second)},
		{ID: "d", Tier: "container", CreatedAt: t0},
	}
	r := Compute(rows, t0, t0.Add(time.Hour))
	if r.Sandboxes != 4 || len(r.Setup) != 2 {
		t.Fatalf("report = %+v", r)
	}
	if s := r.Setup[0]; s.Tier != "container" || s.Environment != "py" || s.Count != 2 || s.P50Seconds != 1 || s.P99Seconds != 3 {
		t.Errorf("setup of container/py = %+v", s)
	}
	if s := r.Setup[1]; s.Tier != "microvm" || s.Count != 1 || s.P50Seconds != 2 {
		t.Errorf("setup of microvm = %+v", s)
	}
	if r.Task.Count != 2 || r.Task.P50Seconds != 60 || r.Task.P99Seconds != 120 || r.Task.Tokens != 4000 || r.Task.TokensPerTask != 2000 {
		t.Errorf("task = %+v", r.Task)
	}
	if r.Actions != 1000 || r.BlockedEgress != 4 || r.BlockedPer1000Actions != 4 {
		t.Errorf("egress: %d blocked in %d actions, %g per 1000", r.BlockedEgress, r.Actions, r.BlockedPer1000Actions)
	}
	if r.TTLExtended != 1 || r.TTLKilled != 1 || r.TTLExtendedShare != 0.25 || r.TTLKilledShare != 0.25 {
		t.Errorf("TTL: %+v", r)
	}
	if empty := Compute(nil, t0, t0); empty.Sandboxes != 0 || empty.Setup == nil || empty.BlockedPer1000Actions != 0 {
		t.Errorf("empty report = %+v", empty)
	}
}
