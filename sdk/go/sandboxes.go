package corral

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"
)

// CreateSandbox creates a sandbox and returns it once the server has accepted it (201). Its
// State says whether it is already running. With req.IdempotencyKey set, retrying the same
// request (after a timeout, through another server) returns the sandbox the first attempt made
// instead of making another.
func (c *Client) CreateSandbox(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	var out Sandbox
	r := request{method: http.MethodPost, path: "/v1/sandboxes", json: req}
	if req.IdempotencyKey != "" {
		r.header = http.Header{"Idempotency-Key": {req.IdempotencyKey}}
	}
	err := c.do(ctx, r, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// GetSandbox returns the sandbox with the given ID. A sandbox that never existed is an error
// that [IsNotFound] recognizes.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var out Sandbox
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListOptions filters [Client.ListSandboxes]. The zero value lists every sandbox.
type ListOptions struct {
	// State keeps only sandboxes in this state (StateRunning, ...).
	State string
	// Labels keeps only sandboxes carrying every one of these labels with these values.
	Labels map[string]string
	// Project keeps only sandboxes in this project's subtree.
	Project string
}

// ListSandboxes returns the sandboxes that match opts.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) ([]Sandbox, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	if opts.Project != "" {
		q.Set("project", opts.Project)
	}
	// Sorted so the same options always produce the same URL.
	keys := make([]string, 0, len(opts.Labels))
	for k := range opts.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		q.Add("label", k+"="+opts.Labels[k])
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sandboxes", query: q}, &out)
	if err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}

// DeleteSandbox stops the sandbox, killing its commands, and returns its final view (state
// stopped, reason deleted).
func (c *Client) DeleteSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var out Sandbox
	if err := c.do(ctx, request{method: http.MethodDelete, path: sandboxPath(id)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetTTL makes the sandbox expire ttl from now, extending or shortening its life.
func (c *Client) SetTTL(ctx context.Context, id string, ttl time.Duration) (*Sandbox, error) {
	var out Sandbox
	err := c.do(ctx, request{
		method: http.MethodPost,
		path:   sandboxPath(id, "ttl"),
		json:   TTLRequest{TTL: ttl.String()},
	}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Trajectory returns the steps of a sandbox's trajectory log with a sequence number above after,
// in order: every exec and file-changing call made through the API. It works for stopped
// sandboxes until their record is forgotten.
func (c *Client) Trajectory(ctx context.Context, id string, after int64) ([]TrajectoryEntry, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "trajectory"), query: q})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []TrajectoryEntry
	dec := json.NewDecoder(resp.Body)
	for {
		var e TrajectoryEntry
		if err := dec.Decode(&e); err == io.EOF {
			return out, nil
		} else if err != nil {
			return out, fmt.Errorf("read trajectory of %s: %w", id, err)
		}
		out = append(out, e)
	}
}

// PauseSandbox freezes the sandbox and returns its memory to the host; its state becomes paused.
// Any later call that uses the sandbox (exec, files) resumes it first.
func (c *Client) PauseSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var out Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "pause")}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ResumeSandbox brings a paused sandbox back to running.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var out Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "resume")}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Fork makes copies of a running sandbox that go on from its state now (memory, processes
// and disk on gVisor and microvm; the disk alone with DiskOnly, the only fork of a runc sandbox) and returns
// them, running. Count 0 asks for one copy. Forks count against quotas like creates, all or
// nothing. A paused, stopped or failed source is a conflict (IsConflict).
func (c *Client) Fork(ctx context.Context, id string, req ForkRequest) ([]Sandbox, error) {
	var out ForkResult
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "fork"), json: req}, &out); err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}

// Snapshot publishes the sandbox's writable layer (its changes on top of its layers) as a layer
// of kind snapshot; CreateRequest.FromSnapshot starts new sandboxes from it.
func (c *Client) Snapshot(ctx context.Context, id string, req SnapshotRequest) (*Layer, error) {
	var out Layer
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "snapshot"), json: req}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
