package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestFaultCreateInterrupted: corral up is killed with SIGKILL while creates with idempotency
// keys are in flight (no retries in the client, so each sees the cut). After the restart, each
// key, sent again with the same request, finds what its create became: a running sandbox (it
// finished before the kill; the same ID the first answer gave, if any) or one rolled back
// (failed, "corral stopped while the sandbox was being created", nothing of it left on the
// host), or nothing (the kill came before the admission), in which case the retry creates it. No
// sandbox runs that no key finds.
func TestFaultCreateInterrupted(t *testing.T) {
	const n = 8
	p := withBase(t)
	raw := corral.New(p.URL, p.Token, corral.WithRetries(0))
	ctx := context.Background()
	req := func(i int) corral.CreateRequest {
		return corral.CreateRequest{Base: "base:test", Limits: corral.Limits{CPUs: 0.1, MemoryBytes: 64 << 20},
			IdempotencyKey: fmt.Sprintf("interrupted-%d", i)}
	}
	first := make([]*corral.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first[i], errs[i] = raw.CreateSandbox(ctx, req(i))
		}()
	}
	// Kill once a create is under way (a record in state creating), or after 10 s.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		list, err := raw.ListSandboxes(ctx, corral.ListOptions{})
		creating := false
		for _, sb := range list {
			creating = creating || sb.State == corral.StateCreating
		}
		if err == nil && creating {
			break
		}
	}
	p.Kill9()
	wg.Wait()
	p.Restart()

	acked, cut := 0, 0
	found := map[string]bool{}
	for i := range n {
		if errs[i] == nil {
			acked++
		} else {
			cut++
		}
		again, err := p.Client.CreateSandbox(ctx, req(i))
		if err != nil {
			t.Errorf("key %d sent again after the restart: %v", i, err)
			continue
		}
		found[again.ID] = true
		if errs[i] == nil && again.ID != first[i].ID {
			t.Errorf("key %d: the first create answered %s, the retry %s", i, first[i].ID, again.ID)
		}
		switch again.State {
		case corral.StateRunning:
			p.sh(again.ID, "true")
		case corral.StateFailed:
			if errs[i] == nil {
				t.Errorf("key %d: acknowledged as %s, now failed: %s", i, first[i].ID, again.Reason)
			}
			t.Logf("key %d: rolled back: %s", i, again.Reason)
		default:
			t.Errorf("key %d: sandbox %s is %s", i, again.ID, again.State)
		}
	}
	list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.State == corral.StateRunning && !found[sb.ID] {
			t.Errorf("sandbox %s runs but no idempotency key finds it", sb.ID)
		}
	}
	t.Logf("%d creates in flight at the kill: %d answered before it, %d cut", n, acked, cut)
	for _, sb := range list {
		if sb.State == corral.StateRunning {
			if _, err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Error(err)
			}
		}
	}
	p.Stop()
	assertNoLeftovers(t, p)
}
