package cgroups

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Reservation is the share of the host kept for Corral itself (API, edge, resolver, proxy,
// lazyd) against its sandboxes.
type Reservation struct {
	// ControlDir names the cgroup Corral's own processes run in, a sibling of the sandboxes'
	// parent: <CgroupParent>-ctl.
	Control string
	// CPUShares is the control cgroup's cpu.shares (v1; v2 gets the matching cpu.weight) against
	// the sandboxes' parent, which keeps the default 1024: under contention Corral gets
	// CPUShares/(CPUShares+1024) of the CPUs when it wants them.
	CPUShares int
	// MemoryBytes is the memory the sandboxes together may use: the parent's limit. Zero
	// leaves the parent unlimited.
	MemoryBytes int64
}

// DefaultReservation is the reservation for parent on this host: Corral's cgroup weighs 8 times
// the sandboxes together, and the sandboxes together may use the host's memory less
// max(512 MiB, 5%) (reserve bytes, when positive, instead).
func DefaultReservation(parent string, reserve int64) (Reservation, error) {
	total, err := memTotal()
	if err != nil {
		return Reservation{}, err
	}
	if reserve <= 0 {
		reserve = max(512<<20, total/20)
	}
	if reserve >= total {
		return Reservation{}, fmt.Errorf("reserve %d bytes of a host with %d: leaves nothing for sandboxes", reserve, total)
	}
	return Reservation{Control: ControlName(parent), CPUShares: 8192, MemoryBytes: total - reserve}, nil
}

// memTotal reads MemTotal from /proc/meminfo.
func memTotal() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("MemTotal %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
}

// Reserve applies r for the sandboxes under parent: it makes the control cgroup with r's CPU
// weight, moves pid (Corral's own process; its children, lazyd included, follow) into it, and
// limits the sandboxes' parent to r.MemoryBytes. A parent already using more memory keeps its
// old limit (the error says so); the process still moves.
func Reserve(parent string, r Reservation, pid int) error {
	l, err := Read(parent)
	if err != nil {
		return err
	}
	var errs []string
	write := func(dir, name, value string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(value), 0o644); err != nil {
			errs = append(errs, fmt.Sprintf("%s/%s: %v", dir, name, err))
		}
	}
	join := func(dir string) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			errs = append(errs, err.Error())
			return
		}
		write(dir, "cgroup.procs", strconv.Itoa(pid))
	}
	if l.Mode == "v2" {
		root := l.mounts[""]
		os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+cpu +memory"), 0o644)
		ctl, sb := filepath.Join(root, r.Control), filepath.Join(root, parent)
		os.MkdirAll(ctl, 0o755)
		os.MkdirAll(sb, 0o755)
		// cpu.weight 100 is cpu.shares 1024.
		write(ctl, "cpu.weight", strconv.Itoa(max(1, min(10000, r.CPUShares*100/1024))))
		join(ctl)
		if r.MemoryBytes > 0 {
			write(sb, "memory.max", strconv.FormatInt(r.MemoryBytes, 10))
		}
	} else {
		cpuCtl := filepath.Join(l.mounts["cpu"], r.Control)
		os.MkdirAll(cpuCtl, 0o755)
		write(cpuCtl, "cpu.shares", strconv.Itoa(r.CPUShares))
		join(cpuCtl)
		join(filepath.Join(l.mounts["memory"], r.Control))
		if r.MemoryBytes > 0 {
			sb := filepath.Join(l.mounts["memory"], parent)
			os.MkdirAll(sb, 0o755)
			write(sb, "memory.limit_in_bytes", strconv.FormatInt(r.MemoryBytes, 10))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("reserve the host for corral: %s", strings.Join(errs, "; "))
	}
	return nil
}

// ReleaseControl moves pid (when not 0) back to the root cgroups and removes the control cgroup
// of r if no process is left in it (lazyd may still serve running sandboxes from it).
func ReleaseControl(parent string, r Reservation, pid int) {
	l, err := Read(parent)
	if err != nil {
		return
	}
	for _, h := range l.Hier {
		if pid != 0 {
			os.WriteFile(filepath.Join(h, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
		}
		os.Remove(filepath.Join(h, r.Control))
	}
}

// ControlName is the control cgroup of the sandboxes' parent: <parent>-ctl beside it.
func ControlName(parent string) string { return strings.TrimSuffix(parent, "/") + "-ctl" }
