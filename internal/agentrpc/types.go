// Package agentrpc is the protocol between the edge (on the host) and corral-agent (inside a
// sandbox): the client the edge uses, the server corral-agent runs, and the messages they share.
//
// Transport: corral-agent inherits a listening unix socket (created by the edge in a host directory
// that nothing inside the sandbox can name) and accepts one connection per request. A connection
// carries exactly one request and its answer; an exec session streams on its connection until the
// command ends or the client hangs up. Nothing inside the sandbox holds a path or descriptor that
// reaches this socket, so the channel survives a restart of the edge (it reconnects by path) without
// ever being reachable from the sandbox.
//
// Pieces: Client is the edge's side (a connection per call, errors keep their errdefs kind across
// the wire); Server is corral-agent's side (commands with bounded output kept for reattaching, file
// operations and tar done natively, never through a sandbox binary); Harden and ListenFD are what
// corral-agent does at start. wire.go documents the frames. calls.go is the fncall tier's
// isolation of one command per call (CallPrep, ExecRequest.Call, CallEnd), with its helper, the
// agent re-executed (CallInit), in callinit.go. move.go renames within the sandbox's root;
// watch.go watches a directory tree with inotify, within bounds. A process running a Server
// reaps all its children itself (it is PID 1 in the sandbox) and must not start processes any
// other way.
package agentrpc

import (
	"io/fs"
	"time"
)

// ExecRequest starts a command inside the sandbox.
type ExecRequest struct {
	// Argv is executed directly with execve (Argv[0] looked up in PATH of Env when it has no slash).
	// When Shell is true, Argv must have exactly one element, which is run as `/bin/sh -c Argv[0]`.
	Argv  []string `json:"argv"`
	Shell bool     `json:"shell,omitempty"`
	// Env is KEY=VALUE; it is added to the sandbox's default environment (later entries win).
	Env []string `json:"env,omitempty"`
	// Cwd defaults to the user's home directory, or "/" when there is none.
	Cwd string `json:"cwd,omitempty"`
	// User is a name or uid[:gid] resolved against the sandbox's /etc/passwd and /etc/group;
	// empty means root.
	User string `json:"user,omitempty"`
	// Stdin, when set, is written to the command's stdin, which is then closed unless
	// KeepStdinOpen is set (then more comes through the Stdin call or the session's writer).
	Stdin         []byte `json:"stdin,omitempty"`
	KeepStdinOpen bool   `json:"keep_stdin_open,omitempty"`
	// Timeout, when positive, kills the command's process group with SIGKILL after it.
	Timeout time.Duration `json:"timeout,omitempty"`
	// TTY runs the command on a pseudo-terminal of Rows x Cols; stdout and stderr are then one stream.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// OutputLimit caps the output the agent keeps for this command (stdout and stderr together);
	// zero means the agent's default (16 MiB). The oldest bytes are dropped first.
	OutputLimit int64 `json:"output_limit,omitempty"`
	// Tag is an opaque label kept with the command (the edge uses it for a client's step id).
	Tag string `json:"tag,omitempty"`
	// Call runs the command as the one command of a call prepared with CallPrep, isolated from
	// the container and from other calls (see calls.go). An agent started with --calls runs
	// nothing else; any other agent refuses it. A call's command cannot have a terminal.
	Call *CallSpec `json:"call,omitempty"`
	// Exclusive runs the command with every other process of the sandbox stopped, so none can
	// signal it, ptrace it or touch its descriptors (see exclusive.go). While it runs other
	// starts and signals are refused (errdefs.ErrConflict). Without a Timeout it gets
	// DefaultExclusiveTimeout.
	Exclusive bool `json:"exclusive,omitempty"`
}

// CallSpec names the call a command runs in.
type CallSpec struct {
	// Dir is what CallPrep returned; unused with Prepare.
	Dir string `json:"dir,omitempty"`
	// Prepare prepares the call in the same request (Exec only), as CallPrep then Mkdir under
	// its upper/ would: one connection to the agent instead of three. A call prepared this way
	// whose command then fails to start stays prepared: end it with CallEnd.
	Prepare *CallPrepare `json:"prepare,omitempty"`
	// End ends the call once its command has exited and its exit event is sent (Exec only), as
	// CallEnd would; Session.CallEnd returns what the agent found. Set it only when nothing of
	// the call is to be read afterwards (its outputs are gone with it).
	End bool `json:"end,omitempty"`
}

// CallPrepare is a call to prepare along with its command.
type CallPrepare struct {
	// ID and Size are CallPrep's id and sizeBytes.
	ID   string `json:"id"`
	Size int64  `json:"size"`
	// Dirs are directories to make in the call's root (absolute paths, made under upper/ with
	// their parents, mode 0755, owned by root), such as the command's working directory.
	Dirs []string `json:"dirs,omitempty"`
}

// CallEnd is what the agent found when it ended a call.
type CallEnd struct {
	// Clean is true when the call is over and nothing of it is left in the container. When it is
	// false the container must not run another call: destroy it.
	Clean bool `json:"clean"`
	// Problems says what was found or what failed ("leftover process 12 sleep").
	Problems []string `json:"problems,omitempty"`
}

// Command states.
const (
	CommandRunning = "running"
	CommandExited  = "exited"
)

// CommandInfo describes a command the agent started.
type CommandInfo struct {
	ID        string    `json:"id"`
	Argv      []string  `json:"argv"`
	Tag       string    `json:"tag,omitempty"`
	Pid       int       `json:"pid"`
	TTY       bool      `json:"tty,omitempty"`
	Exclusive bool      `json:"exclusive,omitempty"`
	State     string    `json:"state"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	Exit      *Exit     `json:"exit,omitempty"`
	// OutputStart and OutputEnd bound the offsets still kept: [OutputStart, OutputEnd).
	// OutputStart > 0 means the oldest output was dropped to respect the limit.
	OutputStart int64 `json:"output_start"`
	OutputEnd   int64 `json:"output_end"`
}

// Exit is how a command ended.
type Exit struct {
	// Code is the exit status, or -1 when the command was killed by a signal.
	Code int `json:"code"`
	// Signal names the signal that killed it ("SIGKILL"), if any.
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// OOMKilled is set when the kernel's OOM killer ended the command (as far as the agent can tell).
	OOMKilled bool `json:"oom_killed,omitempty"`
	// Error is set when the command could not be started at all (no such executable, bad cwd, bad
	// user); Code is then 127 (not found) or 126 (not executable / other).
	Error string `json:"error,omitempty"`
	// CPUTime is the user and system CPU time of the command and the descendants it waited for
	// (wait4's rusage); MaxRSS the largest resident set among them, in bytes. For a call,
	// CPUTime counts every process of the call (background ones too), MaxRSS is the command's
	// as above; both are zero when the command never ran, and MaxRSS also when it is not known
	// (a call whose helper died; see calls.go).
	CPUTime time.Duration `json:"cpu_ns,omitempty"`
	MaxRSS  int64         `json:"max_rss_bytes,omitempty"`
}

// Event kinds in an output stream.
const (
	EventStdout    = "stdout"
	EventStderr    = "stderr"
	EventTruncated = "truncated" // Dropped bytes were lost before Offset
	EventExit      = "exit"
)

// Event is one item of a command's output stream. Offsets count stdout and stderr bytes together,
// in the order the agent read them, from 0 at the command's start.
type Event struct {
	Type    string `json:"type"`
	Offset  int64  `json:"offset"`
	Data    []byte `json:"data,omitempty"`
	Dropped int64  `json:"dropped,omitempty"`
	Exit    *Exit  `json:"exit,omitempty"`
}

// FileInfo describes one file inside the sandbox.
type FileInfo struct {
	Name    string      `json:"name"`
	Path    string      `json:"path"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mod_time"`
	IsDir   bool        `json:"is_dir"`
	// Link is the target of a symbolic link.
	Link string `json:"link,omitempty"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
}

// WriteOptions controls WriteFile and Mkdir.
type WriteOptions struct {
	Mode fs.FileMode `json:"mode,omitempty"` // default 0644 for files, 0755 for directories
	// User owns what is created (name or uid[:gid]); empty means root.
	User string `json:"user,omitempty"`
	// Parents creates missing parent directories.
	Parents bool `json:"parents,omitempty"`
	// Append appends to an existing file instead of replacing it.
	Append bool `json:"append,omitempty"`
}

// Info describes the agent itself.
type Info struct {
	Version  string `json:"version"`
	Pid      int    `json:"pid"`
	Commands int    `json:"commands"`
	// Running counts commands that have not exited; the edge uses it for the idle TTL.
	Running int `json:"running"`
}

// Watch event types. The first five name what happened to an entry of the watched tree; an
// overflow says events were lost (the reader was slow, or the kernel's queue filled), so the
// watcher should look at the tree again.
const (
	WatchCreate   = "create"
	WatchWrite    = "write"
	WatchRemove   = "remove"
	WatchRename   = "rename"
	WatchChmod    = "chmod"
	WatchOverflow = "overflow"
)

// WatchEvent is one change in a watched directory tree.
type WatchEvent struct {
	Type string `json:"type"`
	// Name is the entry's path relative to the watched directory ("sub/file"); empty for the
	// directory itself (its remove or rename ends the watch) and for an overflow.
	Name string `json:"name,omitempty"`
	// At is when the agent read the event.
	At time.Time `json:"at"`
}
