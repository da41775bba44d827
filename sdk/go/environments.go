package corral

import (
	"context"
	"net/http"
	"net/url"
)

// SaveEnvironment saves a named composition of layers (POST /v1/environments).
func (c *Client) SaveEnvironment(ctx context.Context, env Environment) (*Environment, error) {
	var out Environment
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/environments", json: env}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Environments lists the saved environments.
func (c *Client) Environments(ctx context.Context) ([]Environment, error) {
	var out []Environment
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/environments"}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Environment returns one saved environment.
func (c *Client) Environment(ctx context.Context, name string) (*Environment, error) {
	var out Environment
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/environments/" + url.PathEscape(name)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// UpdateEnvironment changes a saved environment's warm pool size (PATCH /v1/environments/{name}).
func (c *Client) UpdateEnvironment(ctx context.Context, name string, patch EnvironmentPatch) (*Environment, error) {
	var out Environment
	if err := c.do(ctx, request{method: http.MethodPatch, path: "/v1/environments/" + url.PathEscape(name), json: patch}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteEnvironment removes a saved environment (sandboxes made from it are not affected).
func (c *Client) DeleteEnvironment(ctx context.Context, name string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/environments/" + url.PathEscape(name)}, nil)
}

// TagLayer points the movable name NAME:TAG (e.g. python:latest) at the published NAME:VERSION.
func (c *Client) TagLayer(ctx context.Context, name, tag, version string) (*Layer, error) {
	var out Layer
	path := "/v1/layers/" + url.PathEscape(name) + "/tags/" + url.PathEscape(tag)
	if err := c.do(ctx, request{method: http.MethodPut, path: path, json: TagRequest{Version: version}}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteTag removes the tag NAME:TAG (the version it pointed at stays).
func (c *Client) DeleteTag(ctx context.Context, name, tag string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/layers/" + url.PathEscape(name) + "/tags/" + url.PathEscape(tag)}, nil)
}

// DeleteLayer deletes the published version NAME:VERSION (refused while a tag, a saved
// environment or a snapshot refers to it) and, when no sandbox uses it, its content.
func (c *Client) DeleteLayer(ctx context.Context, name, version string) (*Layer, error) {
	var out Layer
	if err := c.do(ctx, request{method: http.MethodDelete, path: "/v1/layers/" + url.PathEscape(name) + "/" + url.PathEscape(version)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GCLayers removes layer contents no published version and no sandbox uses.
func (c *Client) GCLayers(ctx context.Context) (*GCResult, error) {
	var out GCResult
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/layers/gc"}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
