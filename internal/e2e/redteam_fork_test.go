package e2e

import (
	"context"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamFork: a fork is the cheapest way to multiply a sandbox, so it is where a tenant
// would try to outgrow its quota: one fork of many copies, and forks of forks. Each stops at the
// project's sandbox quota, all or nothing (a refused fork makes no copy), and the refusal is
// counted as a quota_refused event. A copy's TTL cannot exceed the node's maximum either.
func TestRedTeamFork(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	for _, args := range [][]string{{"project", "create", "fb"}, {"quota", "set", "fb", "--sandboxes", "4"}} {
		if out, errOut, code := p.cli("", args...); code != 0 {
			t.Fatalf("corral %v: %s %s", args, out, errOut)
		}
	}
	src := p.create(corral.CreateRequest{Project: "fb"})
	live := func() int {
		list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{Project: "fb", State: corral.StateRunning})
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	// One fork of the maximum: refused whole.
	if _, err := p.Client.Fork(ctx, src.ID, corral.ForkRequest{Count: corral.MaxForkCount, DiskOnly: true}); !corral.IsExhausted(err) {
		t.Fatalf("fork of %d copies under a quota of 4: %v, want 429", corral.MaxForkCount, err)
	}
	if n := live(); n != 1 {
		t.Fatalf("a refused fork left %d sandboxes, want 1", n)
	}
	// Forks of forks: each copy forks itself until the quota stops them.
	frontier := []string{src.ID}
	refused := 0
	for range 4 {
		var next []string
		for _, id := range frontier {
			copies, err := p.Client.Fork(ctx, id, corral.ForkRequest{Count: 1, DiskOnly: true})
			if corral.IsExhausted(err) {
				refused++
				continue
			}
			if err != nil {
				t.Fatalf("fork of %s: %v", id, err)
			}
			next = append(next, id, copies[0].ID)
		}
		if len(next) > 0 {
			frontier = next
		}
	}
	if n := live(); n != 4 || refused == 0 {
		t.Fatalf("forks of forks under a quota of 4: %d running, %d refused; want exactly 4 and refusals", n, refused)
	}
	// Counted: quota_refused events name the project.
	st, err := p.Client.Events(ctx, corral.EventQuery{Project: "fb", Types: []string{corral.EventQuotaRefused}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs := 0
	for {
		if _, err := st.Next(); err != nil {
			break
		}
		evs++
	}
	if evs < 1+refused {
		t.Fatalf("%d quota_refused events, want at least %d", evs, 1+refused)
	}
	// A copy cannot outlive the node's maximum TTL.
	if _, err := p.Client.Fork(ctx, src.ID, corral.ForkRequest{DiskOnly: true, TTL: "100000h"}); !corral.IsInvalid(err) {
		t.Fatalf("fork with a TTL of 100000h: %v, want 400", err)
	}
}
