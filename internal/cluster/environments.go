package cluster

import (
	"context"
	"slices"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/limits"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/store"
)

// environments keeps a cluster's environments and fncall environments on its servers
// (apiserver.Environments): each is checked as an edge checks it, its layers by the catalogue,
// an fncall environment's containers' limits by the servers' limits policy (clusterLimits), a
// network policy against the saved service catalogue, and written to the store. Every edge
// starts, resizes or ends its own pools when a heartbeat names the new configuration; an
// environment's figures are the pools' of every node that is not lost, as their heartbeats
// reported them, summed (Figures).
type environments struct{ s *Server }

var _ apiserver.Environments = environments{}

func (v environments) SaveEnvironment(ctx context.Context, env model.Environment) (model.Environment, error) {
	return v.save(ctx, env, false)
}

// save checks env and saves it; replace: a build's, which replaces the composition of an
// environment of the same project (nodeEnvironment).
func (v environments) save(ctx context.Context, env model.Environment, replace bool) (model.Environment, error) {
	if err := v.s.resolver.CheckEnvironment(ctx, &env, func(p *model.NetworkPolicy) (*model.NetworkPolicy, error) {
		return v.network(ctx, p)
	}); err != nil {
		return model.Environment{}, err
	}
	if replace {
		return v.s.store.ReplaceEnvironment(ctx, env)
	}
	return v.s.store.PutEnvironment(ctx, env)
}

func (v environments) SetEnvironmentWarm(ctx context.Context, name string, warm int) (model.Environment, error) {
	if err := catalog.CheckWarm(warm); err != nil {
		return model.Environment{}, err
	}
	return v.s.store.SetEnvironmentWarm(ctx, name, warm)
}

// Figures adds to each of envs the figures of its warm pools on every node that is not lost,
// as their last heartbeats reported them (store.WarmFigures): one read of the store, whatever
// the number of nodes.
func (v environments) Figures(ctx context.Context, envs []*model.Environment) {
	if len(envs) == 0 {
		return
	}
	figs, err := v.s.store.WarmFigures(ctx)
	if err != nil {
		v.s.log.Warn("read the warm pools' figures; leaving them out", "err", err)
		return
	}
	apiserver.SetFigures(envs, figs)
}

func (v environments) DeleteEnvironment(ctx context.Context, name string) error {
	return v.s.store.DeleteEnvironment(ctx, name)
}

func (v environments) CreateFncallEnv(ctx context.Context, env model.FncallEnv) (model.FncallEnv, error) {
	if _, _, err := edge.CheckFncallEnv(&env, clusterLimits.MaxTTL()); err != nil {
		return model.FncallEnv{}, err
	}
	res, err := v.s.resolver.Resolve(ctx, edge.ContainerRequest(env, env.Project, clusterLimits.MaxTTL()), true)
	if err != nil {
		return model.FncallEnv{}, err
	}
	lim, err := clusterLimits.Resolve(catalog.TierFncall, limits.Limits(env.Limits))
	if err != nil {
		return model.FncallEnv{}, err
	}
	env.Limits = model.Limits(lim)
	if err := edge.CheckFncallFiles(env); err != nil {
		return model.FncallEnv{}, err
	}
	if env.Network != nil {
		if _, err := v.network(ctx, env.Network); err != nil {
			return model.FncallEnv{}, err
		}
	}
	env.Project = iam.Display(res.ProjectPath)
	env.CreatedAt = time.Now().UTC()
	env.Pool = nil
	if err := v.s.store.PutFncallEnv(ctx, env); err != nil {
		return model.FncallEnv{}, err
	}
	v.s.log.Info("fncall environment created", "fncall", env.Name, "base", env.Base, "pool_min", env.PoolMin, "pool_max", env.PoolMax)
	return env, nil
}

func (v environments) DeleteFncallEnv(ctx context.Context, name string) error {
	return v.s.store.DeleteFncallEnv(ctx, name)
}

func (v environments) FncallProject(ctx context.Context, name string) (string, error) {
	envs, err := v.s.store.ListFncallEnvs(ctx)
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(envs, func(e store.FncallEnvRecord) bool { return e.Name == name })
	if i < 0 {
		return "", errdefs.NotFound("fncall environment %s", name)
	}
	return envs[i].Project, nil
}

// network compiles a network policy the servers record against the saved service catalogue, as
// an edge compiles it (the node's own blocked addresses are checked again where a sandbox is
// made), and returns it as recorded.
func (v environments) network(ctx context.Context, p *model.NetworkPolicy) (*model.NetworkPolicy, error) {
	cat, err := apiserver.SavedCatalog(ctx, v.s.store)
	if err != nil {
		return nil, err
	}
	c, err := netpolicy.Compile(netpolicy.Policy(*p), cat, netpolicy.Env{})
	if err != nil {
		return nil, err
	}
	out := model.NetworkPolicy(c.Source)
	return &out, nil
}
