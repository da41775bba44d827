package store

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store/pgtest"
)

// TestNodeLeases checks the node lifecycle: incarnations and their epochs, fencing of an old
// incarnation's heartbeats and writes, cordon and drain surviving a restart, and a lost node's
// sandboxes failing with their quota given back.
func TestNodeLeases(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		node := Node{Name: "edge-1", URL: "http://127.0.0.2:7071", Capacity: Resources{CPUs: 8, Sandboxes: 100},
			Labels: map[string]string{"kvm": "true"}, Tiers: []string{"container"}, Runtimes: []string{"runc"}}
		first, err := s.Register(ctx, node, time.Minute)
		if err != nil || first.Epoch != 1 || first.State != NodeReady || first.Labels["kvm"] != "true" {
			t.Fatalf("register: %+v, %v", first, err)
		}
		second, err := s.Register(ctx, node, time.Minute)
		if err != nil || second.Epoch != 2 {
			t.Fatalf("register again: %+v, %v", second, err)
		}
		if _, err := s.Heartbeat(ctx, "edge-1", 1, Resources{}, time.Minute, nil); !errors.Is(err, ErrFenced) {
			t.Fatalf("heartbeat of the old incarnation: %v", err)
		}
		if state, err := s.Heartbeat(ctx, "edge-1", 2, Resources{CPUs: 1, Sandboxes: 1}, time.Minute, nil); err != nil || state != NodeReady {
			t.Fatalf("heartbeat: %q, %v", state, err)
		}
		if _, err := s.SetNodeState(ctx, "edge-1", NodeCordoned); err != nil {
			t.Fatal(err)
		}
		if n, err := s.Register(ctx, node, time.Minute); err != nil || n.State != NodeCordoned || n.Epoch != 3 {
			t.Fatalf("a cordoned node restarting: %+v, %v", n, err)
		}
		// The edge learns its state from its heartbeats (a draining edge winds its pools down).
		if state, err := s.Heartbeat(ctx, "edge-1", 3, Resources{}, time.Minute, nil); err != nil || state != NodeCordoned {
			t.Fatalf("heartbeat of a cordoned node: %q, %v", state, err)
		}
		if _, err := s.SetNodeState(ctx, "edge-1", NodeReady); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SetNodeState(ctx, "edge-9", NodeReady); err == nil {
			t.Error("set the state of a missing node")
		}
		// A sandbox on the node, in a project with a quota of one.
		p := mustProject(t, s, "p")
		if _, err := s.SetQuota(ctx, "p", model.Quota{Sandboxes: ptr[int64](1)}); err != nil {
			t.Fatal(err)
		}
		sb := newRecord(p.ID, 0)
		sb.Node = "edge-1"
		if err := s.AdmitSandbox(ctx, sb, nil); err != nil {
			t.Fatal(err)
		}
		sb.State = model.StateRunning
		if err := s.PutNodeSandbox(ctx, "edge-1", 3, sb); err != nil {
			t.Fatal(err)
		}
		// Another node, registered in the API's types (as internal/cluster's tests do).
		if _, err := s.Register(ctx, Node{Name: "edge-2", URL: "http://127.0.0.3:7071"}, time.Hour); err != nil {
			t.Fatal(err)
		}
		// The lease runs out; the sweep declares the node lost.
		if _, err := s.Register(ctx, node, -time.Second); err != nil { // epoch 4, already expired
			t.Fatal(err)
		}
		lost, failed, err := s.SweepLostNodes(ctx, 0)
		if err != nil || len(lost) != 1 || lost[0] != "edge-1" || failed != 1 {
			t.Fatalf("sweep: %v %d %v", lost, failed, err)
		}
		got, err := s.GetSandbox(ctx, sb.ID)
		if err != nil || got.State != model.StateFailed || got.Reason != model.ReasonNodeLost {
			t.Fatalf("the lost node's sandbox: %+v, %v", got, err)
		}
		if q, err := s.GetQuota(ctx, "p"); err != nil || q.Usage.Sandboxes != 0 {
			t.Fatalf("quota after the loss: %+v, %v", q, err)
		}
		// The old incarnation wakes up: it can neither heartbeat nor write.
		if _, err := s.Heartbeat(ctx, "edge-1", 4, Resources{}, time.Minute, nil); !errors.Is(err, ErrFenced) {
			t.Errorf("heartbeat after the loss: %v", err)
		}
		sb.State = model.StateRunning
		if err := s.PutNodeSandbox(ctx, "edge-1", 4, sb); !errors.Is(err, ErrFenced) {
			t.Errorf("a write after the loss: %v", err)
		}
		late := newRecord(p.ID, 0)
		late.ID, late.Node = "sb-edge-1-aaaaaaaaaaaaaaaa", "edge-1"
		if err := s.AdmitNodeSandbox(ctx, "edge-1", 4, late, nil); !errors.Is(err, ErrFenced) {
			t.Errorf("an admission after the loss: %v", err)
		}
		if _, err := s.SetNodeState(ctx, "edge-1", NodeReady); err == nil {
			t.Error("uncordoned a lost node")
		}
		nodes, err := s.ListNodes(ctx)
		if err != nil || len(nodes) != 2 || nodes[0].State != NodeLost || nodes[1].State != NodeReady {
			t.Fatalf("nodes: %+v, %v", nodes, err)
		}
		// It registers again: a new incarnation, ready.
		if n, err := s.Register(ctx, node, time.Minute); err != nil || n.State != NodeReady || n.Epoch != 6 {
			t.Fatalf("re-register after the loss: %+v, %v", n, err)
		}
	})
}

// TestSweepNotHeldByAQuietSession: a node whose client took its row lock in a transaction and
// then went quiet (an edge cut off between its SELECT ... FOR UPDATE and its COMMIT) is still
// declared lost: PostgreSQL ends the idle session (pgIdleInTransaction) and its lock with it,
// instead of keeping both until TCP notices the dead peer.
func TestSweepNotHeldByAQuietSession(t *testing.T) {
	s, err := Open(context.Background(), pgtest.NewDB(t)) // skips where PostgreSQL is missing
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if _, err := s.Register(ctx, Node{Name: "edge-q", URL: "http://127.0.0.4:7071"}, -time.Second); err != nil {
		t.Fatal(err)
	}
	// The quiet client: a connection of the store's own pool (so with its session settings) that
	// locks the row and then sends nothing more, as a partitioned edge would.
	c, err := s.db.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, `SELECT name FROM nodes WHERE name = 'edge-q' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	lost, _, err := s.SweepLostNodes(sctx, 0)
	if err != nil || len(lost) != 1 || lost[0] != "edge-q" {
		t.Fatalf("sweep with the node's row locked by a quiet session: %v, %v; want edge-q lost", lost, err)
	}
}

// TestNodeConversion: the store's Node and Resources are the API's, field for field and tag for
// tag (a field added on one side only fails here, where apiNode and nodeOf would drop it); the
// conversions keep every field; a node's document is byte for byte what it was when the store
// kept the API's type; and the node and live states are the API's.
func TestNodeConversion(t *testing.T) {
	for _, c := range []struct{ ours, api reflect.Type }{
		{reflect.TypeFor[Node](), reflect.TypeFor[model.Node]()},
		{reflect.TypeFor[Resources](), reflect.TypeFor[model.Resources]()},
	} {
		if c.ours.NumField() != c.api.NumField() {
			t.Errorf("%v has %d fields, the API's %v %d", c.ours, c.ours.NumField(), c.api, c.api.NumField())
			continue
		}
		for i := range c.ours.NumField() {
			f, g := c.ours.Field(i), c.api.Field(i)
			if f.Name != g.Name || f.Tag != g.Tag {
				t.Errorf("%v field %d is %s `%s`, the API's %s `%s`", c.ours, i, f.Name, f.Tag, g.Name, g.Tag)
			}
		}
	}
	at := time.Unix(1, 5).UTC()
	full := Node{Name: "edge-1", URL: "https://127.0.0.2:7071", State: NodeDraining, Epoch: 3,
		Capacity: Resources{CPUs: 8, MemoryBytes: 1 << 34, DiskBytes: 1 << 40, Sandboxes: 100},
		Used:     Resources{CPUs: 0.5, MemoryBytes: 1 << 20, DiskBytes: 1 << 30, Sandboxes: 1},
		Labels:   map[string]string{"kvm": "true"}, Tiers: []string{"container"}, Runtimes: []string{"runc"},
		HeartbeatAt: at, LeaseExpiresAt: at.Add(time.Minute), RegisteredAt: at.Add(-time.Hour)}
	for _, n := range []Node{full, {}} {
		if back := nodeOf(apiNode(n)); !reflect.DeepEqual(back, n) {
			t.Errorf("nodeOf(apiNode(%+v)) = %+v", n, back)
		}
		a, _ := json.Marshal(n)
		b, _ := json.Marshal(apiNode(n))
		if string(a) != string(b) {
			t.Errorf("Node's JSON differs from the API's:\nstore %s\nAPI   %s", a, b)
		}
		doc, err := nodeDoc(n)
		api, _ := json.Marshal(model.Node{Capacity: model.Resources(n.Capacity), Used: model.Resources(n.Used),
			Labels: n.Labels, Tiers: n.Tiers, Runtimes: n.Runtimes})
		if err != nil || doc != string(api) {
			t.Errorf("nodeDoc = %s, %v; want the API type's %s", doc, err, api)
		}
	}
	for _, c := range [][2]string{{NodeReady, model.NodeReady}, {NodeCordoned, model.NodeCordoned},
		{NodeDraining, model.NodeDraining}, {NodeLost, model.NodeLost}} {
		if c[0] != c[1] {
			t.Errorf("node state %q, want the API's %q", c[0], c[1])
		}
	}
	if want := []string{model.StateCreating, model.StateRunning, model.StatePaused, model.StateOff}; !slices.Equal(LiveStates(), want) {
		t.Errorf("LiveStates() = %v, want %v", LiveStates(), want)
	}
}

// TestServersAnnounced checks the replica registry edges learn the node channel from: one URL
// per replica, each listed once, those not seen lately left out, a stopped replica forgotten.
func TestServersAnnounced(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		for _, r := range []struct{ name, url string }{
			{"a", "https://10.0.0.1:7071"}, {"b", "https://10.0.0.2:7071"}, {"c", "https://svc:7071"},
			{"d", "https://svc:7071"}, {"e", ""}, {"gone", "https://10.0.0.3:7071"},
		} {
			if err := s.AnnounceServer(ctx, r.name, r.url); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.db.ExecContext(ctx, `UPDATE servers SET seen_ns = ? WHERE name = 'gone'`, time.Now().Add(-time.Hour).UnixNano()); err != nil {
			t.Fatal(err)
		}
		want := []string{"https://10.0.0.1:7071", "https://10.0.0.2:7071", "https://svc:7071"}
		if got, err := s.ServerURLs(ctx, time.Now().Add(-time.Minute)); err != nil || !slices.Equal(got, want) {
			t.Errorf("server URLs: %q, %v; want %q", got, err, want)
		}
		// A replica that stops forgets itself, and the long gone with it.
		if err := s.ForgetServer(ctx, "a", time.Now().Add(-30*time.Minute)); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM servers`).Scan(&n); err != nil || n != 4 {
			t.Errorf("%d replicas left, %v; want b, c, d and e", n, err)
		}
	})
}

// TestWarmFigures: each heartbeat replaces its node's pool figures; WarmFigures sums them by
// environment over the nodes that are not lost.
func TestWarmFigures(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		for _, name := range []string{"edge-1", "edge-2"} {
			if _, err := s.Register(ctx, Node{Name: name, URL: "http://127.0.0.2:7071"}, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := s.WarmFigures(ctx); err != nil || len(got) != 0 {
			t.Fatalf("figures before any heartbeat: %v, %v", got, err)
		}
		beat := func(node string, warm map[string]WarmFigures) {
			t.Helper()
			if _, err := s.Heartbeat(ctx, node, 1, Resources{}, time.Minute, warm); err != nil {
				t.Fatal(err)
			}
		}
		beat("edge-1", map[string]WarmFigures{"py": {Ready: 1, Target: 2, Hits: 3, Claims: 4}, "node": {Ready: 1, Target: 1}})
		beat("edge-2", map[string]WarmFigures{"py": {Ready: 2, Target: 2, Hits: 1, Claims: 1}})
		got, err := s.WarmFigures(ctx)
		if err != nil || got["py"] != (WarmFigures{Ready: 3, Target: 4, Hits: 4, Claims: 5}) || got["node"] != (WarmFigures{Ready: 1, Target: 1}) || len(got) != 2 {
			t.Fatalf("summed figures: %v, %v", got, err)
		}
		// A heartbeat replaces the node's figures: a pool gone is gone from the sum.
		beat("edge-1", nil)
		if got, err := s.WarmFigures(ctx); err != nil || got["py"] != (WarmFigures{Ready: 2, Target: 2, Hits: 1, Claims: 1}) || len(got) != 1 {
			t.Fatalf("figures after edge-1's pools went: %v, %v", got, err)
		}
		// A lost node's figures are left out.
		if _, err := s.db.ExecContext(ctx, `UPDATE nodes SET state = ? WHERE name = ?`, NodeLost, "edge-2"); err != nil {
			t.Fatal(err)
		}
		if got, err := s.WarmFigures(ctx); err != nil || len(got) != 0 {
			t.Fatalf("figures with edge-2 lost: %v, %v", got, err)
		}
	})
}
