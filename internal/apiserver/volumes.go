package apiserver

import (
	"net/http"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
)

// volumeRoutes serves /v1/volumes: volumes are a project's, like its sandboxes, and need the
// same permissions (create, read, admin to delete).
func (s *Server) volumeRoutes(api *http.ServeMux) {
	api.HandleFunc("POST /v1/volumes", s.createVolume)
	api.HandleFunc("GET /v1/volumes/{name}", s.guard(iam.SandboxRead, "", s.onVolume, func(w http.ResponseWriter, r *http.Request) {
		v, err := s.edge.Volume(r.Context(), r.URL.Query().Get("project"), r.PathValue("name"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, v.Volume)
	}))
	api.HandleFunc("DELETE /v1/volumes/{name}", s.guard(iam.SandboxAdmin, "volume.delete", s.onVolume, func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.edge.DeleteVolume(r.Context(), r.URL.Query().Get("project"), r.PathValue("name")); err != nil {
			s.fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
}

// onVolume resolves to the project in the query (the caller's scope when absent); the volume
// in the path is looked up in it.
func (s *Server) onVolume(r *http.Request) (string, string, error) {
	for k := range r.URL.Query() {
		if k != "project" {
			return "", "", errdefs.Invalid(k, "unknown query parameter")
		}
	}
	p, err := who(r).project("project", r.URL.Query().Get("project"))
	if err == nil {
		// The edge reads the project from the query: give it the resolved one.
		q := r.URL.Query()
		q.Set("project", iam.Display(p))
		r.URL.RawQuery = q.Encode()
	}
	return p, r.PathValue("name"), err
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req corral.CreateVolumeRequest
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	project, err := c.project("project", req.Project)
	if err == nil {
		err = c.require(iam.SandboxCreate, project)
	}
	var v *store.VolumeRecord
	if err == nil {
		req.Project = iam.Display(project)
		v, err = s.edge.CreateVolume(r.Context(), req)
	}
	s.audit(r, "volume.create", project, req.Name, err, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusCreated, v.Volume)
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	for k := range r.URL.Query() {
		if k != "project" {
			s.fail(w, r, errdefs.Invalid(k, "unknown query parameter"))
			return
		}
	}
	c := who(r)
	under, err := c.project("project", r.URL.Query().Get("project"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !iam.Within(under, c.tok.ProjectPath) {
		under = c.tok.ProjectPath // nothing above the token's scope is visible anyway
	}
	vs, err := s.store.ListVolumes(r.Context(), under, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []corral.Volume{}
	for _, v := range vs {
		if p, err := iam.ParsePath("project", v.Project); err == nil && c.perms(p).Has(iam.SandboxRead) {
			out = append(out, v.Volume)
		}
	}
	httpjson.Write(w, http.StatusOK, out)
}
