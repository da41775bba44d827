package store

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

// TestProjectPlacement checks a project's placement and the one in effect: the nearest Pin on
// the way up, every Avoid; bad selectors are refused and nothing changes.
func TestProjectPlacement(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		for _, p := range []string{"team-a", "team-a/rollout"} {
			if _, err := s.CreateProject(ctx, p, "test"); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.ProjectPlacement(ctx, "team-a/rollout")
		if err != nil || len(got.Pin) != 0 || len(got.Effective.Pin) != 0 || len(got.Effective.Avoid) != 0 {
			t.Fatalf("placement of a new project: %+v, %v", got, err)
		}
		pinA := []map[string]string{{"group": "a"}, {"group": "shared", "zone": "1"}}
		if _, err := s.SetProjectPlacement(ctx, "team-a", model.ProjectPlacement{Pin: pinA, Avoid: []map[string]string{{"gpu": "h100"}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SetProjectPlacement(ctx, "", model.ProjectPlacement{Avoid: []map[string]string{{"maint": "true"}}}); err != nil {
			t.Fatal(err)
		}
		got, err = s.ProjectPlacement(ctx, "team-a/rollout")
		wantAvoid := []map[string]string{{"maint": "true"}, {"gpu": "h100"}}
		if err != nil || len(got.Pin) != 0 || !reflect.DeepEqual(got.Effective.Pin, pinA) || !reflect.DeepEqual(got.Effective.Avoid, wantAvoid) {
			t.Fatalf("inherited placement: %+v %+v, %v", got, got.Effective, err)
		}
		// The nearest pin wins.
		pinB := []map[string]string{{"group": "b"}}
		if _, err := s.SetProjectPlacement(ctx, "team-a/rollout", model.ProjectPlacement{Pin: pinB}); err != nil {
			t.Fatal(err)
		}
		if got, err = s.ProjectPlacement(ctx, "team-a/rollout"); err != nil || !reflect.DeepEqual(got.Effective.Pin, pinB) || got.Project != "team-a/rollout" {
			t.Fatalf("own pin: %+v, %v", got, err)
		}
		for name, bad := range map[string]model.ProjectPlacement{
			"empty selector": {Pin: []map[string]string{{}}},
			"bad key":        {Avoid: []map[string]string{{"a b": "1"}}},
			"bad value":      {Pin: []map[string]string{{"group": "x y"}}},
		} {
			if _, err := s.SetProjectPlacement(ctx, "team-a/rollout", bad); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%s: %v", name, err)
			}
		}
		if got, err = s.ProjectPlacement(ctx, "team-a/rollout"); err != nil || !reflect.DeepEqual(got.Pin, pinB) {
			t.Fatalf("a refused placement changed it: %+v, %v", got, err)
		}
		if _, err := s.SetProjectPlacement(ctx, "nope", model.ProjectPlacement{}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("placement of a missing project: %v", err)
		}
	})
}
