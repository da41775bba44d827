package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
)

// nodeChannelReplica starts a replica on a bootstrapped PostgreSQL store that serves its API
// and the node channel, and returns its store, the replica, its API and its data dir.
func nodeChannelReplica(t *testing.T) (*store.Store, *Server, *httptest.Server, string) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, dsn, dir, _ := bootstrapped(t, log)
	s := testServer(t, st, Config{DataDir: dir, Store: dsn}, log)
	nodes := httptest.NewUnstartedServer(s.nodeHandler())
	nodes.TLS = s.nodeTLS
	nodes.StartTLS()
	t.Cleanup(nodes.Close)
	s.nodePort = nodes.Listener.Addr().(*net.TCPAddr).Port
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return st, s, hs, dir
}

// TestNodeChannel: edges joined through a replica register, heartbeat and record events over
// the node channel as the node their certificate names, and nothing they send speaks for
// another node or a fenced incarnation.
func TestNodeChannel(t *testing.T) {
	ctx := context.Background()
	st, s, hs, dir := nodeChannelReplica(t)

	join := func(name string) *nodeproto.Servers {
		t.Helper()
		j, err := Join(ctx, hs.URL, filepath.Join(dir, "join.token"), name)
		if err != nil {
			t.Fatal(err)
		}
		if j.Servers == nil || len(j.Servers.URLs()) != 1 || !strings.HasPrefix(j.Servers.URLs()[0], "https://127.0.0.1:") {
			t.Fatalf("join of %s: node channel %v", name, j.Servers)
		}
		return j.Servers
	}
	edge1, edge2 := join("edge1"), join("edge2")
	reg := nodeproto.RegisterRequest{URL: "https://127.0.0.1:1", Protocol: nodeproto.Version, LeaseTTLMillis: 15000,
		Capacity: store.Resources{CPUs: 4, MemoryBytes: 8 << 30, DiskBytes: 1 << 40, Sandboxes: 10},
		Tiers:    []string{"container"}, Runtimes: []string{"runc"}, Labels: map[string]string{"zone": "a"}}
	n1, err := edge1.Register(ctx, reg)
	if err != nil || n1.Name != "edge1" || n1.Epoch != 1 || n1.State != store.NodeReady || n1.Labels["zone"] != "a" {
		t.Fatalf("register edge1: %+v, %v", n1, err)
	}
	if n, err := edge2.Register(ctx, reg); err != nil || n.Name != "edge2" {
		t.Fatalf("register edge2: %+v, %v (the node is the certificate's)", n, err)
	}
	if hb, err := edge1.Heartbeat(ctx, 1, 15*time.Second, nil); err != nil || hb.State != store.NodeReady {
		t.Fatalf("heartbeat: %+v, %v", hb, err)
	}
	// Heartbeats carry the nodes' warm pools' figures, which an environment's read sums over
	// the nodes; figures no pool has are left out, and the lease is renewed all the same.
	if _, err := edge1.Heartbeat(ctx, 1, 15*time.Second, map[string]store.WarmFigures{"py": {Ready: 1, Target: 2, Hits: 1, Claims: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := edge2.Heartbeat(ctx, 1, 15*time.Second, map[string]store.WarmFigures{"py": {Ready: 2, Target: 2, Hits: 3, Claims: 3}, "node": {Target: 1}}); err != nil {
		t.Fatal(err)
	}
	py, other := model.Environment{Name: "py"}, model.Environment{Name: "other"}
	environments{s}.Figures(ctx, []*model.Environment{&py, &other})
	if py.WarmReady != 3 || py.WarmTarget != 4 || py.WarmHits != 4 || py.WarmClaims != 5 || py.WarmHitRate != 0.8 || other.WarmTarget != 0 {
		t.Fatalf("summed figures: py %+v, other %+v", py, other)
	}
	if hb, err := edge2.Heartbeat(ctx, 1, 15*time.Second, map[string]store.WarmFigures{"py": {Ready: -1}}); err != nil || hb.State != store.NodeReady {
		t.Fatalf("a heartbeat with figures no pool has: %+v, %v", hb, err)
	}
	py = model.Environment{Name: "py"}
	environments{s}.Figures(ctx, []*model.Environment{&py})
	if py.WarmReady != 1 || py.WarmTarget != 2 || py.WarmClaims != 2 {
		t.Fatalf("figures after edge2's were left out: %+v", py)
	}
	// An operator drains the node: the next heartbeat says so.
	if _, err := st.SetNodeState(ctx, "edge1", store.NodeDraining); err != nil {
		t.Fatal(err)
	}
	if hb, err := edge1.Heartbeat(ctx, 1, 15*time.Second, nil); err != nil || hb.State != store.NodeDraining {
		t.Fatalf("heartbeat of a drained node: %+v, %v", hb, err)
	}
	// A new incarnation fences the old one: its heartbeat is refused as a stale epoch.
	n1, err = edge1.Register(ctx, reg)
	if err != nil || n1.Epoch != 2 || n1.State != store.NodeDraining {
		t.Fatalf("register edge1 again: %+v, %v", n1, err)
	}
	if _, err := edge1.Heartbeat(ctx, 1, 15*time.Second, nil); !errors.Is(err, store.ErrFenced) {
		t.Errorf("heartbeat of a fenced incarnation: %v, want ErrFenced", err)
	}
	// Bad registrations: a clear refusal, nothing registered.
	for _, c := range []struct {
		name string
		edit func(r *nodeproto.RegisterRequest)
		want error
	}{
		{"lease too short", func(r *nodeproto.RegisterRequest) { r.LeaseTTLMillis = 10 }, errdefs.ErrInvalid},
		{"lease too long", func(r *nodeproto.RegisterRequest) { r.LeaseTTLMillis = int64(time.Hour / time.Millisecond) }, errdefs.ErrInvalid},
		{"plain http", func(r *nodeproto.RegisterRequest) { r.URL = "http://127.0.0.1:1" }, errdefs.ErrInvalid},
		{"another protocol", func(r *nodeproto.RegisterRequest) { r.Protocol = 0 }, nodeproto.ErrVersion},
		{"negative capacity", func(r *nodeproto.RegisterRequest) { r.Capacity.CPUs = -1 }, errdefs.ErrInvalid},
		{"bad label", func(r *nodeproto.RegisterRequest) { r.Labels = map[string]string{"": "x"} }, errdefs.ErrInvalid},
	} {
		r := reg
		c.edit(&r)
		if _, err := edge2.Register(ctx, r); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if list, _ := st.ListNodes(ctx); len(list) != 2 || list[1].Epoch != 1 {
		t.Errorf("nodes after refused registrations: %+v", list)
	}

	// Events: a node records its own; one that speaks for another node is refused whole.
	at := time.Now().UTC()
	own := events.Event{ID: "ev-edge1-1-1", At: at, Type: events.Created, Sandbox: "sb-edge1-aaaaaaaaaaaaaaaa", Project: "/", Node: "edge1"}
	if err := edge1.EventRecorder(2).AddEvents(ctx, []events.Event{own}); err != nil {
		t.Fatalf("record edge1's event: %v", err)
	}
	for _, c := range []struct {
		name string
		ev   events.Event
		want error
	}{
		{"another node", events.Event{ID: "ev-edge1-1-2", At: at, Type: events.Deleted, Node: "edge2"}, errdefs.ErrDenied},
		{"another node's sandbox", events.Event{ID: "ev-edge1-1-3", At: at, Type: events.Deleted, Sandbox: "sb-edge2-aaaaaaaaaaaaaaaa", Node: "edge1"}, errdefs.ErrDenied},
		{"another node's ID", events.Event{ID: "ev-edge2-1-4", At: at, Type: events.Deleted, Node: "edge1"}, errdefs.ErrInvalid},
		{"no type", events.Event{ID: "ev-edge1-1-5", At: at, Node: "edge1"}, errdefs.ErrInvalid},
		{"an unknown type", events.Event{ID: "ev-edge1-1-6", At: at, Type: "evil", Node: "edge1"}, errdefs.ErrInvalid},
		{"a node's state", events.Event{ID: "ev-edge1-1-8", At: at, Type: events.NodeState, Node: "edge1", Reason: "ready"}, errdefs.ErrDenied},
	} {
		ok := events.Event{ID: "ev-edge1-1-9", At: at, Type: events.Started, Node: "edge1"}
		if err := edge1.EventRecorder(2).AddEvents(ctx, []events.Event{ok, c.ev}); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// A sandbox event's project is its record's, whatever the edge says, and a time ahead of
	// the servers' is taken as now.
	rec := &store.Sandbox{Sandbox: model.Sandbox{ID: "sb-edge1-bbbbbbbbbbbbbbbb", Node: "edge1", Tier: "container",
		State: model.StateRunning, CreatedAt: at, ExpiresAt: at.Add(time.Hour)}}
	if err := st.PutSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	recorded, _ := st.GetSandbox(ctx, rec.ID)
	forged := events.Event{ID: "ev-edge1-1-7", At: at.Add(100 * 365 * 24 * time.Hour), Type: events.OOM, Sandbox: rec.ID, Project: "/victim", Node: "edge1"}
	if err := edge1.EventRecorder(2).AddEvents(ctx, []events.Event{forged}); err != nil {
		t.Fatalf("record an event with another project and a time in 2126: %v", err)
	}
	// The incarnation a registration fenced off records nothing more.
	stale := events.Event{ID: "ev-edge1-0-1", At: at, Type: events.Deleted, Sandbox: "sb-edge1-aaaaaaaaaaaaaaaa", Node: "edge1"}
	if err := edge1.EventRecorder(1).AddEvents(ctx, []events.Event{stale}); !errors.Is(err, store.ErrFenced) {
		t.Errorf("events of a fenced incarnation: %v, want ErrFenced", err)
	}
	evs, err := st.ListEvents(ctx, "", time.Time{}, 100)
	if err != nil || len(evs) != 2 || evs[0].ID != own.ID || evs[1].ID != forged.ID {
		t.Fatalf("recorded events: %+v, %v; want edge1's two", evs, err)
	}
	if evs[1].Project != recorded.Project || evs[1].At.After(time.Now()) {
		t.Errorf("the forged event was recorded with project %q at %v; want the record's %q, now at the latest", evs[1].Project, evs[1].At, recorded.Project)
	}

	// Activity: of the node's own sandboxes only, and of the incarnation holding the node.
	act := edge1.ActivityRecorder(2)
	if err := act.RecordActivity(ctx, []store.Activity{{ID: "sb-edge1-aaaaaaaaaaaaaaaa", LastActivityAt: at}}); err != nil {
		t.Errorf("record edge1's activity: %v", err)
	}
	if err := act.RecordActivity(ctx, []store.Activity{{ID: "sb-edge1-aaaaaaaaaaaaaaaa", LastActivityAt: at}, {ID: "sb-edge2-aaaaaaaaaaaaaaaa", LastActivityAt: at}}); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("activity of another node's sandbox: %v, want ErrDenied", err)
	}
	if err := edge1.ActivityRecorder(1).RecordActivity(ctx, []store.Activity{{ID: "sb-edge1-aaaaaaaaaaaaaaaa", LastActivityAt: at}}); !errors.Is(err, store.ErrFenced) {
		t.Errorf("activity of a fenced incarnation: %v, want ErrFenced", err)
	}

	// Edges learn the replicas alive from every heartbeat, the one they call kept first.
	if err := st.AnnounceServer(ctx, "replica-b", "https://10.0.0.9:7071"); err != nil {
		t.Fatal(err)
	}
	first := edge2.URLs()[0]
	s.replicasMu.Lock()
	s.replicasAt = time.Time{}
	s.replicasMu.Unlock()
	if _, err := edge2.Heartbeat(ctx, 1, 15*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if got := edge2.URLs(); len(got) != 2 || got[0] != first || got[1] != "https://10.0.0.9:7071" {
		t.Errorf("replicas after a heartbeat: %q, want %s then the other replica", got, first)
	}

	// Nobody without an edge's certificate gets in: no certificate fails the handshake; a
	// request without the protocol's version is refused.
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := anon.Post(edge1.URLs()[0]+nodeproto.PathHeartbeat, "application/json", strings.NewReader(`{"epoch":2}`)); err == nil {
		resp.Body.Close()
		t.Errorf("the node channel answered a client without a certificate: %s", resp.Status)
	}
}

// TestNodeStart: a registration answers what the edge starts from (its instance name and the
// records of its own sandboxes that may still run, no other node's, no ended one), and the
// configuration edges follow comes over the channel with a generation every heartbeat names,
// which moves when the configuration does.
func TestNodeStart(t *testing.T) {
	ctx := context.Background()
	st, srv, hs, dir := nodeChannelReplica(t)
	j, err := Join(ctx, hs.URL, filepath.Join(dir, "join.token"), "edge1")
	if err != nil {
		t.Fatal(err)
	}
	edge1 := j.Servers

	now := time.Now().UTC()
	for _, r := range []struct{ id, state string }{
		{"sb-edge1-aaaaaaaaaaaaaaaa", model.StateRunning}, {"sb-edge1-bbbbbbbbbbbbbbbb", model.StatePaused},
		{"sb-edge1-cccccccccccccccc", model.StateStopped}, {"sb-edge2-aaaaaaaaaaaaaaaa", model.StateRunning},
	} {
		rec := &store.Sandbox{Sandbox: model.Sandbox{ID: r.id, Node: strings.Split(r.id, "-")[1], Tier: "container", State: r.state,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour)}}
		if err := st.PutSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	ans, err := edge1.Register(ctx, nodeproto.RegisterRequest{URL: "https://127.0.0.1:1", Protocol: nodeproto.Version, LeaseTTLMillis: 15000})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ans.Instance, "edge1-") || ans.Epoch != 1 || !slices.Contains(ans.Features, nodeproto.FeatureVolumes) {
		t.Errorf("registration: instance %q, epoch %d, features %q", ans.Instance, ans.Epoch, ans.Features)
	}
	var ids []string
	for _, r := range ans.Sandboxes {
		ids = append(ids, r.ID)
	}
	if slices.Sort(ids); !slices.Equal(ids, []string{"sb-edge1-aaaaaaaaaaaaaaaa", "sb-edge1-bbbbbbbbbbbbbbbb"}) {
		t.Errorf("records the registration answered: %q; want edge1's live ones", ids)
	}
	if again, err := edge1.Register(ctx, nodeproto.RegisterRequest{URL: "https://127.0.0.1:1", Protocol: nodeproto.Version, LeaseTTLMillis: 15000}); err != nil || again.Instance != ans.Instance {
		t.Errorf("the instance name of a second registration: %v, %v; want %q kept", again, err, ans.Instance)
	}

	// The configuration: a warm environment, an fncall environment, the service catalog; and
	// the artifact limits of the fncall environment's project, asked apart.
	if _, err := st.PutEnvironment(ctx, model.Environment{Name: "py", Base: "b:1", Warm: 2, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutFncallEnv(ctx, model.FncallEnv{Name: "fn", Project: "/", Base: "b:1", PoolMin: 1, PoolMax: 2, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	catalog := []byte(`{"services":{"pypi":{"domains":["pypi.org"]}}}`)
	if err := st.PutSetting(ctx, store.CatalogSetting, catalog); err != nil {
		t.Fatal(err)
	}
	cfg := edge1.Config()
	if _, err := cfg.WarmEnvironments(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("the configuration before a fetch: %v, want ErrUnavailable", err)
	}
	if changed, err := cfg.Follow(ctx, ""); err != nil || !changed {
		t.Fatalf("first fetch: %v, %v", changed, err)
	}
	warm, _ := cfg.WarmEnvironments(ctx)
	fns, _ := cfg.ListFncallEnvs(ctx)
	if len(warm) != 1 || warm[0].Name != "py" || warm[0].Warm != 2 || len(fns) != 1 || fns[0].Name != "fn" || fns[0].ProjectID == "" {
		t.Fatalf("configuration: warm %+v, fncall %+v", warm, fns)
	}
	if limits, err := cfg.ArtifactLimits(ctx, fns[0].ProjectID); err != nil || len(limits) != 1 || limits[0].Limit != model.DefaultArtifactBytes || !slices.Contains(limits[0].Projects, fns[0].ProjectID) {
		t.Errorf("artifact limits of the fncall environment's project: %+v, %v", limits, err)
	}
	if _, err := cfg.ArtifactLimits(ctx, store.RootProjectID+"-nope"); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("artifact limits of a project without an fncall environment: %v, want ErrDenied", err)
	}
	if path, err := cfg.ProjectPath(ctx, fns[0].ProjectID); err != nil || path != "/" {
		t.Errorf("the fncall environment's project: %q, %v", path, err)
	}
	if raw, err := cfg.ServiceCatalog(ctx); err != nil || string(raw) != string(catalog) {
		t.Errorf("service catalog: %s, %v", raw, err)
	}
	hb, err := edge1.Heartbeat(ctx, 2, 15*time.Second, nil)
	if err != nil || hb.Config == "" || hb.Config != cfg.Generation() {
		t.Fatalf("heartbeat: %+v, %v; want the generation held (%s)", hb, err, cfg.Generation())
	}
	if changed, err := cfg.Follow(ctx, hb.Config); err != nil || changed {
		t.Errorf("following the generation held: %v, %v; want nothing fetched", changed, err)
	}
	// A change: an edge that made it refreshes past the replica's copy; heartbeats then name
	// the new generation.
	if _, err := st.SetEnvironmentWarm(ctx, "py", 0); err != nil {
		t.Fatal(err)
	}
	old := cfg.Generation()
	if err := cfg.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if warm, _ := cfg.WarmEnvironments(ctx); len(warm) != 0 || cfg.Generation() == old {
		t.Errorf("after the change: warm %+v, generation %s (was %s)", warm, cfg.Generation(), old)
	}
	if hb, err := edge1.Heartbeat(ctx, 2, 15*time.Second, nil); err != nil || hb.Config != cfg.Generation() {
		t.Errorf("heartbeat after the change: %+v, %v; want generation %s", hb, err, cfg.Generation())
	}

	// Trajectories: of the node's own sandboxes, by the incarnation holding the node.
	const own = "sb-edge1-aaaaaaaaaaaaaaaa"
	steps := edge1.Steps(2)
	step := &model.TrajectoryEntry{Kind: "exec", StepID: "train-1", State: model.StepRunning}
	if existing, err := steps.BeginStep(ctx, own, step); err != nil || existing != nil || step.Seq != 1 {
		t.Fatalf("begin a step: %+v, %v, seq %d", existing, err, step.Seq)
	}
	step.State = model.StepDone
	if err := steps.UpdateStep(ctx, own, step); err != nil {
		t.Fatalf("end the step: %v", err)
	}
	if existing, err := steps.BeginStep(ctx, own, &model.TrajectoryEntry{Kind: "exec", StepID: "train-1"}); err != nil || existing == nil || existing.State != model.StepDone {
		t.Errorf("the step again: %+v, %v; want the step recorded", existing, err)
	}
	logged := []store.StepWrite{{Sandbox: own, Entry: &model.TrajectoryEntry{Kind: "exec", State: model.StepDone}}, {Sandbox: own, Entry: &model.TrajectoryEntry{Kind: "write_file", State: model.StepDone}}}
	if err := steps.WriteSteps(ctx, logged); err != nil || logged[0].Entry.Seq != 2 || logged[1].Entry.Seq != 3 {
		t.Fatalf("write steps: %v, seqs %d, %d", err, logged[0].Entry.Seq, logged[1].Entry.Seq)
	}
	if err := steps.WriteSteps(ctx, []store.StepWrite{{Sandbox: "sb-edge2-aaaaaaaaaaaaaaaa", Entry: &model.TrajectoryEntry{Kind: "exec"}}}); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("a step of another node's sandbox: %v, want ErrDenied", err)
	}
	if err := edge1.Steps(1).WriteSteps(ctx, []store.StepWrite{{Sandbox: own, Entry: &model.TrajectoryEntry{Kind: "exec"}}}); !errors.Is(err, store.ErrFenced) {
		t.Errorf("a step of a fenced incarnation: %v, want ErrFenced", err)
	}
	if list, err := steps.ListSteps(ctx, own, 1, 100, ""); err != nil || len(list) != 2 || list[0].Seq != 2 {
		t.Errorf("the trajectory after step 1: %+v, %v", list, err)
	}
	if _, err := steps.ListSteps(ctx, "sb-edge2-aaaaaaaaaaaaaaaa", 0, 100, ""); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("another node's trajectory: %v, want ErrDenied", err)
	}
	// A begin whose answer broke off, made again at another replica, finds its own append and
	// takes it as its own (not as an earlier call's step).
	first := &model.TrajectoryEntry{Kind: "exec", StepID: "train-2", State: model.StepRunning, StartedAt: time.Now().UTC()}
	if ex, err := steps.BeginStep(ctx, own, first); err != nil || ex != nil {
		t.Fatalf("begin train-2: %+v, %v", ex, err)
	}
	retried := *first
	retried.Seq = 0
	if ex, err := steps.BeginStep(ctx, own, &retried); err != nil || ex != nil || retried.Seq != first.Seq {
		t.Errorf("the same begin again: existing %+v, %v, seq %d; want its own step %d", ex, err, retried.Seq, first.Seq)
	}
	later := &model.TrajectoryEntry{Kind: "exec", StepID: "train-2", State: model.StepRunning, StartedAt: time.Now().UTC().Add(time.Second)}
	if ex, err := steps.BeginStep(ctx, own, later); err != nil || ex == nil || ex.Seq != first.Seq {
		t.Errorf("another call with the step ID: %+v, %v; want the step recorded", ex, err)
	}

	// Records: what became of the node's own sandboxes, by the incarnation holding the node.
	recs := edge1.Records(2)
	rec, err := st.GetSandbox(ctx, own)
	if err != nil {
		t.Fatal(err)
	}
	rec.State = model.StatePaused
	if err := recs.PutSandbox(ctx, rec); err != nil {
		t.Fatalf("record a pause: %v", err)
	}
	if got, err := st.GetSandbox(ctx, own); err != nil || got.State != model.StatePaused {
		t.Errorf("the record after the pause: %+v, %v", got, err)
	}
	theirs := *rec
	theirs.ID, theirs.Node = "sb-edge2-aaaaaaaaaaaaaaaa", "edge2"
	if err := recs.PutSandbox(ctx, &theirs); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("another node's record: %v, want ErrDenied", err)
	}
	if err := edge1.Records(1).PutSandbox(ctx, rec); !errors.Is(err, store.ErrFenced) {
		t.Errorf("a record of a fenced incarnation: %v, want ErrFenced", err)
	}
	// Reads of a record the edge keeps no copy of (its sandbox ended): the node's own only.
	if got, err := recs.GetSandbox(ctx, own); err != nil || got.ID != own || got.State != model.StatePaused {
		t.Errorf("read the node's own record: %+v, %v", got, err)
	}
	if _, err := recs.GetSandbox(ctx, "sb-edge1-nnnnnnnnnnnnnnnn"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a record nobody made: %v, want not found", err)
	}
	if _, err := recs.GetSandbox(ctx, "sb-edge2-aaaaaaaaaaaaaaaa"); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("another node's record: %v, want ErrDenied", err)
	}

	// Volumes: those the node's own sandboxes have attached, by the incarnation holding it.
	root, err := st.GetProject(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	vol := &store.VolumeRecord{Volume: model.Volume{Name: "data", Project: "/", SizeBytes: 1 << 20, Node: "edge1", CreatedAt: time.Now().UTC()},
		ID: store.NewVolumeID(), ProjectID: root.ID, State: store.VolumeReady}
	if err := st.CreateVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
	writer := *rec
	writer.ID, writer.State, writer.ProjectID = "sb-edge1-wwwwwwwwwwwwwwww", model.StateCreating, root.ID
	writer.Volumes, writer.VolumeIDs = []model.VolumeMount{{Name: "data", Path: "/data"}}, []string{vol.ID}

	// Admission: of the node's own new sandboxes, by the incarnation holding the node, for a
	// caller the servers sealed for it that may create there; the store's refusals come back
	// typed.
	vouched := func(node string, held iam.Perm, sealer *nodeproto.Sealer) context.Context {
		return sealedFor(t, ctx, node, map[string]iam.Perm{"": held}, sealer)
	}
	foreign, err := nodeproto.NewSealer([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	adm := edge1.Admissions(2)
	key := &store.Idempotency{Principal: "root", Key: "create-1", RequestHash: "h"}
	for name, vctx := range map[string]context.Context{
		"no caller":                        ctx,
		"a caller sealed for another node": vouched("edge2", iam.SandboxCreate, srv.sealer),
		"a caller sealed with another key": vouched("edge1", iam.SandboxCreate, foreign),
		"a caller who may not create":      vouched("edge1", iam.SandboxRead, srv.sealer),
	} {
		if err := adm.AdmitSandbox(vctx, &writer, key); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("admit for %s: %v, want ErrDenied", name, err)
		}
	}
	if _, err := st.GetSandbox(ctx, writer.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused admission left a record: %v", err)
	}
	ctx = vouched("edge1", iam.SandboxCreate, srv.sealer)
	if err := adm.AdmitSandbox(ctx, &writer, key); err != nil {
		t.Fatalf("admit the writer: %v", err)
	}
	if err := adm.AdmitSandbox(ctx, &writer, key); err != nil {
		t.Errorf("the same admission again (an answer that broke off): %v", err)
	}
	var re *store.ReplayError
	if err := adm.CheckIdempotency(ctx, key); !errors.As(err, &re) || re.SandboxID != writer.ID {
		t.Errorf("the key again: %v, want a replay of %s", err, writer.ID)
	}
	fresh := func(id string) *store.Sandbox {
		c := *rec
		c.ID, c.State, c.ProjectID, c.Volumes, c.VolumeIDs = id, model.StateCreating, root.ID, nil, nil
		return &c
	}
	// A key that made another node's sandbox: its record comes with the replay, for the
	// create's own caller only (the key's principal, sealed for this node).
	replayed := fresh("sb-edge2-kkkkkkkkkkkkkkkk")
	replayed.Node = "edge2"
	theirKey := &store.Idempotency{Principal: "root", Key: "create-2", RequestHash: "h"}
	if err := st.AdmitSandbox(ctx, replayed, theirKey); err != nil {
		t.Fatal(err)
	}
	if err := adm.CheckIdempotency(ctx, theirKey); !errors.As(err, &re) || re.Record == nil || re.Record.ID != replayed.ID {
		t.Errorf("a replay of another node's sandbox: %v (record %+v), want its record", err, re.Record)
	}
	if err := adm.AdmitSandbox(ctx, fresh("sb-edge1-kakakakakakakaka"), theirKey); !errors.As(err, &re) || re.Record == nil || re.Record.ID != replayed.ID {
		t.Errorf("an admission replaying another node's sandbox: %v, want its record", err)
	}
	otherKey := &store.Idempotency{Principal: "someone", Key: "create-2", RequestHash: "h"}
	if err := st.AdmitSandbox(ctx, fresh("sb-edge2-kbkbkbkbkbkbkbkb"), otherKey); err != nil {
		t.Fatal(err)
	}
	if err := adm.CheckIdempotency(ctx, otherKey); !errors.As(err, &re) || re.Record != nil {
		t.Errorf("a replay of another principal's key: %v, record %+v; want the sandbox's ID alone", err, re.Record)
	}
	if err := adm.CheckIdempotency(context.Background(), theirKey); !errors.As(err, &re) || re.Record != nil {
		t.Errorf("a replay without the create's caller: %v, record %+v; want the sandbox's ID alone", err, re.Record)
	}
	if err := adm.AdmitSandbox(ctx, fresh("sb-edge1-kkkkkkkkkkkkkkkk"), key); !errors.As(err, &re) || re.SandboxID != writer.ID {
		t.Errorf("another create with the key: %v, want a replay of %s", err, writer.ID)
	}
	stolen := fresh("sb-edge2-ssssssssssssssss")
	stolen.Node = "edge2"
	if err := adm.AdmitSandbox(ctx, stolen, nil); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("admit another node's sandbox: %v, want ErrDenied", err)
	}
	if err := adm.ReleaseIdempotency(ctx, key, "sb-edge2-aaaaaaaaaaaaaaaa"); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("release a key for another node's sandbox: %v, want ErrDenied", err)
	}
	if err := edge1.Admissions(1).AdmitSandbox(ctx, fresh("sb-edge1-ffffffffffffffff"), nil); !errors.Is(err, store.ErrFenced) {
		t.Errorf("an admission of a fenced incarnation: %v, want ErrFenced", err)
	}
	if err := adm.AdmitSandboxes(ctx, []*store.Sandbox{fresh("sb-edge1-cacacacacacacaca"), fresh("sb-edge1-cbcbcbcbcbcbcbcb")}); err != nil {
		t.Errorf("a fork's copies: %v", err)
	}
	// An fncall environment's pool container needs no caller, in the environment's project
	// only (fn's is the root).
	pooled := fresh("sb-edge1-fnfnfnfnfnfnfnfn")
	pooled.Tier = "fncall"
	if err := adm.AdmitSandbox(context.Background(), pooled, nil); err != nil {
		t.Errorf("an fncall pool's container: %v", err)
	}
	elsewhere := fresh("sb-edge1-fmfmfmfmfmfmfmfm")
	elsewhere.Tier, elsewhere.ProjectID = "fncall", "p-nowhere"
	if err := adm.AdmitSandbox(context.Background(), elsewhere, nil); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("fncall containers in a project without an fncall environment: %v, want ErrDenied", err)
	}
	if _, err := st.SetQuota(ctx, "", model.Quota{Sandboxes: new(int64(1))}); err != nil {
		t.Fatal(err)
	}
	var qe *iam.QuotaError
	if err := adm.AdmitSandbox(ctx, fresh("sb-edge1-qqqqqqqqqqqqqqqq"), nil); !errors.As(err, &qe) || qe.Resource != "sandboxes" {
		t.Errorf("an admission over the quota: %v, want a quota error", err)
	}
	if _, err := st.SetQuota(ctx, "", model.Quota{}); err != nil {
		t.Fatal(err)
	}
	vols := edge1.Volumes(2)
	if got, err := vols.AttachedVolume(ctx, writer.ID, vol.ID); err != nil || got.Version != 0 || got.SizeBytes != vol.SizeBytes {
		t.Fatalf("the writer's volume: %+v, %v", got, err)
	}
	if _, err := vols.AttachedVolume(ctx, "sb-edge2-aaaaaaaaaaaaaaaa", vol.ID); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("a volume for another node's sandbox: %v, want ErrDenied", err)
	}
	if err := vols.CommitVolume(ctx, writer.ID, vol.ID, 1, "not a digest"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a commit without a digest: %v, want invalid", err)
	}
	digest := strings.Repeat("0f", 32)
	if err := edge1.Volumes(1).CommitVolume(ctx, writer.ID, vol.ID, 1, digest); !errors.Is(err, store.ErrFenced) {
		t.Errorf("a commit of a fenced incarnation: %v, want ErrFenced", err)
	}
	if err := vols.CommitVolume(ctx, writer.ID, vol.ID, 1, digest); err != nil {
		t.Fatalf("commit version 1: %v", err)
	}
	if err := vols.RecordVolumeCopy(ctx, writer.ID, vol.ID, 1); err != nil {
		t.Fatalf("record the copy: %v", err)
	}
	if got, err := vols.VolumeVersions(ctx, []string{vol.ID, "vol-0000000000000000"}); err != nil || len(got) != 1 || got[vol.ID] != 1 {
		t.Errorf("volume versions: %v, %v; want %s at 1 alone", got, err, vol.ID)
	}

	// Layer blobs in use, for an edge's GC: named by a published version, or in the rootfs of
	// a live sandbox of any node.
	if _, _, err := st.PublishLayer(ctx, model.Layer{Name: "base", Version: "1", Kind: model.KindBase, Digest: "sha256:published"}); err != nil {
		t.Fatal(err)
	}
	other := writer
	other.ID, other.Node, other.Lower, other.Volumes, other.VolumeIDs = "sb-edge2-rrrrrrrrrrrrrrrr", "edge2", []string{"sha256:rootfs"}, nil, nil
	if err := st.AdmitSandbox(ctx, &other, nil); err != nil {
		t.Fatal(err)
	}
	used, err := edge1.Digests().DigestsInUse(ctx, []string{"sha256:published", "sha256:rootfs", "sha256:unused"})
	if err != nil || len(used) != 2 || !used["sha256:published"] || !used["sha256:rootfs"] {
		t.Errorf("digests in use: %v, %v; want the published one and the other node's sandbox's", used, err)
	}

	// Resolution: for a caller sealed for the node that may create there, or for what the edge
	// starts on its own; a refusal keeps its field.
	cat := edge1.Catalog()
	res, err := cat.Resolve(ctx, model.CreateRequest{Base: "base:1"}, false)
	if err != nil || !slices.Equal(res.Digests, []string{"sha256:published"}) || res.ProjectID != root.ID || res.Tier != "container" {
		t.Errorf("resolve for a caller who may create: %+v, %v", res, err)
	}
	if _, err := cat.Resolve(ctx, model.CreateRequest{Base: "base:2"}, false); !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != "base" ||
		err.Error() != "base: layer base:2 is not published (see `corral layer ls`)" {
		t.Errorf("resolve a layer not published: %v, want the store's own error", err)
	}
	for name, vctx := range map[string]context.Context{
		"no caller":                        context.Background(),
		"a caller sealed for another node": vouched("edge2", iam.SandboxCreate, srv.sealer),
		"a caller who may not create":      vouched("edge1", iam.SandboxRead, srv.sealer),
	} {
		if _, err := cat.Resolve(vctx, model.CreateRequest{Base: "base:1"}, false); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("resolve for %s: %v, want ErrDenied", name, err)
		}
	}
	if _, err := cat.Resolve(context.Background(), model.CreateRequest{Base: "base:1"}, true); err != nil {
		t.Errorf("resolve an fncall pool's container (fn is the root's): %v", err)
	}
	if _, err := cat.Resolve(context.Background(), model.CreateRequest{Project: "/p", Base: "base:1"}, true); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("resolve an fncall container where no fncall environment is: %v, want ErrDenied", err)
	}
	// A warm environment's pooled sandbox (py's base is not published: past the check, the
	// store's refusal).
	if _, err := st.SetEnvironmentWarm(ctx, "py", 2); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := cat.Resolve(context.Background(), model.CreateRequest{Environment: "py"}, false)
		if errors.Is(err, errdefs.ErrInvalid) && errdefs.Field(err) == "base" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("resolve a warm environment's pooled sandbox: %v, want past the check", err)
			break
		}
	}
	if _, err := cat.Resolve(context.Background(), model.CreateRequest{Environment: "other"}, false); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("resolve an environment that is not warm without a caller: %v, want ErrDenied", err)
	}
}

func TestSweepAfter(t *testing.T) {
	now := time.Now()
	nodes := []model.Node{
		{Name: "a", State: model.NodeReady, HeartbeatAt: now, LeaseExpiresAt: now.Add(15 * time.Second)},
		{Name: "b", State: model.NodeDraining, HeartbeatAt: now, LeaseExpiresAt: now.Add(40 * time.Second)},
		{Name: "c", State: model.NodeLost, HeartbeatAt: now, LeaseExpiresAt: now.Add(time.Hour)},
	}
	if got := sweepAfter(nodes); got != 40*time.Second {
		t.Errorf("sweepAfter = %v, want 40s (the longest lease of a node not lost)", got)
	}
	nodes[1].LeaseExpiresAt = now.Add(time.Hour)
	nodes[1].State = model.NodeReady
	if got := sweepAfter(nodes); got != nodeproto.MaxLeaseTTL {
		t.Errorf("sweepAfter = %v, want the bound %v", got, nodeproto.MaxLeaseTTL)
	}
	if got := sweepAfter(nil); got != 0 {
		t.Errorf("sweepAfter of no nodes = %v", got)
	}
}

// TestRecordsOfEndedSandboxes: a replica answers the record of a sandbox that ended from the
// store, with the caller's permission checked as the edge would, without its edge; a live
// sandbox's record is its edge's to answer, or the store's as last written when the edge
// cannot be reached.
func TestRecordsOfEndedSandboxes(t *testing.T) {
	ctx := context.Background()
	st, _, hs, dir := nodeChannelReplica(t)
	j, err := Join(ctx, hs.URL, filepath.Join(dir, "join.token"), "edge1")
	if err != nil {
		t.Fatal(err)
	}
	// Registered at an address nothing answers: its edge is unreachable.
	if _, err := j.Servers.Register(ctx, nodeproto.RegisterRequest{URL: "https://127.0.0.1:1", Protocol: nodeproto.Version, LeaseTTLMillis: 60000}); err != nil {
		t.Fatal(err)
	}
	admin, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	c := corral.New(hs.URL, strings.TrimSpace(string(admin)))
	for _, p := range []string{"team", "other"} {
		if _, err := c.CreateProject(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	team, err := st.GetProject(ctx, "team")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	put := func(id, state string) {
		t.Helper()
		rec := &store.Sandbox{Sandbox: model.Sandbox{ID: id, Node: "edge1", Tier: "container", State: state, CreatedAt: at, ExpiresAt: at.Add(time.Hour)}, ProjectID: team.ID}
		if state == model.StateStopped {
			rec.Reason, rec.EndedAt = model.ReasonDeleted, at
		}
		if err := st.PutSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	const ended, live = "sb-edge1-eeeeeeeeeeeeeeee", "sb-edge1-llllllllllllllll"
	put(ended, model.StateStopped)
	put(live, model.StateRunning)
	if got, err := c.GetSandbox(ctx, ended); err != nil || got.State != model.StateStopped || got.Project != "team" {
		t.Fatalf("an ended sandbox's record, its edge unreachable: %+v, %v", got, err)
	}
	// A live one's is its edge's; when the edge cannot be reached, the replica answers it as
	// the store last had it.
	if got, err := c.GetSandbox(ctx, live); err != nil || got.State != model.StateRunning {
		t.Fatalf("a live sandbox's record, its edge unreachable: %+v, %v", got, err)
	}
	tok, err := c.CreateToken(ctx, corral.TokenRequest{Project: "other", Role: model.RoleUser, Kind: "agent", Name: "elsewhere", TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	var apiErr *corral.APIError
	if _, err := corral.New(hs.URL, tok.Token).GetSandbox(ctx, ended); !errors.As(err, &apiErr) || (apiErr.Status != 403 && apiErr.Status != 404) {
		t.Errorf("another project's token reads the ended record: %v, want refused", err)
	}
	if _, err := c.GetSandbox(ctx, "sb-edge1-nnnnnnnnnnnnnnnn"); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("a sandbox with no record: %v, want 404", err)
	}
}
