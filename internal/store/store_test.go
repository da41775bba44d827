package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	os.Exit(code)
}

// drivers runs f once per store driver, as the subtests "sqlite" and "postgres" (a throwaway
// cluster, skipped where PostgreSQL is not installed): one conformance suite for both.
func drivers(t *testing.T, f func(t *testing.T)) {
	t.Run("sqlite", f)
	t.Run("postgres", f)
}

// dsn returns a fresh store location for the driver of the running subtest.
func dsn(t *testing.T) string {
	t.Helper()
	if strings.Contains(t.Name()+"/", "/postgres/") {
		return pgtest.NewDB(t)
	}
	return filepath.Join(t.TempDir(), "corral.db")
}

func open(t *testing.T) *Store {
	t.Helper()
	s, err := Open(context.Background(), dsn(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSandboxRoundTripAndFilters(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		now := time.Now().UTC().Truncate(time.Millisecond)
		for i, st := range []string{model.StateRunning, model.StateStopped, model.StateRunning} {
			sb := &Sandbox{Sandbox: model.Sandbox{
				ID: "sb-n1-" + string(rune('a'+i)), Node: "n1", State: st,
				Labels:    map[string]string{"team": []string{"x", "y", "x"}[i]},
				CreatedAt: now.Add(time.Duration(i) * time.Second), ExpiresAt: now.Add(time.Hour),
			}, Lower: []string{"sha256:00"}}
			if err := s.PutSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.GetSandbox(ctx, "sb-n1-b")
		if err != nil || got.State != model.StateStopped || len(got.Lower) != 1 {
			t.Fatalf("GetSandbox = %+v, %v", got, err)
		}
		if _, err := s.GetSandbox(ctx, "sb-n1-z"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("missing sandbox: err = %v, want not found", err)
		}
		tests := []struct {
			f    SandboxFilter
			want []string
		}{
			{SandboxFilter{}, []string{"sb-n1-a", "sb-n1-b", "sb-n1-c"}},
			{SandboxFilter{States: []string{model.StateRunning}}, []string{"sb-n1-a", "sb-n1-c"}},
			{SandboxFilter{Labels: map[string]string{"team": "x"}}, []string{"sb-n1-a", "sb-n1-c"}},
			{SandboxFilter{States: []string{model.StateStopped}, Labels: map[string]string{"team": "x"}}, nil},
			{SandboxFilter{Node: "n2"}, nil},
		}
		for _, tt := range tests {
			list, err := s.ListSandboxes(ctx, tt.f)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, sb := range list {
				ids = append(ids, sb.ID)
			}
			if len(ids) != len(tt.want) {
				t.Errorf("ListSandboxes(%+v) = %v, want %v", tt.f, ids, tt.want)
				continue
			}
			for i := range ids {
				if ids[i] != tt.want[i] {
					t.Errorf("ListSandboxes(%+v) = %v, want %v", tt.f, ids, tt.want)
				}
			}
		}
	})
}

func TestPublishLayerIsImmutable(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		l := model.Layer{Name: "busybox", Version: "1", Kind: model.KindBase, Digest: "sha256:aa", CreatedAt: time.Now()}
		if _, created, err := s.PublishLayer(ctx, l); err != nil || !created {
			t.Fatalf("first publish: created=%v err=%v", created, err)
		}
		if _, created, err := s.PublishLayer(ctx, l); err != nil || created {
			t.Fatalf("same content again: created=%v err=%v, want no-op", created, err)
		}
		other := l
		other.Digest = "sha256:bb"
		if _, _, err := s.PublishLayer(ctx, other); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("other content under same version: err = %v, want conflict", err)
		}
		got, err := s.GetLayer(ctx, "busybox", "1")
		if err != nil || got.Digest != "sha256:aa" {
			t.Fatalf("GetLayer = %+v, %v; want the first digest kept", got, err)
		}
		if inUse, err := s.DigestsInUse(ctx, []string{"sha256:aa", "sha256:bb"}); err != nil || !inUse["sha256:aa"] || inUse["sha256:bb"] {
			t.Fatalf("digests in use: %v, %v; want the published one alone, not the rejected one", inUse, err)
		}
		// A live sandbox's rootfs keeps a blob no version names; an ended one's does not.
		for i, state := range []string{model.StateRunning, model.StateStopped} {
			rec := &Sandbox{Sandbox: model.Sandbox{ID: fmt.Sprintf("sb-test-%016d", 900+i), Node: "test", State: state}, Lower: []string{"sha256:cc" + state}}
			if err := s.PutSandbox(ctx, rec); err != nil {
				t.Fatal(err)
			}
		}
		if inUse, err := s.DigestsInUse(ctx, []string{"sha256:ccrunning", "sha256:ccstopped"}); err != nil || !inUse["sha256:ccrunning"] || inUse["sha256:ccstopped"] {
			t.Fatalf("digests of sandboxes' rootfs in use: %v, %v; want the running one's alone", inUse, err)
		}
		many := make([]string, 1200) // more than one query's worth
		for i := range many {
			many[i] = fmt.Sprintf("sha256:%04d", i)
		}
		if inUse, err := s.DigestsInUse(ctx, append(many, "sha256:aa")); err != nil || len(inUse) != 1 || !inUse["sha256:aa"] {
			t.Fatalf("1201 digests, one published: %v, %v", len(inUse), err)
		}
	})
}

// TestStackedLayers: a layer stacked on parts keeps its parts from deletion, and republishing a
// version with other parts is refused.
func TestStackedLayers(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		part := model.Layer{Name: "app.part1", Version: "1", Kind: model.KindBase, Digest: "sha256:aa", CreatedAt: time.Now()}
		top := model.Layer{Name: "app", Version: "1", Kind: model.KindBase, Digest: "sha256:bb", CreatedAt: time.Now(), Below: []string{"app.part1:1"}}
		for _, l := range []model.Layer{part, top} {
			if _, _, err := s.PublishLayer(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		again := top
		again.Below = nil
		if _, _, err := s.PublishLayer(ctx, again); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("republish without its parts: %v; want conflict", err)
		}
		if _, err := s.DeleteLayer(ctx, "app.part1", "1"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "app:1") {
			t.Errorf("delete a part under app:1 = %v; want a conflict naming app:1", err)
		}
		if _, err := s.DeleteLayer(ctx, "app", "1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.DeleteLayer(ctx, "app.part1", "1"); err != nil {
			t.Errorf("delete the part once nothing stacks on it: %v", err)
		}
	})
}

func TestReopenKeepsData(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		path := dsn(t)
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.AddRootToken(ctx, "h1"); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, err = Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if tok, err := s.TokenByHash(ctx, "h1"); err != nil || tok.Principal != "root" || tok.Perms != iam.All {
			t.Fatalf("TokenByHash after reopen = %+v, %v", tok, err)
		}
	})
}

func TestTrajectory(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		for i, step := range []string{"", "a", ""} {
			e := &model.TrajectoryEntry{StepID: step, Kind: "exec", State: model.StepRunning, Request: map[string]any{"argv": []string{"x"}}, Exclusive: step == "a"}
			if ex, err := s.BeginStep(ctx, "sb-1", e); err != nil || ex != nil {
				t.Fatalf("BeginStep %d: existing %v, err %v", i, ex, err)
			}
			if e.Seq != int64(i+1) {
				t.Fatalf("step %d got seq %d", i, e.Seq)
			}
		}
		e := &model.TrajectoryEntry{StepID: "a", Kind: "exec", State: model.StepRunning}
		ex, err := s.BeginStep(ctx, "sb-1", e)
		if err != nil || ex == nil || ex.Seq != 2 {
			t.Fatalf("reused step id: existing %+v, err %v; want step 2", ex, err)
		}
		if !ex.Exclusive {
			t.Errorf("existing step %+v lost its exclusive mark", ex)
		}
		// The mark is set once, when the step is appended: an update cannot clear it.
		ex.State, ex.Exit, ex.Exclusive = model.StepDone, &model.Exit{Code: 3}, false
		if err := s.UpdateStep(ctx, "sb-1", ex); err != nil {
			t.Fatal(err)
		}
		steps, err := s.ListSteps(ctx, "sb-1", 1, 10, "")
		if err != nil || len(steps) != 2 || steps[0].Seq != 2 || steps[0].Exit.Code != 3 {
			t.Fatalf("ListSteps after 1 = %+v, %v", steps, err)
		}
		if !steps[0].Exclusive || steps[1].Exclusive {
			t.Errorf("exclusive marks %v, %v; want true, false", steps[0].Exclusive, steps[1].Exclusive)
		}
		if running, _ := s.ListSteps(ctx, "sb-1", 0, 10, model.StepRunning); len(running) != 2 {
			t.Fatalf("running steps = %d, want 2", len(running))
		}
		// Sequences are per sandbox.
		other := &model.TrajectoryEntry{Kind: "exec", State: model.StepRunning}
		s.BeginStep(ctx, "sb-2", other)
		if other.Seq != 1 {
			t.Fatalf("first step of another sandbox has seq %d", other.Seq)
		}
		if err := s.DeleteSandbox(ctx, "sb-1"); err != nil {
			t.Fatal(err)
		}
		if steps, _ := s.ListSteps(ctx, "sb-1", 0, 10, ""); len(steps) != 0 {
			t.Fatalf("trajectory kept after the sandbox was forgotten: %d steps", len(steps))
		}
	})
}
