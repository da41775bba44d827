package catalog

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

// The runtimes a create or an environment may name: runc and gVisor for containers; QEMU runs
// microvms and vms.
const (
	RuntimeRunc   = "runc"
	RuntimeGVisor = "gvisor"
	RuntimeQEMU   = "qemu"
)

// MaxWarm bounds an environment's warm pool on each node.
const MaxWarm = 256

// CheckWarm checks an environment's warm pool size.
func CheckWarm(n int) error {
	if n < 0 || n > MaxWarm {
		return errdefs.Invalid("warm", "%d is outside [0, %d]", n, MaxWarm)
	}
	return nil
}

// CheckEnvironmentDefaults checks an environment's tier, runtime, network and warm pool, and
// normalises them as they are recorded: the container tier as none, a microvm's runtime as none
// (QEMU's). network compiles its network policy (the service catalogue's names resolved) into
// the policy recorded; it is the caller's, since what it checks is where the API runs.
func CheckEnvironmentDefaults(env *model.Environment, network func(*model.NetworkPolicy) (*model.NetworkPolicy, error)) error {
	switch env.Tier {
	case "", TierContainer:
		env.Tier = "" // the default, recorded as none
	case TierMicroVM:
		if env.Runtime != "" && env.Runtime != RuntimeQEMU {
			return errdefs.Invalid("runtime", "%q: microvm sandboxes run on %q; runtime is for the container tier", env.Runtime, RuntimeQEMU)
		}
		env.Runtime = ""
	default:
		return errdefs.Invalid("tier", "%q: want %q or %q", env.Tier, TierContainer, TierMicroVM)
	}
	switch env.Runtime {
	case "", RuntimeRunc, RuntimeGVisor:
	default:
		return errdefs.Invalid("runtime", "%q: want %q or %q", env.Runtime, RuntimeRunc, RuntimeGVisor)
	}
	if env.Network != nil {
		p, err := network(env.Network)
		if err != nil {
			return err
		}
		env.Network = p
	}
	return CheckWarm(env.Warm)
}

// CheckEnvironment validates an environment to save, in its project (env.Project, a path, which
// must exist): its name, its defaults (CheckEnvironmentDefaults, with network), and that its
// layers are published, of their kinds and usable in the project's subtree, where the
// environment is. It sets what the catalogue records of it: the project's display path, the
// time, no warm statistics.
func (r *Resolver) CheckEnvironment(ctx context.Context, env *model.Environment, network func(*model.NetworkPolicy) (*model.NetworkPolicy, error)) error {
	if err := ValidateName("name", "environment", env.Name); err != nil {
		return err
	}
	if env.Base == "" {
		return errdefs.Invalid("base", "a base layer is required (NAME:VERSION)")
	}
	if err := CheckEnvironmentDefaults(env, network); err != nil {
		return err
	}
	if len(env.Toolkits) > MaxToolkits {
		return errdefs.Invalid("toolkits", "at most %d toolkits, got %d", MaxToolkits, len(env.Toolkits))
	}
	proj, err := ProjectAt(ctx, r.Store, env.Project)
	if err != nil {
		return err
	}
	at := proj.Path
	if _, err := r.Layer(ctx, "base", env.Base, model.KindBase, at); err != nil {
		return err
	}
	if env.Workspace != "" {
		if _, err := r.Layer(ctx, "workspace", env.Workspace, model.KindWorkspace, at); err != nil {
			return err
		}
	}
	for i, t := range env.Toolkits {
		if _, err := r.Layer(ctx, fmt.Sprintf("toolkits[%d]", i), t, model.KindToolkit, at); err != nil {
			return err
		}
	}
	env.Project = iam.Display(at)
	env.CreatedAt = time.Now().UTC()
	env.WarmReady, env.WarmTarget, env.WarmHits, env.WarmClaims, env.WarmHitRate = 0, 0, 0, 0, 0
	return nil
}
