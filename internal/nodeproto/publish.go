package nodeproto

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/model"
)

// PublishRequest records a layer version the caller's node made (an import, a snapshot, a
// build's step; its blob already in the blob store) in the catalogue (PathPublishLayer). The
// servers check it as a record (its name, kind, digest, image configuration and the parts it
// stacks on, usable in its project) and publish it only for Voucher, the sealed caller of the
// request that made it, where that caller may publish layers (iam.LayerPublish in the layer's
// project). A version published already is answered as it is, not created.
type PublishRequest struct {
	Layer   model.Layer `json:"layer"`
	Voucher *Voucher    `json:"voucher,omitempty"`
}

// PublishResponse is the version as the catalogue has it, and whether this call created it.
type PublishResponse struct {
	Layer   model.Layer `json:"layer"`
	Created bool        `json:"created,omitempty"`
}

// LayerRequest changes a published version (PathSetLayer: its fill rate, whether it is public)
// or deletes it (PathDeleteLayer), for Voucher where that caller may publish in the version's
// project. Name:Version is a version, not a tag.
type LayerRequest struct {
	Name     string   `json:"name"`
	Version  string   `json:"version"`
	FillRate *int64   `json:"fill_rate,omitempty"`
	Public   *bool    `json:"public,omitempty"`
	Voucher  *Voucher `json:"voucher,omitempty"`
}

// EnvironmentRequest saves the environment a build made (PathEnvironment), replacing the
// composition of one of the same project, for Voucher where that caller may publish in the
// environment's project. The servers check it as an environment saved through the API.
type EnvironmentRequest struct {
	Environment model.Environment `json:"environment"`
	Voucher     *Voucher          `json:"voucher,omitempty"`
}

// Publisher returns what records the layer versions an edge makes and the environments its
// builds save: the servers, over the node channel (edge.Publisher).
func (s *Servers) Publisher() Publisher { return Publisher{s} }

// Publisher sends an edge's catalogue writes to the servers, each for the caller ctx carries
// (WithVoucher).
type Publisher struct{ s *Servers }

// PublishLayer records l and reports whether the version is new.
func (p Publisher) PublishLayer(ctx context.Context, l model.Layer) (model.Layer, bool, error) {
	var ans PublishResponse
	if err := p.s.call(ctx, PathPublishLayer, PublishRequest{Layer: l, Voucher: VoucherFrom(ctx)}, &ans); err != nil {
		return model.Layer{}, false, fmt.Errorf("publish layer %s:%s through the servers: %w", l.Name, l.Version, err)
	}
	return ans.Layer, ans.Created, nil
}

// SetLayerFillRate sets the background fill rate of name:version.
func (p Publisher) SetLayerFillRate(ctx context.Context, name, version string, rate int64) (model.Layer, error) {
	return p.layer(ctx, PathSetLayer, LayerRequest{Name: name, Version: version, FillRate: &rate})
}

// SetLayerPublic shows name:version to every project, or takes it back to its project's subtree.
func (p Publisher) SetLayerPublic(ctx context.Context, name, version string, public bool) (model.Layer, error) {
	return p.layer(ctx, PathSetLayer, LayerRequest{Name: name, Version: version, Public: &public})
}

// DeleteLayer deletes name:version from the catalogue and returns it.
func (p Publisher) DeleteLayer(ctx context.Context, name, version string) (model.Layer, error) {
	return p.layer(ctx, PathDeleteLayer, LayerRequest{Name: name, Version: version})
}

func (p Publisher) layer(ctx context.Context, path string, req LayerRequest) (model.Layer, error) {
	req.Voucher = VoucherFrom(ctx)
	var l model.Layer
	if err := p.s.call(ctx, path, req, &l); err != nil {
		return model.Layer{}, fmt.Errorf("layer %s:%s through the servers: %w", req.Name, req.Version, err)
	}
	return l, nil
}

// ReplaceEnvironment saves a build's environment.
func (p Publisher) ReplaceEnvironment(ctx context.Context, env model.Environment) (model.Environment, error) {
	var saved model.Environment
	if err := p.s.call(ctx, PathEnvironment, EnvironmentRequest{Environment: env, Voucher: VoucherFrom(ctx)}, &saved); err != nil {
		return model.Environment{}, fmt.Errorf("save environment %s through the servers: %w", env.Name, err)
	}
	return saved, nil
}
