package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/nodeproto"
)

// nodeCatalogRead answers what an edge reads of the catalogue for its builds and snapshots, for
// the caller the servers sealed for it where that caller may read layers in the project asked
// about, and only what that project sees (catalog.Resolver.VisibleLayer and
// VisibleEnvironment), or the versions of a name that caller can read (for the API's guards). A
// stolen edge reads through it no more than its recent callers could through the API.
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
	if req.What == nodeproto.ReadReadableLayer {
		if err := catalog.ValidateLayerName("name", "version", req.Name, req.Version); err != nil {
			return nil, clientRefusal{err}
		}
		l, err := s.store.GetLayer(ctx, req.Name, req.Version)
		if err == nil && !apiserver.CallerCanReadLayer(c, l) {
			err = errdefs.NotFound("layer %s:%s", req.Name, req.Version) // as if there were none
		}
		if err != nil {
			return nil, refusedWrite(err)
		}
		return &nodeproto.ReadResponse{Layer: &l}, nil
	}
	if req.What == nodeproto.ReadLayerVersions {
		if !catalog.ValidLayerName(req.Name) {
			return nil, clientRefusal{errdefs.Invalid("name", "layer name %q must be lowercase letters, digits, '.', '_' or '-' (at most 128)", req.Name)}
		}
		ls, err := s.store.ListLayers(ctx, req.Name)
		if err != nil {
			return nil, err
		}
		ans := &nodeproto.ReadResponse{}
		for _, l := range ls {
			if apiserver.CallerCanReadLayer(c, l) {
				ans.Layers = append(ans.Layers, l)
			}
		}
		return ans, nil
	}
	if err := apiserver.CallerMay(c, iam.LayerRead, at); err != nil {
		return nil, err
	}
	switch req.What {
	case nodeproto.ReadLayer:
		if err := catalog.ValidateLayerName("name", "version", req.Name, req.Version); err != nil {
			return nil, clientRefusal{err}
		}
		l, err := s.resolver.VisibleLayer(ctx, at, req.Name, req.Version)
		if err != nil {
			return nil, refusedWrite(err)
		}
		return &nodeproto.ReadResponse{Layer: &l}, nil
	case nodeproto.ReadEnvironment, nodeproto.ReadEnvironmentOwner:
		if !catalog.ValidLayerName(req.Name) {
			return nil, clientRefusal{errdefs.Invalid("name", "environment name %q must be lowercase letters, digits, '.', '_' or '-' (at most 128)", req.Name)}
		}
		if req.What == nodeproto.ReadEnvironmentOwner {
			owner, exists, err := s.resolver.EnvironmentOwner(ctx, at, req.Name)
			if err != nil {
				return nil, err
			}
			return &nodeproto.ReadResponse{Owner: owner, Exists: exists}, nil
		}
		env, err := s.resolver.VisibleEnvironment(ctx, at, req.Name)
		if err != nil {
			return nil, refusedWrite(err)
		}
		return &nodeproto.ReadResponse{Environment: &env}, nil
	}
	return nil, errdefs.Invalid("what", "%q: want %s, %s, %s, %s or %s", req.What, nodeproto.ReadLayer, nodeproto.ReadEnvironment, nodeproto.ReadEnvironmentOwner, nodeproto.ReadLayerVersions, nodeproto.ReadReadableLayer)
}
