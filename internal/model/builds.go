package model

import (
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
