package edge

import (
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestWarmTarget: a pool aims at its full size while new, then at the busiest recent minute's
// claims (at least 1), and at 0 after warmIdle without a claim.
func TestWarmTarget(t *testing.T) {
	now := time.Unix(1_000_000_000, 0)
	for _, tc := range []struct {
		name   string
		age    time.Duration   // since the pool was made
		claims []time.Duration // ago
		want   int
	}{
		{"new pool", time.Minute, nil, 16},
		{"new pool with claims", time.Minute, []time.Duration{time.Second}, 16},
		{"idle pool", 2 * warmIdle, nil, 0},
		{"last claim long ago", 2 * warmIdle, []time.Duration{warmIdle + time.Minute}, 0},
		{"one recent claim", 2 * warmIdle, []time.Duration{time.Minute}, 1},
		{"busy minute", 2 * warmIdle, []time.Duration{5 * time.Minute, 5 * time.Minute, 5 * time.Minute, time.Second}, 3},
		{"more than N", 2 * warmIdle, func() []time.Duration {
			var d []time.Duration
			for range 40 {
				d = append(d, time.Second)
			}
			return d
		}(), 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &warmPool{env: corral.Environment{Warm: 16}, since: now.Add(-tc.age)}
			for _, ago := range tc.claims {
				p.claimedLocked(now.Add(-ago))
			}
			if got := p.targetLocked(now); got != tc.want {
				t.Errorf("target = %d, want %d", got, tc.want)
			}
			if got := p.claims.Load(); got != int64(len(tc.claims)) {
				t.Errorf("claims = %d, want %d", got, len(tc.claims))
			}
		})
	}
}

// TestWarmUsesDigest: layer GC sees a blob in use while a pooled sandbox has it, whether it is
// being started, ready or stale, and free once none has it.
func TestWarmUsesDigest(t *testing.T) {
	w := newWarmState()
	p := &warmPool{}
	w.pools[warmKey{env: "e"}] = p
	sb := func(lower ...string) *store.Sandbox { return &store.Sandbox{Lower: lower} }
	p.filling = []*store.Sandbox{sb("sha256:a")}
	p.ready = []*warmSandbox{{rec: sb("sha256:b", "sha256:c")}}
	p.stale = []*warmSandbox{{rec: sb("sha256:d")}}
	for d, want := range map[string]bool{"sha256:a": true, "sha256:b": true, "sha256:c": true, "sha256:d": true, "sha256:e": false} {
		if got := w.usesDigest(d); got != want {
			t.Errorf("usesDigest(%s) = %v, want %v", d, got, want)
		}
	}
	p.filling, p.ready, p.stale = nil, nil, nil
	if w.usesDigest("sha256:a") {
		t.Error("an emptied pool still holds sha256:a")
	}
}
