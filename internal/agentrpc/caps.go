package agentrpc

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sandboxCaps is the capability set of a sandbox's processes: Docker's default set without
// NET_RAW. Never add SYS_ADMIN, SYS_PTRACE, SYS_MODULE, NET_RAW or SYS_RESOURCE (the last would
// let a process make itself unkillable by the OOM killer).
var sandboxCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_SETGID",
	"CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
	"CAP_KILL", "CAP_AUDIT_WRITE",
}

// capNumbers maps the names in sandboxCaps to capability numbers.
var capNumbers = map[string]int{
	"CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "CAP_FSETID": unix.CAP_FSETID,
	"CAP_FOWNER": unix.CAP_FOWNER, "CAP_MKNOD": unix.CAP_MKNOD, "CAP_SETGID": unix.CAP_SETGID,
	"CAP_SETUID": unix.CAP_SETUID, "CAP_SETFCAP": unix.CAP_SETFCAP, "CAP_SETPCAP": unix.CAP_SETPCAP,
	"CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT,
	"CAP_KILL": unix.CAP_KILL, "CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE,
}

// SandboxCaps returns the capability set of a sandbox's processes. internal/runtime/runc gives
// exactly these to a sandbox's agent (bounding, effective and permitted; a sandbox that runs
// calls gets CAP_SYS_ADMIN besides), and a call's helper drops to them before it starts the
// call's command, so a call's command has what any sandbox command has.
func SandboxCaps() []string { return slices.Clone(sandboxCaps) }

// maskedPaths are hidden from a sandbox's processes: files have /dev/null bound over them,
// directories an empty read-only tmpfs. readonlyPaths are bound read-only over themselves.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/kpagecgroup", "/proc/kpagecount", "/proc/kpageflags", "/proc/latency_stats",
		"/proc/sched_debug", "/proc/scsi", "/proc/sysrq-trigger", "/proc/timer_list",
		"/proc/timer_stats", "/sys/devices/virtual/powercap", "/sys/firmware",
	}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"}
)

// hostFactPaths describe the host rather than the sandbox and are hidden in a container
// sandbox as maskedPaths are: the host's boot command line, its block devices (every other
// sandbox's loop device among them), the host's swap devices, the kernel's slab caches and
// crash-dump layout. /proc/swaps is also one of the files LXCFS serves per sandbox: where LXCFS
// runs, internal/runtime/runc binds its file instead of the mask. The other figures LXCFS gives
// (meminfo, cpuinfo, stat, uptime, loadavg, diskstats, cpu/online) stay the host's without it.
// A VM's kernel is its own and keeps them all (internal/vmguest).
var hostFactPaths = []string{
	"/proc/cmdline", "/proc/partitions", "/proc/slabinfo", "/proc/swaps", "/sys/kernel/vmcoreinfo",
	"/sys/block", "/sys/class/block",
}

// HostFactPaths returns the host facts a container sandbox does not see (see hostFactPaths).
func HostFactPaths() []string { return slices.Clone(hostFactPaths) }

// MaskedPaths and ReadonlyPaths return the /proc and /sys policy of a sandbox: what
// internal/runtime/runc puts in every bundle, and what a call's helper repeats on the fresh /proc
// it mounts for the call (its /sys is the sandbox's, bound with its masks).
func MaskedPaths() []string   { return slices.Clone(maskedPaths) }
func ReadonlyPaths() []string { return slices.Clone(readonlyPaths) }

// sandboxCapMask is sandboxCaps as a bit mask.
func sandboxCapMask() uint64 {
	var m uint64
	for _, name := range sandboxCaps {
		m |= 1 << capNumbers[name]
	}
	return m
}

// SandboxCapMask is SandboxCaps as a bit mask (internal/vmguest drops a VM's commands to it).
func SandboxCapMask() uint64 { return sandboxCapMask() }

// LastCap is the highest capability number this kernel knows.
func LastCap() int { return lastCap() }

// lastCap is the highest capability number this kernel knows.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 && n < 64 {
			return n
		}
	}
	return unix.CAP_LAST_CAP
}

// capsBeyondSandbox lists the capabilities in the calling thread's bounding set that the
// sandbox's set lacks (in a calls sandbox: CAP_SYS_ADMIN). A helper reads it once, before its
// first call: every call drops the same ones.
func capsBeyondSandbox() []int {
	keep := sandboxCapMask()
	var extra []int
	for c := 0; c <= lastCap(); c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || in != 0 {
			extra = append(extra, c)
		}
	}
	return extra
}

// dropToSandboxCaps reduces the calling thread to the sandbox's capability set: the capabilities
// in extra (capsBeyondSandbox) leave the bounding set (so no later execve, of a setuid or
// file-capability binary or as root, can bring them back), the effective, permitted and
// inheritable sets become the sandbox's set (intersected with what is held), the ambient set
// empty. no_new_privs stays set (it cannot be cleared). Capabilities are per thread: the caller
// must be locked to its thread, and starts the call's command from it; a helper's other threads
// keep CAP_SYS_ADMIN for the next calls.
func dropToSandboxCaps(extra []int) error {
	for _, c := range extra {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	keep := sandboxCapMask()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	held := uint64(data[0].Permitted) | uint64(data[1].Permitted)<<32
	set := held & keep
	data[0] = unix.CapUserData{Effective: uint32(set), Permitted: uint32(set)}
	data[1] = unix.CapUserData{Effective: uint32(set >> 32), Permitted: uint32(set >> 32)}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("set capabilities: %w", err)
	}
	// The empty inheritable set has emptied the ambient set already.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	// Check what was done, CAP_SYS_ADMIN always.
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	eff := uint64(data[0].Effective) | uint64(data[1].Effective)<<32
	perm := uint64(data[0].Permitted) | uint64(data[1].Permitted)<<32
	if left := (eff | perm) &^ keep; left != 0 {
		return fmt.Errorf("capabilities %#x still held after the drop", left)
	}
	for _, c := range append(extra, unix.CAP_SYS_ADMIN) {
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || in != 0 {
			return fmt.Errorf("capability %d still in the bounding set after the drop (%v)", c, err)
		}
	}
	return nil
}

// DefaultEnv is env with PATH and HOME defaulted (unless env sets them): the environment of a
// sandbox's agent, and so of its commands, in a container (internal/runtime/runc) and in a VM
// (internal/vmguest).
func DefaultEnv(env []string) []string {
	out := make([]string, 0, len(env)+2)
	var havePath, haveHome bool
	for _, e := range env {
		havePath = havePath || strings.HasPrefix(e, "PATH=")
		haveHome = haveHome || strings.HasPrefix(e, "HOME=")
	}
	if !havePath {
		out = append(out, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	if !haveHome {
		out = append(out, "HOME=/root")
	}
	return append(out, env...)
}

// HostsFile is a sandbox's /etc/hosts: localhost for both address families, in Debian's order
// (IPv4 first), so that programs connecting to "localhost" depend neither on the image nor on
// DNS (which answers only the policy's names). Like Docker's, it replaces the image's.
//
// It does not name the sandbox's hostname (Debian's "127.0.1.1 <hostname>"): with that line,
// the noVNC stream of E2B's desktop SDK never showed the desktop (TestDesktop/e2b-sdk failed
// twice with it and passed without it; the cause is not found yet).
func HostsFile() string {
	return "# written by corral\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
}
