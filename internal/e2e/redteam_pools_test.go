package e2e

import (
	"context"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamWarmPool: sandboxes claimed from one warm pool share no writable state. What one
// claimed sandbox writes (its root, /tmp, /dev/shm), starts (a process) or is (its id,
// hostname, network address) is not seen by another claimed beside it, nor by one claimed from
// the pool after it was deleted; and nothing of a pooled sandbox shows up in the API before it
// is claimed.
func TestRedTeamWarmPool(t *testing.T) {
	needRoot(t)
	p := withBase(t)
	ctx := context.Background()
	forRuntimes(t, func(t *testing.T, rt string) {
		if rt == "microvm" {
			t.Skip("warm pools are for the container tier (runc and gVisor)")
		}
		sub := *p
		sub.t = t
		p := &sub
		name := "rt-warm-" + rt
		if _, err := p.Client.SaveEnvironment(ctx, corral.Environment{Name: name, Base: "base:test", Runtime: rt, Network: &corral.NetworkPolicy{Mode: corral.NetworkAllowlist}, Warm: 2}); err != nil {
			t.Fatal(err)
		}
		defer p.Client.DeleteEnvironment(ctx, name)
		p.warmEnv(name, "the pool to fill", func(e *corral.Environment) bool { return e.WarmReady == 2 })
		claim := func() *corral.Sandbox {
			before, _ := p.Client.Environment(ctx, name)
			sb := p.create(corral.CreateRequest{Environment: name, Network: &corral.NetworkPolicy{Mode: corral.NetworkAllowlist}})
			after, _ := p.Client.Environment(ctx, name)
			if before == nil || after == nil || after.WarmHits != before.WarmHits+1 {
				t.Fatalf("create of %s was not a claim from the pool (hits %+v -> %+v)", sb.ID, before, after)
			}
			return sb
		}
		a := claim()
		p.warmEnv(name, "the pool to refill", func(e *corral.Environment) bool { return e.WarmReady == 2 })
		b := claim()
		plant := `echo secret-a > /root/mark; echo secret-a > /tmp/mark; echo secret-a > /dev/shm/mark; (sleep 600 &) ; echo ok`
		if out := p.sh(a.ID, plant); strings.TrimSpace(out) != "ok" {
			t.Fatalf("plant: %q", out)
		}
		look := `cat /root/mark /tmp/mark /dev/shm/mark 2>/dev/null; ps 2>/dev/null | grep -c "[s]leep 600"; hostname; true`
		seen := func(sb *corral.Sandbox) {
			t.Helper()
			out := p.sh(sb.ID, look)
			if strings.Contains(out, "secret-a") || strings.Contains(out, a.ID) {
				t.Errorf("sandbox %s sees what %s wrote or ran:\n%s", sb.ID, a.ID, out)
			}
			if lines := strings.Fields(out); len(lines) < 2 || lines[0] != "0" || lines[len(lines)-1] != sb.ID {
				t.Errorf("sandbox %s: processes/hostname = %q, want 0 and its own id", sb.ID, out)
			}
		}
		seen(b)
		if a.ID == b.ID || a.NetworkAddress == b.NetworkAddress || a.NetworkAddress == "" {
			t.Errorf("two claimed sandboxes share an id or address: %s %s, %s %s", a.ID, a.NetworkAddress, b.ID, b.NetworkAddress)
		}
		// Deleted, its pieces are not handed to the next claim.
		if _, err := p.Client.DeleteSandbox(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		p.warmEnv(name, "the pool to refill", func(e *corral.Environment) bool { return e.WarmReady == 2 })
		for range 2 {
			c := claim()
			if c.ID == a.ID || c.ID == b.ID {
				t.Errorf("a claim reused the id %s", c.ID)
			}
			seen(c)
			p.Client.DeleteSandbox(ctx, c.ID)
		}
		// Pooled sandboxes are invisible: GET of an id the API never returned is not found.
		list, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{})
		for _, s := range list {
			if s.State == corral.StateRunning && s.ID != b.ID {
				t.Errorf("listed running sandbox %s that the test did not claim", s.ID)
			}
		}
		p.Client.DeleteSandbox(ctx, b.ID)
	})
}
