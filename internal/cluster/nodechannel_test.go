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
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestNodeChannel: edges joined through a replica register, heartbeat and record events over
// the node channel as the node their certificate names, and nothing they send speaks for
// another node or a fenced incarnation.
func TestNodeChannel(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, dsn, dir, _ := bootstrapped(t, log)
	s := testServer(t, st, Config{DataDir: dir, Store: dsn}, log)
	nodes := httptest.NewUnstartedServer(s.nodeHandler())
	nodes.TLS = s.nodeTLS
	nodes.StartTLS()
	defer nodes.Close()
	s.nodePort = nodes.Listener.Addr().(*net.TCPAddr).Port
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()

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
	if state, err := edge1.Heartbeat(ctx, 1, 15*time.Second); err != nil || state != store.NodeReady {
		t.Fatalf("heartbeat: %q, %v", state, err)
	}
	// An operator drains the node: the next heartbeat says so.
	if _, err := st.SetNodeState(ctx, "edge1", store.NodeDraining); err != nil {
		t.Fatal(err)
	}
	if state, err := edge1.Heartbeat(ctx, 1, 15*time.Second); err != nil || state != store.NodeDraining {
		t.Fatalf("heartbeat of a drained node: %q, %v", state, err)
	}
	// A new incarnation fences the old one: its heartbeat is refused as a stale epoch.
	n1, err = edge1.Register(ctx, reg)
	if err != nil || n1.Epoch != 2 || n1.State != store.NodeDraining {
		t.Fatalf("register edge1 again: %+v, %v", n1, err)
	}
	if _, err := edge1.Heartbeat(ctx, 1, 15*time.Second); !errors.Is(err, store.ErrFenced) {
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
	rec := &store.Sandbox{Sandbox: corral.Sandbox{ID: "sb-edge1-bbbbbbbbbbbbbbbb", Node: "edge1", Tier: "container",
		State: corral.StateRunning, CreatedAt: at, ExpiresAt: at.Add(time.Hour)}}
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
	if _, err := edge2.Heartbeat(ctx, 1, 15*time.Second); err != nil {
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

func TestSweepAfter(t *testing.T) {
	now := time.Now()
	nodes := []corral.Node{
		{Name: "a", State: corral.NodeReady, HeartbeatAt: now, LeaseExpiresAt: now.Add(15 * time.Second)},
		{Name: "b", State: corral.NodeDraining, HeartbeatAt: now, LeaseExpiresAt: now.Add(40 * time.Second)},
		{Name: "c", State: corral.NodeLost, HeartbeatAt: now, LeaseExpiresAt: now.Add(time.Hour)},
	}
	if got := sweepAfter(nodes); got != 40*time.Second {
		t.Errorf("sweepAfter = %v, want 40s (the longest lease of a node not lost)", got)
	}
	nodes[1].LeaseExpiresAt = now.Add(time.Hour)
	nodes[1].State = corral.NodeReady
	if got := sweepAfter(nodes); got != nodeproto.MaxLeaseTTL {
		t.Errorf("sweepAfter = %v, want the bound %v", got, nodeproto.MaxLeaseTTL)
	}
	if got := sweepAfter(nil); got != 0 {
		t.Errorf("sweepAfter of no nodes = %v", got)
	}
}
