// Package runc is Corral's container sandbox backend: it turns a runtime.Spec (read-only layers,
// the corral-agent binary, limits) into a running runc container whose init process is the agent,
// and takes it apart again leaving nothing behind on the host. It implements internal/runtime's
// Runtime for the runtime names "runc" and "gvisor" (gvisor.go), with Pauser, Snapshotter,
// Forker, UsageReader and DiskHolder; Factory builds it for internal/runtime/backends.
//
// # What a sandbox is on disk
//
// Each sandbox owns <StateDir>/<id> (mode 0700), which is also its OCI bundle:
//
//	disk.img     ext4 image of DiskBytes, its blocks allocated (disk.go), loop-mounted at disk/ (the write quota)
//	disk/upper   overlayfs upper dir   disk/work  overlayfs work dir
//	disk/agent.log  stdout and stderr of the agent (bounded by the disk, like everything it writes)
//	rootfs/      overlayfs: Spec.Lower (base lowest) + disk/upper; the container's / (with
//	             Config.UserNS it is mounted at <RootsDir>/<id>/rootfs instead, see userns.go)
//	userns       with Config.UserNS: the sandbox's user-namespace slot
//	vol/<i>      Spec.Volumes[i]'s ext4 image, loop-mounted (read-only when the volume is), bound
//	             in at its path by the last mount entries of config.json (volumes.go)
//	config.json  the OCI runtime spec (built from a template made once in New)
//	agent.sock   the listening unix socket whose fd the agent inherits as fd 3 (gVisor: the
//	             Proxy's socket, whose connections go over ctl.sock to the agent; see gvisor.go)
//	ctl.sock     gVisor only: the holder's socket for the agent's link
//	init.pid     the agent's host pid, written by runc (or by Create from corral-runcd's answer)
//	runc.log     runc's own log (JSON lines); its last error is quoted in Create's error
//	pause.json   the memory settings a Pause changes, saved while it runs (see pause.go); found
//	             later, it is a crashed Pause's, and Resume or the next Pause restores them
//
// The overlay is given each directory as "." from a thread-local working directory, so its
// options in the sandbox's mountinfo name no host path (mounts.go). With Config.LXCFS, a runc
// sandbox's /proc/{meminfo,cpuinfo,stat,uptime,loadavg,diskstats,swaps} and
// /sys/devices/system/cpu/online are LXCFS's files, bound read-only as slaves of the host's view
// of them so that a restarted LXCFS reaches them (internal/lxcfs); the host-only facts
// (agentrpc.HostFactPaths) are masked.
//
// With Config.UserNS each runc sandbox runs in a user namespace of its own, owned by and mapping
// its root to an unprivileged host uid of its slot, with its layers and disk given to the
// overlay as idmapped mounts (userns.go says how and why).
//
// The container's cgroups are <CgroupParent>/<id> in every mounted hierarchy (cgroupfs driver),
// runc's state is <RuncRoot>/<id>. StateDir, RuncRoot and CgroupParent belong to one Runtime: it
// treats anything it finds there as its own, including leftovers of a crashed predecessor.
//
// # The agent
//
// The container's init IS the agent, started as
//
//	argv   = ["/proc/self/fd/4", Spec.AgentArgs...]
//	fd 0   = /dev/null; fd 1, 2 = disk/agent.log
//	fd 3   = the listening socket bound at agent.sock (accept connections on it)
//	fd 4   = the agent binary: a sealed memfd copy, which runc execs by descriptor
//	pid 1 of a new pid namespace; oom_score_adj -1000 when this process has CAP_SYS_RESOURCE
//
// The binary is never placed in the container's filesystem. Create copies it once per
// version into a memfd sealed against writes, resizing, chmod of the exec bits and unsealing,
// shared by every sandbox; the file on the host is unreachable from inside. In return the agent
// must, first thing:
//
//   - prctl(PR_SET_DUMPABLE, 0): the default seccomp profile allows ptrace (kernel >= 4.8) and
//     this host has no Yama, so otherwise any root process inside could ptrace pid 1, or open
//     /proc/1/fd/3 and /proc/1/exe, and take over the control channel;
//   - close fd 4 and keep fd 3 close-on-exec (net.FileListener dups it so; close the original);
//   - reap every child, orphans included (it is pid 1; os/exec's Wait races with a wait4(-1)
//     loop, so one loop must reap all and hand statuses to waiters);
//   - reset each child's oom_score_adj to 0 (children inherit -1000).
//
// testdata/standin is a minimal agent that does all four.
//
// # Sandboxes that run calls
//
// With Spec.Calls (the fncall tier's warm containers) the agent also gets CAP_SYS_ADMIN, its
// seccomp profile is Docker's for that capability set plus pivot_root (native architecture
// only), and its arguments end with --calls (appended when missing). It needs them to isolate
// each call in namespaces of its own, and drops back to the ordinary set and profile for the
// call's command (internal/agentrpc/calls.go); it refuses every command that is not a call. Not
// for gVisor.
//
// # Lifecycle and failure semantics
//
//	New       prepares StateDir and RuncRoot, checks runc and mkfs.ext4, builds the spec template
//	          (seccomp profile included) and starts refilling the disk pool in the background.
//	          Stale pool disks of an earlier process are destroyed; sandboxes are left alone (see
//	          List and Open).
//	Create    is all-or-nothing: on any error, including a cancelled ctx, everything it made is
//	          destroyed before it returns, and the error says which step failed (runc's own message
//	          included). An ID that already has state returns errdefs.ErrConflict without touching
//	          it. A crash of the caller in the middle leaves partial state that List reports and
//	          Delete removes. The container runs detached: it is not the caller's child, not in its
//	          session or process group, and holds no pipe to it, so it survives the caller.
//	          Create returns once runc has handed over to the agent's exec; an agent that fails
//	          after that (a binary for the wrong architecture) is not reported by runc: the
//	          socket then refuses connections and Status reads stopped.
//	Open      re-adopts a sandbox after a restart of the caller, from its directory and `runc
//	          state`. errdefs.ErrNotFound when neither exists, or when only partial state exists
//	          (an interrupted Create): Delete it.
//	Status    reads the kernel's view (cgroup files and the pids in the sandbox's cgroup), not
//	          runc's, so it is cheap enough to poll and right even when every process died while
//	          nobody watched. errdefs.ErrNotFound when nothing of the sandbox is left.
//	Delete    is idempotent and tolerates any partial state: it kills every process in the
//	          sandbox's cgroup (pidfd, so a recycled pid is never hit), removes runc's state
//	          itself (no `runc delete` process; only when a process survived the kill does it
//	          run `runc delete --force`, keeping the state for the next try), unmounts the overlay, the volumes and the disk (their loop devices detach
//	          themselves: autoclear),
//	          removes the cgroups and the directory. Deleting an unknown ID returns
//	          nil. On error some state may remain; calling Delete again continues from there.
//	Pause     freezes every process (cgroup freezer, waiting until all are frozen, at most 5 s),
//	          then has the kernel reclaim the sandbox's memory: anonymous and tmpfs pages to
//	          swap, page cache dropped (pause.go says how, per cgroup version). The limits it
//	          lowers meanwhile are restored before it returns. All-or-nothing: on error,
//	          including a cancelled ctx, the sandbox is thawed again. No swap on the host is no
//	          error: only page cache is returned, and PauseStats says so. Status reads paused.
//	          errdefs.ErrConflict if it is paused already or stopped, ErrNotFound if unknown.
//	Resume    thaws the sandbox and returns; a goroutine then reads its memory back from swap
//	          (best effort). errdefs.ErrConflict if it is running or stopped, ErrNotFound if
//	          unknown. A Runtime resumes what another (an earlier process) paused: the state is
//	          the kernel's. Delete of a paused sandbox works as of any other.
//	List      returns every ID with any state: a directory, runc state or a cgroup.
//	Close     stops the pool refill and the prefetches and destroys the pool's disks; running
//	          sandboxes are left running, paused ones paused. The other methods keep working
//	          after it, Create without a pool, Resume without a prefetch.
//
// # Concurrency
//
// All methods are safe for concurrent use. Operations on one ID are serialised by a per-ID lock
// (Runtime.locks); different IDs proceed in parallel. The pool has one refill goroutine, owned by
// the Runtime, started by New and stopped by Close; it is the only sender on Runtime.ready.
// Resume leaves at most one prefetch goroutine per ID (Runtime.prefetches), which ends by itself,
// or when Pause or Delete of that ID cancels it and waits, or when Close does.
// Lock order: an ID lock, then agentCache.mu; idLocks.mu and Runtime.prefetchMu are leaves.
package runc
