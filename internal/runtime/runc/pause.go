package runc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/runtime/cgroups"
)

// Pause and Resume.
//
// Pause freezes the sandbox with the cgroup freezer, then has the kernel reclaim the memory
// charged to its memory cgroup: anonymous and tmpfs pages go to swap, clean page cache is
// dropped. The frozen processes cannot touch a page meanwhile, so nothing comes back until
// Resume thaws them. On cgroup v1 there is no "reclaim N bytes" file: lowering
// memory.limit_in_bytes below the usage makes the writer reclaim until the usage fits (then the
// new limit holds) or until reclaim makes no progress (then the write fails with EBUSY and the
// old limit stays). Pause lowers it 64 MiB at a time below the current usage, so that ctx is
// looked at between steps, and stops after four writes in a row (1, 2, 4, 8 ms apart) that free
// less than 1 MiB while nothing is under writeback: that is the floor (kernel memory, dirty or
// locked pages, anonymous memory when there is no swap). On v2 it writes 64 MiB at a time to
// memory.reclaim, with the same stopping rule.
//
// What Pause changes while it reclaims, and puts back before it returns:
//
//	v1  memory.limit_in_bytes  lowered step by step (above)
//	v1  memory.swappiness      100, so that anonymous pages are reclaimed as readily as page cache
//	                           (a cgroup that inherited 0 would otherwise never swap)
//	v2  memory.swap.max        "max": Create sets it to 0 (OCI swap = memory), which forbids swap
//
// The original values are written to <dir>/pause.json before the first change and the file is
// removed after the last restore; whoever finds it (a crash in between) puts them back: Resume,
// or the next Pause. The limits are restored at the end of Pause, not kept low until Resume: a
// frozen cgroup at its floor would OOM-kill (or, on v1, hang) the first thing charged to it.
//
// Swap and the sandbox's limit. On v1 the sandbox runs with memory.memsw.limit_in_bytes equal
// to memory.limit_in_bytes. memsw counts memory plus swap, and moving a page to swap does not
// change it, so Pause need not raise it: reclaim swaps regardless of memsw. It follows that the
// sandbox can never hold more than its limit in RAM and swap together, before or after a pause,
// and that while part of its memory is still in swap it can allocate only what is left of the
// limit. On v2 swap is not in memory.max: restoring memory.swap.max to 0 keeps what is in swap
// there (it comes back when touched) but forbids more, so until it is all back the sandbox may
// hold its memory limit in RAM plus what is still in swap; Resume's prefetch makes that window
// short.
//
// Resume thaws the sandbox and returns. A goroutine then brings the memory back, racing the
// thawed processes, in two passes over the anonymous and tmpfs mappings of every process in the
// sandbox (read from /proc/<pid>/maps while still frozen):
//
//  1. prefetch: process_madvise(MADV_WILLNEED) queues the reads of everything in swap at once,
//     so they go at the disk's streaming speed rather than one page fault at a time;
//  2. populate: the pages still mapped as swap entries (/proc/<pid>/pagemap) are read through
//     /proc/<pid>/mem, which maps them into the process's page tables: it then takes no page
//     fault for them, and a fault costs far more than the copy (~10 us here, in a VM).
//
// Pages that belong to no process (a tmpfs file nobody maps) come back when touched. Pause and
// Delete of the sandbox, and Close, cancel the goroutine and wait for it (at most one batch).

const (
	// freezeTimeout bounds the wait for every process to freeze; a process stuck in
	// uninterruptible sleep (a hung NFS read) can hold up the freezer indefinitely.
	freezeTimeout = 5 * time.Second
	// reclaimStep is how much one write asks the kernel to reclaim.
	reclaimStep = 64 << 20
	// reclaimTries writes in a row that each free less than reclaimMinProgress, with nothing
	// under writeback, end the reclaim.
	reclaimTries       = 4
	reclaimMinProgress = 1 << 20
	// reclaimWritebackWait bounds the time the reclaim waits for writes to swap to finish.
	reclaimWritebackWait = 2 * time.Second
	pauseFile            = "pause.json"
	// prefetchIOVs and prefetchBytes bound one process_madvise call: at most IOV_MAX ranges,
	// and a total that the kernel does not truncate (MAX_RW_COUNT, about 2 GiB) and that it
	// queues in tens of milliseconds, which bounds the wait for a cancelled prefetch.
	prefetchIOVs  = 1024
	prefetchBytes = 64 << 20
	// populateChunk is the largest read of another process's memory at once (the buffer).
	populateChunk = 1 << 20
)

// Pause freezes every process of the sandbox and then pushes its memory out to swap so the host
// gets it back; see the package doc. It is all-or-nothing: on error (ctx ending included) the
// sandbox is thawed again and its limits are as before. A host without swap is no error: Pause
// then returns page cache only, and says so in PauseStats.NoSwap.
//
// Errors: errdefs.ErrNotFound for an unknown sandbox; errdefs.ErrConflict if it is already
// paused or is stopped.
func (r *Runtime) Pause(ctx context.Context, id string) (runtime.PauseStats, error) {
	start := time.Now()
	var stats runtime.PauseStats
	st, unlock, err := r.lockedStatus(ctx, id)
	if err != nil {
		return stats, err
	}
	defer unlock()
	switch st.State {
	case runtime.StatePaused:
		return stats, errdefs.Conflict("sandbox %s is already paused: Resume it first", id)
	case runtime.StateStopped:
		return stats, errdefs.Conflict("sandbox %s is stopped, there is nothing to pause: Delete it", id)
	}
	if r.engineOf(id) == EngineGVisor {
		return r.pauseGVisor(ctx, id, st)
	}
	// A prefetch still reading back would fight the reclaim.
	r.stopPrefetch(id)
	// Settings a crashed Pause left lowered must not be saved as the originals.
	if err := r.restoreMemory(id); err != nil {
		return stats, fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	stats.MemoryBefore = st.MemoryBytes
	swapBefore := r.cg.SwapUsage(id)
	if err := r.cg.Freeze(ctx, id, freezeTimeout); err != nil {
		r.cg.Thaw(id)
		return stats, fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	stats.Freeze = time.Since(start)
	stats.NoSwap = !hostHasSwap()
	if err := r.reclaim(ctx, id, !stats.NoSwap); err != nil {
		if terr := r.cg.Thaw(id); terr != nil {
			err = errors.Join(err, fmt.Errorf("thaw: %w", terr))
		}
		return stats, fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	stats.MemoryAfter, err = r.cg.MemUsage(id)
	if err != nil {
		stats.MemoryAfter = stats.MemoryBefore
	}
	if stats.MemoryBefore > stats.MemoryAfter {
		stats.MemoryReturned = stats.MemoryBefore - stats.MemoryAfter
	}
	if s := r.cg.SwapUsage(id); s > swapBefore {
		stats.Swapped = s - swapBefore
	}
	stats.Duration = time.Since(start)
	r.log.Debug("sandbox paused", "id", id, "freeze", stats.Freeze, "total", stats.Duration,
		"memory_before", stats.MemoryBefore, "memory_after", stats.MemoryAfter, "swapped", stats.Swapped, "no_swap", stats.NoSwap)
	return stats, nil
}

// Resume thaws a paused sandbox and brings its memory back in (a best-effort prefetch from
// swap, which completes in the background); see the package doc. A Pause that crashed half-way
// leaves settings that Resume restores, even when it then refuses.
//
// Errors: errdefs.ErrNotFound for an unknown sandbox; errdefs.ErrConflict if it is running
// (not paused) or stopped.
func (r *Runtime) Resume(ctx context.Context, id string) (runtime.ResumeStats, error) {
	start := time.Now()
	var stats runtime.ResumeStats
	st, unlock, err := r.lockedStatus(ctx, id)
	if err != nil {
		return stats, err
	}
	defer unlock()
	if err := r.restoreMemory(id); err != nil {
		return stats, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	switch st.State {
	case runtime.StateRunning:
		return stats, errdefs.Conflict("sandbox %s is running, not paused", id)
	case runtime.StateStopped:
		return stats, errdefs.Conflict("sandbox %s is stopped, there is nothing to resume: Delete it", id)
	}
	if r.engineOf(id) == EngineGVisor {
		return r.resumeGVisor(ctx, id)
	}
	r.stopPrefetch(id) // one of an earlier Resume, if something else froze the sandbox since
	stats.InSwap = r.cg.SwapUsage(id)
	// Read the address ranges while every process is frozen: none can exit (so no pid is
	// recycled between the pidfd and /proc/<pid>/maps) or change its mappings meanwhile.
	var targets []prefetchTarget
	if stats.InSwap > 0 && !r.noPrefetch && r.bg.Err() == nil {
		targets = r.prefetchTargets(id)
	}
	if err := r.cg.Thaw(id); err != nil {
		closeTargets(targets)
		return stats, fmt.Errorf("resume sandbox %s: thaw: %w", id, err)
	}
	r.startPrefetch(id, targets)
	stats.Duration = time.Since(start)
	r.log.Debug("sandbox resumed", "id", id, "total", stats.Duration, "in_swap", stats.InSwap, "prefetch_processes", len(targets))
	return stats, nil
}

// lockedStatus takes id's lock and reads its status; the caller calls unlock (unless err).
func (r *Runtime) lockedStatus(ctx context.Context, id string) (runtime.Status, func(), error) {
	if !validID(id) {
		return runtime.Status{}, nil, errdefs.Invalid("ID", "%q is not a valid sandbox ID", id)
	}
	unlock := r.locks.lock(id)
	st, err := r.Status(ctx, id)
	if err != nil {
		unlock()
		return runtime.Status{}, nil, err
	}
	return st, unlock, nil
}

// reclaim pushes the frozen sandbox's memory out; see the package doc. It restores every setting
// it changed before it returns, error or not. Preconditions: id's lock is held; id is frozen.
func (r *Runtime) reclaim(ctx context.Context, id string, swapOn bool) (err error) {
	d := r.cg.Dir("memory", id)
	v2 := r.cg.Mode == "v2"
	// The settings to change, in order, and their values during the reclaim ("" = set by the loop).
	type knob struct{ file, val string }
	knobs := []knob{{"memory.swappiness", "100"}, {"memory.limit_in_bytes", ""}}
	if v2 {
		knobs = nil
		if swapOn {
			knobs = []knob{{"memory.swap.max", "max"}}
		}
	}
	saved := map[string]string{}
	for _, k := range knobs {
		b, err := os.ReadFile(filepath.Join(d, k.file))
		if errors.Is(err, fs.ErrNotExist) {
			continue // memory.swap.max without swap accounting: swap is not limited anyway
		}
		if err != nil {
			return fmt.Errorf("reclaim: %w", err)
		}
		saved[k.file] = strings.TrimSpace(string(b))
	}
	if err := r.saveMemory(id, saved); err != nil {
		return err
	}
	defer func() {
		if rerr := r.restoreMemory(id); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	for _, k := range knobs {
		if _, ok := saved[k.file]; !ok || k.val == "" {
			continue
		}
		// Best effort: without it the reclaim returns less, which Pause reports.
		if err := os.WriteFile(filepath.Join(d, k.file), []byte(k.val), 0); err != nil {
			r.log.Warn("set memory knob for pause", "id", id, "file", k.file, "err", err)
		}
	}
	// Dirty page cache can not be reclaimed; the sandbox's disk writes with direct I/O, so
	// syncing it makes its dirty pages clean and reclaimable in one go.
	if fd, err := unix.Open(filepath.Join(r.dir(id), diskMount), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		if err := unix.Syncfs(fd); err != nil {
			r.log.Warn("sync sandbox disk for pause", "id", id, "err", err)
		}
		unix.Close(fd)
	}

	usageFile := "memory.usage_in_bytes"
	if v2 {
		usageFile = "memory.current"
	}
	var waited time.Duration // for writeback, in total
	for stuck := 0; stuck < reclaimTries; {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("reclaim: %w", err)
		}
		u, err := cgroups.ReadUint(filepath.Join(d, usageFile))
		if err != nil {
			return fmt.Errorf("reclaim: %w", err)
		}
		if u == 0 {
			break
		}
		var expected error // the kernel's way of saying "could not reclaim that much"
		if v2 {
			err = os.WriteFile(filepath.Join(d, "memory.reclaim"), []byte(strconv.FormatUint(min(u, reclaimStep), 10)), 0)
			expected = unix.EAGAIN
		} else {
			err = os.WriteFile(filepath.Join(d, "memory.limit_in_bytes"), []byte(strconv.FormatUint(u-min(u, reclaimStep), 10)), 0)
			expected = unix.EBUSY
		}
		if err != nil && !errors.Is(err, expected) {
			return fmt.Errorf("reclaim: %w", err)
		}
		after, err := cgroups.ReadUint(filepath.Join(d, usageFile))
		if err != nil {
			return fmt.Errorf("reclaim: %w", err)
		}
		if after+reclaimMinProgress <= u {
			stuck = 0
			continue
		}
		// One pass of the kernel gives up while the pages it started writing to swap are still
		// in flight (it moves them aside rather than wait): give the writes time, then retry.
		// At the true floor the retries are cheap, since nothing reclaimable is left to scan.
		backoff := time.Millisecond << stuck
		time.Sleep(backoff)
		if waited += backoff; !v2 && cgroups.MemStat(d, "writeback") > 0 && waited < reclaimWritebackWait {
			continue
		}
		stuck++
	}
	return nil
}

// memorySettings are the only files pause.json may name.
var memorySettings = []string{"memory.limit_in_bytes", "memory.swappiness", "memory.swap.max"}

// saveMemory writes the settings reclaim is about to change to pause.json, atomically.
func (r *Runtime) saveMemory(id string, saved map[string]string) error {
	b, err := json.Marshal(saved)
	if err != nil {
		return err
	}
	p := filepath.Join(r.dir(id), pauseFile)
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("save memory settings: %w", err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("save memory settings: %w", err)
	}
	return nil
}

// restoreMemory writes back the settings saved in pause.json, if there is one, and removes it.
// Preconditions: id's lock is held.
func (r *Runtime) restoreMemory(id string) error {
	p := filepath.Join(r.dir(id), pauseFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore memory settings: %w", err)
	}
	var saved map[string]string
	if err := json.Unmarshal(b, &saved); err != nil {
		return fmt.Errorf("restore memory settings: %s: %w", p, err)
	}
	d := r.cg.Dir("memory", id)
	var errs []error
	for _, f := range memorySettings {
		v, ok := saved[f]
		if !ok {
			continue
		}
		err := os.WriteFile(filepath.Join(d, f), []byte(v), 0)
		if err != nil && !errors.Is(err, fs.ErrNotExist) { // no cgroup left: nothing to restore
			errs = append(errs, fmt.Errorf("restore %s to %s: %w", f, v, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil {
		return fmt.Errorf("restore memory settings: %w", err)
	}
	return nil
}

// prefetchTarget is one process's address ranges to read back from swap. The three files are
// opened while the process is frozen, so they refer to it even if its pid is recycled later.
type prefetchTarget struct {
	pidfd   int
	mem     *os.File // /proc/<pid>/mem
	pagemap *os.File // /proc/<pid>/pagemap
	iov     []remoteIovec
}

// remoteIovec is struct iovec for addresses in another process: never dereferenced here.
type remoteIovec struct{ base, len uintptr }

// prefetchTargets opens every process of the frozen sandbox and lists the ranges whose pages
// may be in swap: anonymous memory and tmpfs (shmem) mappings. A regular file's mapping is
// left out: MADV_WILLNEED on it would read the whole file range ahead, not swap.
func (r *Runtime) prefetchTargets(id string) []prefetchTarget {
	pids, err := r.cg.Procs(id)
	if err != nil {
		return nil
	}
	// The agent first: the next exec after a resume needs it, and only it, at once.
	if agent, err := readPid(filepath.Join(r.dir(id), "init.pid")); err == nil {
		if i := slices.Index(pids, agent); i > 0 {
			pids[0], pids[i] = pids[i], pids[0]
		}
	}
	var out []prefetchTarget
	for _, pid := range pids {
		t, err := openPrefetchTarget(pid)
		if err != nil {
			r.log.Debug("prefetch: skip process", "id", id, "pid", pid, "err", err)
			continue
		}
		if len(t.iov) > 0 {
			out = append(out, t)
		} else {
			t.close()
		}
	}
	return out
}

func openPrefetchTarget(pid int) (t prefetchTarget, err error) {
	t.pidfd, err = unix.PidfdOpen(pid, 0)
	if err != nil {
		return t, err
	}
	proc := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(proc + "/maps")
	if err != nil {
		t.close()
		return t, err
	}
	t.iov = swapRanges(b)
	// Without them (no CAP_SYS_PTRACE for a non-dumpable process) there is only no populate.
	if t.mem, err = os.Open(proc + "/mem"); err == nil {
		if t.pagemap, err = os.Open(proc + "/pagemap"); err != nil {
			t.mem.Close()
			t.mem = nil
		}
	}
	return t, nil
}

func (t prefetchTarget) close() {
	unix.Close(t.pidfd)
	if t.mem != nil {
		t.mem.Close()
	}
	if t.pagemap != nil {
		t.pagemap.Close()
	}
}

// swapRanges parses /proc/<pid>/maps and returns the ranges that may hold swapped pages.
func swapRanges(maps []byte) []remoteIovec {
	var iov []remoteIovec
	sc := bufio.NewScanner(bytes.NewReader(maps))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// start-end perms offset major:minor inode [path]
		f := strings.Fields(sc.Text())
		if len(f) < 5 || strings.HasPrefix(f[1], "--") {
			continue // PROT_NONE: reserved, never touched
		}
		if len(f) >= 6 {
			path, dev := f[5], f[3]
			switch {
			case path == "[heap]" || path == "[stack]" || strings.HasPrefix(path, "[anon:"):
			case strings.HasPrefix(path, "["): // [vdso], [vvar], [vsyscall]: not swappable
				continue
			case !strings.HasPrefix(dev, "00:") && !strings.HasPrefix(dev, "0:"):
				continue // a file on a block device: not swap
			}
			// A file on device 0:x is tmpfs, memfd or SysV shm (swappable) or on another
			// virtual filesystem, for which the hint does nothing. (overlayfs maps the real file.)
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		for start < end {
			n := min(end-start, prefetchBytes)
			iov = append(iov, remoteIovec{uintptr(start), uintptr(n)})
			start += n
		}
	}
	return iov
}

// prefetchRun is a running background prefetch.
type prefetchRun struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine has ended
}

// startPrefetch reads targets back from swap in a goroutine that ends when it is done, when
// stopPrefetch(id) is called (Pause and Delete do) or when Close begins. It owns and closes
// the targets' pidfds. Preconditions: id's lock is held.
func (r *Runtime) startPrefetch(id string, targets []prefetchTarget) {
	if len(targets) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(r.bg)
	run := &prefetchRun{cancel: cancel, done: make(chan struct{})}
	r.prefetchMu.Lock()
	if r.bg.Err() != nil { // Close has begun
		r.prefetchMu.Unlock()
		cancel()
		closeTargets(targets)
		return
	}
	r.prefetches[id] = run
	r.prefetchWG.Add(1)
	r.prefetchMu.Unlock()
	go func() {
		defer r.prefetchWG.Done()
		defer close(run.done)
		defer cancel()
		start := time.Now()
		// The agent (targets[0], when it had anything in swap) is read back completely before the
		// rest is queued, so that the first exec after a resume does not wait behind the
		// sandbox's bulk memory. Then queue every other read first and map what came in.
		buf := make([]byte, populateChunk)
		targets[0].prefetch(ctx)
		targets[0].populate(ctx, buf)
		for _, t := range targets[1:] {
			t.prefetch(ctx)
		}
		queued := time.Since(start)
		for _, t := range targets[1:] {
			t.populate(ctx, buf)
		}
		clear(buf) // the sandbox's memory passed through it
		closeTargets(targets)
		r.prefetchMu.Lock()
		if r.prefetches[id] == run {
			delete(r.prefetches, id)
		}
		r.prefetchMu.Unlock()
		r.log.Debug("prefetch done", "id", id, "queued", queued, "took", time.Since(start), "cancelled", ctx.Err() != nil)
	}()
}

// stopPrefetch cancels id's prefetch, if one runs, and waits for it to end (at most one
// process_madvise call). Preconditions: id's lock is held.
func (r *Runtime) stopPrefetch(id string) {
	r.prefetchMu.Lock()
	run := r.prefetches[id]
	delete(r.prefetches, id)
	r.prefetchMu.Unlock()
	if run != nil {
		run.cancel()
		<-run.done
	}
}

func closeTargets(targets []prefetchTarget) {
	for _, t := range targets {
		t.close()
	}
}

// prefetch asks the kernel to read t's ranges back from swap (MADV_WILLNEED), a batch at a
// time until done or ctx ends: each call allocates the pages and queues their reads, and
// returns without waiting for them. Best effort: a process that exited or a range unmapped
// since maps was read is skipped; without process_madvise (Linux < 5.10) or CAP_SYS_NICE
// nothing is prefetched.
func (t prefetchTarget) prefetch(ctx context.Context) {
	iov := t.iov
	for len(iov) > 0 && ctx.Err() == nil {
		n, total := 0, uintptr(0)
		for n < len(iov) && n < prefetchIOVs && total+iov[n].len <= prefetchBytes {
			total += iov[n].len
			n++
		}
		batch := iov[:n]
		done, _, errno := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(t.pidfd),
			uintptr(unsafe.Pointer(&batch[0])), uintptr(len(batch)), unix.MADV_WILLNEED, 0, 0)
		switch {
		case errno == unix.ESRCH || errno == unix.ENOSYS || errno == unix.EPERM || errno == unix.EINVAL:
			return
		case errno != 0:
			iov = iov[1:] // the first range failed (unmapped meanwhile)
			continue
		}
		// A range that fails after others succeeded ends the call early: skip past it.
		skip := 0
		for skip < n && done >= batch[skip].len {
			done -= batch[skip].len
			skip++
		}
		if skip < n {
			skip++
		}
		iov = iov[skip:]
	}
}

// populate maps t's pages that are still swap entries into its page tables, by reading them
// through /proc/<pid>/mem (the kernel faults them in on the process's behalf). After prefetch
// they are in memory already, but each page the process touches first would still cost it a
// page fault, and a fault's trap costs many times the copy, in a VM above all.
// /proc/<pid>/pagemap says which pages those are, so nothing else is read (an untouched page
// would become a mapped zero page). Best effort; stops when ctx ends.
func (t prefetchTarget) populate(ctx context.Context, buf []byte) {
	if t.mem == nil {
		return
	}
	const pmSwapped = 1 << 62 // pagemap: the entry is a swap entry
	page := uintptr(os.Getpagesize())
	entries := make([]byte, 8*(prefetchBytes/page))
	swapped := func(i int) bool { return binary.LittleEndian.Uint64(entries[8*i:])&pmSwapped != 0 }
	for _, v := range t.iov {
		for addr, end := v.base, v.base+v.len; addr < end; {
			if ctx.Err() != nil {
				return
			}
			n := min((end-addr)/page, uintptr(len(entries)/8))
			got, _ := t.pagemap.ReadAt(entries[:8*n], int64(addr/page*8))
			if got < 8 {
				break // the process is gone, or the range was unmapped meanwhile
			}
			got /= 8
			for i := 0; i < got; {
				if !swapped(i) {
					i++
					continue
				}
				j := i + 1
				for j < got && swapped(j) && uintptr(j-i)*page < uintptr(len(buf)) {
					j++
				}
				t.mem.ReadAt(buf[:uintptr(j-i)*page], int64(addr+uintptr(i)*page))
				i = j
			}
			addr += uintptr(got) * page
		}
	}
}

// hostHasSwap reports whether the host has free swap space now.
func hostHasSwap() bool {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "SwapFree:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb > 0
		}
	}
	return false
}
