package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

// TestEnvironmentWarm: an environment's pool size is saved with it, changed by saving the same
// composition again or by SetEnvironmentWarm, and listed by WarmEnvironments while above 0; its
// runtime and network are part of the composition.
func TestEnvironmentWarm(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		env := model.Environment{Name: "e", Base: "b:1", Runtime: "gvisor", Network: &model.NetworkPolicy{Mode: model.NetworkAllowlist},
			Warm: 3, CreatedAt: time.Now().UTC()}
		if _, err := s.PutEnvironment(ctx, env); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutEnvironment(ctx, model.Environment{Name: "cold", Base: "b:1", CreatedAt: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
		names := func() []string {
			list, err := s.WarmEnvironments(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, e := range list {
				out = append(out, e.Name)
				if e.Warm <= 0 || e.Project != "/" {
					t.Errorf("warm environment %+v", e)
				}
			}
			return out
		}
		if got := names(); len(got) != 1 || got[0] != "e" {
			t.Errorf("warm environments = %v, want [e]", got)
		}
		// The same composition again with another size changes the size.
		env.Warm = 5
		if got, err := s.PutEnvironment(ctx, env); err != nil || got.Warm != 5 {
			t.Errorf("re-save with warm 5: %+v, %v", got, err)
		}
		// Another runtime or network is another composition.
		other := env
		other.Runtime = "runc"
		if _, err := s.PutEnvironment(ctx, other); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("re-save with another runtime: %v, want conflict", err)
		}
		other = env
		other.Network = nil
		if _, err := s.PutEnvironment(ctx, other); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("re-save with another network: %v, want conflict", err)
		}
		if got, err := s.SetEnvironmentWarm(ctx, "e", 0); err != nil || got.Warm != 0 || got.Runtime != "gvisor" {
			t.Errorf("SetEnvironmentWarm(0) = %+v, %v", got, err)
		}
		if got, err := s.GetEnvironment(ctx, "e"); err != nil || got.Warm != 0 {
			t.Errorf("after SetEnvironmentWarm(0): %+v, %v", got, err)
		}
		if got := names(); len(got) != 0 {
			t.Errorf("warm environments after warm 0 = %v", got)
		}
		if _, err := s.SetEnvironmentWarm(ctx, "nope", 1); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("SetEnvironmentWarm of a missing environment: %v, want not found", err)
		}
	})
}

// TestEnvironmentRebuild: a build's ReplaceEnvironment replaces the composition and keeps what is
// no part of it: the pool size, the tier and the runtime.
func TestEnvironmentRebuild(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		env := model.Environment{Name: "vm", Base: "b:1", Tier: "microvm", Runtime: "qemu", Warm: 2, CreatedAt: time.Now().UTC()}
		if _, err := s.PutEnvironment(ctx, env); err != nil {
			t.Fatal(err)
		}
		got, err := s.ReplaceEnvironment(ctx, model.Environment{Name: "vm", Base: "b:2", CreatedAt: time.Now().UTC()})
		if err != nil {
			t.Fatal(err)
		}
		if got.Base != "b:2" || got.Warm != 2 || got.Tier != "microvm" || got.Runtime != "qemu" {
			t.Errorf("rebuilt environment = %+v, want base b:2 with warm 2, tier microvm, runtime qemu", got)
		}
		if saved, err := s.GetEnvironment(ctx, "vm"); err != nil || saved.Base != "b:2" || saved.Tier != "microvm" {
			t.Errorf("saved after the rebuild: %+v, %v", saved, err)
		}
	})
}
