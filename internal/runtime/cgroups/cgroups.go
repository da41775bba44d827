// Package cgroups knows the host's cgroup hierarchies as runc's cgroupfs driver lays them out
// (<mount>/<CgroupParent>/<id>), for every runtime backend: runc's containers (Layout), a
// process a backend starts itself, such as a VM's QEMU (Manager), and the share of the host kept
// for Corral against its sandboxes (Reserve).
package cgroups

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/mountinfo"
	"github.com/corral-dev/corral/internal/runtime"
)

// Layout knows where runc's cgroupfs driver puts a sandbox's cgroups on this host.
//
// On a v1 (or hybrid) host, runc makes <mount>/<CgroupParent>/<id> in every mounted v1
// hierarchy (cpu, cpuacct, cpuset, memory, devices, freezer, blkio, pids, name=systemd, ...) and,
// on a hybrid host, in the controller-less v2 hierarchy too (/sys/fs/cgroup/unified). On a
// unified (v2) host there is one directory, <mount>/<CgroupParent>/<id>.
type Layout struct {
	Mode   string            // "v1" or "v2"
	parent string            // Config.CgroupParent
	mounts map[string]string // v1: controller or "name=x" -> mountpoint; v2: "" -> mountpoint
	Hier   []string          // distinct mountpoints runc populates
}

func Read(parent string) (*Layout, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	l := &Layout{parent: parent, mounts: map[string]string{}}
	var v2 string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := slices.Index(f, "-")
		if sep < 0 || len(f) < sep+4 || f[3] != "/" {
			continue // a cgroup mount of a sub-tree (bind) is not the hierarchy's root
		}
		mp, fstype := mountinfo.Unescape(f[4]), f[sep+1]
		switch fstype {
		case "cgroup2":
			if v2 == "" || mp == "/sys/fs/cgroup" {
				v2 = mp
			}
		case "cgroup":
			if _, dup := l.mounts[mp]; dup {
				continue
			}
			for _, opt := range strings.Split(f[sep+3], ",") {
				switch opt {
				case "rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec", "clone_children", "xattr":
				default:
					if _, seen := l.mounts[opt]; !seen {
						l.mounts[opt] = mp
					}
				}
			}
			if !slices.Contains(l.Hier, mp) {
				l.Hier = append(l.Hier, mp)
			}
		}
	}
	switch {
	case len(l.Hier) > 0:
		l.Mode = "v1"
		if v2 != "" {
			l.Hier = append(l.Hier, v2) // hybrid
		}
		for _, c := range []string{"memory", "pids", "cpu", "freezer"} {
			if l.mounts[c] == "" {
				return nil, fmt.Errorf("cgroup v1 controller %s is not mounted", c)
			}
		}
	case v2 != "":
		l.Mode = "v2"
		l.mounts[""] = v2
		l.Hier = []string{v2}
	default:
		return nil, errors.New("no cgroup filesystem is mounted")
	}
	return l, nil
}

// dir is the sandbox's cgroup directory for controller ("" for v2).
func (l *Layout) Dir(controller, id string) string {
	if l.Mode == "v2" {
		controller = ""
	}
	return filepath.Join(l.mounts[controller], l.parent, id)
}

// dirs are all of the sandbox's cgroup directories, one per hierarchy.
func (l *Layout) Dirs(id string) []string {
	out := make([]string, len(l.Hier))
	for i, h := range l.Hier {
		out[i] = filepath.Join(h, l.parent, id)
	}
	return out
}

// children returns the names of the cgroups under the parent in any hierarchy.
func (l *Layout) Children() []string {
	var ids []string
	for _, h := range l.Hier {
		ents, _ := os.ReadDir(filepath.Join(h, l.parent))
		for _, e := range ents {
			if e.IsDir() && !slices.Contains(ids, e.Name()) {
				ids = append(ids, e.Name())
			}
		}
	}
	return ids
}

// procs returns the pids in the sandbox's cgroup; nil if the cgroup does not exist.
func (l *Layout) Procs(id string) ([]int, error) {
	b, err := readFile(filepath.Join(l.Dir("pids", id), "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, s := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(s); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// exists reports whether the sandbox has a cgroup in any hierarchy.
func (l *Layout) Exists(id string) bool {
	for _, d := range l.Dirs(id) {
		if _, err := os.Stat(d); err == nil {
			return true
		}
	}
	return false
}

// memStats reads the memory cgroup: bytes in use, OOM kills so far, and whether the cgroup is
// stuck under OOM (on v1, when every process left is unkillable).
func (l *Layout) MemStats(id string) (usage, oomKills uint64, underOOM bool, err error) {
	d := l.Dir("memory", id)
	usageFile, eventsFile := "memory.usage_in_bytes", "memory.oom_control"
	if l.Mode == "v2" {
		usageFile, eventsFile = "memory.current", "memory.events"
	}
	b, err := readFile(filepath.Join(d, usageFile))
	if err != nil {
		return 0, 0, false, err
	}
	usage, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	b, err = readFile(filepath.Join(d, eventsFile))
	if err != nil {
		return 0, 0, false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		n, _ := strconv.ParseUint(v, 10, 64)
		switch k {
		case "oom_kill":
			oomKills = n
		case "under_oom":
			underOOM = n == 1
		}
	}
	return usage, oomKills, underOOM, nil
}

// frozen reports whether the freezer has the sandbox frozen (runc pause).
func (l *Layout) Frozen(id string) bool {
	if l.Mode == "v2" {
		b, _ := readFile(filepath.Join(l.Dir("", id), "cgroup.freeze"))
		return strings.TrimSpace(string(b)) == "1"
	}
	b, _ := readFile(filepath.Join(l.Dir("freezer", id), "freezer.state"))
	return strings.TrimSpace(string(b)) != "THAWED" && len(b) > 0
}

// freeze asks the freezer to freeze the sandbox and waits until every process is frozen, polling
// (neither v1 nor v2 has an event for it that a poll on a file would not need anyway) until
// the deadline or ctx ends. On error the sandbox may be partly frozen: the caller thaws it.
func (l *Layout) Freeze(ctx context.Context, id string, timeout time.Duration) error {
	file, val, want := filepath.Join(l.Dir("freezer", id), "freezer.state"), "FROZEN", "FROZEN"
	if l.Mode == "v2" {
		file, val = filepath.Join(l.Dir("", id), "cgroup.freeze"), "1"
	}
	if err := os.WriteFile(file, []byte(val), 0); err != nil {
		return fmt.Errorf("freeze: %w", err)
	}
	deadline := time.Now().Add(timeout)
	wait := 50 * time.Microsecond
	for {
		var done bool
		if l.Mode == "v2" {
			// cgroup.freeze says what was asked; cgroup.events says whether it is done.
			b, err := readFile(filepath.Join(l.Dir("", id), "cgroup.events"))
			if err != nil {
				return fmt.Errorf("freeze: %w", err)
			}
			done = slices.Contains(strings.Split(string(b), "\n"), "frozen 1")
		} else {
			// Reading freezer.state is what moves it from FREEZING to FROZEN once all tasks are.
			b, err := readFile(file)
			if err != nil {
				return fmt.Errorf("freeze: %w", err)
			}
			done = strings.TrimSpace(string(b)) == want
		}
		if done {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("freeze: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("freeze: not every process froze within %v (one in uninterruptible sleep?)", timeout)
		}
		time.Sleep(wait)
		wait = min(2*wait, 10*time.Millisecond)
	}
}

// thaw undoes freeze. The kernel wakes every process before the write returns.
func (l *Layout) Thaw(id string) error {
	if l.Mode == "v2" {
		return os.WriteFile(filepath.Join(l.Dir("", id), "cgroup.freeze"), []byte("0"), 0)
	}
	return os.WriteFile(filepath.Join(l.Dir("freezer", id), "freezer.state"), []byte("THAWED"), 0)
}

// killAll SIGKILLs every process in the sandbox's cgroup until none is left or the deadline
// passes. Each pid is opened as a pidfd and signalled only if it is still in the cgroup after
// that: a pidfd pins its pid, so a pid recycled for an unrelated process is never signalled.
func (l *Layout) KillAll(id string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := l.Procs(id)
		if err != nil {
			return fmt.Errorf("list processes of %s: %w", id, err)
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill processes of %s: %d still alive after %v", id, len(pids), timeout)
		}
		fds := map[int]int{}
		for _, pid := range pids {
			if fd, err := unix.PidfdOpen(pid, 0); err == nil {
				fds[pid] = fd
			}
		}
		still, _ := l.Procs(id)
		for _, pid := range still {
			if fd, ok := fds[pid]; ok {
				unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			}
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		l.Thaw(id)                   // a frozen process dies only once thawed
		time.Sleep(time.Millisecond) // polling with a deadline: v1 has no "cgroup empty" event
	}
}

// join moves pid into the sandbox's existing cgroups (those its runtime made), in every hierarchy.
func (l *Layout) Join(id string, pid int) error {
	joined := false
	for _, d := range l.Dirs(id) {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("cgroup %s: add %d: %w", d, pid, err)
		}
		joined = true
	}
	if !joined {
		return fmt.Errorf("sandbox %s has no cgroup", id)
	}
	return nil
}

// remove deletes the sandbox's cgroup directories. They must be empty of processes.
func (l *Layout) Remove(id string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var errs []error
	for _, d := range l.Dirs(id) {
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			// EBUSY: a process is still leaving the cgroup; it takes a moment after SIGKILL.
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// Manager gives a process that the runtime does not run through runc (a microvm's QEMU,
// internal/runtime/qemu) the cgroups a container of the same ID would have: <CgroupParent>/<id>
// in the cpu, pids and memory hierarchies (v1) or the one v2 directory. So its CPU quota holds,
// its memory is accounted, lazyd attributes its reads to the sandbox (by the ID in its cgroup
// path), and a runc runtime sharing the parent sees it as one of the parent's sandboxes.
type Manager struct{ l *Layout }

// NewManager reads the host's cgroup layout for parent.
func NewManager(parent string) (*Manager, error) {
	l, err := Read(parent)
	if err != nil {
		return nil, err
	}
	return &Manager{l: l}, nil
}

// Join moves pid into the cgroups of id, making them, with a CFS quota of cpus (0: none),
// pids.max (0: none) and a memory limit of memory bytes (0: none).
func (c *Manager) Join(id string, pid int, cpus float64, pids, memory int64) error {
	type file struct{ name, value string }
	quota := int64(cpus * 100000)
	var dirs []string
	limits := map[string][]file{}
	if c.l.Mode == "v2" {
		d := c.l.Dir("", id)
		dirs = []string{d}
		// The controllers must be on in every ancestor's subtree_control (runc does the same).
		for p := filepath.Dir(d); strings.HasPrefix(p, c.l.mounts[""]) && p != c.l.mounts[""]; p = filepath.Dir(p) {
			os.WriteFile(filepath.Join(filepath.Dir(p), "cgroup.subtree_control"), []byte("+cpu +pids +memory"), 0o644)
		}
		if quota > 0 {
			limits[d] = append(limits[d], file{"cpu.max", strconv.FormatInt(quota, 10) + " 100000"})
		}
		if pids > 0 {
			limits[d] = append(limits[d], file{"pids.max", strconv.FormatInt(pids, 10)})
		}
		if memory > 0 {
			limits[d] = append(limits[d], file{"memory.max", strconv.FormatInt(memory, 10)})
		}
	} else {
		cpu, pd, mem := c.l.Dir("cpu", id), c.l.Dir("pids", id), c.l.Dir("memory", id)
		dirs = []string{cpu, pd, mem}
		if c.l.mounts["cpuacct"] != "" {
			// Where cpuacct is a hierarchy of its own, it counts the CPU time the metrics report.
			dirs = append(dirs, c.l.Dir("cpuacct", id))
		}
		if quota > 0 {
			limits[cpu] = []file{{"cpu.cfs_period_us", "100000"}, {"cpu.cfs_quota_us", strconv.FormatInt(quota, 10)}}
		}
		if pids > 0 {
			limits[pd] = []file{{"pids.max", strconv.FormatInt(pids, 10)}}
		}
		if memory > 0 {
			limits[mem] = []file{{"memory.limit_in_bytes", strconv.FormatInt(memory, 10)}}
		}
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		for _, f := range limits[d] {
			if err := os.WriteFile(filepath.Join(d, f.name), []byte(f.value), 0o644); err != nil {
				return fmt.Errorf("cgroup %s: %s: %w", d, f.name, err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("cgroup %s: add %d: %w", d, pid, err)
		}
	}
	return nil
}

// Remove deletes the cgroups of id once their processes are gone (waiting up to timeout).
func (c *Manager) Remove(id string, timeout time.Duration) error { return c.l.Remove(id, timeout) }

func ReadUint(path string) (uint64, error) {
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// memUsage is the bytes charged to the sandbox's memory cgroup (RAM, not swap).
func (l *Layout) MemUsage(id string) (uint64, error) {
	if l.Mode == "v2" {
		return ReadUint(filepath.Join(l.Dir("", id), "memory.current"))
	}
	return ReadUint(filepath.Join(l.Dir("memory", id), "memory.usage_in_bytes"))
}

// swapUsage is the bytes of the sandbox's memory in swap; 0 when unknown (no swap accounting).
func (l *Layout) SwapUsage(id string) uint64 {
	if l.Mode == "v2" {
		n, _ := ReadUint(filepath.Join(l.Dir("", id), "memory.swap.current"))
		return n
	}
	return MemStat(l.Dir("memory", id), "swap")
}

// memStat returns one counter of memory.stat in the memory cgroup dir; 0 if absent.
func MemStat(dir, key string) uint64 {
	b, _ := readFile(filepath.Join(dir, "memory.stat"))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}

// usage reads the sandbox's cgroups: CPU time (v1 cpuacct.usage, v2 cpu.stat usage_usec),
// memory in use and its peak (v1 memory.max_usage_in_bytes; v2 memory.peak where the kernel
// has it) and the number of tasks. A sandbox without a memory cgroup is not found.
func (l *Layout) Usage(id string) (runtime.Usage, error) {
	var u runtime.Usage
	if l.Mode == "v2" {
		d := l.Dir("", id)
		cur, err := ReadUint(filepath.Join(d, "memory.current"))
		if err != nil {
			return u, gone(id, err)
		}
		u.MemoryBytes = int64(cur)
		if p, err := ReadUint(filepath.Join(d, "memory.peak")); err == nil {
			u.MemoryPeakBytes = int64(p)
		}
		if b, err := readFile(filepath.Join(d, "cpu.stat")); err == nil {
			for line := range strings.SplitSeq(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
					us, _ := strconv.ParseUint(v, 10, 64)
					u.CPUNanos = us * 1000
				}
			}
		}
		if n, err := ReadUint(filepath.Join(d, "pids.current")); err == nil {
			u.Pids = int64(n)
		}
		return u, nil
	}
	mem := l.Dir("memory", id)
	cur, err := ReadUint(filepath.Join(mem, "memory.usage_in_bytes"))
	if err != nil {
		return u, gone(id, err)
	}
	u.MemoryBytes = int64(cur)
	if p, err := ReadUint(filepath.Join(mem, "memory.max_usage_in_bytes")); err == nil {
		u.MemoryPeakBytes = int64(p)
	}
	acct := "cpuacct"
	if l.mounts[acct] == "" {
		acct = "cpu" // cpu,cpuacct mounted together
	}
	if n, err := ReadUint(filepath.Join(l.Dir(acct, id), "cpuacct.usage")); err == nil {
		u.CPUNanos = n
	}
	if n, err := ReadUint(filepath.Join(l.Dir("pids", id), "pids.current")); err == nil {
		u.Pids = int64(n)
	}
	return u, nil
}

func gone(id string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.NotFound("cgroup of sandbox %s", id)
	}
	return err
}

// Usage reads the cgroups of id (those Join made). DiskBytes is left to the caller.
func (c *Manager) Usage(id string) (runtime.Usage, error) { return c.l.Usage(id) }

// readFile reads a small cgroup file with plain system calls. os.ReadFile would also stat it
// and add it to, then remove it from, the runtime's epoll set (kernfs files can be polled):
// three calls more on every read of the reaper's and the sampler's, which read every sandbox's
// files every second.
func readFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 512)
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, cap(buf))
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}
