package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

// TestPutNodeSandbox: a node's incarnation rewrites its own admitted records only while it holds
// the node; what admission decided (project, tier, limits, node, create time) stays as stored
// whatever the write says, so the project's usage moves only with the sandbox's state, and an
// ended sandbox stays ended.
func TestPutNodeSandbox(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		team, other := mustProject(t, s, "team"), mustProject(t, s, "other")
		if _, err := s.Register(ctx, Node{Name: "n1", URL: "https://127.0.0.1:1"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		at := time.Now().UTC().Truncate(time.Second)
		rec := &Sandbox{Sandbox: model.Sandbox{ID: "sb-n1-aaaaaaaaaaaaaaaa", Node: "n1", Tier: "container", State: model.StateCreating,
			Limits: model.Limits{CPUs: 1, MemoryBytes: 256 << 20}, CreatedAt: at, ExpiresAt: at.Add(time.Hour)}, ProjectID: team.ID}
		if err := s.PutSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
		usage := func(p *ProjectRecord) model.Usage { return projectUsage(t, s, p) }
		// Running, with the project, tier and limits tampered with: the state is taken, the rest
		// kept.
		forged := *rec
		forged.State, forged.ProjectID, forged.Tier, forged.Node = model.StateRunning, other.ID, "fncall", "n2"
		forged.Limits = model.Limits{CPUs: 0.01, MemoryBytes: 1 << 20}
		forged.CreatedAt = at.Add(-24 * time.Hour)
		if err := s.PutNodeSandbox(ctx, "n1", 1, &forged); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetSandbox(ctx, rec.ID)
		if err != nil || got.State != model.StateRunning || got.ProjectID != team.ID || got.Tier != "container" || got.Node != "n1" ||
			got.Limits.CPUs != 1 || !got.CreatedAt.Equal(at) {
			t.Fatalf("record after a tampered write: %+v, %v", got, err)
		}
		if u := usage(team); u.Sandboxes != 1 || u.CPUs != 1 {
			t.Errorf("team's usage: %+v, want the sandbox and its CPU", u)
		}
		if u := usage(other); u.Sandboxes != 0 {
			t.Errorf("other's usage: %+v, want none", u)
		}
		// Refusals: another node's record, one never admitted, a fenced incarnation.
		if err := s.PutNodeSandbox(ctx, "n2", 1, &forged); !errors.Is(err, ErrFenced) {
			t.Errorf("a node never registered: %v, want ErrFenced", err)
		}
		if _, err := s.Register(ctx, Node{Name: "n2", URL: "https://127.0.0.1:2"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.PutNodeSandbox(ctx, "n2", 1, &forged); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("another node's record: %v, want ErrDenied", err)
		}
		ghost := forged
		ghost.ID = "sb-n1-bbbbbbbbbbbbbbbb"
		if err := s.PutNodeSandbox(ctx, "n1", 1, &ghost); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("a record never admitted: %v, want ErrNotFound", err)
		}
		// Deleting released its quota: it never becomes live again.
		forged.State = model.StateDeleting
		if err := s.PutNodeSandbox(ctx, "n1", 1, &forged); err != nil {
			t.Fatal(err)
		}
		forged.State = model.StateRunning
		if err := s.PutNodeSandbox(ctx, "n1", 1, &forged); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("a sandbox being deleted made running again: %v, want ErrConflict", err)
		}
		// Ended, it stays ended; its usage went with it.
		forged.State, forged.EndedAt = model.StateStopped, time.Now().UTC()
		if err := s.PutNodeSandbox(ctx, "n1", 1, &forged); err != nil {
			t.Fatal(err)
		}
		if u := usage(team); u.Sandboxes != 0 || u.CPUs != 0 {
			t.Errorf("team's usage after the end: %+v, want none", u)
		}
		forged.State = model.StateRunning
		if err := s.PutNodeSandbox(ctx, "n1", 1, &forged); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("an ended sandbox made running again: %v, want ErrConflict", err)
		}
		if _, err := s.Register(ctx, Node{Name: "n1", URL: "https://127.0.0.1:1"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		forged.State = model.StateStopped
		if err := s.PutNodeSandbox(ctx, "n1", 1, &forged); !errors.Is(err, ErrFenced) {
			t.Errorf("a fenced incarnation's write: %v, want ErrFenced", err)
		}
	})
}

// projectUsage is what project p's usage counters say now.
func projectUsage(t *testing.T, s *Store, p *ProjectRecord) model.Usage {
	t.Helper()
	u, err := readUsage(context.Background(), s.db, p, false, false, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return u
}
