package apiserver

import (
	"io"
	"net/http"

	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/store"
)

// ServerPaths are the patterns of the routes a cluster's servers serve themselves
// (ServerHandler, serverRoutes), never an edge: identity (who the caller is, projects, quotas,
// placement, principals, grants, tokens, the audit log), what spans every node (the event
// stream, the usage report, webhooks and their deliveries, the lists of sandboxes, volumes and
// environments), the catalogue's reads (the layers, listed or one by one; an environment, with
// the figures of every edge's pools), and
// what only the servers may change in the store: the network service catalog and layer tags.
var ServerPaths = []string{"/v1/whoami", "/v1/projects", "/v1/projects/", "/v1/quotas/", "/v1/placement/",
	"/v1/principals", "/v1/grants", "/v1/tokens", "/v1/tokens/", "/v1/audit",
	"/v1/events", "/v1/report", "/v1/webhooks", "/v1/webhooks/",
	"GET /v1/sandboxes", "GET /v1/volumes", "POST /v1/volumes", "GET /v1/volumes/{name}", "DELETE /v1/volumes/{name}",
	"GET /v1/environments", "POST /v1/environments", "GET /v1/environments/{name}", "PATCH /v1/environments/{name}", "DELETE /v1/environments/{name}",
	"POST /v1/fncall", "DELETE /v1/fncall/{name}",
	"/v1/network/services",
	"GET /v1/layers", "GET /v1/layers/{name}/{version}", "PUT /v1/layers/{name}/tags/{tag}", "DELETE /v1/layers/{name}/tags/{tag}"}

// ServerHandler serves the ServerPaths routes alone, authenticated, for a cluster server. A
// forced project delete deletes its sandboxes and volumes through the Fleet given to SetFleet;
// events are read from the store, where every edge records its own.
func (s *Server) ServerHandler() http.Handler {
	mux := http.NewServeMux()
	s.serverRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpjson.Error(w, r, s.log, errdefs.NotFound("no API route %s %s", r.Method, r.URL.Path))
	})
	return s.authenticate(mux)
}

// serverRoutes adds the routes of ServerPaths: corral up serves them with the rest, a cluster's
// servers alone.
func (s *Server) serverRoutes(api *http.ServeMux) {
	s.iamRoutes(api)
	s.clusterObserveRoutes(api)
	api.HandleFunc("GET /v1/sandboxes", s.listSandboxes)
	api.HandleFunc("GET /v1/volumes", s.listVolumes)
	s.volumeRoutes(api)
	api.HandleFunc("GET /v1/environments", s.listEnvironments)
	s.environmentRoutes(api)
	api.HandleFunc("GET /v1/network/services", s.networkServices)
	api.HandleFunc("PUT /v1/network/services", s.guard(iam.Operator, "network.catalog", operator, s.setNetworkServices))
	api.HandleFunc("GET /v1/layers", s.listLayers)
	api.HandleFunc("GET /v1/layers/{name}/{version}", s.getLayer)
	api.HandleFunc("PUT /v1/layers/{name}/tags/{tag}", s.guard(iam.LayerPublish, "layer.tag", s.onLayerName, s.tagLayer))
	api.HandleFunc("DELETE /v1/layers/{name}/tags/{tag}", s.guard(iam.LayerPublish, "layer.untag", s.onLayerName, func(w http.ResponseWriter, r *http.Request) {
		if err := s.store.DeleteTag(r.Context(), r.PathValue("name"), r.PathValue("tag")); err != nil {
			s.fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
}

// networkServices serves GET /v1/network/services: the catalog corral up's edge has in force,
// or, on a cluster's server, the one saved in the store (edges take it up within a flush
// interval; one started with --services keeps its file's).
func (s *Server) networkServices(w http.ResponseWriter, r *http.Request) {
	if s.edge != nil {
		httpjson.Write(w, http.StatusOK, s.edge.NetworkServices())
		return
	}
	cat, err := SavedCatalog(r.Context(), s.store)
	switch {
	case err != nil:
		s.fail(w, r, err)
	case cat == nil:
		httpjson.Write(w, http.StatusOK, []model.NetworkService{})
	default:
		httpjson.Write(w, http.StatusOK, edge.APIServices(cat.Services()))
	}
}

// setNetworkServices serves PUT /v1/network/services: the catalog replaced, corral up's edge's
// at once, a cluster's in the store, which every edge reads.
func (s *Server) setNetworkServices(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		s.fail(w, r, errdefs.Invalid("catalog", "read the body (at most 1 MiB): %v", err))
		return
	}
	if s.edge != nil {
		list, err := s.edge.SetCatalog(r.Context(), raw)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, list)
		return
	}
	cat, err := netpolicy.ParseCatalog(raw)
	if err == nil {
		err = s.store.PutSetting(r.Context(), store.CatalogSetting, raw)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("service catalog replaced", "services", len(cat.Names()))
	httpjson.Write(w, http.StatusOK, edge.APIServices(cat.Services()))
}

// listEnvironments serves GET /v1/environments: those the caller may read, with their warm
// pools' figures.
func (s *Server) listEnvironments(w http.ResponseWriter, r *http.Request) {
	list, err := s.store.ListEnvironments(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	out := []model.Environment{}
	for _, env := range list {
		if c.canRead(iam.LayerRead, env.Project, false) {
			out = append(out, env)
		}
	}
	envs := make([]*model.Environment, len(out))
	for i := range out {
		envs[i] = &out[i]
	}
	s.environments.Figures(r.Context(), envs)
	httpjson.Write(w, http.StatusOK, out)
}
