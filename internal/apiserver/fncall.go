package apiserver

import (
	"context"
	"net/http"
	"time"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/limits"
	corral "github.com/corral-dev/corral/sdk/go"
)

// SetLimits sets the limits policy a cluster's server checks the fncall environments it saves
// with (the one it places creates with).
func (s *Server) SetLimits(p *limits.Policy) { s.limits = p }

// fncallRoutes adds the writes of fncall environments (ServerPaths): corral up's edge makes
// them and starts or ends their pool at once; a cluster's servers write the store, and every
// edge starts or ends its own pool when a heartbeat names the new configuration.
func (s *Server) fncallRoutes(api *http.ServeMux) {
	api.HandleFunc("POST /v1/fncall", s.createFncallEnv)
	api.HandleFunc("DELETE /v1/fncall/{name}", s.guard(iam.SandboxAdmin, "fncall.delete", s.onFncall, func(w http.ResponseWriter, r *http.Request) {
		var err error
		if s.edge != nil {
			err = s.edge.DeleteFncallEnv(r.Context(), r.PathValue("name"))
		} else {
			err = s.store.DeleteFncallEnv(r.Context(), r.PathValue("name"))
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
}

// createFncallEnv serves POST /v1/fncall.
func (s *Server) createFncallEnv(w http.ResponseWriter, r *http.Request) {
	var env corral.FncallEnv
	if err := httpjson.Decode(r, &env); err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	project, err := c.project("project", env.Project)
	if err == nil {
		err = c.require(iam.SandboxCreate, project)
	}
	var out corral.FncallEnv
	if err == nil {
		env.Project = project
		out, err = s.putFncallEnv(r.Context(), env)
	}
	s.audit(r, "fncall.create", project, env.Name, err, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusCreated, out)
}

// putFncallEnv validates and saves env: through corral up's edge, which starts its pool; or, on
// a cluster's server, checked as an edge checks it (edge.CheckFncallEnv; its containers'
// composition resolved by the catalogue and their limits by the servers' policy) and written to
// the store. The answer then has no pool: each edge has its own.
func (s *Server) putFncallEnv(ctx context.Context, env corral.FncallEnv) (corral.FncallEnv, error) {
	if s.edge != nil {
		return s.edge.CreateFncallEnv(ctx, env)
	}
	if s.limits == nil {
		return corral.FncallEnv{}, errdefs.Unavailable("this server has no limits policy to check fncall environments with")
	}
	if _, _, err := edge.CheckFncallEnv(&env, s.limits.MaxTTL()); err != nil {
		return corral.FncallEnv{}, err
	}
	r := &catalog.Resolver{Store: s.store, Log: s.log}
	res, err := r.Resolve(ctx, edge.ContainerRequest(env, env.Project, s.limits.MaxTTL()), true)
	if err != nil {
		return corral.FncallEnv{}, err
	}
	lim, err := s.limits.Resolve(catalog.TierFncall, limits.Limits(env.Limits))
	if err != nil {
		return corral.FncallEnv{}, err
	}
	env.Limits = corral.Limits(lim)
	if err := edge.CheckFncallFiles(env); err != nil {
		return corral.FncallEnv{}, err
	}
	if env.Network != nil {
		if _, err := s.compileNetwork(ctx, env.Network); err != nil {
			return corral.FncallEnv{}, err
		}
	}
	env.Project = iam.Display(res.ProjectPath)
	env.CreatedAt = time.Now().UTC()
	env.Pool = nil
	if err := s.store.PutFncallEnv(ctx, env); err != nil {
		return corral.FncallEnv{}, err
	}
	s.log.Info("fncall environment created", "fncall", env.Name, "base", env.Base, "pool_min", env.PoolMin, "pool_max", env.PoolMax)
	return env, nil
}
