package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/store"
)

// Environments keeps the saved environments and the fncall environments: corral up's edge,
// which starts, resizes and ends their pools at once (New), or a cluster's servers, which check
// them as an edge would and write the store, every edge following the change when a heartbeat
// names the new configuration (SetEnvironments).
type Environments interface {
	SaveEnvironment(ctx context.Context, env model.Environment) (model.Environment, error)
	// SetEnvironmentWarm changes an environment's pool size.
	SetEnvironmentWarm(ctx context.Context, name string, warm int) (model.Environment, error)
	// Figures sets on each of envs the figures of its warm pools (SetFigures): the edge's under
	// corral up; in a cluster, every node's that is not lost, as its last heartbeat reported
	// them. A failure to read them leaves them out (logged).
	Figures(ctx context.Context, envs []*model.Environment)
	DeleteEnvironment(ctx context.Context, name string) error
	// CreateFncallEnv saves an fncall environment; the answer has its pool's figures where
	// there is one pool.
	CreateFncallEnv(ctx context.Context, env model.FncallEnv) (model.FncallEnv, error)
	DeleteFncallEnv(ctx context.Context, name string) error
	// FncallProject returns the project (its path as the API shows it) of fncall environment
	// name.
	FncallProject(ctx context.Context, name string) (string, error)
}

// SetEnvironments sets who keeps the environments (a cluster server's store), before Handler or
// ServerHandler; New sets the local edge.
func (s *Server) SetEnvironments(e Environments) { s.environments = e }

// edgeEnvironments is the edge in this process.
type edgeEnvironments struct{ e *edge.Edge }

func (v edgeEnvironments) SaveEnvironment(ctx context.Context, env model.Environment) (model.Environment, error) {
	return v.e.SaveEnvironment(ctx, env)
}

func (v edgeEnvironments) SetEnvironmentWarm(ctx context.Context, name string, warm int) (model.Environment, error) {
	return v.e.SetEnvironmentWarm(ctx, name, warm)
}

func (v edgeEnvironments) Figures(_ context.Context, envs []*model.Environment) {
	SetFigures(envs, v.e.WarmFigures())
}

// SetFigures sets each of envs' read-only pool fields from figs, its warm pools' figures by
// environment.
func SetFigures(envs []*model.Environment, figs map[string]store.WarmFigures) {
	for _, env := range envs {
		f := figs[env.Name]
		env.WarmReady, env.WarmTarget, env.WarmHits, env.WarmClaims, env.WarmHitRate = f.Ready, f.Target, f.Hits, f.Claims, 0
		if f.Claims > 0 {
			env.WarmHitRate = float64(f.Hits) / float64(f.Claims)
		}
	}
}

func (v edgeEnvironments) DeleteEnvironment(ctx context.Context, name string) error {
	return v.e.DeleteEnvironment(ctx, name)
}

func (v edgeEnvironments) CreateFncallEnv(ctx context.Context, env model.FncallEnv) (model.FncallEnv, error) {
	return v.e.CreateFncallEnv(ctx, env)
}

func (v edgeEnvironments) DeleteFncallEnv(ctx context.Context, name string) error {
	return v.e.DeleteFncallEnv(ctx, name)
}

func (v edgeEnvironments) FncallProject(_ context.Context, name string) (string, error) {
	env, err := v.e.FncallEnv(name)
	return env.Project, err
}

// environmentRoutes adds the reads and writes of saved environments and fncall environments
// (ServerPaths).
func (s *Server) environmentRoutes(api *http.ServeMux) {
	api.HandleFunc("GET /v1/environments/{name}", s.guard(iam.LayerRead, "", s.onEnvironment(true), func(w http.ResponseWriter, r *http.Request) {
		env, err := s.store.GetEnvironment(r.Context(), r.PathValue("name"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		s.environments.Figures(r.Context(), []*model.Environment{&env})
		httpjson.Write(w, http.StatusOK, env)
	}))
	api.HandleFunc("POST /v1/environments", s.saveEnvironment)
	api.HandleFunc("PATCH /v1/environments/{name}", s.guard(iam.LayerPublish, "environment.update", s.onEnvironment(false), func(w http.ResponseWriter, r *http.Request) {
		var patch model.EnvironmentPatch
		if err := httpjson.Decode(r, &patch); err != nil {
			s.fail(w, r, err)
			return
		}
		if patch.Warm == nil {
			s.fail(w, r, errdefs.Invalid("warm", "nothing to change: the body names no field (warm)"))
			return
		}
		env, err := s.environments.SetEnvironmentWarm(r.Context(), r.PathValue("name"), *patch.Warm)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		s.environments.Figures(r.Context(), []*model.Environment{&env})
		httpjson.Write(w, http.StatusOK, env)
	}))
	api.HandleFunc("DELETE /v1/environments/{name}", s.guard(iam.LayerPublish, "environment.delete", s.onEnvironment(false), s.deleted(s.environments.DeleteEnvironment)))
	api.HandleFunc("POST /v1/fncall", s.createFncallEnv)
	api.HandleFunc("DELETE /v1/fncall/{name}", s.guard(iam.SandboxAdmin, "fncall.delete", s.onFncall, s.deleted(s.environments.DeleteFncallEnv)))
}

// deleted serves a delete of the object the path names, by del: 204, or the error.
func (s *Server) deleted(del func(ctx context.Context, name string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := del(r.Context(), r.PathValue("name")); err != nil {
			s.fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// saveEnvironment serves POST /v1/environments.
func (s *Server) saveEnvironment(w http.ResponseWriter, r *http.Request) {
	var env model.Environment
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
		env, err = s.environments.SaveEnvironment(r.Context(), env)
	}
	s.audit(r, "environment.save", project, env.Name, err, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, env)
}

// createFncallEnv serves POST /v1/fncall.
func (s *Server) createFncallEnv(w http.ResponseWriter, r *http.Request) {
	var env model.FncallEnv
	if err := httpjson.Decode(r, &env); err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	project, err := c.project("project", env.Project)
	if err == nil {
		err = c.require(iam.SandboxCreate, project)
	}
	var out model.FncallEnv
	if err == nil {
		env.Project = project
		out, err = s.environments.CreateFncallEnv(r.Context(), env)
	}
	s.audit(r, "fncall.create", project, env.Name, err, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusCreated, out)
}

// SavedCatalog returns the service catalogue saved through the API (nil: none saved), which a
// cluster's edges follow.
func SavedCatalog(ctx context.Context, st *store.Store) (*netpolicy.Catalog, error) {
	raw, err := st.GetSetting(ctx, store.CatalogSetting)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cat, err := netpolicy.ParseCatalog(raw)
	if err != nil {
		return nil, fmt.Errorf("the service catalog saved through the API: %w", err)
	}
	return cat, nil
}
