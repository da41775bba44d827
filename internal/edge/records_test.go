package edge

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// TestOwnRecordsFollowTheStore: the edge's copy of its records (what its reads of own records
// and of the node's usage answer from) says what the store says after every kind of change:
// creates that fit and ones the node refuses, a failed create, pause, resume, a TTL change, a
// delete before and after its cleanup, a project moved, and a restart.
func TestOwnRecordsFollowTheStore(t *testing.T) {
	rt := newFakeRuntime()
	ctx := context.Background()
	st := newTestStore(t)
	start := func() *Edge {
		t.Helper()
		cfg := Config{Capacity: &store.Resources{CPUs: 4, MemoryBytes: 8 << 30, Sandboxes: 4}, AgentPath: "/agent", ReapInterval: time.Hour}
		e, err := New(cfg, slog.New(slog.DiscardHandler), st, rt, newFakeLayers())
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := start()
	// same compares the copy with the store; settling names a sandbox whose cleanup may be
	// under way (its record changes meanwhile), left out of the records' comparison.
	same := func(when string, e *Edge, settling ...string) {
		t.Helper()
		want, err := st.NodeUsage(ctx, e.Node())
		if err != nil {
			t.Fatal(err)
		}
		if got := e.nodeUsage(); got != want {
			t.Errorf("%s: the node's usage from the edge's copy is %+v, the store's %+v", when, got, want)
		}
		recs, err := st.ListSandboxes(ctx, store.SandboxFilter{Node: e.Node()})
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			if slices.Contains(settling, rec.ID) {
				continue
			}
			held, ok := e.own.get(rec.ID)
			if ended(rec) {
				if ok {
					t.Errorf("%s: the edge still holds %s, which ended (%s)", when, rec.ID, rec.State)
				}
				continue
			}
			if !ok {
				t.Errorf("%s: the edge holds no record of %s (%s)", when, rec.ID, rec.State)
				continue
			}
			// The store's last activity is the later of the record's and the activity flushed
			// apart; the edge answers a live sandbox's from memory.
			held.LastActivityAt, rec.LastActivityAt = time.Time{}, time.Time{}
			a, _ := json.Marshal(held)
			b, _ := json.Marshal(rec)
			if string(a) != string(b) {
				t.Errorf("%s: the edge's record of %s differs from the store's:\n edge  %s\n store %s", when, rec.ID, a, b)
			}
		}
	}
	small := model.Limits{CPUs: 0.5, MemoryBytes: 1 << 30}
	a, err := e.Create(ctx, model.CreateRequest{Base: "base:1", Limits: small})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Create(ctx, model.CreateRequest{Base: "base:1", Limits: model.Limits{CPUs: 1, MemoryBytes: 2 << 30}, TTL: "10m"})
	if err != nil {
		t.Fatal(err)
	}
	same("two creates", e)
	rt.failing = errors.New("the runtime broke")
	if _, err := e.Create(ctx, model.CreateRequest{Base: "base:1", Limits: small}); err == nil {
		t.Fatal("a create the runtime failed succeeded")
	}
	rt.failing = nil
	same("a failed create", e)
	if _, err := e.Create(ctx, model.CreateRequest{Base: "base:1", Limits: model.Limits{CPUs: 3, MemoryBytes: 1 << 30}}); err == nil {
		t.Fatal("a create past the node's CPUs was admitted")
	}
	same("a create the node refused", e)
	if _, err := e.Pause(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	same("a pause", e)
	if _, err := e.Resume(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.SetTTL(ctx, b.ID, "30m"); err != nil {
		t.Fatal(err)
	}
	same("a resume and a TTL change", e)
	if _, err := e.Delete(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	// The delete answered; its cleanup (which ends the record) runs on: whichever it is at,
	// deleting or stopped, counts nothing, and the other records stay as they were.
	same("a delete", e, b.ID)
	if err := e.WaitCleanups(ctx); err != nil {
		t.Fatal(err)
	}
	same("a delete's cleanup", e)
	if got, err := e.Get(ctx, b.ID); err != nil || got.State != model.StateStopped {
		t.Fatalf("an ended sandbox's record (from the store): %+v, %v", got, err)
	}
	// A project's path changes under its sandboxes' records: the API server says so per request.
	e.NoteProject(a.ID, "team/moved")
	if got, err := e.Get(ctx, a.ID); err != nil || got.Project != "team/moved" {
		t.Fatalf("the record after its project moved: %+v, %v", got, err)
	}
	e.NoteProject(a.ID, "")
	if got, _ := e.Get(ctx, a.ID); got.Project != "/" {
		t.Fatalf("the record of a sandbox of the root project: project %q", got.Project)
	}
	same("the project noted", e)

	// A restart loads the copy from the store's records.
	e.Close()
	e2 := start()
	defer e2.Close()
	same("a restart", e2)
	if got, err := e2.Get(ctx, a.ID); err != nil || got.State != model.StateRunning {
		t.Fatalf("after the restart: %+v, %v", got, err)
	}
}

// TestRecordCopies: what the edge's copy hands out and takes in are copies: a caller changing a
// record it read, or one it wrote, changes nothing held.
func TestRecordCopies(t *testing.T) {
	o := newOwnRecords()
	slot := 7
	rec := &store.Sandbox{Sandbox: model.Sandbox{ID: "sb-a", State: model.StateRunning, Labels: map[string]string{"k": "v"}}, NetSlot: &slot, Lower: []string{"sha256:b"}}
	o.put(rec)
	rec.Labels["k"], *rec.NetSlot, rec.Lower[0] = "changed", 8, "changed"
	got, _ := o.get("sb-a")
	if got.Labels["k"] != "v" || *got.NetSlot != 7 || got.Lower[0] != "sha256:b" {
		t.Fatalf("a change to the record written reached the copy: %+v", got)
	}
	got.Labels["k"] = "again"
	if again, _ := o.get("sb-a"); again.Labels["k"] != "v" {
		t.Fatal("a change to a record read reached the copy")
	}
	rec.State = model.StateFailed
	o.put(rec)
	if _, ok := o.get("sb-a"); ok {
		t.Fatal("an ended sandbox's record is still held")
	}
}

// TestStorelessConfig: an edge given no store (a cluster's) is refused unless the servers stand
// in for everything the store would give, and the refusal names each missing part.
func TestStorelessConfig(t *testing.T) {
	_, err := New(Config{Node: "n1", AgentPath: "/agent", Settings: storeSettings{}}, slog.Default(), nil, nil, nil)
	if err == nil {
		t.Fatal("an edge without a store and without the servers' parts was made")
	}
	_, lacks, _ := strings.Cut(err.Error(), "lacks ")
	want := "Admissions, Trajectory, Records, RecordReader, Catalog, CatalogReader, Publisher, VolumeCatalog, LayerUse, Activity, Instance, OwnRecords, SharedStore"
	if lacks != want {
		t.Errorf("the refusal names %q as missing, want %q (Settings was given)", lacks, want)
	}
}
