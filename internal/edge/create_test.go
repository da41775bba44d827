package edge

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// TestCreateFailsAtTheLastStep injects a failure at the last step of a create: the runtime has
// made the sandbox and it is live, and the write of its running record fails (its caller went
// away: the runtime's Create cancels the context, so that write is the first to see it). Every
// resource an earlier step took is given back: the runtime's sandbox, the live entry, the layer
// references; the record ends failed with the cause, and the idempotency key is released, so a
// retry makes a new sandbox.
func TestCreateFailsAtTheLastStep(t *testing.T) {
	rt := newFakeRuntime()
	e, st := newTestEdge(t, rt)
	ctx := context.Background()
	req := model.CreateRequest{Base: "base:1", Workspace: "ws:1", Toolkits: []string{"tk:1"}}
	key := &store.Idempotency{Principal: "root", Key: "late", RequestHash: "h"}

	cctx, cancel := context.WithCancel(ctx)
	rt.beforeCreate = func() {
		cancel()
		// Nothing before the runtime step failed: the create got this far.
		if n := e.layers.(*fakeLayers).ref("sha256:t"); n != 1 {
			t.Errorf("the top layer has %d references when the runtime creates; want 1", n)
		}
	}
	_, _, err := e.CreateOnce(cctx, req, key)
	rt.beforeCreate = nil
	if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "create sandbox sb-") {
		t.Fatalf("CreateOnce = %v; want create sandbox ID: context canceled", err)
	}
	recs, err := st.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].State != model.StateFailed || !strings.Contains(recs[0].Reason, "context canceled") || recs[0].EndedAt.IsZero() {
		t.Fatalf("records = %+v; want one failed with the cause", recs)
	}
	made := recs[0].ID
	if ids, _ := rt.List(ctx); len(ids) != 0 {
		t.Errorf("the runtime still has %v", ids)
	}
	if e.lookup(made) != nil || e.Count() != 0 {
		t.Errorf("the failed sandbox is still live (%d live)", e.Count())
	}
	for _, d := range []string{"sha256:b", "sha256:w", "sha256:t"} {
		if n := e.layers.(*fakeLayers).ref(d); n != 0 {
			t.Errorf("layer %s has %d references after the failed create; want 0", d, n)
		}
	}
	// The key was released: the retry creates anew instead of finding the failure.
	sb, replayed, err := e.CreateOnce(ctx, req, key)
	if err != nil || replayed || sb.ID == made || sb.State != model.StateRunning {
		t.Fatalf("retry = %+v, replayed %v, %v; want a new running sandbox", sb, replayed, err)
	}
}

// TestWarmFillFailureGivesBack: a warm pool's fill that fails at its last step (the runtime's
// create) gives back the layers it mounted and is no longer counted as filling (layer GC); one
// that succeeds holds them until the pooled sandbox is deleted.
func TestWarmFillFailureGivesBack(t *testing.T) {
	rt := newFakeRuntime()
	e, st := newTestEdge(t, rt)
	ctx := context.Background()
	env, err := st.PutEnvironment(ctx, model.Environment{Name: "env", Base: "base:1", Workspace: "ws:1", CreatedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	p := &warmPool{key: warmKey{env: env.Name, runtime: RuntimeRunc}, env: env}
	ls := e.layers.(*fakeLayers)
	refs := func() []int { return []int{ls.ref("sha256:b"), ls.ref("sha256:w")} }

	rt.failing = errors.New("runc exploded")
	if _, err := e.fillWarm(ctx, p); err == nil || !strings.Contains(err.Error(), "runc exploded") {
		t.Fatalf("fill with a failing runtime: %v", err)
	}
	if got := refs(); !slices.Equal(got, []int{0, 0}) {
		t.Errorf("after a failed fill the layers have %v references; want none", got)
	}
	if len(p.filling) != 0 || len(p.ready) != 0 || e.withPooled(store.Resources{}).Sandboxes != 0 {
		t.Errorf("after a failed fill: filling %d, ready %d, pooled %+v", len(p.filling), len(p.ready), e.withPooled(store.Resources{}))
	}

	rt.failing = nil
	if _, err := e.fillWarm(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := refs(); !slices.Equal(got, []int{1, 1}) || len(p.ready) != 1 {
		t.Fatalf("after a fill: references %v, ready %d; want 1 each, 1 ready", got, len(p.ready))
	}
	e.drainWarm(p)
	if got := refs(); !slices.Equal(got, []int{0, 0}) {
		t.Errorf("after the pool drained the layers have %v references; want none", got)
	}
	if ids, _ := rt.List(ctx); len(ids) != 0 {
		t.Errorf("the runtime still has %v", ids)
	}
}
