package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
)

// nodeCatalogRead answers what an edge reads of the catalogue, always for the caller the
// servers sealed for it: for a job of the node (a build, a snapshot, an import's parts) where
// that caller may read layers in the project asked about, and only what that project sees
// (catalog.Resolver.VisibleLayer, VisibleEnvironment); for the API's guards and reads, what that
// caller can read (as GET /v1/layers lists it). A stolen edge reads through it no more than its
// recent callers could through the API.
func (s *Server) nodeCatalogRead(ctx context.Context, node string, req *nodeproto.ReadRequest) (*nodeproto.ReadResponse, error) {
	at, err := iam.ParsePath("at", req.At)
	if err != nil {
		return nil, err
	}
	if req.Voucher == nil {
		return nil, fmt.Errorf("the catalogue is read for the caller of the request behind the read, and the edge sent none: %w", errdefs.ErrDenied)
	}
	c, err := s.sealer.Open(req.Voucher, node, time.Now())
	if err != nil {
		return nil, err
	}
	switch req.What {
	case nodeproto.ReadLayer, nodeproto.ReadReadableLayer:
		err = catalog.ValidateLayerName("name", "version", req.Name, req.Version)
	case nodeproto.ReadLayerVersions:
		err = catalog.ValidateName("name", "layer", req.Name)
	case nodeproto.ReadEnvironment, nodeproto.ReadEnvironmentOwner:
		err = catalog.ValidateName("name", "environment", req.Name)
	default:
		return nil, errdefs.Invalid("what", "%q: want %s, %s, %s, %s or %s", req.What, nodeproto.ReadLayer, nodeproto.ReadEnvironment,
			nodeproto.ReadEnvironmentOwner, nodeproto.ReadLayerVersions, nodeproto.ReadReadableLayer)
	}
	if err != nil {
		return nil, clientRefusal{err}
	}
	// What the caller can read, whichever project: no project to hold something in.
	switch req.What {
	case nodeproto.ReadReadableLayer:
		l, err := s.store.GetLayer(ctx, req.Name, req.Version)
		if err == nil && !apiserver.CallerCanReadLayer(c, l) {
			err = errdefs.NotFound("layer %s:%s", req.Name, req.Version) // as if there were none
		}
		if err != nil {
			return nil, refusedWrite(err)
		}
		return &nodeproto.ReadResponse{Layer: &l}, nil
	case nodeproto.ReadLayerVersions:
		ls, err := s.store.ListLayers(ctx, req.Name)
		if err != nil {
			return nil, err
		}
		readable := []model.Layer{}
		for _, l := range ls {
			if apiserver.CallerCanReadLayer(c, l) {
				readable = append(readable, l)
			}
		}
		return &nodeproto.ReadResponse{Layers: readable}, nil
	}
	// What project at sees, for a caller who may read layers there.
	if err := apiserver.CallerMay(c, iam.LayerRead, at); err != nil {
		return nil, err
	}
	switch req.What {
	case nodeproto.ReadLayer:
		l, err := s.resolver.VisibleLayer(ctx, at, req.Name, req.Version)
		if err != nil {
			return nil, refusedWrite(err)
		}
		return &nodeproto.ReadResponse{Layer: &l}, nil
	case nodeproto.ReadEnvironment:
		env, err := s.resolver.VisibleEnvironment(ctx, at, req.Name)
		if err != nil {
			return nil, refusedWrite(err)
		}
		return &nodeproto.ReadResponse{Environment: &env}, nil
	default: // ReadEnvironmentOwner
		owner, exists, err := s.resolver.EnvironmentOwner(ctx, at, req.Name)
		if err != nil {
			return nil, err
		}
		return &nodeproto.ReadResponse{Owner: owner, Exists: exists}, nil
	}
}
