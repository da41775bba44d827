package apiserver

import (
	"context"
	"errors"
	"net/http"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
)

// environmentRoutes adds the writes of saved environments (ServerPaths): corral up's edge makes
// them, which starts or drains its warm pools at once; a cluster's servers write the store, and
// every edge follows the change when a heartbeat names the new configuration.
func (s *Server) environmentRoutes(api *http.ServeMux) {
	api.HandleFunc("POST /v1/environments", s.saveEnvironment)
	api.HandleFunc("PATCH /v1/environments/{name}", s.guard(iam.LayerPublish, "environment.update", s.onEnvironment(false), func(w http.ResponseWriter, r *http.Request) {
		var patch corral.EnvironmentPatch
		if err := httpjson.Decode(r, &patch); err != nil {
			s.fail(w, r, err)
			return
		}
		if patch.Warm == nil {
			s.fail(w, r, errdefs.Invalid("warm", "nothing to change: the body names no field (warm)"))
			return
		}
		env, err := s.setEnvironmentWarm(r.Context(), r.PathValue("name"), *patch.Warm)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, env)
	}))
	api.HandleFunc("DELETE /v1/environments/{name}", s.guard(iam.LayerPublish, "environment.delete", s.onEnvironment(false), func(w http.ResponseWriter, r *http.Request) {
		var err error
		if s.edge != nil {
			err = s.edge.DeleteEnvironment(r.Context(), r.PathValue("name"))
		} else {
			err = s.store.DeleteEnvironment(r.Context(), r.PathValue("name"))
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
}

// saveEnvironment serves POST /v1/environments.
func (s *Server) saveEnvironment(w http.ResponseWriter, r *http.Request) {
	var env corral.Environment
	if err := httpjson.Decode(r, &env); err != nil {
		s.fail(w, r, err)
		return
	}
	if !env.CreatedAt.IsZero() {
		s.fail(w, r, errdefs.Invalid("created_at", "is set by the server"))
		return
	}
	c := who(r)
	project, err := c.project("project", env.Project)
	if err == nil {
		err = c.require(iam.LayerPublish, project)
	}
	if err == nil {
		env.Project = project
		env, err = s.putEnvironment(r.Context(), env)
	}
	s.audit(r, "environment.save", project, env.Name, err, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, env)
}

// putEnvironment validates and saves env: through corral up's edge, or, on a cluster's server,
// checked by the catalogue (catalog.Resolver.CheckEnvironment) and written to the store.
func (s *Server) putEnvironment(ctx context.Context, env corral.Environment) (corral.Environment, error) {
	if s.edge != nil {
		return s.edge.SaveEnvironment(ctx, env)
	}
	r := &catalog.Resolver{Store: s.store, Log: s.log}
	if err := r.CheckEnvironment(ctx, &env, func(p *corral.NetworkPolicy) (*corral.NetworkPolicy, error) {
		return s.compileNetwork(ctx, p)
	}); err != nil {
		return corral.Environment{}, err
	}
	return s.store.PutEnvironment(ctx, env)
}

// setEnvironmentWarm changes an environment's pool size; corral up's answer has its pool's
// figures, a cluster's none (each edge has its own pool).
func (s *Server) setEnvironmentWarm(ctx context.Context, name string, warm int) (corral.Environment, error) {
	if s.edge != nil {
		env, err := s.edge.SetEnvironmentWarm(ctx, name, warm)
		if err == nil {
			s.edge.WarmStats(&env)
		}
		return env, err
	}
	if err := catalog.CheckWarm(warm); err != nil {
		return corral.Environment{}, err
	}
	return s.store.SetEnvironmentWarm(ctx, name, warm)
}

// compileNetwork checks a network policy a cluster's server records (an environment's) against
// the service catalogue saved through the API, as an edge compiles it (the node's own blocked
// addresses are checked again where a sandbox is made).
func (s *Server) compileNetwork(ctx context.Context, p *corral.NetworkPolicy) (*corral.NetworkPolicy, error) {
	var cat *netpolicy.Catalog
	raw, err := s.store.GetSetting(ctx, store.CatalogSetting)
	switch {
	case err == nil:
		if cat, err = netpolicy.ParseCatalog(raw); err != nil {
			return nil, err
		}
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, err
	}
	c, err := netpolicy.Compile(netpolicy.Policy(*p), cat, netpolicy.Env{})
	if err != nil {
		return nil, err
	}
	out := corral.NetworkPolicy(c.Source)
	return &out, nil
}
