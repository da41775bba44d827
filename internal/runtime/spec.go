package runtime

import (
	"net/netip"
	"path"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Spec describes one sandbox to create, in terms every backend understands. A backend uses the
// fields that apply to it (a container mounts Lower; a VM attaches Images) and refuses a Spec
// it cannot run with errdefs.ErrInvalid.
type Spec struct {
	// ID names the sandbox: 1-64 of [A-Za-z0-9_.-], starting with a letter or digit.
	ID string
	// Hostname defaults to the ID (cut to 63 bytes).
	Hostname string
	// Runtime names what runs the sandbox (one of a backend's Runtimes: "runc", "gvisor",
	// "qemu"); Set routes Create by it. Empty: the first registered backend's default.
	Runtime string

	// Lower are the read-only layer directories, bottom (base) first; a later layer's files win.
	Lower []string
	// Images are the same layers as files (EROFS images and their extra devices), for a
	// backend that mounts them itself inside a guest kernel.
	Images []LayerImage
	// BootDisk, when set, asks for a full machine booted from this disk image (a qcow2 or raw
	// file, BootDiskFormat "qcow2" or "raw") under a writable overlay of its own (the vm tier);
	// only a backend whose Runtime serves Machine takes it.
	BootDisk, BootDiskFormat string
	// Template lets a backend that keeps templates (pre-booted VMs of a shape) start the
	// sandbox from one; others ignore it.
	Template bool

	// AgentPath is the host path of the static corral-agent binary; it runs as the sandbox's init.
	AgentPath string
	// AgentArgs follow argv[0], e.g. {"serve", "--fd", "3"}.
	AgentArgs []string
	// Env is KEY=VALUE for the agent; PATH and HOME get defaults unless set here.
	Env []string
	// Workdir, when set, is the image's working directory: made in the sandbox's root (owned by
	// root, mode 0755) when no layer has it.
	Workdir string

	// Netns is the path of a prepared network namespace to join (internal/egress); empty: a new,
	// empty one (loopback only). ResolvConf is a host file given to the sandbox as
	// /etc/resolv.conf (with Netns: it names the edge's resolver).
	Netns, ResolvConf string
	// Addr and Gateway are the sandbox's address in Netns and its gateway, for a backend whose
	// guest configures its own interface (a VM).
	Addr, Gateway netip.Addr

	CPUs        float64 // CPU quota in CPUs
	MemoryBytes int64   // memory limit; no swap
	Pids        int64   // most tasks
	DiskBytes   int64   // size of the writable layer
	OpenFiles   uint64  // RLIMIT_NOFILE, soft and hard
	ShmBytes    int64   // size of /dev/shm (tmpfs, charged to the sandbox's memory)

	// Volumes are volume images mounted into the sandbox; at most MaxVolumes.
	Volumes []Volume
	// Fork, when set, starts the sandbox from an image a Forker took of another: on its disk,
	// and from its memory when the image holds it. DiskBytes is then the image's.
	Fork *ForkImage
	// Calls makes a container of the fncall tier: its agent runs nothing but calls, each in
	// namespaces of its own (internal/agentrpc/calls.go). A backend that cannot refuses it.
	Calls bool
}

// LayerImage is one layer as files: its EROFS image and the image's extra devices (a split
// layer's data blob), bottom layer first in Spec.Images.
type LayerImage struct {
	Image   string
	Devices []string
}

// Volume is a volume to mount into a sandbox (Spec.Volumes).
type Volume struct {
	// Image is the host path of the volume's ext4 image.
	Image string
	// Path is where it is mounted in the sandbox: clean, absolute, not reserved (CheckVolumePath).
	Path     string
	ReadOnly bool
}

// MaxVolumes is the most volumes one sandbox mounts.
const MaxVolumes = 8

// reservedPaths are the sandbox paths a volume may not be mounted at or under: the kernel's
// filesystems, and Corral's own files in the sandbox.
var reservedPaths = []string{"/proc", "/dev", "/sys", "/etc/resolv.conf", "/etc/hostname", "/etc/hosts"}

// CheckVolumePath reports whether p may be a volume's path in a sandbox: absolute, clean, not /,
// not at or under /proc, /dev, /sys or a file Corral provides, and not a /.corral* path.
func CheckVolumePath(field, p string) error {
	switch {
	case p == "" || !path.IsAbs(p):
		return errdefs.Invalid(field, "%q is not an absolute path", p)
	case path.Clean(p) != p:
		return errdefs.Invalid(field, "%q is not clean (want %q)", p, path.Clean(p))
	case p == "/":
		return errdefs.Invalid(field, "a volume cannot be mounted at /")
	case len(p) > 512 || strings.ContainsAny(p, "\x00,:"):
		return errdefs.Invalid(field, "%q: at most 512 bytes, without NUL, ',' or ':'", p)
	case strings.HasPrefix(p, "/.corral"):
		return errdefs.Invalid(field, "%q: /.corral* paths are Corral's own", p)
	}
	for _, r := range reservedPaths {
		if p == r || strings.HasPrefix(p, r+"/") {
			return errdefs.Invalid(field, "%q: a volume cannot be mounted at or under %s", p, r)
		}
	}
	return nil
}

// Sandbox is a created sandbox.
type Sandbox struct {
	ID string
	// Pid is the sandbox's main host process: a container's agent (its init), a VM's QEMU.
	Pid int
	// AgentSocket is the unix socket the agent accepts on: connect here to reach it.
	AgentSocket string
	// Dir is the sandbox's state directory.
	Dir string
	// AgentLog receives the agent's stdout and stderr, where the backend keeps one.
	AgentLog string
	// Accelerator runs a VM sandbox: "kvm" or "tcg"; empty for a container.
	Accelerator string
	// Template names the template a VM was restored from; empty when it booted.
	Template string
	// HostUID is the host uid (and gid) the sandbox's root is: the first of its user
	// namespace's ids; 0 when it has none.
	HostUID uint32
}

// State is a sandbox's run state as the host sees it.
type State string

// The states Status reports.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"  // frozen (a container's cgroup freezer, a VM's snapshot)
	StateStopped State = "stopped" // the agent is gone; Delete to free the resources
	// StateOff is a machine that is powered off (Machine.Power): no process runs, its disk
	// stays, and power on boots it again.
	StateOff State = "off"
)

// Status is a sandbox's state and its memory counters.
type Status struct {
	State State
	Pid   int // the main host pid; 0 unless running or paused
	// OOMKills counts processes the kernel's OOM killer ended in this sandbox.
	OOMKills uint64
	// UnderOOM: at its memory limit with nothing the OOM killer may kill (cgroup v1 only).
	// Processes that allocate are stuck until memory is freed; the caller should Delete it.
	UnderOOM bool
	// MemoryBytes is the memory charged to the sandbox now (page cache and /dev/shm included).
	MemoryBytes uint64
}

// PauseStats describes what a Pause did. Memory figures are bytes charged to the sandbox, as
// in Status.MemoryBytes (RAM only: page cache, tmpfs and kernel memory included, swap not).
type PauseStats struct {
	// Duration is the whole call.
	Duration time.Duration
	// Freeze is the time from the start of the call until every process was frozen: from then on
	// the sandbox used no CPU. The rest of Duration is the reclaim.
	Freeze time.Duration
	// MemoryBefore is the usage just before the freeze, MemoryAfter after the reclaim.
	MemoryBefore, MemoryAfter uint64
	// MemoryReturned is MemoryBefore - MemoryAfter (0 if it grew): the RAM the host got back.
	MemoryReturned uint64
	// Swapped is the part of MemoryReturned written to swap; the rest was page cache.
	Swapped uint64
	// NoSwap reports that the host had no free swap: only page cache could be returned.
	NoSwap bool
}

// ResumeStats describes what a Resume did.
type ResumeStats struct {
	// Duration is the whole call; the processes run again from its end (minus microseconds).
	Duration time.Duration
	// InSwap is how much of the sandbox's memory was in swap when Resume began: what the
	// prefetch reads back in the background after Resume returns, or page faults do.
	InSwap uint64
}

// Usage is what a sandbox uses now, read from its cgroups and its writable disk. CPUNanos is
// the CPU time its processes used since its cgroup was made (the caller turns two reads into a
// rate); zero fields were not available.
type Usage struct {
	CPUNanos        uint64
	MemoryBytes     int64
	MemoryPeakBytes int64
	Pids            int64
	DiskBytes       int64
}

// ForkOptions tune Fork.
type ForkOptions struct {
	// DiskOnly takes the disk alone, also of a sandbox whose memory the backend could take.
	DiskOnly bool
	// BeforeRestore runs before the source is restored, where taking the image stopped it (the
	// edge puts its network address back in its namespace, as for Resume).
	BeforeRestore func() error
}

// ForkImage is what a Forker took of a sandbox, for Create (Spec.Fork) to start copies from.
// Its methods are safe for concurrent use; the backend that took it owns Backend.
type ForkImage struct {
	// Source is the sandbox it was taken of.
	Source string
	// Memory reports that it holds the source's processes and memory; false: its disk only,
	// and a copy boots afresh on it.
	Memory bool
	// Stopped is how long the source was stopped (checkpoint, disk copy and restore).
	Stopped time.Duration
	// DiskBytes is the size of the disk image.
	DiskBytes int64
	// Backend is the taking backend's own description of the image (its files), opaque to
	// everyone else.
	Backend any
}
