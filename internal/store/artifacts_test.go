package store

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

// TestArtifactLimits: a project's artifact limits are its own (the default when unset) and each
// ancestor's that sets one, each with the IDs of its subtree; artifact_bytes is validated and
// delegated like every other limit.
func TestArtifactLimits(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		team := mustProject(t, s, "team")
		a := mustProject(t, s, "team/a")
		b := mustProject(t, s, "team/b")
		ls, err := s.ArtifactLimits(ctx, a.ID)
		if err != nil || len(ls) != 1 || ls[0].Path != "team/a" || ls[0].Limit != model.DefaultArtifactBytes || !slices.Equal(ls[0].Projects, []string{a.ID}) {
			t.Fatalf("no quotas set: %+v, %v; want the default on the project itself", ls, err)
		}
		if _, err := s.SetQuota(ctx, "team", model.Quota{ArtifactBytes: ptr[int64](-1)}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("a negative artifact_bytes: %v", err)
		}
		if _, err := s.SetQuota(ctx, "team", model.Quota{ArtifactBytes: ptr[int64](100)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SetQuota(ctx, "team/a", model.Quota{ArtifactBytes: ptr[int64](60)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SetQuota(ctx, "team/b", model.Quota{ArtifactBytes: ptr[int64](60)}); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("children's artifact_bytes past the parent's: %v, want conflict", err)
		}
		ls, err = s.ArtifactLimits(ctx, a.ID)
		if err != nil || len(ls) != 2 {
			t.Fatalf("limits of team/a: %+v, %v", ls, err)
		}
		byPath := map[string]ArtifactLimit{}
		for _, l := range ls {
			slices.Sort(l.Projects)
			byPath[l.Path] = l
		}
		want := []string{team.ID, a.ID, b.ID}
		slices.Sort(want)
		if l := byPath["team"]; l.Limit != 100 || !slices.Equal(l.Projects, want) {
			t.Errorf("team's limit: %+v, want 100 over %v", l, want)
		}
		if l := byPath["team/a"]; l.Limit != 60 || !slices.Equal(l.Projects, []string{a.ID}) {
			t.Errorf("team/a's limit: %+v", l)
		}
		ls, err = s.ArtifactLimits(ctx, b.ID)
		if err != nil || len(ls) != 2 {
			t.Fatalf("team/b: its default and team's limit: %+v, %v", ls, err)
		}
		// The root's subtree is every project (on PostgreSQL too, where no path bound may be
		// other than UTF-8).
		ls, err = s.ArtifactLimits(ctx, RootProjectID)
		if err != nil || len(ls) != 1 || ls[0].Path != "" || len(ls[0].Projects) != 4 {
			t.Errorf("the root's limits: %+v, %v; want its default over its 4 projects", ls, err)
		}
		if _, err := s.ArtifactLimits(ctx, "prj-nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("an unknown project: %v", err)
		}
	})
}
