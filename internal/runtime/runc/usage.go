package runc

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// usage reads the sandbox's cgroups: CPU time (v1 cpuacct.usage, v2 cpu.stat usage_usec),
// memory in use and its peak (v1 memory.max_usage_in_bytes; v2 memory.peak where the kernel
// has it) and the number of tasks. A sandbox without a memory cgroup is not found.
func (l *cgroupLayout) usage(id string) (runtime.Usage, error) {
	var u runtime.Usage
	if l.mode == "v2" {
		d := l.dir("", id)
		cur, err := readCgroupUint(filepath.Join(d, "memory.current"))
		if err != nil {
			return u, cgroupGone(id, err)
		}
		u.MemoryBytes = int64(cur)
		if p, err := readCgroupUint(filepath.Join(d, "memory.peak")); err == nil {
			u.MemoryPeakBytes = int64(p)
		}
		if b, err := os.ReadFile(filepath.Join(d, "cpu.stat")); err == nil {
			for line := range strings.SplitSeq(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
					us, _ := strconv.ParseUint(v, 10, 64)
					u.CPUNanos = us * 1000
				}
			}
		}
		if n, err := readCgroupUint(filepath.Join(d, "pids.current")); err == nil {
			u.Pids = int64(n)
		}
		return u, nil
	}
	mem := l.dir("memory", id)
	cur, err := readCgroupUint(filepath.Join(mem, "memory.usage_in_bytes"))
	if err != nil {
		return u, cgroupGone(id, err)
	}
	u.MemoryBytes = int64(cur)
	if p, err := readCgroupUint(filepath.Join(mem, "memory.max_usage_in_bytes")); err == nil {
		u.MemoryPeakBytes = int64(p)
	}
	acct := "cpuacct"
	if l.mounts[acct] == "" {
		acct = "cpu" // cpu,cpuacct mounted together
	}
	if n, err := readCgroupUint(filepath.Join(l.dir(acct, id), "cpuacct.usage")); err == nil {
		u.CPUNanos = n
	}
	if n, err := readCgroupUint(filepath.Join(l.dir("pids", id), "pids.current")); err == nil {
		u.Pids = int64(n)
	}
	return u, nil
}

func cgroupGone(id string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.NotFound("cgroup of sandbox %s", id)
	}
	return err
}

// usedBytes is how much of the filesystem at dir is in use (statfs: blocks less free blocks).
func usedBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// Usage reads what a container sandbox uses now: its cgroups, and the bytes in use on its
// writable disk (the ext4 filesystem holding the overlay's upper directory).
func (r *Runtime) Usage(id string) (runtime.Usage, error) {
	if !validID(id) {
		return runtime.Usage{}, errdefs.Invalid("ID", "%q is not a valid sandbox ID", id)
	}
	u, err := r.cg.usage(id)
	if err != nil {
		return u, err
	}
	if n, err := usedBytes(filepath.Join(r.dir(id), diskMount)); err == nil {
		u.DiskBytes = n
	}
	return u, nil
}

// Usage reads the cgroups of id (those Join made). DiskBytes is left to the caller.
func (c *Cgroups) Usage(id string) (runtime.Usage, error) { return c.l.usage(id) }
