package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
)

// The catalogue's writes an edge makes: the layer versions it imports, snapshots and builds,
// their settings and deletes, and the environments builds save. Each is made for the caller of
// the request behind it, sealed for the edge's node, where that caller may publish layers, and
// checked as a record: a stolen edge adds, changes or deletes nothing of a project that no
// recent caller of its own may publish in, and rewrites no version (versions are immutable).
// What the servers cannot check is the blob: a version's content is what the edge stored under
// its digest, as under `corral up`.

// mayPublish checks that v, a caller the servers sealed for node, may publish layers in project
// (as the API names it; field names it in a refusal).
func (s *Server) mayPublish(node string, v *nodeproto.Voucher, field, project string) error {
	at, err := iam.ParsePath(field, project)
	if err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("the catalogue is written for the caller of the request that writes it, and the edge sent none: %w", errdefs.ErrDenied)
	}
	c, err := s.sealer.Open(v, node, time.Now())
	if err != nil {
		return err
	}
	return apiserver.CallerMay(c, iam.LayerPublish, at)
}

// refusedWrite marks what the store refuses of a write an edge relays (a version reused with
// other content, a name another project has, a layer still used) as its client's, not the
// edge's: the same answer `corral up` gives, not logged as a refused call.
func refusedWrite(err error) error {
	if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrConflict) || errors.Is(err, errdefs.ErrNotFound) {
		return clientRefusal{err}
	}
	return err
}

// nodePublishLayer records a layer version an edge made.
func (s *Server) nodePublishLayer(ctx context.Context, node string, req *nodeproto.PublishRequest) (*nodeproto.PublishResponse, error) {
	l := req.Layer
	if err := s.mayPublish(node, req.Voucher, "layer.project", l.Project); err != nil {
		return nil, err
	}
	if err := s.resolver.CheckRecord(ctx, l); err != nil {
		return nil, err
	}
	got, created, err := s.store.PublishLayer(ctx, l)
	if err != nil {
		return nil, refusedWrite(err)
	}
	if created {
		s.log.Info("layer published", "node", node, "layer", got.Name+":"+got.Version, "kind", got.Kind, "digest", got.Digest, "project", got.Project)
	}
	return &nodeproto.PublishResponse{Layer: got, Created: created}, nil
}

// publishedLayer returns the version req names, for a caller who may publish in its project.
func (s *Server) publishedLayer(ctx context.Context, node string, req *nodeproto.LayerRequest) (model.Layer, error) {
	if err := catalog.ValidateLayerName("name", "version", req.Name, req.Version); err != nil {
		return model.Layer{}, err
	}
	l, err := s.store.GetLayer(ctx, req.Name, req.Version)
	if err != nil {
		return model.Layer{}, refusedWrite(err)
	}
	if err := s.mayPublish(node, req.Voucher, "project", l.Project); err != nil {
		return model.Layer{}, err
	}
	if l.Name != req.Name || l.Version != req.Version {
		return model.Layer{}, clientRefusal{errdefs.Invalid("version", "%s:%s is a tag; settings belong to versions (%s:%s)", req.Name, req.Version, l.Name, l.Version)}
	}
	return l, nil
}

// nodeSetLayer sets a published version's fill rate or visibility.
func (s *Server) nodeSetLayer(ctx context.Context, node string, req *nodeproto.LayerRequest) (*model.Layer, error) {
	switch {
	case req.FillRate == nil && req.Public == nil:
		return nil, errdefs.Invalid("fill_rate", "nothing to set (fill_rate, public)")
	case req.FillRate != nil && *req.FillRate < -1:
		return nil, errdefs.Invalid("fill_rate", "%d: want bytes per second, 0 for the node's default or -1 for never", *req.FillRate)
	}
	l, err := s.publishedLayer(ctx, node, req)
	if err != nil {
		return nil, err
	}
	if req.Public != nil && *req.Public {
		if err := s.resolver.CheckPublicParts(ctx, "below", l.Below); err != nil {
			return nil, refusedWrite(err)
		}
	}
	if req.FillRate != nil {
		if l, err = s.store.SetLayerFillRate(ctx, req.Name, req.Version, *req.FillRate); err != nil {
			return nil, refusedWrite(err)
		}
	}
	if req.Public != nil {
		if l, err = s.store.SetLayerPublic(ctx, req.Name, req.Version, *req.Public); err != nil {
			return nil, refusedWrite(err)
		}
	}
	return &l, nil
}

// nodeDeleteLayer deletes a published version from the catalogue; the edge then removes its
// ref from the shared catalogue and its blob when nothing else uses it.
func (s *Server) nodeDeleteLayer(ctx context.Context, node string, req *nodeproto.LayerRequest) (*model.Layer, error) {
	if _, err := s.publishedLayer(ctx, node, req); err != nil {
		return nil, err
	}
	l, err := s.store.DeleteLayer(ctx, req.Name, req.Version)
	if err != nil {
		return nil, refusedWrite(err)
	}
	s.log.Info("layer deleted", "node", node, "layer", l.Name+":"+l.Version, "digest", l.Digest)
	return &l, nil
}

// nodeEnvironment saves the environment a build made, checked as one saved through the API.
func (s *Server) nodeEnvironment(ctx context.Context, node string, req *nodeproto.EnvironmentRequest) (*model.Environment, error) {
	if err := s.mayPublish(node, req.Voucher, "environment.project", req.Environment.Project); err != nil {
		return nil, err
	}
	env, err := environments{s}.save(ctx, req.Environment, true)
	if err != nil {
		return nil, refusedWrite(err)
	}
	return &env, nil
}
