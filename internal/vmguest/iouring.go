package vmguest

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// In a microvm the VM is the syscall boundary and commands run without Docker's seccomp profile,
// but one thing Docker's profile refuses matters inside the VM too: io_uring. Requests queued on a
// ring run in the kernel on the submitter's behalf, so a process stopped by an exclusive exec
// (SIGSTOP) could still write into a later command's descriptors through requests it queued
// before. The agent therefore refuses io_uring to itself and so to every process it starts (a
// seccomp filter is inherited across fork and exec), as a container sandbox does.

// ioURingSyscalls are io_uring_setup, io_uring_enter and io_uring_register: the same numbers for
// amd64's native, i386 and x32 (with its bit) ABIs, and for arm64.
var ioURingSyscalls = []uint32{425, 426, 427}

const x32Bit = 0x40000000

// ioURingFilter returns a seccomp program answering EPERM to every io_uring call, in any ABI,
// and allowing everything else.
func ioURingFilter() []unix.SockFilter {
	const (
		ldNr  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret   = unix.BPF_RET | unix.BPF_K
		deny  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		allow = unix.SECCOMP_RET_ALLOW
	)
	var nrs []uint32
	for _, nr := range ioURingSyscalls {
		nrs = append(nrs, nr, nr|x32Bit)
	}
	prog := []unix.SockFilter{{Code: ldNr, K: 0}} // seccomp_data.nr
	for i, nr := range nrs {
		// Equal: jump to the deny at the end; else fall through to the next test.
		prog = append(prog, unix.SockFilter{Code: jeq, K: nr, Jt: uint8(len(nrs) - i), Jf: 0})
	}
	return append(prog, unix.SockFilter{Code: ret, K: allow}, unix.SockFilter{Code: ret, K: deny})
}

// denyIOURing installs ioURingFilter on every thread of this process (TSYNC). It needs
// CAP_SYS_ADMIN or no_new_privs, so the agent calls it before dropping capabilities.
func denyIOURing() error {
	prog := ioURingFilter()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("refuse io_uring (seccomp): %w", errno)
	}
	return nil
}
