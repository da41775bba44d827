package build

import (
	"time"

	"github.com/corral-dev/corral/internal/netpolicy"
)

// The package keeps types of its own (issue 29 item 5): it does not import the SDK. The API
// server converts a request to Spec and a job's Build and Events to the API's where it writes
// them, and the edge converts what Backend passes; those conversions and their tests
// (apiserver.TestBuildConversion, edge.TestBuildConversion) hold these types equal to the API's.

// Spec is what a build is asked for: the API's BuildRequest, field for field.
type Spec struct {
	// Name is the environment the build saves (created or replaced) when it succeeds.
	Name string `json:"name"`
	// Dockerfile is the Dockerfile's text.
	Dockerfile string `json:"dockerfile"`
	// BuildArgs are NAME=VALUE values of the Dockerfile's ARGs.
	BuildArgs []string `json:"build_args,omitempty"`
	// Network is the egress policy of every RUN step's sandbox (nil: no network).
	Network *netpolicy.Policy `json:"network,omitempty"`
	// Runtime runs the steps: runc (empty) or gvisor.
	Runtime string `json:"runtime,omitempty"`
	// Project owns the environment and the layers the build makes, as the request names it.
	Project string `json:"project,omitempty"`
	// From, when set, replaces the Dockerfile's FROM reference.
	From string `json:"from,omitempty"`
	// NoCache runs every step again, even those whose layer exists.
	NoCache bool `json:"no_cache,omitempty"`
}

// The states of a build (Build.State), the API's.
const (
	Running   = "running"
	Succeeded = "succeeded"
	Failed    = "failed"
)

// Build is a build's state as the API shows it (the API's Build, field for field).
type Build struct {
	ID       string       `json:"id"`
	Name     string       `json:"name"`
	Project  string       `json:"project"`
	State    string       `json:"state"`
	Error    string       `json:"error,omitempty"`
	From     string       `json:"from"`
	Steps    []StepStatus `json:"steps"`
	Warnings []string     `json:"warnings,omitempty"`
	// Layer is the environment's base layer, NAME:VERSION, once the build succeeded.
	Layer      string     `json:"layer,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// StepStatus is one step of a Build (the API's BuildStep).
type StepStatus struct {
	N    int    `json:"n"`
	Text string `json:"text"`
	// Kind is the step's kind: StepRun, StepCopy or StepConfig.
	Kind string `json:"kind"`
	// State is pending, running, cached, done or failed.
	State   string  `json:"state"`
	Layer   string  `json:"layer,omitempty"`
	Seconds float64 `json:"seconds,omitempty"`
}

// Event is one entry of a build's log (the API's BuildEvent): "step" (a step begins, or is
// cached), "log" (a command's output), "end" (with the Build as it ended).
type Event struct {
	Type   string `json:"type"`
	Step   int    `json:"step,omitempty"`
	Text   string `json:"text,omitempty"`
	Cached bool   `json:"cached,omitempty"`
	Data   []byte `json:"data,omitempty"`
	Build  *Build `json:"build,omitempty"`
}

// ImageConfig is the configuration an environment's base layer records (the API's
// ImageConfig, field for field). Its JSON is part of the cache key of an environment's layer
// (Jobs.steps), so it is the API's byte for byte.
type ImageConfig struct {
	Env        []string          `json:"env,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	// Services are the programs a sandbox made with the layer starts (the base's, kept).
	Services []Service `json:"services,omitempty"`
}

// Service is a program a layer starts in each sandbox made with it (the API's Service).
type Service struct {
	Name    string   `json:"name"`
	Command []string `json:"command"`
	Env     []string `json:"env,omitempty"`
	Port    int      `json:"port,omitempty"`
	Ready   string   `json:"ready,omitempty"`
}

// Layer is what a build reads and sets of a layer. Every layer a build makes is of kind base
// (Backend).
type Layer struct {
	Name, Version string
	Digest        string
	Size, Files   int64
	// Below lists the layers (NAME:VERSION) it stacks on, lowest first.
	Below       []string
	ImageConfig *ImageConfig
	// Project is the owning project, canonical.
	Project   string
	CreatedAt time.Time
}

// Sandbox is what a build step's sandbox is made with.
type Sandbox struct {
	// Base is the layer (NAME:VERSION) under the step, with its stack.
	Base    string
	Project string
	Runtime string
	// Network is the step's policy (nil: no network).
	Network *netpolicy.Policy
	// TTL is the sandbox's lifetime, a Go duration.
	TTL    string
	Labels map[string]string
}

// Command is a RUN step's command.
type Command struct {
	Argv []string
	Env  []string
	Cwd  string
	User string
}

// Exit is how a command ended (the API's Exit).
type Exit struct {
	Code      int
	Signal    string
	TimedOut  bool
	OOMKilled bool
	Error     string
}
