package model

import (
	"time"
)

// FncallEnv is a named fncall environment (POST /v1/fncall): the layers, limits and pool of
// warm containers that stateless calls (POST /v1/fncall/{name}) run in. Nothing of a call
// survives it: every process it started is killed and every file it wrote is discarded before
// its container serves the next call.
type FncallEnv struct {
	Name string `json:"name"`
	// Project owns the environment and its pool containers (their quota is charged there);
	// empty: the caller's token's project.
	Project   string   `json:"project,omitempty"`
	Base      LayerRef `json:"base"`
	Workspace LayerRef `json:"workspace,omitempty"`
	// Toolkits stack above the workspace, in order.
	Toolkits []LayerRef `json:"toolkits,omitempty"`
	// Limits bound each pool container (all the calls it runs at once share them); zero fields
	// take the server's defaults.
	Limits Limits `json:"limits"`
	// PoolMin containers are kept ready (default 1); the pool grows under load up to PoolMax
	// (default 4) and shrinks back to PoolMin when idle.
	PoolMin int `json:"pool_min"`
	PoolMax int `json:"pool_max"`
	// Timeout is a call's default and largest timeout (Go duration, default "30s").
	Timeout string `json:"timeout,omitempty"`
	// QueueDepth calls may wait for a container when the pool is at PoolMax and busy (default
	// 64), each for at most QueueWait (default "10s"); beyond that a call gets 429 with
	// Retry-After.
	QueueDepth int    `json:"queue_depth"`
	QueueWait  string `json:"queue_wait,omitempty"`
	// Network is the egress policy of the pool's containers, which their calls share; nil or
	// mode "none": loopback only.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Warm keeps a Python interpreter started ahead in each pool container, its modules already
	// imported, for calls that give Python code (CallRequest.Python).
	Warm *WarmPython `json:"warm,omitempty"`
	// FilesBytes bounds what one call may write (its private writable layer, a tmpfs charged to
	// the container's memory; default 64 MiB).
	FilesBytes int64     `json:"files_bytes"`
	CreatedAt  time.Time `json:"created_at"`
	// Pool is the pool's state now (in GET answers).
	Pool *FncallPool `json:"pool,omitempty"`
}

// WarmPython describes an fncall environment's warm interpreters. Each serves exactly one call:
// it is started (in the call's own fresh root and namespaces) before the call arrives, imports
// Imports, then waits for the call's code; after the call a new one is started.
type WarmPython struct {
	// Interpreter is the Python executable in the environment's layers (default "python3").
	Interpreter string `json:"interpreter,omitempty"`
	// Imports are the modules imported ahead, e.g. ["json", "email", "sqlite3"].
	Imports []string `json:"imports,omitempty"`
}

// FncallPool is the state of an fncall environment's pool of containers.
type FncallPool struct {
	Ready    int   `json:"ready"`    // idle containers waiting for a call
	Busy     int   `json:"busy"`     // containers running a call
	Starting int   `json:"starting"` // containers being created
	Queued   int   `json:"queued"`   // calls waiting for a container
	Calls    int64 `json:"calls"`    // calls served since corral started
	Rejected int64 `json:"rejected"` // calls refused with 429
	Replaced int64 `json:"replaced"` // containers destroyed because a call's cleanup failed
	// LastError is why the last container could not be started, until one starts.
	LastError string `json:"last_error,omitempty"`
}

// CallRequest is one stateless call (POST /v1/fncall/{name}). Exactly one of Argv, Script and
// Python.
type CallRequest struct {
	// Python is Python code, run by the environment's warm interpreter (its modules already
	// imported) when one is ready, else by a fresh one; Argv, if given, becomes sys.argv[1:].
	Python string `json:"python,omitempty"`
	// Argv is executed directly (Argv[0] looked up in PATH when it has no slash).
	Argv []string `json:"argv,omitempty"`
	// Script is run by /bin/sh -c.
	Script string `json:"script,omitempty"`
	// Stdin is the command's standard input.
	Stdin []byte `json:"stdin,omitempty"`
	// Files are written before the command starts: absolute path, or relative to Cwd, to content.
	Files map[string][]byte `json:"files,omitempty"`
	// Env is KEY=VALUE added to the environment's defaults.
	Env []string `json:"env,omitempty"`
	// Cwd is the working directory (default /tmp/call, created empty for each call).
	Cwd string `json:"cwd,omitempty"`
	// Timeout (Go duration) kills the call and everything it started; default and maximum: the
	// environment's Timeout.
	Timeout string `json:"timeout,omitempty"`
	// Outputs are files (absolute, or relative to Cwd) to return after the command ends.
	Outputs []string `json:"outputs,omitempty"`
	// Keep are files to keep on the node as artifacts after the command ends (returned by
	// reference in CallResult.Artifacts, not through the client), for a later call to take with
	// FileRefs: compile in one environment, run the binary in another.
	Keep []string `json:"keep,omitempty"`
	// KeepTTL (Go duration, 1s to MaxArtifactTTL; default ArtifactTTL) is how long the node
	// keeps the Keep files; each use keeps an artifact at least ArtifactTTL longer.
	KeepTTL string `json:"keep_ttl,omitempty"`
	// FileRefs are artifacts ("sha256:<hex>" from an earlier call's Artifacts) to write before the
	// command starts, path to reference, with the file mode they were kept with. An artifact is
	// found only by calls of environments in the project whose call kept it, on the same node.
	FileRefs map[string]string `json:"file_refs,omitempty"`
	// OutputLimit caps stdout and stderr, each (default 1 MiB, at most 16 MiB).
	OutputLimit int64 `json:"output_limit,omitempty"`
}

// CallResult is the answer to a call.
type CallResult struct {
	Stdout []byte `json:"stdout"`
	Stderr []byte `json:"stderr"`
	// StdoutTruncated and StderrTruncated say the output went over OutputLimit (its start is kept).
	StdoutTruncated bool `json:"stdout_truncated,omitempty"`
	StderrTruncated bool `json:"stderr_truncated,omitempty"`
	Exit            Exit `json:"exit"`
	// WallMs is the command's run time; QueuedMs the wait for a container; CPUMs its user+system
	// CPU time; MaxRSSBytes its peak resident memory.
	WallMs      float64 `json:"wall_ms"`
	QueuedMs    float64 `json:"queued_ms"`
	CPUMs       float64 `json:"cpu_ms"`
	MaxRSSBytes int64   `json:"max_rss_bytes"`
	// Outputs holds the requested files that existed, OutputErrors why the others are missing,
	// both keyed by the paths as CallRequest.Outputs gave them.
	Outputs      map[string][]byte `json:"outputs,omitempty"`
	OutputErrors map[string]string `json:"output_errors,omitempty"`
	// Artifacts are the Keep files kept on the node for the environment's project: path as given
	// to "sha256:<hex>" of the content. They live for KeepTTL, and at least ArtifactTTL after
	// their last use; they count against the project's Quota.ArtifactBytes.
	Artifacts map[string]string `json:"artifacts,omitempty"`
	// Warm says a warm interpreter, started before the call, ran it.
	Warm bool `json:"warm,omitempty"`
	// Container is the pool container that served the call (for debugging).
	Container string `json:"container"`
}

// ArtifactTTL is how long the node keeps an artifact after it was kept (unless the call set
// KeepTTL) and, at least, after it was last used; MaxArtifactTTL bounds KeepTTL.
const (
	ArtifactTTL    = 10 * time.Minute
	MaxArtifactTTL = 24 * time.Hour
)
