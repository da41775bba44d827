package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/lazy"
	"github.com/corral-dev/corral/internal/limits"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/store"
)

// fakeRuntime is an in-memory Runtime for tests of the edge's own logic (validation, lifecycle,
// reaper, reconcile). The real runtime is tested in internal/runtime/runc and end to end.
type fakeRuntime struct {
	mu      sync.Mutex
	running map[string]bool
	oom     map[string]uint64
	failing error
	// deleteFails, when set, is what Delete fails with, leaving the state in place (a teardown
	// cut short).
	deleteFails error
	// deleteGate, when set, holds every Delete until it is closed (a cleanup still running).
	deleteGate chan struct{}
	// killed records the sandboxes Kill ended.
	killed map[string]bool
	// agent, when set, is the socket of a real agent every sandbox gets (files_test.go).
	agent string
	// beforeCreate, when set, runs at the start of Create (without the lock).
	beforeCreate func()
}

func (f *fakeRuntime) agentSocket(id string) string {
	if f.agent != "" {
		return f.agent
	}
	return "/nonexistent/" + id
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{running: map[string]bool{}, oom: map[string]uint64{}, killed: map[string]bool{}}
}

func (f *fakeRuntime) Create(ctx context.Context, spec runtime.Spec) (*runtime.Sandbox, error) {
	if f.beforeCreate != nil {
		f.beforeCreate()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failing != nil {
		return nil, f.failing
	}
	f.running[spec.ID] = true
	return &runtime.Sandbox{ID: spec.ID, AgentSocket: f.agentSocket(spec.ID)}, nil
}

func (f *fakeRuntime) Open(ctx context.Context, id string) (*runtime.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.running[id]; !ok {
		return nil, errdefs.NotFound("sandbox %s", id)
	}
	return &runtime.Sandbox{ID: id, AgentSocket: f.agentSocket(id)}, nil
}

func (f *fakeRuntime) Status(ctx context.Context, id string) (runtime.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	run, ok := f.running[id]
	if !ok {
		return runtime.Status{}, errdefs.NotFound("sandbox %s", id)
	}
	st := runtime.Status{State: runtime.StateStopped, OOMKills: f.oom[id]}
	if run {
		st.State = runtime.StateRunning
	}
	return st, nil
}

func (f *fakeRuntime) Delete(ctx context.Context, id string) error {
	f.mu.Lock()
	gate := f.deleteGate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deleteFails != nil {
		return f.deleteFails
	}
	delete(f.running, id)
	return nil
}

func (f *fakeRuntime) List(ctx context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.running {
		ids = append(ids, id)
	}
	return ids, nil
}

func (f *fakeRuntime) Pause(ctx context.Context, id string) (runtime.PauseStats, error) {
	return runtime.PauseStats{}, nil
}

func (f *fakeRuntime) Resume(ctx context.Context, id string) (runtime.ResumeStats, error) {
	return runtime.ResumeStats{}, nil
}

func (f *fakeRuntime) Freeze(ctx context.Context, id string) error { return nil }
func (f *fakeRuntime) Available(name string) error {
	if name == RuntimeRunc {
		return nil
	}
	return errdefs.Unavailable("no %s in the fake runtime", name)
}
func (f *fakeRuntime) Thaw(ctx context.Context, id string) error { return nil }
func (f *fakeRuntime) Kill(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.killed[id] = true
	return nil
}
func (f *fakeRuntime) UpperDir(id string) (string, error) { return "", errdefs.NotFound("upper") }
func (f *fakeRuntime) Fork(ctx context.Context, id string, opts runtime.ForkOptions) (*runtime.ForkImage, error) {
	return nil, errdefs.Conflict("the fake runtime does not fork")
}
func (f *fakeRuntime) DropFork(img *runtime.ForkImage) {}

func (f *fakeRuntime) kill(id string, oom bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running[id] = false
	if oom {
		f.oom[id]++
	}
}

// fakeLayers counts the references sandboxes hold on each mounted layer, as internal/layers does.
type fakeLayers struct {
	mu   sync.Mutex
	refs map[string]int // mounted layers; a key with 0 is mounted but unused
}

func newFakeLayers() *fakeLayers { return &fakeLayers{refs: map[string]int{}} }

// restarted is the layer store a restarted process opens: the same mounts, no references.
func (f *fakeLayers) restarted() *fakeLayers {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := newFakeLayers()
	for d := range f.refs {
		g.refs[d] = 0
	}
	return g
}

func (f *fakeLayers) ref(digest string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refs[digest]
}

func (f *fakeLayers) Acquire(ctx context.Context, digest string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refs[digest]++
	return "/layers/" + digest, nil
}

func (f *fakeLayers) Files(ctx context.Context, digest string) (string, []string, error) {
	return "/layers/" + digest + ".erofs", nil, nil
}

func (f *fakeLayers) Release(digest string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refs[digest] == 0 {
		return fmt.Errorf("release of %s, which nobody holds", digest)
	}
	f.refs[digest]--
	return nil
}

func (f *fakeLayers) Hold(digest string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.refs[digest]; !ok {
		return false
	}
	f.refs[digest]++
	return true
}

func (f *fakeLayers) Sweep() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for d, r := range f.refs {
		if r == 0 {
			delete(f.refs, d)
			n++
		}
	}
	return n, nil
}

func (f *fakeLayers) ImportTar(ctx context.Context, r io.Reader) (layers.Blob, error) {
	return layers.Blob{}, errors.New("fakeLayers: no import")
}

func (f *fakeLayers) Remove(ctx context.Context, digest string) error { return nil }

func (f *fakeLayers) List(ctx context.Context) ([]layers.Blob, error) { return nil, nil }

func (f *fakeLayers) CollectImages(ctx context.Context) (int, int64, error) { return 0, 0, nil }

// The fake stores layers whole: nothing is fetched lazily.
func (f *fakeLayers) Prepare(ctx context.Context, digests []string, fe layers.Fetch) error {
	return nil
}

func (f *fakeLayers) Finish(ctx context.Context, sandbox string) (lazy.Stats, error) {
	return lazy.Stats{}, errdefs.ErrNotFound
}

func (f *fakeLayers) SandboxStats(ctx context.Context, sandbox string) (lazy.Stats, error) {
	return lazy.Stats{}, errdefs.ErrNotFound
}

func (f *fakeLayers) FetchMetrics(ctx context.Context) (lazy.CacheStats, []lazy.Stats, bool) {
	return lazy.CacheStats{}, nil, false
}

func (f *fakeLayers) Stats(ctx context.Context, digest string) (layers.LayerStats, error) {
	return layers.LayerStats{Digest: digest, Format: "erofs"}, nil
}

func newTestEdge(t *testing.T, rt *fakeRuntime) (*Edge, *store.Store) {
	t.Helper()
	return newTestEdgeWith(t, rt, Config{})
}

// newTestEdgeWith is newTestEdge with cfg (its agent path and reap interval are set here).
func newTestEdgeWith(t *testing.T, rt *fakeRuntime, cfg Config) (*Edge, *store.Store) {
	t.Helper()
	st := newTestStore(t)
	cfg.AgentPath, cfg.ReapInterval = "/agent", 20*time.Millisecond
	e, err := New(cfg, slog.New(slog.DiscardHandler), st, rt, newFakeLayers())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e, st
}

// newTestStore opens a store holding the layers base:1, ws:1 and tk:1.
func newTestStore(t *testing.T) *store.Store {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, l := range []model.Layer{
		{Name: "base", Version: "1", Kind: model.KindBase, Digest: "sha256:b"},
		{Name: "ws", Version: "1", Kind: model.KindWorkspace, Digest: "sha256:w"},
		{Name: "tk", Version: "1", Kind: model.KindToolkit, Digest: "sha256:t"},
	} {
		if _, _, err := st.PublishLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

func TestAdmitValidation(t *testing.T) {
	e, _ := newTestEdge(t, newFakeRuntime())
	tests := []struct {
		name  string
		req   model.CreateRequest
		field string
	}{
		{"no base", model.CreateRequest{}, "base"},
		{"unknown base", model.CreateRequest{Base: "nope:1"}, "base"},
		{"base without version", model.CreateRequest{Base: "base"}, "base"},
		{"base of wrong kind", model.CreateRequest{Base: "ws:1"}, "base"},
		{"toolkit of wrong kind", model.CreateRequest{Base: "base:1", Toolkits: []string{"ws:1"}}, "toolkits[0]"},
		{"unknown tier", model.CreateRequest{Base: "base:1", Tier: "vm2"}, "tier"},
		{"negative cpus", model.CreateRequest{Base: "base:1", Limits: model.Limits{CPUs: -1}}, "limits.cpus"},
		{"too many cpus", model.CreateRequest{Base: "base:1", Limits: model.Limits{CPUs: 1000}}, "limits.cpus"},
		{"tiny memory", model.CreateRequest{Base: "base:1", Limits: model.Limits{MemoryBytes: 1024}}, "limits.memory_bytes"},
		{"negative pids", model.CreateRequest{Base: "base:1", Limits: model.Limits{Pids: -5}}, "limits.pids"},
		{"huge disk", model.CreateRequest{Base: "base:1", Limits: model.Limits{DiskBytes: 1 << 62}}, "limits.disk_bytes"},
		{"bad ttl", model.CreateRequest{Base: "base:1", TTL: "soon"}, "ttl"},
		{"ttl too short", model.CreateRequest{Base: "base:1", TTL: "1ms"}, "ttl"},
		{"ttl too long", model.CreateRequest{Base: "base:1", TTL: "10000h"}, "ttl"},
		{"bad idle ttl", model.CreateRequest{Base: "base:1", IdleTTL: "-1m"}, "idle_ttl"},
		{"bad env", model.CreateRequest{Base: "base:1", Env: []string{"1X=2"}}, "env[0]"},
		{"bad label", model.CreateRequest{Base: "base:1", Labels: map[string]string{"a b": "c"}}, "labels"},
		{"bad hostname", model.CreateRequest{Base: "base:1", Hostname: "a_b"}, "hostname"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.Create(context.Background(), tt.req)
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("Create(%+v) err = %v, want invalid", tt.req, err)
			}
			if got := errdefs.Field(err); got != tt.field {
				t.Fatalf("field = %q, want %q (%v)", got, tt.field, err)
			}
		})
	}
	if n := e.Count(); n != 0 {
		t.Fatalf("%d sandboxes after only invalid requests", n)
	}
}

func TestCreateDefaultsAndLayerOrder(t *testing.T) {
	rt := newFakeRuntime()
	e, _ := newTestEdge(t, rt)
	rec, err := e.Create(context.Background(), model.CreateRequest{Base: "base:1", Workspace: "ws:1", Toolkits: []string{"tk:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if !ValidID(rec.ID) || NodeOf(rec.ID) != "local" {
		t.Fatalf("ID %q does not encode the node", rec.ID)
	}
	if want := []string{"sha256:b", "sha256:w", "sha256:t"}; len(rec.Lower) != 3 || rec.Lower[0] != want[0] || rec.Lower[2] != want[2] {
		t.Fatalf("lower = %v, want %v (base first)", rec.Lower, want)
	}
	if def, _ := limits.Default().Bounds(TierContainer); rec.Limits != model.Limits(def.Default) || rec.State != model.StateRunning || rec.Hostname != rec.ID {
		t.Fatalf("record = %+v", rec)
	}
	if d := rec.ExpiresAt.Sub(rec.CreatedAt); d != time.Hour {
		t.Fatalf("default TTL = %s, want 1h", d)
	}
	ls := e.layers.(*fakeLayers)
	for _, d := range rec.Lower {
		if n := ls.ref(d); n != 1 {
			t.Errorf("layer %s has %d references while the sandbox runs; want 1", d, n)
		}
	}
	if _, err := e.Delete(context.Background(), rec.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitCleanups(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range rec.Lower {
		if n := ls.ref(d); n != 0 {
			t.Errorf("layer %s has %d references after delete; want 0", d, n)
		}
	}
}

func TestCreateFailureIsRecorded(t *testing.T) {
	rt := newFakeRuntime()
	rt.failing = errors.New("runc exploded")
	e, st := newTestEdge(t, rt)
	if _, err := e.Create(context.Background(), model.CreateRequest{Base: "base:1"}); err == nil {
		t.Fatal("Create succeeded with a failing runtime")
	}
	recs, _ := st.ListSandboxes(context.Background(), store.SandboxFilter{})
	if len(recs) != 1 || recs[0].State != model.StateFailed || recs[0].Reason != "error: runc exploded" {
		t.Fatalf("records = %+v, want one failed with the reason", recs)
	}
	if n := e.layers.(*fakeLayers).ref("sha256:b"); n != 0 {
		t.Errorf("a failed create left %d references on its base", n)
	}
}

func TestReaperTTLAndDeath(t *testing.T) {
	rt := newFakeRuntime()
	e, _ := newTestEdge(t, rt)
	ctx := context.Background()
	expiring, _ := e.Create(ctx, model.CreateRequest{Base: "base:1", TTL: "1s"})
	dying, _ := e.Create(ctx, model.CreateRequest{Base: "base:1"})
	oomed, _ := e.Create(ctx, model.CreateRequest{Base: "base:1"})
	rt.kill(dying.ID, false)
	rt.kill(oomed.ID, true)
	want := map[string][2]string{
		expiring.ID: {model.StateStopped, model.ReasonTTLExpired},
		dying.ID:    {model.StateFailed, "error: the sandbox's processes exited"},
		oomed.ID:    {model.StateFailed, model.ReasonOOMKilled},
	}
	deadline := time.Now().Add(5 * time.Second)
	for id, w := range want {
		for {
			rec, err := e.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if rec.State == w[0] && rec.Reason == w[1] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: state %s (%s), want %s (%s)", id, rec.State, rec.Reason, w[0], w[1])
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if _, err := rt.Status(ctx, expiring.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("expired sandbox still in the runtime: %v", err)
	}
	if n := e.layers.(*fakeLayers).ref("sha256:b"); n != 0 {
		t.Errorf("ended sandboxes left %d references on their base", n)
	}
}

func TestReconcileAfterRestart(t *testing.T) {
	rt := newFakeRuntime()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.PublishLayer(ctx, model.Layer{Name: "base", Version: "1", Kind: model.KindBase, Digest: "sha256:b"})
	cfg := Config{AgentPath: "/agent", ReapInterval: time.Hour}
	ls1 := newFakeLayers()
	e1, _ := New(cfg, slog.New(slog.DiscardHandler), st, rt, ls1)
	e1.Start(ctx)
	alive, _ := e1.Create(ctx, model.CreateRequest{Base: "base:1"})
	dead, _ := e1.Create(ctx, model.CreateRequest{Base: "base:1"})
	e1.Close()
	rt.kill(dead.ID, true)
	rt.running["sb-local-orphanorphanorph"] = true // runtime state with no record

	ls2 := ls1.restarted()
	e2, _ := New(cfg, slog.New(slog.DiscardHandler), st, rt, ls2)
	if err := e2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	if e2.Count() != 1 || e2.lookup(alive.ID) == nil {
		t.Fatalf("after restart %d live sandboxes, want only %s", e2.Count(), alive.ID)
	}
	rec, _ := e2.Get(ctx, dead.ID)
	if rec.State != model.StateFailed || rec.Reason != model.ReasonOOMKilled {
		t.Fatalf("sandbox that died while down: %s (%s)", rec.State, rec.Reason)
	}
	if _, ok := rt.running["sb-local-orphanorphanorph"]; ok {
		t.Fatal("orphaned runtime state was not removed")
	}
	if n := ls2.ref("sha256:b"); n != 1 {
		t.Errorf("after restart the base has %d references; want 1 (the surviving sandbox)", n)
	}
}

// TestInterruptedDeleteFinishesAfterRestart: a delete whose teardown was cut short (corral
// killed in the middle of it) ends as deleted at the next start, not as a sandbox that died.
func TestInterruptedDeleteFinishesAfterRestart(t *testing.T) {
	rt := newFakeRuntime()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.PublishLayer(ctx, model.Layer{Name: "base", Version: "1", Kind: model.KindBase, Digest: "sha256:b"})
	cfg := Config{AgentPath: "/agent", ReapInterval: time.Hour}
	ls1 := newFakeLayers()
	e1, _ := New(cfg, slog.New(slog.DiscardHandler), st, rt, ls1)
	e1.Start(ctx)
	sb, err := e1.Create(ctx, model.CreateRequest{Base: "base:1"})
	if err != nil {
		t.Fatal(err)
	}
	rt.deleteFails = errors.New("killed in the middle of the teardown")
	if del, err := e1.Delete(ctx, sb.ID); err != nil || del.State != model.StateDeleting {
		t.Fatalf("delete = %+v, %v; want state deleting (the cleanup runs after the answer)", del, err)
	}
	if err := e1.WaitCleanups(ctx); err != nil {
		t.Fatal(err)
	}
	if rec, _ := st.GetSandbox(ctx, sb.ID); rec.State != model.StateDeleting || rec.Stopping == nil || rec.Stopping.Reason != model.ReasonDeleted {
		t.Fatalf("record after a failed cleanup: %s, intent %+v; want deleting with the stop intent", rec.State, rec.Stopping)
	}
	e1.Close()
	rt.deleteFails = nil

	e2, _ := New(cfg, slog.New(slog.DiscardHandler), st, rt, ls1.restarted())
	if err := e2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	rec, _ := e2.Get(ctx, sb.ID)
	if rec.State != model.StateStopped || rec.Reason != model.ReasonDeleted || rec.Stopping != nil {
		t.Fatalf("interrupted delete after restart: %s (%s), intent %+v; want stopped (deleted)", rec.State, rec.Reason, rec.Stopping)
	}
	if _, ok := rt.running[sb.ID]; ok {
		t.Fatal("runtime state of the deleted sandbox was left")
	}
}

// TestDeleteAnswersBeforeCleanup: a delete answers with the sandbox killed, out of the live set
// and off the quota, in state deleting; the deleted event and state stopped come when the
// cleanup has finished.
// holdDeletes holds every Delete of rt until the returned func is called (once; at the test's
// end at the latest, so that a failed check does not leave Close waiting for a cleanup).
func holdDeletes(t *testing.T, rt *fakeRuntime) func() {
	gate := make(chan struct{})
	rt.mu.Lock()
	rt.deleteGate = gate
	rt.mu.Unlock()
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return release
}

func TestDeleteAnswersBeforeCleanup(t *testing.T) {
	rt := newFakeRuntime()
	e, st := newTestEdge(t, rt)
	ctx := context.Background()
	rec, err := e.Create(ctx, model.CreateRequest{Base: "base:1"})
	if err != nil {
		t.Fatal(err)
	}
	sub, _ := e.Events().Subscribe(64, time.Now(), nil)
	defer sub.Close()
	open := holdDeletes(t, rt)
	del, err := e.Delete(ctx, rec.ID)
	if err != nil || del.State != model.StateDeleting || del.Reason != model.ReasonDeleted {
		t.Fatalf("delete = %+v, %v; want deleting (deleted)", del, err)
	}
	rt.mu.Lock()
	killed, left := rt.killed[rec.ID], rt.running[rec.ID]
	rt.mu.Unlock()
	if !killed || !left {
		t.Fatalf("after the answer: killed %v, runtime state left %v; want killed with the cleanup pending", killed, left)
	}
	if _, err := e.ownSandbox(ctx, rec.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("data-plane lookup of a deleting sandbox: %v, want conflict", err)
	}
	if u, err := st.NodeUsage(ctx, "local"); err != nil || u.Sandboxes != 0 || u.CPUs != 0 {
		t.Fatalf("node usage while deleting = %+v, %v; want nothing counted", u, err)
	}
	if got, err := e.Get(ctx, rec.ID); err != nil || got.State != model.StateDeleting {
		t.Fatalf("get while deleting = %+v, %v", got, err)
	}
	if again, err := e.Delete(ctx, rec.ID); err != nil || again.State != model.StateDeleting {
		t.Fatalf("second delete = %+v, %v; want the deleting record", again, err)
	}
	select {
	case ev := <-sub.C():
		t.Fatalf("event %+v before the cleanup finished", ev)
	default:
	}
	open()
	if err := e.WaitCleanups(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, sub.C()); ev.Type != events.Deleted || ev.Sandbox != rec.ID {
		t.Fatalf("event = %+v, want deleted", ev)
	}
	if got, _ := e.Get(ctx, rec.ID); got.State != model.StateStopped || got.Reason != model.ReasonDeleted || got.Stopping != nil {
		t.Fatalf("after the cleanup: %s (%s), intent %+v; want stopped (deleted)", got.State, got.Reason, got.Stopping)
	}
}

// TestExpiryDoesNotWaitForTeardown: sandboxes whose TTL passes in one tick all leave the live
// set (deleting, ttl_expired, nothing counted) while their teardowns are still held, and end
// stopped (ttl_expired) once the teardowns run.
func TestExpiryDoesNotWaitForTeardown(t *testing.T) {
	rt := newFakeRuntime()
	e, st := newTestEdge(t, rt)
	ctx := context.Background()
	var ids []string
	for range 4 {
		rec, err := e.Create(ctx, model.CreateRequest{Base: "base:1", TTL: "1s"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rec.ID)
	}
	open := holdDeletes(t, rt)
	deadline := time.Now().Add(10 * time.Second)
	for _, id := range ids {
		for {
			rec, err := e.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if rec.State == model.StateDeleting {
				if rec.Reason != model.ReasonTTLExpired {
					t.Fatalf("%s: deleting with reason %q, want %s", id, rec.Reason, model.ReasonTTLExpired)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s (%s) with every teardown held; want all four deleting", id, rec.State, rec.Reason)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if u, err := st.NodeUsage(ctx, "local"); err != nil || u.Sandboxes != 0 {
		t.Fatalf("node usage with the teardowns pending = %+v, %v; want nothing counted", u, err)
	}
	open()
	if err := e.WaitCleanups(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if got, _ := e.Get(ctx, id); got.State != model.StateStopped || got.Reason != model.ReasonTTLExpired || got.Stopping != nil {
			t.Errorf("%s after the cleanup: %s (%s), intent %+v; want stopped (ttl_expired)", id, got.State, got.Reason, got.Stopping)
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]int{"SIGTERM": 15, "term": 15, "9": 9, "KILL": 9} {
		got, err := ParseSignal(in)
		if err != nil || int(got) != want {
			t.Errorf("ParseSignal(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "65", "SIGNOPE", "-1"} {
		if _, err := ParseSignal(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseSignal(%q) err = %v, want invalid", bad, err)
		}
	}
}

func TestAutoPauseAndResume(t *testing.T) {
	rt := newFakeRuntime()
	e, _ := newTestEdge(t, rt)
	ctx := context.Background()
	keep := false
	rec, err := e.Create(ctx, model.CreateRequest{Base: "base:1", AutoPauseAfter: "1s", PauseKeepsTTL: &keep})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := e.Get(ctx, rec.ID)
		if got.State == model.StatePaused {
			if got.LastPause == nil || !got.LastPause.AutomaticPause {
				t.Fatalf("auto-paused record: %+v", got.LastPause)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state %s after 5s idle, want paused", got.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := e.Pause(ctx, rec.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("pause of a paused sandbox: %v, want conflict", err)
	}
	time.Sleep(100 * time.Millisecond)
	got, err := e.Resume(ctx, rec.ID)
	if err != nil || got.State != model.StateRunning {
		t.Fatalf("resume = %+v, %v", got, err)
	}
	if !got.ExpiresAt.After(rec.ExpiresAt) {
		t.Fatalf("pause_keeps_ttl=false: expiry %s did not move past %s", got.ExpiresAt, rec.ExpiresAt)
	}
	if _, err := e.Resume(ctx, rec.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("resume of a running sandbox: %v, want conflict", err)
	}
}

// TestAdmitLimitsPolicy: every admission path resolves limits by the one policy: a create and an
// fncall environment's containers (tier fncall). A bad limit is invalid
// naming the field and the tier, and the runtime is never asked for a sandbox.
func TestAdmitLimitsPolicy(t *testing.T) {
	rt := newFakeRuntime()
	e, _ := newTestEdge(t, rt)
	ctx := context.Background()
	_, err := e.Create(ctx, model.CreateRequest{Base: "base:1", Limits: model.Limits{MemoryBytes: 8 << 20}})
	if errdefs.Field(err) != "limits.memory_bytes" || !strings.Contains(err.Error(), "on container") {
		t.Errorf("create with 8 MiB: %v; want invalid limits.memory_bytes on container", err)
	}
	_, err = e.CreateFncallEnv(ctx, model.FncallEnv{Name: "judge", Base: "base:1", Limits: model.Limits{OpenFiles: 10}})
	if errdefs.Field(err) != "limits.open_files" || !strings.Contains(err.Error(), "on fncall") {
		t.Errorf("fncall env with 10 open files: %v; want invalid limits.open_files on fncall", err)
	}
	if n := e.Count(); n != 0 {
		t.Errorf("%d sandboxes after refused creates", n)
	}
	env, err := e.CreateFncallEnv(ctx, model.FncallEnv{Name: "judge", Base: "base:1", Limits: model.Limits{MemoryBytes: 256 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if def, _ := limits.Default().Bounds(limits.TierFncall); env.Limits.MemoryBytes != 256<<20 || env.Limits.Pids != def.Default.Pids {
		t.Errorf("fncall env limits %+v; want its memory and the fncall defaults", env.Limits)
	}
}

// TestFncallPoolBackoff: when containers cannot be started, the pool says why, backs off, and
// calls fail at once with 503 instead of waiting in the queue.
func TestFncallPoolBackoff(t *testing.T) {
	rt := newFakeRuntime()
	rt.failing = errors.New("runc exploded")
	e, _ := newTestEdge(t, rt)
	ctx := context.Background()
	if _, err := e.CreateFncallEnv(ctx, model.FncallEnv{Name: "judge", Base: "base:1", QueueWait: "30s"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		env, err := e.FncallEnv("judge")
		if err != nil {
			t.Fatal(err)
		}
		if env.Pool.LastError != "" {
			if !strings.Contains(env.Pool.LastError, "runc exploded") || env.Pool.Starting != 0 {
				t.Fatalf("pool = %+v", env.Pool)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool never reported its failure: %+v", env.Pool)
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	_, err := e.Call(ctx, "judge", model.CallRequest{Argv: []string{"true"}}, nil)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "runc exploded") || time.Since(start) > 5*time.Second {
		t.Fatalf("call to a pool that cannot start containers: %v after %s; want a prompt 503 naming the cause", err, time.Since(start))
	}
	if err := e.DeleteFncallEnv(ctx, "judge"); err != nil {
		t.Fatal(err)
	}
}

// TestUnheldLayersAreNotReleased: a sandbox re-adopted after a restart whose layer was not
// mounted under the layer store holds no reference on it, so its end must not release one that
// a newer sandbox holds.
func TestUnheldLayersAreNotReleased(t *testing.T) {
	rt := newFakeRuntime()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.PublishLayer(ctx, model.Layer{Name: "base", Version: "1", Kind: model.KindBase, Digest: "sha256:b"})
	cfg := Config{AgentPath: "/agent", ReapInterval: time.Hour}
	e1, _ := New(cfg, slog.New(slog.DiscardHandler), st, rt, newFakeLayers())
	e1.Start(ctx)
	old, _ := e1.Create(ctx, model.CreateRequest{Base: "base:1"})
	e1.Close()

	ls := newFakeLayers() // after the restart the layer is not mounted where the store looks
	e2, _ := New(cfg, slog.New(slog.DiscardHandler), st, rt, ls)
	if err := e2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	if _, err := e2.Create(ctx, model.CreateRequest{Base: "base:1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e2.Delete(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	if n := ls.ref("sha256:b"); n != 1 {
		t.Errorf("after the re-adopted sandbox ended, the new one's layer has %d references; want 1", n)
	}
}

// Node names may carry hyphens (Kubernetes node names do), so a sandbox ID's node is everything
// between "sb-" and the last hyphen.
func TestNodeOf(t *testing.T) {
	for id, want := range map[string]string{
		"sb-local-abcdefghijklmnop":                           "local",
		"sb-ip-10-0-1-23-abcdefghijklmnop":                    "ip-10-0-1-23",
		"sb-a-abcdefghijklmnop":                               "a",
		"sb-" + strings.Repeat("x", 32) + "-abcdefghijklmnop": strings.Repeat("x", 32),
		"sb-" + strings.Repeat("x", 33) + "-abcdefghijklmnop": "",
		"sb--node-abcdefghijklmnop":                           "",
		"sb-node--abcdefghijklmnop":                           "",
		"sb-node-abcdefghijklmnop1":                           "",
		"sb-Node-abcdefghijklmnop":                            "",
	} {
		if got := NodeOf(id); got != want {
			t.Errorf("NodeOf(%q) = %q, want %q", id, got, want)
		}
		if ValidID(id) != (want != "") {
			t.Errorf("ValidID(%q) = %v", id, !(want != ""))
		}
	}
	for name, ok := range map[string]bool{"edge1": true, "ip-10-0-1-23": true, "-a": false, "a-": false, "a.b": false, strings.Repeat("a", 33): false} {
		c := Config{Node: name, AgentPath: "/x"}
		c.setDefaults()
		if err := c.Validate(); (err == nil) != ok && (ok || !strings.Contains(err.Error(), "node")) {
			t.Errorf("node name %q: %v", name, err)
		}
	}
}

// TestNodeHasFinalSay checks the edge's own admission in a cluster: over its capacity, while
// draining, or without the labels a create asks for, a create is refused with node_full (which
// placement takes as "try another node") and leaves nothing behind.
func TestNodeHasFinalSay(t *testing.T) {
	rt := newFakeRuntime()
	e, st := newTestEdgeWith(t, rt, Config{Capacity: &store.Resources{CPUs: 2, MemoryBytes: 4 << 30, Sandboxes: 3}, Labels: map[string]string{"pool": "a"}})
	ctx := context.Background()
	small := model.Limits{CPUs: 0.5, MemoryBytes: 1 << 30}
	full := func(what string, req model.CreateRequest, want string) {
		t.Helper()
		_, err := e.Create(ctx, req)
		if !errors.Is(err, errdefs.ErrNodeFull) || errdefs.Code(err) != "node_full" || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v (want node_full, %q)", what, err, want)
		}
	}
	a, err := e.Create(ctx, model.CreateRequest{Base: "base:1", Limits: small, NodeSelector: map[string]string{"pool": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	full("a selector the node does not match", model.CreateRequest{Base: "base:1", Limits: small, NodeSelector: map[string]string{"pool": "b"}}, "lacks the labels")
	full("more CPU than is left", model.CreateRequest{Base: "base:1", Limits: model.Limits{CPUs: 1.75, MemoryBytes: 1 << 30}}, "CPUs 0.5+1.75 of 2")
	full("more memory than is left", model.CreateRequest{Base: "base:1", Limits: model.Limits{CPUs: 0.5, MemoryBytes: 3200 << 20}}, "memory")
	for _, cpus := range []float64{1, 0.25} {
		if _, err := e.Create(ctx, model.CreateRequest{Base: "base:1", Limits: model.Limits{CPUs: cpus, MemoryBytes: 512 << 20}}); err != nil {
			t.Fatalf("a sandbox that fits: %v", err)
		}
	}
	full("a fourth sandbox", model.CreateRequest{Base: "base:1", Limits: model.Limits{MemoryBytes: 256 << 20, CPUs: 0.01}}, "sandboxes 3 of 3")
	if _, err := e.Create(ctx, model.CreateRequest{Base: "base:1", Limits: small, NodeSelector: map[string]string{"bad key": "x"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a malformed selector: %v", err)
	}
	// Room comes back when a sandbox goes; a draining node takes nothing all the same.
	if _, err := e.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	e.SetDraining(true)
	full("a create while draining", model.CreateRequest{Base: "base:1", Limits: small}, "draining")
	e.SetDraining(false)
	if _, err := e.Create(ctx, model.CreateRequest{Base: "base:1", Limits: model.Limits{CPUs: 0.75, MemoryBytes: 1 << 30}}); err != nil {
		t.Fatalf("what fits exactly, after the drain ended: %v", err)
	}
	// Refused creates left no record.
	list, err := st.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 4 {
		t.Fatalf("%d records, want 4 (one deleted, three live)", len(list))
	}
}

// TestCreateRetryAfterCutShortCreate: the retry of a create nobody had an answer for makes the
// sandbox: one whose caller went away mid-create (its key released at once), and one a crash
// interrupted (rolled back at the restart, its key released on the retry). A retry while the
// first try is still at work is a retryable 503, and a retry of a create that succeeded replays.
func TestCreateRetryAfterCutShortCreate(t *testing.T) {
	rt := newFakeRuntime()
	e, _ := newTestEdge(t, rt)
	ctx := context.Background()
	req := model.CreateRequest{Base: "base:1"}
	key := func(k string) *store.Idempotency {
		return &store.Idempotency{Principal: "root", Key: k, RequestHash: "h"}
	}

	// The caller goes away while the runtime creates: the create fails, its key is released.
	cctx, cancel := context.WithCancel(ctx)
	rt.beforeCreate = cancel // after admission: the key is recorded
	rt.failing = context.Canceled
	if _, _, err := e.CreateOnce(cctx, req, key("gone")); err == nil {
		t.Fatal("a create whose context ended succeeded")
	}
	rt.beforeCreate, rt.failing = nil, nil
	sb, replayed, err := e.CreateOnce(ctx, req, key("gone"))
	if err != nil || replayed || sb.State != model.StateRunning {
		t.Fatalf("retry of a create whose caller went away = %+v, replayed %v, %v; want a new running sandbox", sb, replayed, err)
	}

	// A crash interrupted it: the record is failed with the rollback's reason.
	first, _, err := e.CreateOnce(ctx, req, key("crash"))
	if err != nil {
		t.Fatal(err)
	}
	// As the restart's reconcile records it (through the edge, whose copy of its records
	// follows).
	first.State, first.Reason = model.StateFailed, reasonInterruptedCreate
	if err := e.records.PutSandbox(ctx, first); err != nil {
		t.Fatal(err)
	}
	sb, replayed, err = e.CreateOnce(ctx, req, key("crash"))
	if err != nil || replayed || sb.ID == first.ID || sb.State != model.StateRunning {
		t.Fatalf("retry of a create a crash interrupted = %+v, replayed %v, %v; want a new running sandbox", sb, replayed, err)
	}
	if again, replayed, err := e.CreateOnce(ctx, req, key("crash")); err != nil || !replayed || again.ID != sb.ID {
		t.Fatalf("a second retry = %+v, replayed %v, %v; want the replay of %s", again, replayed, err, sb.ID)
	}

	// Still at work: a retryable 503.
	sb.State = model.StateCreating
	if err := e.records.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	_, _, err = e.CreateOnce(ctx, req, key("crash"))
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.RetryAfter(err) == 0 {
		t.Fatalf("retry while the first try is at work = %v; want unavailable with a Retry-After", err)
	}
}
