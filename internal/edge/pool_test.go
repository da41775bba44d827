package edge

import (
	"errors"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
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
			p := &warmPool{env: model.Environment{Warm: 16}, since: now.Add(-tc.age)}
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

// TestWarmQuietLeft: a pool's fill waits for warmQuiet after the node's last create, and while
// one is in flight, unless the pool is under a quarter of its target.
func TestWarmQuietLeft(t *testing.T) {
	now := time.Unix(1_000_000_000, 0)
	for _, tc := range []struct {
		name       string
		ago        time.Duration // since the last create ended
		inFlight   bool
		have, want int
		wait       time.Duration
	}{
		{"just after a claim", time.Millisecond, false, 7, 8, warmQuiet - time.Millisecond},
		{"quiet long enough", warmQuiet, false, 7, 8, 0},
		{"long ago", time.Hour, false, 0, 1, 0},
		{"a create in flight", time.Hour, true, 7, 8, warmQuiet},
		{"a small pool emptied", time.Millisecond, true, 0, 2, warmQuiet},
		{"under a quarter", time.Millisecond, true, 15, 64, 0},
		{"at a quarter", time.Millisecond, false, 16, 64, warmQuiet - time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := warmQuietLeft(now, now.Add(-tc.ago), tc.inFlight, tc.have, tc.want)
			if max(got, 0) != tc.wait {
				t.Errorf("wait %s, want %s", got, tc.wait)
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

// TestEnvironmentTier: an environment's tier is container (recorded as none) or microvm, whose
// runtime is QEMU's (none recorded); its pool is of runtime qemu, and only where the node offers
// microvms (a create naming only the environment takes its tier: catalog.TestResolve).
func TestEnvironmentTier(t *testing.T) {
	e, _ := newTestEdge(t, newFakeRuntime())
	for _, tc := range []struct {
		tier, runtime string
		wantTier      string
		bad           string // the invalid field; "" for accepted
	}{
		{"", "", "", ""},
		{"container", "gvisor", "", ""},
		{"microvm", "", "microvm", ""},
		{"microvm", "qemu", "microvm", ""},
		{"microvm", "runc", "", "runtime"},
		{"vm", "", "", "tier"},
		{"fncall", "", "", "tier"},
	} {
		env := model.Environment{Name: "x", Base: "base:1", Tier: tc.tier, Runtime: tc.runtime}
		err := catalog.CheckEnvironmentDefaults(&env, e.environmentNetwork)
		if tc.bad != "" {
			if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != tc.bad {
				t.Errorf("tier %q runtime %q: %v, want invalid %s", tc.tier, tc.runtime, err, tc.bad)
			}
			continue
		}
		if err != nil || env.Tier != tc.wantTier || (tc.tier == "microvm" && env.Runtime != "") {
			t.Errorf("tier %q runtime %q: %+v, %v", tc.tier, tc.runtime, env, err)
		}
	}
	// The fake runtime offers runc only: no microvm pool here.
	if _, ok := e.warmKeyOf(model.Environment{Name: "vm", Tier: TierMicroVM, Warm: 1}); ok {
		t.Errorf("a microvm pool on a node without QEMU")
	}
	if k, ok := e.warmKeyOf(model.Environment{Name: "c", Warm: 1}); !ok || k.runtime != RuntimeRunc || k.tier() != TierContainer {
		t.Errorf("container pool key = %+v, %v", k, ok)
	}
	if k := (warmKey{runtime: RuntimeQEMU}); k.tier() != TierMicroVM {
		t.Errorf("a qemu pool's tier = %s", k.tier())
	}
}
