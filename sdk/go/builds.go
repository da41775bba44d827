package corral

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// BuildRequest is the JSON head of POST /v1/builds: a Dockerfile to build into the environment
// Name. The request body is this object, a newline, then the build context as a tar (may be
// empty).
type BuildRequest struct {
	// Name is the environment the build saves (created or replaced) when it succeeds.
	Name string `json:"name"`
	// Dockerfile is the Dockerfile's text.
	Dockerfile string `json:"dockerfile"`
	// BuildArgs are NAME=VALUE values of the Dockerfile's ARGs.
	BuildArgs []string `json:"build_args,omitempty"`
	// Network is the egress policy of every RUN step's sandbox (default: no network).
	Network *NetworkPolicy `json:"network,omitempty"`
	// Runtime runs the steps: runc (default) or gvisor.
	Runtime string `json:"runtime,omitempty"`
	// Project owns the environment and the layers the build makes (default: the token's).
	Project string `json:"project,omitempty"`
	// From, when set, replaces the Dockerfile's FROM reference (the CLI imports a local image
	// archive named in FROM and sends the layer it made).
	From string `json:"from,omitempty"`
	// NoCache runs every step again, even those whose layer exists.
	NoCache bool `json:"no_cache,omitempty"`
}

// Build states.
const (
	BuildRunning   = "running"
	BuildSucceeded = "succeeded"
	BuildFailed    = "failed"
)

// Build is a build job (GET /v1/builds/{id}).
type Build struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Project string `json:"project"`
	State   string `json:"state"`
	// Error says why a failed build failed, naming the step.
	Error    string      `json:"error,omitempty"`
	From     string      `json:"from"`
	Steps    []BuildStep `json:"steps"`
	Warnings []string    `json:"warnings,omitempty"`
	// Layer is the layer the environment's base is (NAME:VERSION), once the build succeeded.
	Layer      string     `json:"layer,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// BuildStep is one instruction of a build.
type BuildStep struct {
	N    int    `json:"n"`
	Text string `json:"text"`
	// Kind is config (no layer), run or copy.
	Kind string `json:"kind"`
	// State is pending, running, cached, done or failed.
	State string `json:"state"`
	// Layer is the step's layer (NAME:VERSION) once made or found in the cache.
	Layer   string  `json:"layer,omitempty"`
	Seconds float64 `json:"seconds,omitempty"`
}

// BuildEvent is one line of GET /v1/builds/{id}/logs: "step" starts step Step (Text is its
// progress line, Cached set when its layer was found), "log" carries output of the step's
// command, "end" is last and carries the build as it ended.
type BuildEvent struct {
	Type   string `json:"type"`
	Step   int    `json:"step,omitempty"`
	Text   string `json:"text,omitempty"`
	Cached bool   `json:"cached,omitempty"`
	Data   []byte `json:"data,omitempty"`
	Build  *Build `json:"build,omitempty"`
}

// StartBuild starts a build job with the build context read from ctxTar (nil: none).
func (c *Client) StartBuild(ctx context.Context, req BuildRequest, ctxTar io.Reader) (*Build, error) {
	head, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var body io.Reader = bytes.NewReader(append(head, '\n'))
	if ctxTar != nil {
		body = io.MultiReader(body, ctxTar)
	}
	var out Build
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/builds", body: body, contentType: "application/octet-stream"}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Build returns a build job.
func (c *Client) Build(ctx context.Context, id string) (*Build, error) {
	var out Build
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/builds/" + url.PathEscape(id)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CancelBuild ends a running build (it fails, "cancelled"; its sandbox is removed and no
// environment saved); an ended build is returned as it is.
func (c *Client) CancelBuild(ctx context.Context, id string) (*Build, error) {
	var out Build
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/builds/" + url.PathEscape(id) + "/cancel"}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Builds lists the build jobs this server remembers (the last 100).
func (c *Client) Builds(ctx context.Context) ([]Build, error) {
	var out []Build
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/builds"}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// BuildLogs opens a build's log: what it wrote so far, and with follow everything until it
// ends (the stream then ends with an "end" event).
func (c *Client) BuildLogs(ctx context.Context, id string, follow bool) (*BuildLogStream, error) {
	q := url.Values{}
	if follow {
		q.Set("follow", "true")
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/v1/builds/" + url.PathEscape(id) + "/logs", query: q})
	if err != nil {
		return nil, err
	}
	return &BuildLogStream{body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

// BuildLogStream is an open build log. Close may be called from any goroutine.
type BuildLogStream struct {
	body      io.ReadCloser
	dec       *json.Decoder
	closeOnce sync.Once
}

// Next returns the next event, io.EOF at the end.
func (s *BuildLogStream) Next() (BuildEvent, error) {
	var ev BuildEvent
	if err := s.dec.Decode(&ev); err != nil {
		if errors.Is(err, io.EOF) {
			return ev, io.EOF
		}
		return ev, fmt.Errorf("read build log: %w", err)
	}
	return ev, nil
}

// Close ends the stream.
func (s *BuildLogStream) Close() error {
	s.closeOnce.Do(func() { s.body.Close() })
	return nil
}
