package runc

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

	"github.com/corral-dev/corral/internal/mountinfo"
)

// cgroupLayout knows where runc's cgroupfs driver puts a sandbox's cgroups on this host.
//
// On a v1 (or hybrid) host, runc makes <mount>/<CgroupParent>/<id> in every mounted v1
// hierarchy (cpu, cpuacct, cpuset, memory, devices, freezer, blkio, pids, name=systemd, ...) and,
// on a hybrid host, in the controller-less v2 hierarchy too (/sys/fs/cgroup/unified). On a
// unified (v2) host there is one directory, <mount>/<CgroupParent>/<id>.
type cgroupLayout struct {
	mode   string            // "v1" or "v2"
	parent string            // Config.CgroupParent
	mounts map[string]string // v1: controller or "name=x" -> mountpoint; v2: "" -> mountpoint
	hier   []string          // distinct mountpoints runc populates
}

func readCgroupLayout(parent string) (*cgroupLayout, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	l := &cgroupLayout{parent: parent, mounts: map[string]string{}}
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
			if !slices.Contains(l.hier, mp) {
				l.hier = append(l.hier, mp)
			}
		}
	}
	switch {
	case len(l.hier) > 0:
		l.mode = "v1"
		if v2 != "" {
			l.hier = append(l.hier, v2) // hybrid
		}
		for _, c := range []string{"memory", "pids", "cpu", "freezer"} {
			if l.mounts[c] == "" {
				return nil, fmt.Errorf("cgroup v1 controller %s is not mounted", c)
			}
		}
	case v2 != "":
		l.mode = "v2"
		l.mounts[""] = v2
		l.hier = []string{v2}
	default:
		return nil, errors.New("no cgroup filesystem is mounted")
	}
	return l, nil
}

// dir is the sandbox's cgroup directory for controller ("" for v2).
func (l *cgroupLayout) dir(controller, id string) string {
	if l.mode == "v2" {
		controller = ""
	}
	return filepath.Join(l.mounts[controller], l.parent, id)
}

// dirs are all of the sandbox's cgroup directories, one per hierarchy.
func (l *cgroupLayout) dirs(id string) []string {
	out := make([]string, len(l.hier))
	for i, h := range l.hier {
		out[i] = filepath.Join(h, l.parent, id)
	}
	return out
}

// children returns the names of the cgroups under the parent in any hierarchy.
func (l *cgroupLayout) children() []string {
	var ids []string
	for _, h := range l.hier {
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
func (l *cgroupLayout) procs(id string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(l.dir("pids", id), "cgroup.procs"))
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
func (l *cgroupLayout) exists(id string) bool {
	for _, d := range l.dirs(id) {
		if _, err := os.Stat(d); err == nil {
			return true
		}
	}
	return false
}

// memStats reads the memory cgroup: bytes in use, OOM kills so far, and whether the cgroup is
// stuck under OOM (on v1, when every process left is unkillable).
func (l *cgroupLayout) memStats(id string) (usage, oomKills uint64, underOOM bool, err error) {
	d := l.dir("memory", id)
	usageFile, eventsFile := "memory.usage_in_bytes", "memory.oom_control"
	if l.mode == "v2" {
		usageFile, eventsFile = "memory.current", "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(d, usageFile))
	if err != nil {
		return 0, 0, false, err
	}
	usage, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	b, err = os.ReadFile(filepath.Join(d, eventsFile))
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
func (l *cgroupLayout) frozen(id string) bool {
	if l.mode == "v2" {
		b, _ := os.ReadFile(filepath.Join(l.dir("", id), "cgroup.freeze"))
		return strings.TrimSpace(string(b)) == "1"
	}
	b, _ := os.ReadFile(filepath.Join(l.dir("freezer", id), "freezer.state"))
	return strings.TrimSpace(string(b)) != "THAWED" && len(b) > 0
}

// freeze asks the freezer to freeze the sandbox and waits until every process is frozen, polling
// (neither v1 nor v2 has an event for it that a poll on a file would not need anyway) until
// the deadline or ctx ends. On error the sandbox may be partly frozen: the caller thaws it.
func (l *cgroupLayout) freeze(ctx context.Context, id string, timeout time.Duration) error {
	file, val, want := filepath.Join(l.dir("freezer", id), "freezer.state"), "FROZEN", "FROZEN"
	if l.mode == "v2" {
		file, val = filepath.Join(l.dir("", id), "cgroup.freeze"), "1"
	}
	if err := os.WriteFile(file, []byte(val), 0); err != nil {
		return fmt.Errorf("freeze: %w", err)
	}
	deadline := time.Now().Add(timeout)
	wait := 50 * time.Microsecond
	for {
		var done bool
		if l.mode == "v2" {
			// cgroup.freeze says what was asked; cgroup.events says whether it is done.
			b, err := os.ReadFile(filepath.Join(l.dir("", id), "cgroup.events"))
			if err != nil {
				return fmt.Errorf("freeze: %w", err)
			}
			done = slices.Contains(strings.Split(string(b), "\n"), "frozen 1")
		} else {
			// Reading freezer.state is what moves it from FREEZING to FROZEN once all tasks are.
			b, err := os.ReadFile(file)
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
func (l *cgroupLayout) thaw(id string) error {
	if l.mode == "v2" {
		return os.WriteFile(filepath.Join(l.dir("", id), "cgroup.freeze"), []byte("0"), 0)
	}
	return os.WriteFile(filepath.Join(l.dir("freezer", id), "freezer.state"), []byte("THAWED"), 0)
}

// killAll SIGKILLs every process in the sandbox's cgroup until none is left or the deadline
// passes. Each pid is opened as a pidfd and signalled only if it is still in the cgroup after
// that: a pidfd pins its pid, so a pid recycled for an unrelated process is never signalled.
func (l *cgroupLayout) killAll(id string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := l.procs(id)
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
		still, _ := l.procs(id)
		for _, pid := range still {
			if fd, ok := fds[pid]; ok {
				unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			}
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		l.thaw(id)                   // a frozen process dies only once thawed
		time.Sleep(time.Millisecond) // polling with a deadline: v1 has no "cgroup empty" event
	}
}

// join moves pid into the sandbox's existing cgroups (those its runtime made), in every hierarchy.
func (l *cgroupLayout) join(id string, pid int) error {
	joined := false
	for _, d := range l.dirs(id) {
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
func (l *cgroupLayout) remove(id string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var errs []error
	for _, d := range l.dirs(id) {
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

// Cgroups gives a process that the runtime does not run through runc (a microvm's QEMU,
// internal/runtime/qemu) the cgroups a container of the same ID would have: <CgroupParent>/<id>
// in the cpu, pids and memory hierarchies (v1) or the one v2 directory. So its CPU quota holds,
// its memory is accounted, lazyd attributes its reads to the sandbox (by the ID in its cgroup
// path), and a runc runtime sharing the parent sees it as one of the parent's sandboxes.
type Cgroups struct{ l *cgroupLayout }

// NewCgroups reads the host's cgroup layout for parent.
func NewCgroups(parent string) (*Cgroups, error) {
	l, err := readCgroupLayout(parent)
	if err != nil {
		return nil, err
	}
	return &Cgroups{l: l}, nil
}

// Join moves pid into the cgroups of id, making them, with a CFS quota of cpus (0: none),
// pids.max (0: none) and a memory limit of memory bytes (0: none).
func (c *Cgroups) Join(id string, pid int, cpus float64, pids, memory int64) error {
	type file struct{ name, value string }
	quota := int64(cpus * 100000)
	var dirs []string
	limits := map[string][]file{}
	if c.l.mode == "v2" {
		d := c.l.dir("", id)
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
		cpu, pd, mem := c.l.dir("cpu", id), c.l.dir("pids", id), c.l.dir("memory", id)
		dirs = []string{cpu, pd, mem}
		if c.l.mounts["cpuacct"] != "" {
			// Where cpuacct is a hierarchy of its own, it counts the CPU time the metrics report.
			dirs = append(dirs, c.l.dir("cpuacct", id))
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
func (c *Cgroups) Remove(id string, timeout time.Duration) error { return c.l.remove(id, timeout) }
