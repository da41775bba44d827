package cgroups

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/mountinfo"
)

// favorDynMods is cgroup v2's mount option that makes moving a process into a cgroup cheap.
//
// Every sandbox's start moves its init into the sandbox's cgroups (runc's cgroupfs driver
// writes its PID to cgroup.procs). Without the option that takes a global lock whose write side
// waits for an RCU grace period first: 5.5-6 ms on an idle 2-CPU host, 18 ms under load, a
// seventh of a container's create. With it the move takes 50-70 µs (forks and exits pay a
// little instead; see the kernel's cgroup-v2 documentation). The option belongs to the v2
// hierarchy but the lock is shared by every hierarchy, so it speeds up v1 and hybrid hosts too.
// Once on it stays on until the host reboots (the kernel refuses to turn it off again).
const favorDynMods = "favordynmods"

// ErrNoCgroup2 is FavorDynMods on a host without a cgroup v2 hierarchy (v1 only).
var ErrNoCgroup2 = errors.New("no cgroup v2 hierarchy is mounted")

// FavorDynMods turns favordynmods on for the host's cgroup v2 hierarchy, keeping its other
// options. It reports the mount point and whether it changed anything; a host without a v2
// hierarchy, or a kernel without the option (before Linux 6.0), is an error that changes nothing.
func FavorDynMods() (mountpoint string, changed bool, err error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false, fmt.Errorf("read mountinfo: %w", err)
	}
	mp, opts, ok := cgroup2Mount(b)
	if !ok {
		return "", false, ErrNoCgroup2
	}
	if slices.Contains(opts, favorDynMods) {
		return mp, false, nil
	}
	// A reconfiguration sets the hierarchy's options to those it is given: pass the ones it has
	// (nsdelegate, memory_recursiveprot and the like, which systemd relies on) with the new one.
	if err := reconfigure(mp, append(reconfigureOptions(opts), favorDynMods)); err != nil {
		return mp, false, err
	}
	// Outside the host's cgroup namespace the kernel accepts the options and applies none.
	if b, err = os.ReadFile("/proc/self/mountinfo"); err != nil {
		return mp, false, fmt.Errorf("read mountinfo: %w", err)
	}
	if _, now, _ := cgroup2Mount(b); !slices.Contains(now, favorDynMods) {
		return mp, false, fmt.Errorf("%s: the kernel took %s but did not apply it (is corral outside the host's cgroup namespace?)", mp, favorDynMods)
	}
	return mp, true, nil
}

// reconfigure sets the options of the cgroup v2 hierarchy mounted at mp to opts. fspick
// reconfigures the superblock only, so the mount's own flags (nosuid, ...) stay.
func reconfigure(mp string, opts []string) error {
	fd, err := unix.Fspick(unix.AT_FDCWD, mp, unix.FSPICK_CLOEXEC|unix.FSPICK_NO_AUTOMOUNT)
	if err != nil {
		return fmt.Errorf("fspick %s: %w", mp, err)
	}
	defer unix.Close(fd)
	for _, o := range opts {
		if k, v, hasValue := strings.Cut(o, "="); hasValue {
			err = unix.FsconfigSetString(fd, k, v)
		} else {
			err = unix.FsconfigSetFlag(fd, o)
		}
		if err != nil {
			return fmt.Errorf("cgroup2 option %s on %s: %w", o, mp, err)
		}
	}
	if err := unix.FsconfigReconfigure(fd); err != nil {
		return fmt.Errorf("reconfigure %s with %s: %w", mp, strings.Join(opts, ","), err)
	}
	return nil
}

// cgroup2Mount finds the root of the cgroup v2 hierarchy in mountinfo (/sys/fs/cgroup on a
// unified host, /sys/fs/cgroup/unified on a hybrid one) and its superblock options.
func cgroup2Mount(mountinfoText []byte) (mp string, opts []string, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(mountinfoText))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := slices.Index(f, "-")
		if sep < 0 || len(f) < sep+4 || f[3] != "/" || f[sep+1] != "cgroup2" {
			continue
		}
		if p := mountinfo.Unescape(f[4]); !ok || p == "/sys/fs/cgroup" {
			mp, opts, ok = p, strings.Split(f[sep+3], ","), true
		}
	}
	return mp, opts, ok
}

// reconfigureOptions are the superblock options to give a reconfiguration again: all but the
// read-only state, which is the mount's.
func reconfigureOptions(opts []string) []string {
	var out []string
	for _, o := range opts {
		if o != "rw" && o != "ro" && o != "" {
			out = append(out, o)
		}
	}
	return out
}
