package agentrpc

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A sandbox that runs calls has a seccomp profile built for CAP_SYS_ADMIN (its agent mounts), so
// it allows mount, unshare, setns and friends, clone with namespace flags and clone3. Capabilities
// alone do not close all of that to a call's command: unshare(CLONE_NEWUSER) needs none and
// would hand it a user namespace, a kernel attack surface an ordinary sandbox denies. So the
// helper stacks a second filter before it starts the command, answering exactly what Docker's
// profile leaves out without CAP_SYS_ADMIN (plus pivot_root, which the profile of such a sandbox
// adds for the helper) as that profile does: EPERM, and ENOSYS for clone3, so that libc falls back
// to clone, whose flags the filter can read. Filters stack: the stricter answer wins.

// callDenied are the syscalls a call's command gets EPERM for.
var callDenied = []uintptr{
	unix.SYS_BPF, unix.SYS_FANOTIFY_INIT, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSOPEN,
	unix.SYS_FSPICK, unix.SYS_LOOKUP_DCOOKIE, unix.SYS_LSM_GET_SELF_ATTR, unix.SYS_LSM_LIST_MODULES,
	unix.SYS_LSM_SET_SELF_ATTR, unix.SYS_MOUNT, unix.SYS_MOUNT_SETATTR, unix.SYS_MOVE_MOUNT,
	unix.SYS_OPEN_TREE, unix.SYS_PERF_EVENT_OPEN, unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD,
	unix.SYS_SETDOMAINNAME, unix.SYS_SETHOSTNAME, unix.SYS_SETNS, unix.SYS_SYSLOG, unix.SYS_UMOUNT2,
	unix.SYS_UNSHARE, unix.SYS_PIVOT_ROOT,
}

// cloneNamespaceFlags are the clone flags that make a new namespace.
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// x32SyscallBit marks a syscall of amd64's x32 ABI.
const x32SyscallBit = 0x40000000

// callAuditArch is the native architecture's AUDIT_ARCH value, or 0 where the filter is not
// built (calls are then refused).
func callAuditArch() uint32 {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64
	}
	return 0
}

// Offsets in struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6];} (little endian: the
// low half of args[0] comes first).
const (
	seccompDataNr    = 0
	seccompDataArch  = 4
	seccompDataArg0  = 16
	bpfLoadAbs       = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJumpEqual     = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJumpAtLeast   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	bpfJumpSet       = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfReturn        = unix.BPF_RET | unix.BPF_K
	seccompDenyEPERM = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	seccompNoSys     = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// callFilter returns the BPF program of the call filter for arch.
func callFilter(arch uint32) []unix.SockFilter {
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jump := func(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: code, K: k, Jt: jt, Jf: jf}
	}
	p := []unix.SockFilter{
		stmt(bpfLoadAbs, seccompDataArch),
		jump(bpfJumpEqual, arch, 1, 0),
		stmt(bpfReturn, unix.SECCOMP_RET_KILL_PROCESS), // another ABI: the sandbox's profile has none either
		stmt(bpfLoadAbs, seccompDataNr),
	}
	if arch == unix.AUDIT_ARCH_X86_64 {
		p = append(p, jump(bpfJumpAtLeast, x32SyscallBit, 0, 1), stmt(bpfReturn, unix.SECCOMP_RET_KILL_PROCESS))
	}
	for _, nr := range callDenied {
		p = append(p, jump(bpfJumpEqual, uint32(nr), 0, 1), stmt(bpfReturn, seccompDenyEPERM))
	}
	p = append(p,
		jump(bpfJumpEqual, unix.SYS_CLONE3, 0, 1), stmt(bpfReturn, seccompNoSys),
		jump(bpfJumpEqual, unix.SYS_CLONE, 0, 3),
		stmt(bpfLoadAbs, seccompDataArg0), // clone's flags on amd64 and arm64
		jump(bpfJumpSet, cloneNamespaceFlags, 0, 1),
		stmt(bpfReturn, seccompDenyEPERM),
		stmt(bpfReturn, unix.SECCOMP_RET_ALLOW),
	)
	return p
}

// installCallFilter adds the call filter to the calling thread, which starts the command (the
// helper's other threads must stay free to set up later calls). no_new_privs must be set, as it
// is in every sandbox.
func installCallFilter() error {
	arch := callAuditArch()
	if arch == 0 {
		return fmt.Errorf("no seccomp filter for calls on %s", runtime.GOARCH)
	}
	prog := callFilter(arch)
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("install the call's seccomp filter: %w", errno)
	}
	return nil
}
