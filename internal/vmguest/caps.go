package vmguest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
)

// commandCaps is what every command the agent starts may have: the sandbox's capability set
// (agentrpc.SandboxCaps, what a container's processes get), plus CAP_SYS_ADMIN for an agent that
// runs fncalls (which drops it for each call's command, as in a container of that tier).
func commandCaps(calls bool) uint64 {
	m := agentrpc.SandboxCapMask()
	if calls {
		m |= 1 << unix.CAP_SYS_ADMIN
	}
	return m
}

// initOnlyCaps are kept by PID 1 beyond the commands' set, in its effective and permitted sets
// but not in its bounding set, so no command can ever have them (a root execve gets the bounding
// set; a non-root one nothing): CAP_SYS_BOOT, to power the VM off when the agent fails.
const initOnlyCaps = 1 << unix.CAP_SYS_BOOT

// dropCaps reduces every thread of the process to the commands' capabilities (commandCaps),
// which is what makes commands as privileged as a container's processes and no more:
//   - every other capability leaves the bounding set, so no execve (as root, of a setuid or a
//     file-capability binary) can bring it back;
//   - the effective set becomes the commands' set plus initOnlyCaps, the permitted set that
//     plus forkCaps (raised on one thread by ApplyForkIdentity alone), the inheritable and
//     ambient sets empty;
//   - no_new_privs is set, as runc sets it for a container's processes.
//
// Capabilities and no_new_privs are per thread: this runs on every thread of the Go runtime at
// once (syscall.AllThreadsSyscall, which needs a binary without cgo, as the static agent is), and
// threads started later inherit the calling thread's credentials. It then checks every thread.
func dropCaps(keep uint64) error {
	hdr := &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := &[2]unix.CapUserData{}
	if err := unix.Capget(hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	held := uint64(data[0].Permitted) | uint64(data[1].Permitted)<<32
	var bnd uint64 // what will be left of the bounding set
	last := agentrpc.LastCap()
	for c := 0; c <= last; c++ {
		if keep&(1<<c) != 0 {
			if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err == nil && in == 1 {
				bnd |= 1 << c
			}
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, e)
		}
	}
	set := (keep | initOnlyCaps) & held
	prm := (set | forkCaps) & held
	*data = [2]unix.CapUserData{
		{Effective: uint32(set), Permitted: uint32(prm)},
		{Effective: uint32(set >> 32), Permitted: uint32(prm >> 32)},
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("set capabilities: %w", e)
	}
	// The empty inheritable set has emptied the ambient set too.
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
		return fmt.Errorf("set no_new_privs: %w", e)
	}
	return checkCaps("/proc/self/task", bnd, set, prm)
}

// checkCaps reads the status of every thread under taskDir (/proc/self/task) and fails unless
// each has bounding set bnd, effective set set and permitted set prm, empty inheritable and
// ambient sets, and no_new_privs.
func checkCaps(taskDir string, bnd, set, prm uint64) error {
	ents, err := os.ReadDir(taskDir)
	if err != nil {
		return fmt.Errorf("check capabilities: %w", err)
	}
	want := map[string]uint64{"CapBnd": bnd, "CapEff": set, "CapPrm": prm, "CapInh": 0, "CapAmb": 0, "NoNewPrivs": 1}
	for _, e := range ents {
		got, err := readStatus(filepath.Join(taskDir, e.Name(), "status"))
		if err != nil {
			continue // the thread is gone
		}
		for k, w := range want {
			if g, ok := got[k]; !ok || g != w {
				return fmt.Errorf("check capabilities: thread %s has %s %#x, want %#x", e.Name(), k, g, w)
			}
		}
	}
	return nil
}

// readStatus returns the capability sets (hexadecimal) and NoNewPrivs of a /proc status file.
func readStatus(path string) (map[string]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch {
		case strings.HasPrefix(k, "Cap"):
			n, err := strconv.ParseUint(v, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, k, err)
			}
			out[k] = n
		case k == "NoNewPrivs":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, k, err)
			}
			out[k] = n
		}
	}
	return out, sc.Err()
}
