// Package lxcfs runs and supervises the node's LXCFS, the FUSE file system that gives a container
// sandbox its own /proc/meminfo, /proc/cpuinfo, /proc/stat, /proc/uptime, /proc/loadavg,
// /proc/diskstats, /proc/swaps and /sys/devices/system/cpu/online: LXCFS answers each read with
// the figures of the reading process's cgroups (memory limit, CPU quota and cpuset) and the start
// time of its PID namespace's init.
//
// # One per data directory
//
// A Server serves one directory, <data-dir>/lxcfs, so two Corrals on one host never share, stop
// or clean up each other's LXCFS (issue 30):
//
//	lxcfs.pid   LXCFS's pid file (it holds a lock on it)
//	lxcfs.log   its output, truncated at each start
//	mnt/        the FUSE mount of the LXCFS now running
//
// and the directory's view, ViewDir: /run/corral-lxcfs/<hash>/, a small tmpfs, its own shared
// peer group, holding one file per served path (Files); the running LXCFS's file is bound
// read-only over each. The view is readable by every host uid, unlike the directory: a
// sandbox's runc init, an unprivileged uid in its user namespace, binds its files itself.
//
// Sandboxes bind the view's files, not mnt/..., over their /proc and /sys files, and their
// binds are slaves of the view's (internal/runtime/runc sets rslave propagation). That is what
// makes a restart survivable: when LXCFS dies its FUSE connection is gone for good (reads
// return ENOTCONN) and nothing can revive a bind of its files, but the next LXCFS's files,
// bound over the view's, propagate to every sandbox's bind of them and stack on top of the
// dead ones. Each restart adds
// one mount per file on the host and in each sandbox; they go when the sandbox does.
//
// # Lifecycle
//
//	Start  adopts a live LXCFS a predecessor left (its pid file names an lxcfs process and
//	       every view file reads), else kills whatever is left, detaches a dead mount and starts
//	       a new one. Missing lxcfs binary or FUSE: errdefs.ErrUnavailable, nothing changed.
//	       LXCFS runs in a session of its own, so it outlives this process: running sandboxes
//	       read through it across Corral restarts and crashes.
//	Files  waits (at most ReadyTimeout) for a live LXCFS and returns the binds a sandbox needs;
//	       errdefs.ErrUnavailable when none came up, so no sandbox is made half without it.
//	Close  stops supervising; LXCFS keeps running for the sandboxes that use it.
//	Stop   Close, then stops LXCFS, unmounts everything under the directory and removes it.
//	       Callers stop it only when no sandbox is left (corral up does on shutdown).
//	Remove Stop for a directory no Server runs (corral up --no-lxcfs cleans up after an
//	       earlier run).
//
// # Supervision and concurrency
//
// One goroutine, started by Start and ended by Close or Stop, watches the LXCFS process through a
// pidfd and starts the next one when it exits (at once, then with a backoff up to 5 s while they
// keep dying within a minute). Server.mu guards the ready channel and the counters; it is never
// held across I/O.
package lxcfs
