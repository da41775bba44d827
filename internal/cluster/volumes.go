package cluster

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// volumes keeps a cluster's volumes on its servers (apiserver.Volumes). A volume's record is the
// store's, and its images are versions in the cluster's blob store that the nodes attaching it
// fetch and upload (edge/volblob.go), so a create is its record alone (made lazily: version 0,
// whose first attach makes the filesystem), and a delete removes the record here and then asks
// an edge to remove its blobs, since a replica opens no blob store. The edges therefore never
// write a volume's record or the quota it charges.
type volumes struct{ s *Server }

var _ apiserver.Volumes = volumes{}

// CreateVolume records a new volume, its size charged to its project's disk quota.
func (v volumes) CreateVolume(ctx context.Context, req model.CreateVolumeRequest) (*store.VolumeRecord, error) {
	if v.s.cfg.BlobStore == "" {
		return nil, errdefs.Invalid("volumes", "volumes in a cluster need its blob store: start the servers with --blob-store")
	}
	if err := edge.CheckVolume(req); err != nil {
		return nil, err
	}
	p, err := catalog.ProjectAt(ctx, v.s.store, req.Project)
	if err != nil {
		return nil, err
	}
	vol := edge.NewVolume(req, p, "")
	vol.State = store.VolumeReady
	if err := v.s.store.CreateVolume(ctx, vol); err != nil {
		return nil, err
	}
	v.s.log.Info("volume created", "volume", vol.ID, "name", vol.Name, "project", vol.Project, "bytes", vol.SizeBytes)
	return vol, nil
}

// Volume returns the volume name of the project at path.
func (v volumes) Volume(ctx context.Context, project, name string) (*store.VolumeRecord, error) {
	p, err := catalog.ProjectAt(ctx, v.s.store, project)
	if err != nil {
		return nil, err
	}
	return v.s.store.GetVolume(ctx, p.ID, name)
}

// DeleteVolume deletes a volume's record (refused while a sandbox has it attached; its quota
// given back), then has an edge remove its blobs (removeBlobs). The delete is done once the
// record is gone: blobs no edge could remove are removed at the next start of any edge
// (reconcileClusterVolumes), and each node drops its cached image then too.
func (v volumes) DeleteVolume(r *http.Request, project, name string) (*store.VolumeRecord, error) {
	vol, err := v.Volume(r.Context(), project, name)
	if err != nil {
		return nil, err
	}
	if vol, err = v.s.store.DeleteVolume(r.Context(), vol.ID); err != nil {
		return nil, err
	}
	v.s.log.Info("volume deleted", "volume", vol.ID, "name", vol.Name, "project", vol.Project)
	v.removeBlobs(r, vol.ID)
	return vol, nil
}

// firstBlobTry bounds the try a volume's delete waits for: an edge removes a volume's objects
// in well under a second, and one that does not answer must not hold the client's delete.
var firstBlobTry = 10 * time.Second

// removeBlobs asks an up edge to remove deleted volume id's blobs, within firstBlobTry; when
// that fails, up to two more edges are asked after the delete has answered.
func (v volumes) removeBlobs(r *http.Request, id string) {
	up := v.s.upNodes(r.Context())
	if len(up) == 0 {
		v.s.log.Warn("remove a deleted volume's blobs: no edge is up (the next start of an edge removes them)", "volume", id)
		return
	}
	first := int(v.s.rr.Add(1) % uint64(len(up)))
	path := apiserver.VolumeBlobsPath + url.PathEscape(id)
	err := v.s.callEdgeWithin(r, up[first], http.MethodDelete, path, firstBlobTry)
	if err == nil {
		return
	}
	rest := make([]model.Node, 0, 2)
	for i := 1; i < min(len(up), 3); i++ {
		rest = append(rest, up[(first+i)%len(up)])
	}
	// The request's caller goes along (the edges audit the removal); its context does not.
	later := r.Clone(context.WithoutCancel(r.Context()))
	go func() {
		errs := []error{err}
		for _, n := range rest {
			err := v.s.callEdge(later, n, http.MethodDelete, path)
			if err == nil {
				return
			}
			errs = append(errs, err)
		}
		v.s.log.Warn("remove a deleted volume's blobs (the next start of an edge removes them)", "volume", id, "err", errors.Join(errs...))
	}()
}
