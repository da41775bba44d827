package corral

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
)

// ImportLayer publishes the tar stream r (plain, gzip or zstd) as layer name:version of the
// given kind (KindBase, KindWorkspace, KindToolkit). Publishing the same content again under the
// same name:version succeeds and returns the existing layer; other content under an existing
// name:version is an error [IsConflict] recognizes. r is read to its end, not closed.
func (c *Client) ImportLayer(ctx context.Context, name, version, kind string, r io.Reader) (*Layer, error) {
	return c.ImportImageLayer(ctx, name, version, kind, nil, r)
}

// ImportImageLayer is ImportLayer for a layer made from a container image: cfg (may be nil) is
// the image's configuration, applied to sandboxes whose base the layer is.
func (c *Client) ImportImageLayer(ctx context.Context, name, version, kind string, cfg *ImageConfig, r io.Reader) (*Layer, error) {
	return c.ImportLayerWith(ctx, name, version, kind, ImportOptions{ImageConfig: cfg}, r)
}

// ImportOptions are the optional parts of a layer import.
type ImportOptions struct {
	// ImageConfig is the configuration of the container image the layer comes from.
	ImageConfig *ImageConfig
	// Below lists published versions of the same kind (NAME:VERSION, bottom first) that the
	// layer stacks on; see Layer.Below.
	Below []string
	// Project publishes the layer in this project (default: the caller's token's); Private keeps
	// it from the project's descendants; Public shows it to every project (see Layer.Public).
	Project string
	Private bool
	Public  bool
}

// ImportLayerWith is ImportLayer with options.
func (c *Client) ImportLayerWith(ctx context.Context, name, version, kind string, opt ImportOptions, r io.Reader) (*Layer, error) {
	q := url.Values{"name": {name}, "version": {version}, "kind": {kind}}
	if opt.ImageConfig != nil {
		b, err := json.Marshal(opt.ImageConfig)
		if err != nil {
			return nil, err
		}
		q.Set("image_config", string(b))
	}
	for _, b := range opt.Below {
		q.Add("below", b)
	}
	if opt.Project != "" {
		q.Set("project", opt.Project)
	}
	if opt.Private {
		q.Set("private", "true")
	}
	if opt.Public {
		q.Set("public", "true")
	}
	var out Layer
	err := c.do(ctx, request{
		method:      http.MethodPost,
		path:        "/v1/layers",
		query:       q,
		body:        r,
		contentType: "application/x-tar",
	}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Layers lists published layers; a non-empty name keeps only that layer's versions.
func (c *Client) Layers(ctx context.Context, name string) ([]Layer, error) {
	q := url.Values{}
	if name != "" {
		q.Set("name", name)
	}
	var out struct {
		Layers []Layer `json:"layers"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/layers", query: q}, &out); err != nil {
		return nil, err
	}
	return out.Layers, nil
}

// Layer returns one published layer version.
func (c *Client) Layer(ctx context.Context, name, version string) (*Layer, error) {
	var out Layer
	path := "/v1/layers/" + url.PathEscape(name) + "/" + url.PathEscape(version)
	if err := c.do(ctx, request{method: http.MethodGet, path: path}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// LayerStats describes a layer version's storage and how its data reached a node: bytes fetched
// and cached, cache hits and misses, fetch latencies, prefetch. node names the node (in a
// cluster); "" asks any.
func (c *Client) LayerStats(ctx context.Context, name, version, node string) (*LayerStats, error) {
	var out LayerStats
	path := "/v1/layers/" + url.PathEscape(name) + "/" + url.PathEscape(version) + "/stats"
	if node != "" {
		path += "?node=" + url.QueryEscape(node)
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: path}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// FetchStats describes how a running sandbox's layer data reaches its node (zero counters when
// none of it is fetched lazily).
func (c *Client) FetchStats(ctx context.Context, id string) (*FetchStats, error) {
	var out FetchStats
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "fetch")}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetLayerFillRate sets how fast nodes fetch the rest of a layer version in the background
// after a prefetch sandbox's start-up set (bytes per second; 0: each node's default; -1: never).
func (c *Client) SetLayerFillRate(ctx context.Context, name, version string, rate int64) (*Layer, error) {
	var out Layer
	path := "/v1/layers/" + url.PathEscape(name) + "/" + url.PathEscape(version)
	if err := c.do(ctx, request{method: http.MethodPatch, path: path, json: LayerSettings{FillRate: &rate}}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetLayerPublic shows a layer version to every project (public true) or takes it back to its
// default visibility, its project's subtree (false). See Layer.Public.
func (c *Client) SetLayerPublic(ctx context.Context, name, version string, public bool) (*Layer, error) {
	var out Layer
	path := "/v1/layers/" + url.PathEscape(name) + "/" + url.PathEscape(version)
	if err := c.do(ctx, request{method: http.MethodPatch, path: path, json: LayerSettings{Public: &public}}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
