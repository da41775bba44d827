package corral

import (
	"bytes"
	"context"
	"net/http"
)

// SetNetwork replaces a running sandbox's egress policy (PUT /v1/sandboxes/{id}/network). The new
// policy applies to the next packet of every connection, open ones included.
func (c *Client) SetNetwork(ctx context.Context, id string, p NetworkPolicy) (*Sandbox, error) {
	var out Sandbox
	if err := c.do(ctx, request{method: http.MethodPut, path: sandboxPath(id, "network"), json: p}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// BlockedAttempts returns a sandbox's latest blocked egress attempts, oldest first.
func (c *Client) BlockedAttempts(ctx context.Context, id string) ([]BlockedAttempt, error) {
	var out []BlockedAttempt
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "network", "blocked")}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// NetworkServices lists the operator's service catalog: the names policy rules may use.
func (c *Client) NetworkServices(ctx context.Context) ([]NetworkService, error) {
	var out []NetworkService
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/network/services"}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// SetNetworkServices replaces the operator's service catalog with catalog (the JSON shape of
// corral up --services: {"services": {"NAME": {"domains": [...], "addresses": [...]}}}).
// Refused while corral up runs with --services (the file wins).
func (c *Client) SetNetworkServices(ctx context.Context, catalog []byte) ([]NetworkService, error) {
	var out []NetworkService
	if err := c.do(ctx, request{method: http.MethodPut, path: "/v1/network/services", body: bytes.NewReader(catalog), contentType: "application/json"}, &out); err != nil {
		return nil, err
	}
	return out, nil
}
