package apiserver

import (
	"context"
	"net/http"

	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// Volumes keeps the projects' volumes: corral up's edge (images on its node), or a cluster's
// servers (records in the store, images in the cluster's blob store, fetched by the nodes whose
// sandboxes attach them), set with SetVolumes.
type Volumes interface {
	CreateVolume(ctx context.Context, req model.CreateVolumeRequest) (*store.VolumeRecord, error)
	Volume(ctx context.Context, project, name string) (*store.VolumeRecord, error)
	// DeleteVolume deletes a volume; refused (409) while a sandbox has it attached. r is the
	// request that asks, whose caller a cluster's server sends along to the edge that removes
	// the volume's blobs.
	DeleteVolume(r *http.Request, project, name string) (*store.VolumeRecord, error)
}

// SetVolumes sets who keeps the volumes (a cluster server's store and nodes); New sets the
// local edge.
func (s *Server) SetVolumes(v Volumes) { s.volumes = v }

// edgeVolumes is the edge in this process.
type edgeVolumes struct{ e *edge.Edge }

func (v edgeVolumes) CreateVolume(ctx context.Context, req model.CreateVolumeRequest) (*store.VolumeRecord, error) {
	return v.e.CreateVolume(ctx, req)
}

func (v edgeVolumes) Volume(ctx context.Context, project, name string) (*store.VolumeRecord, error) {
	return v.e.Volume(ctx, project, name)
}

func (v edgeVolumes) DeleteVolume(r *http.Request, project, name string) (*store.VolumeRecord, error) {
	return v.e.DeleteVolume(r.Context(), project, name)
}

// noVolumes is the Volumes of an API that keeps none (a cluster server's until SetVolumes).
type noVolumes struct{}

var errNoVolumes = errdefs.Invalid("volumes", "this API keeps no volumes")

func (noVolumes) CreateVolume(context.Context, model.CreateVolumeRequest) (*store.VolumeRecord, error) {
	return nil, errNoVolumes
}

func (noVolumes) Volume(context.Context, string, string) (*store.VolumeRecord, error) {
	return nil, errNoVolumes
}

func (noVolumes) DeleteVolume(*http.Request, string, string) (*store.VolumeRecord, error) {
	return nil, errNoVolumes
}

// volumeRoutes serves /v1/volumes: volumes are a project's, like its sandboxes, and need the
// same permissions (create, read, admin to delete).
func (s *Server) volumeRoutes(api *http.ServeMux) {
	api.HandleFunc("POST /v1/volumes", s.createVolume)
	api.HandleFunc("GET /v1/volumes/{name}", s.guard(iam.SandboxRead, "", s.onVolume, func(w http.ResponseWriter, r *http.Request) {
		v, err := s.volumes.Volume(r.Context(), r.URL.Query().Get("project"), r.PathValue("name"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, v.Volume)
	}))
	api.HandleFunc("DELETE /v1/volumes/{name}", s.guard(iam.SandboxAdmin, "volume.delete", s.onVolume, func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.volumes.DeleteVolume(r, r.URL.Query().Get("project"), r.PathValue("name")); err != nil {
			s.fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
}

// volumeBlobRoutes serves what a cluster's servers ask of an edge about volumes: remove what a
// deleted volume left in the blob store (edge.RemoveDeletedVolume). It needs no permission:
// it removes nothing a volume's record still names.
func (s *Server) volumeBlobRoutes(api *http.ServeMux) {
	api.HandleFunc("DELETE "+VolumeBlobsPath+"{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.edge.RemoveDeletedVolume(r.Context(), r.PathValue("id")); err != nil {
			s.fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// VolumeBlobsPath is where a cluster's edge removes a deleted volume's blobs (its ID follows).
const VolumeBlobsPath = "/v1/volume-blobs/"

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
	var req model.CreateVolumeRequest
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
		v, err = s.volumes.CreateVolume(r.Context(), req)
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
	out := []model.Volume{}
	for _, v := range vs {
		if p, err := iam.ParsePath("project", v.Project); err == nil && c.perms(p).Has(iam.SandboxRead) {
			out = append(out, v.Volume)
		}
	}
	httpjson.Write(w, http.StatusOK, out)
}
