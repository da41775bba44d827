package nodeproto

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/model"
)

// What a ReadRequest asks.
const (
	ReadLayer            = "layer"             // the version Name:Version (or a tag's) At sees
	ReadEnvironment      = "environment"       // environment Name, if At may use it
	ReadEnvironmentOwner = "environment-owner" // the project owning environment Name
	ReadLayerVersions    = "layer-versions"    // the versions of layer Name the caller can read
	ReadReadableLayer    = "readable-layer"    // Name:Version (or a tag's), if the caller can read it
)

// ReadRequest reads the catalogue for a job of the caller's node (PathCatalogRead): a build's
// FROM, its steps' cached layers and the environment it saves, a snapshot's version and parent.
// The servers answer for Voucher, the sealed caller of the request behind the job, where that
// caller may read layers in At (a canonical project path), and only what At sees: anything else
// is answered as not found. ReadLayerVersions and ReadReadableLayer ask about no project: they
// answer what the caller can read (as GET /v1/layers lists it), for the API's guards and reads.
type ReadRequest struct {
	What    string   `json:"what"`
	At      string   `json:"at"`
	Name    string   `json:"name"`
	Version string   `json:"version,omitempty"`
	Voucher *Voucher `json:"voucher,omitempty"`
}

// ReadResponse is what a ReadRequest found: Layer, Layers (a name's versions), Environment, or
// Owner (canonical) with Exists.
type ReadResponse struct {
	Layer       *model.Layer       `json:"layer,omitempty"`
	Layers      []model.Layer      `json:"layers,omitempty"`
	Environment *model.Environment `json:"environment,omitempty"`
	Owner       string             `json:"owner,omitempty"`
	Exists      bool               `json:"exists,omitempty"`
}

// CatalogReader returns what reads the catalogue for an edge's jobs and the requests it serves:
// the servers, over the node channel (edge.CatalogReader).
func (s *Servers) CatalogReader() CatalogReader { return CatalogReader{s} }

// CatalogReader sends an edge's catalogue reads to the servers, each for the caller ctx carries
// (WithVoucher).
type CatalogReader struct{ s *Servers }

// VisibleLayer returns version name:version (or the one tag version names), if project at sees it.
func (c CatalogReader) VisibleLayer(ctx context.Context, at, name, version string) (model.Layer, error) {
	ans, err := c.read(ctx, ReadRequest{What: ReadLayer, At: at, Name: name, Version: version})
	if err == nil && ans.Layer == nil {
		err = fmt.Errorf("the servers answered no layer: %w", ErrVersion)
	}
	if err != nil {
		return model.Layer{}, fmt.Errorf("read layer %s:%s through the servers: %w", name, version, err)
	}
	return *ans.Layer, nil
}

// VisibleEnvironment returns environment name, if project at may use it.
func (c CatalogReader) VisibleEnvironment(ctx context.Context, at, name string) (model.Environment, error) {
	ans, err := c.read(ctx, ReadRequest{What: ReadEnvironment, At: at, Name: name})
	if err == nil && ans.Environment == nil {
		err = fmt.Errorf("the servers answered no environment: %w", ErrVersion)
	}
	if err != nil {
		return model.Environment{}, fmt.Errorf("read environment %s through the servers: %w", name, err)
	}
	return *ans.Environment, nil
}

// EnvironmentOwner returns the project owning environment name, and whether there is one.
func (c CatalogReader) EnvironmentOwner(ctx context.Context, at, name string) (string, bool, error) {
	ans, err := c.read(ctx, ReadRequest{What: ReadEnvironmentOwner, At: at, Name: name})
	if err != nil {
		return "", false, fmt.Errorf("read environment %s's project through the servers: %w", name, err)
	}
	return ans.Owner, ans.Exists, nil
}

// LayerVersions returns the versions of layer name the caller can read.
func (c CatalogReader) LayerVersions(ctx context.Context, name string) ([]model.Layer, error) {
	ans, err := c.read(ctx, ReadRequest{What: ReadLayerVersions, Name: name})
	if err != nil {
		return nil, fmt.Errorf("list layer %s's versions through the servers: %w", name, err)
	}
	return ans.Layers, nil
}

// ReadableLayer returns version name:version (or a tag's) if the caller can read it.
func (c CatalogReader) ReadableLayer(ctx context.Context, name, version string) (model.Layer, error) {
	ans, err := c.read(ctx, ReadRequest{What: ReadReadableLayer, Name: name, Version: version})
	if err == nil && ans.Layer == nil {
		err = fmt.Errorf("the servers answered no layer: %w", ErrVersion)
	}
	if err != nil {
		return model.Layer{}, fmt.Errorf("read layer %s:%s through the servers: %w", name, version, err)
	}
	return *ans.Layer, nil
}

func (c CatalogReader) read(ctx context.Context, req ReadRequest) (*ReadResponse, error) {
	req.Voucher = VoucherFrom(ctx)
	var ans ReadResponse
	if err := c.s.call(ctx, PathCatalogRead, req, &ans); err != nil {
		return nil, err
	}
	return &ans, nil
}
