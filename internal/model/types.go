package model

import (
	"io/fs"
	"time"
)

// Sandbox states.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StatePaused   = "paused"
	StateStopped  = "stopped"
	// StateDeleting is a deleted sandbox whose host cleanup has not finished: nothing of it
	// runs and it no longer counts against quotas; it becomes stopped (reason deleted, with
	// the deleted event) once its mounts, cgroups and network are gone.
	StateDeleting = "deleting"
	StateFailed   = "failed"
	// StateOff is a vm sandbox whose machine is powered off (POST .../power off): its disk
	// stays; power on boots it again.
	StateOff = "off"
)

// Reasons a sandbox stopped or failed. Errors are reported as "error: <message>".
const (
	ReasonDeleted     = "deleted"
	ReasonTTLExpired  = "ttl_expired"
	ReasonIdleExpired = "idle_expired"
	ReasonOOMKilled   = "oom_killed"
)

// LayerRef names a published layer version, "NAME:VERSION".
type LayerRef = string

// Limits bound what a sandbox may use. Zero fields take the server's defaults.
type Limits struct {
	// CPUs is a CPU quota in cores (0.5 = half a core).
	CPUs float64 `json:"cpus,omitempty"`
	// MemoryBytes is the memory limit (processes and page cache, without swap).
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Pids caps the number of processes and threads.
	Pids int64 `json:"pids,omitempty"`
	// DiskBytes caps the writable layer (enforced by a filesystem of that size).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// OpenFiles is RLIMIT_NOFILE for every process in the sandbox.
	OpenFiles int64 `json:"open_files,omitempty"`
	// OutputBytes caps the output kept per command (stdout and stderr together).
	OutputBytes int64 `json:"output_bytes,omitempty"`
}

// CreateRequest is the body of POST /v1/sandboxes.
type CreateRequest struct {
	// Tier is "container" (the default), "microvm" (a VM with its own kernel) or "vm" (a full
	// machine booted from a disk image, with a screen, keyboard and mouse; see
	// docs/ARCHITECTURE.md). fncall sandboxes are made by fncall environments.
	Tier string `json:"tier,omitempty"`
	// Image is a vm sandbox's disk image: a published layer NAME:VERSION of kind vm-image. The
	// vm tier takes it instead of Base, Workspace and Toolkits.
	Image LayerRef `json:"image,omitempty"`
	// Runtime runs a container sandbox: "runc" (the default) or "gvisor" (gVisor's runsc: the
	// sandbox's syscalls are served by a user-space kernel; pause is a checkpoint to disk).
	Runtime   string     `json:"runtime,omitempty"`
	Base      LayerRef   `json:"base"`
	Workspace LayerRef   `json:"workspace,omitempty"`
	Toolkits  []LayerRef `json:"toolkits,omitempty"`
	Limits    Limits     `json:"limits,omitzero"`
	// Env is added to every command's environment (KEY=VALUE).
	Env    []string          `json:"env,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// TTL is the hard lifetime (Go duration, "30m"); empty takes the server's default.
	TTL string `json:"ttl,omitempty"`
	// IdleTTL stops the sandbox after this long without API activity and without a running command.
	IdleTTL string `json:"idle_ttl,omitempty"`
	// Hostname defaults to the sandbox ID.
	Hostname string `json:"hostname,omitempty"`
	// FromSnapshot creates the sandbox from a snapshot layer NAME:VERSION: its environment and the
	// snapshot chain below it. Base, Workspace and Toolkits must then be empty.
	FromSnapshot LayerRef `json:"from_snapshot,omitempty"`
	// AutoPauseAfter pauses the sandbox after this long without API activity and without a
	// running command (instead of stopping it, which IdleTTL does). Go duration; empty: never.
	AutoPauseAfter string `json:"auto_pause_after,omitempty"`
	// PauseKeepsTTL (default true) makes paused time count against the hard TTL; false moves the
	// expiry later by the time spent paused.
	PauseKeepsTTL *bool `json:"pause_keeps_ttl,omitempty"`
	// Network is the egress policy; nil or mode "none": loopback only.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Environment names a saved environment to create the sandbox from; Base, Workspace and
	// Toolkits must then be empty.
	Environment string `json:"environment,omitempty"`
	// Project is the project the sandbox lives in (a path, "team-a/rollout-17"); empty: the
	// project of the caller's token.
	Project string `json:"project,omitempty"`
	// NodeSelector lists labels the node must carry (gpu=h100, kvm=true): in a cluster the
	// sandbox is placed only on such a node, and a node without them refuses it (409 node_full).
	NodeSelector map[string]string `json:"node_selector,omitempty"`
	// Fetch says how the sandbox's layer data reaches the node: "eager" (all of it before the
	// sandbox starts), "lazy" (chunks fetched when read) or "prefetch" (lazy, with the start-up
	// set its environment read last time fetched at once); empty takes the node's default.
	Fetch string `json:"fetch,omitempty"`
	// Volumes are volumes of the sandbox's project mounted into it (at most 8): one read-write
	// attachment of a volume at a time, or any number of read-only ones.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// IdempotencyKey, sent as the Idempotency-Key header (not in the body), makes the create safe
	// to retry: for 24 hours the same key with the same request returns the sandbox the first
	// create made (200, header Idempotent-Replayed), and with another request is refused (409).
	IdempotencyKey string `json:"-"`
}

// EgressStats counts a networked sandbox's blocked egress attempts.
type EgressStats struct {
	// Blocked counts attempts by reason: no_rule, denied, blocked_range, dns_bypass, host (packets; host: to the host itself);
	// dns_refused, dns_type, dns_tunnel, dns_rate (DNS queries).
	Blocked      map[string]uint64 `json:"blocked"`
	BlockedTotal uint64            `json:"blocked_total"`
	// Actions counts the sandbox's data-plane calls (exec, commands, files) since corral started.
	Actions               uint64  `json:"actions"`
	BlockedPer1000Actions float64 `json:"blocked_per_1000_actions"`
}

// BlockedAttempt is one blocked egress attempt (GET /v1/sandboxes/{id}/network/blocked).
type BlockedAttempt struct {
	At       time.Time `json:"at"`
	Reason   string    `json:"reason"`
	Name     string    `json:"name,omitempty"` // the DNS name asked for
	Dest     string    `json:"dest,omitempty"` // the destination address
	Port     int       `json:"port,omitempty"`
	Protocol string    `json:"protocol"`
}

// Sandbox is the API view of a sandbox.
type Sandbox struct {
	ID      string `json:"id"`
	Project string `json:"project"`
	Node    string `json:"node"`
	Tier    string `json:"tier"`
	Runtime string `json:"runtime"`
	// Accelerator runs a microvm sandbox: "kvm", or "tcg" (QEMU's software emulation, several
	// times slower) where KVM cannot boot the guest.
	Accelerator string `json:"accelerator,omitempty"`
	// Boot says how a microvm sandbox started: "boot" (its kernel booted), "template"
	// (restored from a snapshot of a template VM of its shape; corral up --microvm-templates),
	// "warm" (claimed from its environment's warm pool, booted ahead) or "fork" (restored from the
	// memory snapshot of the sandbox it was forked from).
	Boot string `json:"boot,omitempty"`
	// Image is a vm sandbox's disk image layer (NAME:VERSION).
	Image     LayerRef          `json:"image,omitempty"`
	State     string            `json:"state"`
	Reason    string            `json:"reason,omitempty"`
	Base      LayerRef          `json:"base"`
	Workspace LayerRef          `json:"workspace,omitempty"`
	Toolkits  []LayerRef        `json:"toolkits,omitempty"`
	Limits    Limits            `json:"limits"`
	Env       []string          `json:"env,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Hostname  string            `json:"hostname"`
	CreatedAt time.Time         `json:"created_at"`
	// ExpiresAt is when the hard TTL ends.
	ExpiresAt time.Time `json:"expires_at"`
	// IdleTTL in seconds; 0 means none.
	IdleTTLSeconds int64     `json:"idle_ttl_seconds,omitempty"`
	LastActivityAt time.Time `json:"last_activity_at"`
	EndedAt        time.Time `json:"ended_at,omitzero"`
	// FromSnapshot names the snapshot the sandbox was made from, if any.
	FromSnapshot LayerRef `json:"from_snapshot,omitempty"`
	// ForkedFrom names the sandbox this one is a fork copy of (POST /v1/sandboxes/{id}/fork).
	ForkedFrom string `json:"forked_from,omitempty"`
	// AutoPauseAfterSeconds is 0 when the sandbox never pauses by itself.
	AutoPauseAfterSeconds int64 `json:"auto_pause_after_seconds,omitempty"`
	PauseKeepsTTL         bool  `json:"pause_keeps_ttl"`
	// PausedAt is set while the sandbox is paused.
	PausedAt time.Time `json:"paused_at,omitzero"`
	// LastPause describes the last pause: how long it took and the memory it gave back.
	LastPause *PauseInfo `json:"last_pause,omitempty"`
	// Cwd and User are the defaults of commands that name none (from the base image's config).
	Cwd  string `json:"cwd,omitempty"`
	User string `json:"user,omitempty"`
	// Environment is the saved environment the sandbox was made from, if any (Base, Workspace and
	// Toolkits then hold the versions it resolved to).
	Environment string `json:"environment,omitempty"`
	// Fetch is how the sandbox's layer data reached the node: eager, lazy or prefetch.
	Fetch string `json:"fetch,omitempty"`
	// Network is the egress policy in force (normalised); NetworkAddress the sandbox's address.
	Network        *NetworkPolicy `json:"network,omitempty"`
	NetworkAddress string         `json:"network_address,omitempty"`
	// Egress counts blocked egress attempts (running networked sandboxes).
	Egress *EgressStats `json:"egress,omitempty"`
	// Volumes are the volumes mounted into the sandbox.
	Volumes []VolumeMount `json:"volumes,omitempty"`
}

// PauseInfo reports what a pause did.
type PauseInfo struct {
	TookMs         float64 `json:"took_ms"`
	MemoryBefore   int64   `json:"memory_before_bytes"`
	MemoryAfter    int64   `json:"memory_after_bytes"`
	MemoryReturned int64   `json:"memory_returned_bytes"`
	// MemorySwapped is the part of MemoryReturned written to swap (the rest was page cache).
	MemorySwapped int64 `json:"memory_swapped_bytes"`
	// NoSwap says the host had no free swap, so only page cache could be returned.
	NoSwap         bool    `json:"no_swap,omitempty"`
	ResumeTookMs   float64 `json:"resume_took_ms,omitempty"`
	AutomaticPause bool    `json:"automatic,omitempty"`
}

// MaxForkCount is the most copies one fork makes.
const MaxForkCount = 64

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork: Count copies (1 when absent, at most
// MaxForkCount) that go on from the sandbox's state at the moment of the fork. Labels are set on
// every copy over the source's. DiskOnly copies the writable layer only (each copy then starts
// its processes afresh): the only fork a runc sandbox has. TTL, when set, is the copies' hard
// TTL from the fork (a Go duration, as in CreateRequest); without it they expire when the
// source does.
type ForkRequest struct {
	Count    int               `json:"count,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	DiskOnly bool              `json:"disk_only,omitempty"`
	TTL      string            `json:"ttl,omitempty"`
}

// ForkResult answers a fork: the new sandboxes, running.
type ForkResult struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// TTLRequest is the body of POST /v1/sandboxes/{id}/ttl: the sandbox then expires TTL from now.
type TTLRequest struct {
	TTL string `json:"ttl"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec and POST /v1/sandboxes/{id}/commands.
type ExecRequest struct {
	Argv []string `json:"argv"`
	// Shell runs Argv[0] with /bin/sh -c inside the sandbox (Argv must then have one element).
	Shell bool     `json:"shell,omitempty"`
	Env   []string `json:"env,omitempty"`
	Cwd   string   `json:"cwd,omitempty"`
	User  string   `json:"user,omitempty"`
	// Stdin is sent to the command, then stdin is closed (unless the request streams stdin, or
	// OpenStdin is set).
	Stdin []byte `json:"stdin,omitempty"`
	// OpenStdin keeps the command's stdin open after Stdin for WriteStdin (POST
	// .../commands/{cid}/stdin), which closes it with eof; a background command otherwise reads
	// an empty stdin.
	OpenStdin bool `json:"open_stdin,omitempty"`
	// Timeout (Go duration) kills the command after it.
	Timeout string `json:"timeout,omitempty"`
	TTY     bool   `json:"tty,omitempty"`
	Rows    uint16 `json:"rows,omitempty"`
	Cols    uint16 `json:"cols,omitempty"`
	// StepID names this call in the sandbox's trajectory. Calling again with a step ID that
	// completed returns the recorded result without running anything; with one still running it
	// attaches to that command; with one used for a different request it is a 409.
	StepID string `json:"step_id,omitempty"`
	// Exclusive runs the command with every other process of the sandbox stopped (SIGSTOP) for
	// its duration, so none can signal it, ptrace it, or read or write its stdin, stdout or
	// stderr; they continue when it ends. Meant for a grader running after an agent's turn. While
	// it runs, other commands and signals in the sandbox are refused (409), as is a second
	// exclusive command; without a Timeout it is killed after 10 minutes. The argv runs directly;
	// with Shell it runs the sandbox's /bin/sh, which the sandbox's processes may have replaced.
	Exclusive bool `json:"exclusive,omitempty"`
}

// Command describes a command started in a sandbox.
type Command struct {
	ID          string    `json:"id"`
	Argv        []string  `json:"argv"`
	Pid         int       `json:"pid"`
	TTY         bool      `json:"tty,omitempty"`
	Exclusive   bool      `json:"exclusive,omitempty"`
	State       string    `json:"state"` // running | exited
	StartedAt   time.Time `json:"started_at"`
	EndedAt     time.Time `json:"ended_at,omitzero"`
	Exit        *Exit     `json:"exit,omitempty"`
	OutputStart int64     `json:"output_start"`
	OutputEnd   int64     `json:"output_end"`
}

// Exit is how a command ended.
type Exit struct {
	Code      int    `json:"code"`
	Signal    string `json:"signal,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	Error     string `json:"error,omitempty"`
}

// Event is one line of an NDJSON output stream (exec, attach).
//
// type "start" carries the command ID (and, from exec, its Pid); "stdout"/"stderr" carry Data at Offset (stdout and stderr
// bytes counted together); "truncated" says Dropped bytes before Offset are gone; "exit" is last.
type Event struct {
	Type      string `json:"type"`
	CommandID string `json:"command_id,omitempty"`
	// Pid is the command's process ID in the sandbox, on the start event of an exec that ran
	// it (a replayed step has none).
	Pid     int    `json:"pid,omitempty"`
	Offset  int64  `json:"offset,omitempty"`
	Data    []byte `json:"data,omitempty"`
	Dropped int64  `json:"dropped,omitempty"`
	Exit    *Exit  `json:"exit,omitempty"`
	// Replayed is set on the start event when the result comes from the trajectory log (a
	// completed step_id) and nothing was run.
	Replayed bool `json:"replayed,omitempty"`
	// Result is set on the exit event that ends a call's stream (CallStream).
	Result *CallResult `json:"result,omitempty"`
}

// ResizeRequest is the body of POST /v1/sandboxes/{id}/commands/{cid}/resize.
type ResizeRequest struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// SignalRequest is the body of POST /v1/sandboxes/{id}/commands/{cid}/signal.
type SignalRequest struct {
	Signal string `json:"signal"` // "SIGTERM", "TERM" or a number
}

// FileInfo describes a file inside a sandbox.
type FileInfo struct {
	Name    string      `json:"name"`
	Path    string      `json:"path"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mod_time"`
	IsDir   bool        `json:"is_dir"`
	Link    string      `json:"link,omitempty"`
	UID     int         `json:"uid"`
	GID     int         `json:"gid"`
}

// MkdirRequest is the body of POST /v1/sandboxes/{id}/files/mkdir.
type MkdirRequest struct {
	Path    string      `json:"path"`
	Mode    fs.FileMode `json:"mode,omitempty"`
	Parents bool        `json:"parents,omitempty"`
	User    string      `json:"user,omitempty"`
}

// MoveRequest is the body of POST /v1/sandboxes/{id}/files/move.
type MoveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// Watch event types. A watch stream starts with WatchStart once the watch is in place; then each
// event names what happened to an entry of the watched tree. WatchOverflow says events were lost
// (the client read too slowly, or the tree changed faster than the sandbox could report): look at
// the tree again.
const (
	WatchStart    = "start"
	WatchCreate   = "create"
	WatchWrite    = "write"
	WatchRemove   = "remove"
	WatchRename   = "rename"
	WatchChmod    = "chmod"
	WatchOverflow = "overflow"
)

// WatchEvent is one line of a watch stream (GET /v1/sandboxes/{id}/files/watch).
type WatchEvent struct {
	Type string `json:"type"`
	// Name is the entry's path relative to the watched directory ("sub/file"); empty for the
	// directory itself, whose remove or rename is the last event of the stream.
	Name string `json:"name,omitempty"`
	// At is when the sandbox saw the change.
	At time.Time `json:"at,omitzero"`
}

// Layer kinds.
const (
	KindBase      = "base"
	KindWorkspace = "workspace"
	KindToolkit   = "toolkit"
	// KindSnapshot layers come only from POST /v1/sandboxes/{id}/snapshot.
	KindSnapshot = "snapshot"
	// KindVMImage is a vm sandbox's disk image: a layer holding one file, disk.qcow2 or
	// disk.raw (see VMDiskQCOW2, VMDiskRaw).
	KindVMImage = "vm-image"
)

// The file names a vm-image layer may hold (exactly one of them).
const (
	VMDiskQCOW2 = "disk.qcow2"
	VMDiskRaw   = "disk.raw"
)

// SnapshotOf records what a snapshot layer sits on: the environment of the sandbox it was taken
// from, and the snapshots below it (bottom first) when that sandbox was itself made from one.
type SnapshotOf struct {
	Base      LayerRef   `json:"base"`
	Workspace LayerRef   `json:"workspace,omitempty"`
	Toolkits  []LayerRef `json:"toolkits,omitempty"`
	Parents   []LayerRef `json:"parents,omitempty"`
	// Sandbox is the sandbox the snapshot was taken from.
	Sandbox string `json:"sandbox"`
	// Excluded lists the paths whose changes were left out.
	Excluded []string `json:"excluded,omitempty"`
	// Skipped lists entries of the sandbox's changes that a layer cannot hold and the snapshot
	// left out (device nodes, sockets, names starting with ".wh.", which in a layer would be
	// whiteouts, and hard links to those), the first 100 of them; SkippedCount counts them all.
	Skipped      []SnapshotSkip `json:"skipped,omitempty"`
	SkippedCount int            `json:"skipped_count,omitempty"`
}

// SnapshotSkip is an entry a snapshot left out, and why.
type SnapshotSkip struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshot.
type SnapshotRequest struct {
	// Name and Version publish the snapshot as a layer NAME:VERSION of kind snapshot.
	Name    string `json:"name"`
	Version string `json:"version"`
	// Exclude leaves out the sandbox's changes under these absolute paths (build leftovers,
	// answers), so they never reach the sandboxes made from the snapshot.
	Exclude []string `json:"exclude,omitempty"`
	// Public publishes the snapshot to every project; by default only the sandbox's project and
	// its descendants see it (a root-project snapshot: the root project only). See Layer.Public.
	Public bool `json:"public,omitempty"`
}

// Layer is a published, immutable layer version.
type Layer struct {
	Name      string            `json:"name"`
	Version   string            `json:"version"`
	Kind      string            `json:"kind"`
	Digest    string            `json:"digest"`
	Size      int64             `json:"size"`
	Files     int64             `json:"files"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// Snapshot is set on layers of kind snapshot.
	Snapshot *SnapshotOf `json:"snapshot,omitempty"`
	// Tags are the tags of the movable names NAME:TAG pointing at this version now: "latest"
	// for python:latest.
	Tags []string `json:"tags,omitempty"`
	// ImageConfig is the configuration of the container image the layer was imported from, if
	// any: sandboxes whose base is this layer get its Env, and its WorkingDir and User as the
	// defaults of their commands.
	ImageConfig *ImageConfig `json:"image_config,omitempty"`
	// Below lists the versions (NAME:VERSION, bottom first) that this layer stacks on: a
	// multi-layer image imported as several layers (`corral layer import --split`). Using this
	// layer uses them, under it, in this order.
	Below []string `json:"below,omitempty"`
	// Project is the project that owns the layer's name. Who sees and uses the layer: by default
	// its project and that project's descendants, except that a root-project layer reaches no
	// other project; Private keeps it to its project alone; Public shows it to every project.
	// A layer a caller does not see is, to that caller, not found.
	Project string `json:"project"`
	Private bool   `json:"private,omitempty"`
	Public  bool   `json:"public,omitempty"`
	// FillRate is how fast (bytes per second) a node fetches the rest of this layer in the
	// background once a prefetch sandbox's start-up set is in: 0 takes the node's default
	// (corral up --fetch-fill-rate), -1 never. Set with PATCH /v1/layers/{name}/{version} (corral layer set); it is a setting, not
	// content, so it may change on a published version.
	FillRate int64 `json:"fill_rate,omitempty"`
}

// LayerSettings is the body of PATCH /v1/layers/{name}/{version}: the settings of a published
// version (its content stays immutable). Nil fields are left as they are.
type LayerSettings struct {
	// FillRate: bytes per second; 0 the node's default; -1 never.
	FillRate *int64 `json:"fill_rate,omitempty"`
	// Public true shows the version to every project (and clears Private); false takes it back
	// to its default visibility (Layer.Project). Sandboxes already made keep what they use.
	Public *bool `json:"public,omitempty"`
}

// ImageConfig is the part of an OCI image's configuration Corral keeps (POST /v1/layers takes it
// as the image_config query parameter, JSON).
type ImageConfig struct {
	Env        []string          `json:"env,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	// Services are programs every sandbox with this layer (base or toolkit) starts in the
	// background when it is created: a toolkit's server, such as the code interpreter's that
	// `corral env install code-interpreter` publishes.
	Services []Service `json:"services,omitempty"`
}

// Service is a program a layer starts in each sandbox made with it (ImageConfig.Services), as
// root, in /, with the sandbox's environment and Env. It runs as a command of the sandbox
// (`corral ps`), tagged "service:NAME".
type Service struct {
	Name    string   `json:"name"`
	Command []string `json:"command"`
	Env     []string `json:"env,omitempty"`
	// Port, when set, is the loopback TCP port the service listens on: on container sandboxes
	// (runc) the create returns once it accepts connections, or after 10 s.
	Port int `json:"port,omitempty"`
	// Ready, when set, is the service's readiness check: an HTTP path on Port ("/ready") that
	// answers GET with a 2xx status once the service can serve, 503 while it is still starting
	// (any other status: it failed to get ready). A warm pool counts a sandbox ready only once
	// every such check passes (or after 60 s), so a claimed sandbox's services are ready. A
	// create that starts a sandbox waits for Port only.
	Ready string `json:"ready,omitempty"`
}

// Environment is a saved composition of layers (POST /v1/environments): create a sandbox from it
// with CreateRequest.Environment. Base is required; toolkits stack in order above the workspace.
// References may be tags (python:latest); they are resolved when a sandbox is created.
type Environment struct {
	Name      string     `json:"name"`
	Base      LayerRef   `json:"base"`
	Workspace LayerRef   `json:"workspace,omitempty"`
	Toolkits  []LayerRef `json:"toolkits,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	// Project owns the environment's name; it is usable in the project's whole subtree.
	Project string `json:"project"`
	// MicroVMTemplate starts the environment's microvm sandboxes from a snapshot of a template
	// VM of their shape, built by the first of them on each node, instead of booting each.
	MicroVMTemplate bool `json:"microvm_template,omitempty"`
	// Tier is the tier of the environment's sandboxes when a create names none, and the tier of
	// its warm pool: "container" (empty: container) or "microvm".
	Tier string `json:"tier,omitempty"`
	// Runtime is the container runtime of the environment's sandboxes when a create names none
	// ("runc" or "gvisor"; empty: runc), and the runtime of its warm pool.
	Runtime string `json:"runtime,omitempty"`
	// Network is the egress policy of the environment's sandboxes when a create names none. A
	// warm pool's sandboxes are networked when its mode is not none; a claim applies the
	// create's own policy.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Warm keeps up to this many started sandboxes of the environment ready on each node (at
	// most 256; 0: none): containers, or booted VMs when its tier is microvm. A create naming the environment whose request matches the
	// pool's shape claims one instead of starting a sandbox; PATCH /v1/environments/{name}
	// changes it. The pool shrinks towards 1 (0 after 10 minutes without claims) when demand is
	// lower.
	Warm int `json:"warm,omitempty"`
	// WarmReady, WarmTarget, WarmHits, WarmClaims and WarmHitRate describe this node's pools of
	// the environment (read-only): sandboxes ready, the size the pool aims at now, creates
	// served from the pool, creates that named the environment while it had a pool, and
	// hits/claims.
	WarmReady   int     `json:"warm_ready"`
	WarmTarget  int     `json:"warm_target"`
	WarmHits    int64   `json:"warm_hits"`
	WarmClaims  int64   `json:"warm_claims"`
	WarmHitRate float64 `json:"warm_hit_rate"`
}

// EnvironmentPatch is the body of PATCH /v1/environments/{name}: the fields to change (nil:
// unchanged).
type EnvironmentPatch struct {
	Warm *int `json:"warm,omitempty"`
}

// GCResult is the answer of POST /v1/layers/gc.
type GCResult struct {
	Removed int   `json:"removed"`
	Bytes   int64 `json:"bytes"`
}

// TagRequest is the body of PUT /v1/layers/{name}/tags/{tag}.
type TagRequest struct {
	Version string `json:"version"`
}

// Info is the answer of GET /v1/info.
type Info struct {
	Version     string `json:"version"`
	Node        string `json:"node"`
	Runtime     string `json:"runtime"`      // the default runtime, "runc"
	RuntimePath string `json:"runtime_path"` // the binary in use
	// RuntimeVersion is the first line of `runc --version`.
	RuntimeVersion string `json:"runtime_version"`
	// Runtimes lists the runtimes sandboxes can be created with here ("runc", "gvisor").
	Runtimes []string `json:"runtimes"`
	// GVisorVersion is the first line of `runsc --version`; GVisorUnavailable says why gVisor
	// cannot be used here when it cannot.
	GVisorVersion     string `json:"gvisor_version,omitempty"`
	GVisorUnavailable string `json:"gvisor_unavailable,omitempty"`
	// LXCFSVersion is the version of the LXCFS that gives container sandboxes their own
	// /proc/meminfo, cpuinfo, stat, uptime, loadavg, diskstats, swaps and
	// /sys/devices/system/cpu/online; LXCFSUnavailable says why none runs here (they then read
	// the host's).
	LXCFSVersion     string `json:"lxcfs_version,omitempty"`
	LXCFSUnavailable string `json:"lxcfs_unavailable,omitempty"`
	// UserNS describes the user namespaces container sandboxes (runc) run in: each its own
	// range of unprivileged host ids, layers and disk through idmapped mounts.
	// UserNSUnavailable says why they run without (their root is then the host's).
	UserNS            string `json:"userns,omitempty"`
	UserNSUnavailable string `json:"userns_unavailable,omitempty"`
	// Tiers lists the tiers sandboxes can be created in here ("container", "microvm", "vm").
	Tiers []string `json:"tiers,omitempty"`
	// MicroVMAccelerator is what microvm sandboxes run on here ("kvm" or "tcg") and
	// MicroVMAcceleratorWhy why (e.g. why not KVM); MicroVMUnavailable says why microvm
	// sandboxes cannot be created here when they cannot. QEMUVersion is QEMU's version line.
	MicroVMAccelerator    string `json:"microvm_accelerator,omitempty"`
	MicroVMAcceleratorWhy string `json:"microvm_accelerator_why,omitempty"`
	MicroVMUnavailable    string `json:"microvm_unavailable,omitempty"`
	QEMUVersion           string `json:"qemu_version,omitempty"`
	// VMUnavailable says why vm sandboxes cannot be created here when they cannot (they run on
	// MicroVMAccelerator too).
	VMUnavailable string `json:"vm_unavailable,omitempty"`
	// NetworkPool is the sandbox address pool when sandbox networking is on; NetworkOff says
	// why it is off.
	NetworkPool   string `json:"network_pool,omitempty"`
	NetworkOff    string `json:"network_off,omitempty"`
	DataDir       string `json:"data_dir"`
	Sandboxes     int    `json:"sandboxes"`
	CgroupVersion string `json:"cgroup_version"`
	// Disk is the node's disk account (shown to operators only).
	Disk *DiskAccount `json:"disk,omitempty"`
}

// DiskAccount is what a node has promised of its data dir's filesystem. A create is admitted
// while PromisedBytes plus its disk limit stays within HaveBytes (else 409 node_full).
type DiskAccount struct {
	// PromisedBytes is the disk limits of live sandboxes plus disks made ahead (and volumes).
	PromisedBytes int64 `json:"promised_bytes"`
	// AllocatedBytes is what of it is already taken from the filesystem.
	AllocatedBytes int64 `json:"allocated_bytes"`
	// FreeBytes is the filesystem's free space, less what Corral keeps for itself.
	FreeBytes int64 `json:"free_bytes"`
	// Overcommit multiplies what the filesystem can hold (corral up --overcommit-disk).
	Overcommit float64 `json:"overcommit"`
	// HaveBytes is (FreeBytes + AllocatedBytes) × Overcommit.
	HaveBytes int64 `json:"have_bytes"`
}

// Error is the body of every error response.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the request field that was invalid, when there is one.
	Field string `json:"field,omitempty"`
	// Quota says which limit refused the request (code exhausted, status 429).
	Quota *QuotaExceeded `json:"quota,omitempty"`
	// Permission names the permission the caller lacks (code denied, status 403).
	Permission string `json:"permission,omitempty"`
}

// Trajectory step states.
const (
	StepRunning = "running"
	StepDone    = "done"
	StepFailed  = "failed"
)

// TrajectoryEntry is one step of a sandbox's trajectory log: an exec or file-changing call made
// through the API, in the order the sandbox received them. GET /v1/sandboxes/{id}/trajectory
// returns them as NDJSON.
type TrajectoryEntry struct {
	Seq    int64  `json:"seq"`
	StepID string `json:"step_id,omitempty"`
	// Kind is exec, write_file, mkdir, remove, move or tar_in.
	Kind string `json:"kind"`
	// Request is the call as received (file contents are represented by their size and sha256).
	Request   any    `json:"request"`
	CommandID string `json:"command_id,omitempty"`
	// Exclusive marks an exec run with every other process of the sandbox stopped
	// (ExecRequest.Exclusive).
	Exclusive bool      `json:"exclusive,omitempty"`
	State     string    `json:"state"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	Exit      *Exit     `json:"exit,omitempty"`
	// Output holds the command's stdout and stderr events, capped; OutputTruncated says bytes
	// were left out.
	Output          []Event `json:"output,omitempty"`
	OutputTruncated bool    `json:"output_truncated,omitempty"`
	// OutputDropped says the step's output was dropped after it finished, to keep its
	// sandbox's stored trajectory within its bound (oldest steps' first; the step and its
	// step_id stay, and a replay of it returns its exit without its output).
	OutputDropped bool   `json:"output_dropped,omitempty"`
	Error         string `json:"error,omitempty"`
}

// FetchStats describe how a layer's data, or a sandbox's layers' data, reached the node: Corral
// stores layers as metadata plus data fetched in chunks from the blob store when read.
type FetchStats struct {
	Layer   string `json:"layer,omitempty"`   // the layer's metadata image digest (hex), for a layer
	Sandbox string `json:"sandbox,omitempty"` // the sandbox ID, for a sandbox
	// DataSize and Chunks describe the layer's data blob; CachedChunks and CachedBytes how much
	// of it the node's chunk cache holds; Open how many mounts read it now.
	DataSize     int64 `json:"data_size,omitempty"`
	Chunks       int   `json:"chunks,omitempty"`
	CachedChunks int   `json:"cached_chunks,omitempty"`
	CachedBytes  int64 `json:"cached_bytes"`
	Open         int   `json:"open,omitempty"`
	// BytesRead were served to the kernel (page-cache misses of the sandboxes' reads); Hits and
	// Misses count chunk reads found in, or missing from, the node's cache.
	BytesRead int64 `json:"bytes_read"`
	Hits      int64 `json:"cache_hits"`
	Misses    int64 `json:"cache_misses"`
	// BytesFetched and Fetches count ranged reads of the blob store; FetchErrors the failed ones
	// (retried), Corrupt the chunks that did not match their SHA-256 (refetched), ReadErrors the
	// reads that failed with EIO in the sandbox.
	BytesFetched int64 `json:"bytes_fetched"`
	Fetches      int64 `json:"fetches"`
	FetchErrors  int64 `json:"fetch_errors"`
	Corrupt      int64 `json:"corrupt_chunks"`
	ReadErrors   int64 `json:"read_errors"`
	// FillBytes were fetched by the background fill.
	FillBytes    int64            `json:"fill_bytes"`
	Prefetch     PrefetchStats    `json:"prefetch"`
	FetchLatency LatencyHistogram `json:"fetch_latency"`
	LastError    string           `json:"last_error,omitempty"`
	LastErrorAt  time.Time        `json:"last_error_at,omitzero"`
}

// PrefetchStats say how much prefetch fetched and how much of it was then read.
type PrefetchStats struct {
	Chunks int64 `json:"chunks"`
	Bytes  int64 `json:"bytes"`
	Used   int64 `json:"used_chunks"`
	// Effectiveness is Used / Chunks: the share of prefetched chunks that were then read.
	Effectiveness float64 `json:"effectiveness"`
}

// LatencyHistogram counts latencies in buckets with upper bounds BoundsMs (one more count for
// everything above the last bound).
type LatencyHistogram struct {
	BoundsMs []float64 `json:"bounds_ms"`
	Counts   []int64   `json:"counts"`
	// P50Ms and P99Ms are the upper bounds of the buckets holding those quantiles (-1: above
	// the last bound).
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
}

// ChunkCacheStats describe a node's chunk cache.
type ChunkCacheStats struct {
	Bytes        int64 `json:"bytes"`
	Limit        int64 `json:"limit"`
	Chunks       int64 `json:"chunks"`
	PinnedBytes  int64 `json:"pinned_bytes"`
	Evictions    int64 `json:"evictions"`
	EvictedBytes int64 `json:"evicted_bytes"`
	Corrupt      int64 `json:"corrupt"`
	Bypassed     int64 `json:"bypassed"`
}

// LayerStats describe a layer version's storage and its fetching on the node that answered.
type LayerStats struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Digest  string `json:"digest"`
	Node    string `json:"node"`
	// Format is "erofs-split" (metadata image plus data fetched on demand) or "erofs" (one
	// image, imported before lazy loading; no fetch statistics).
	Format     string           `json:"format"`
	ImageBytes int64            `json:"image_bytes"`
	DataBytes  int64            `json:"data_bytes"`
	Fetch      *FetchStats      `json:"fetch,omitempty"`
	Cache      *ChunkCacheStats `json:"cache,omitempty"`
}

// InputEvent is one keyboard or mouse action for a vm sandbox (POST /v1/sandboxes/{id}/input).
type InputEvent struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
	Key  string `json:"key,omitempty"`
	X    int    `json:"x,omitempty"`
	Y    int    `json:"y,omitempty"`
	// Button is "left" (the default), "right" or "middle".
	Button string `json:"button,omitempty"`
	Count  int    `json:"count,omitempty"`
	Delta  int    `json:"delta,omitempty"`
	Down   *bool  `json:"down,omitempty"`
}

// InputRequest is the body of POST /v1/sandboxes/{id}/input: events sent in order (at most 256,
// and 1024 bytes of text; keys take about 20 ms each).
type InputRequest struct {
	Events []InputEvent `json:"events"`
}

// InputResult answers an input call: the events sent and the screen size that mouse coordinates
// were scaled against.
type InputResult struct {
	Events int `json:"events"`
	Width  int `json:"width,omitempty"`
	Height int `json:"height,omitempty"`
}

// Power actions (PowerRequest.Action).
const (
	PowerOn     = "on"
	PowerOff    = "off"
	PowerReboot = "reboot"
)

// PowerRequest is the body of POST /v1/sandboxes/{id}/power, for vm sandboxes. Off asks the
// guest to shut down (ACPI) and ends the machine after a grace period; Force ends it at once
// (pulling the plug). Reboot resets the machine. On boots a machine that is off.
type PowerRequest struct {
	Action string `json:"action"`
	Force  bool   `json:"force,omitempty"`
}
