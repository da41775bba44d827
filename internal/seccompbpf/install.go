package seccompbpf

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EnvVar carries a sandbox's program (Encode) to its agent, which installs it first thing
// (InstallFromEnv) and drops the variable, so the commands it starts do not see it.
const EnvVar = "CORRAL_SECCOMP_BPF"

// Install sets no_new_privs and installs p on every thread of this process (TSYNC); the
// processes it starts after inherit it.
func (p Program) Install() error {
	if len(p) == 0 || len(p) > MaxInstructions {
		return fmt.Errorf("install seccomp filter: %d instructions is not 1 to %d", len(p), MaxInstructions)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("install seccomp filter: set no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(p)), Filter: &p[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(p)
	if errno != 0 {
		return fmt.Errorf("install seccomp filter: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("install seccomp filter: thread %d could not take it", r)
	}
	return nil
}

// InstallFromEnv installs the program in EnvVar, if it is set, and unsets it. An error means the
// variable was set and its program is not in force.
func InstallFromEnv() error {
	s, ok := os.LookupEnv(EnvVar)
	if !ok {
		return nil
	}
	os.Unsetenv(EnvVar)
	p, err := Decode(s)
	if err != nil {
		return err
	}
	return p.Install()
}
