package agentrpc

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Exclusive commands (ExecRequest.Exclusive): a command no other process of the sandbox can touch
// while it runs. Before starting it the agent stops every other process it descends to (every
// process of the sandbox: the agent is its PID 1, or the VM's init) with SIGSTOP, which cannot be
// caught, ignored or blocked; it starts the command only once two consecutive scans of /proc find
// every one of them stopped and none of them scheduled in between; and when the command has ended
// (after its output reached EOF or ExitGrace) it sends SIGCONT to exactly the processes it stopped,
// so that processes stopped before (job control) stay stopped. A stopped process cannot write to
// /proc/PID/fd/N, send a signal, ptrace, or continue another, so the command's output and exit
// status are its own.
//
// While an exclusive command runs (from the moment it is claimed until its thaw) the agent starts
// no other command and signals no other command: both are refused with errdefs.ErrConflict, as is a
// second exclusive command. An exclusive command always has a timeout (DefaultExclusiveTimeout
// when the request sets none), and the thaw runs when the command ends however it ends (exit,
// timeout, a signal, the client hanging up does not matter: the thaw is not tied to any
// connection); a watchdog thaws ExclusiveThawGrace after the timeout even if the command's process
// could not be reaped. Freezing gives up (and thaws what it stopped) after freezeTimeout, for
// example against processes that keep continuing one another: the exec is then refused with
// errdefs.ErrUnavailable, never run unprotected.
//
// Limits (see docs/ARCHITECTURE.md): the command sees the sandbox's filesystem as the other
// processes left it (`sh -c` runs the sandbox's /bin/sh, a dynamic program reads its
// /etc/ld.so.preload), and kernel objects those processes set up before the freeze keep working
// (a file lock, a full pipe, a fanotify permission listener that now never answers): they can make
// the command fail or wait until its timeout, not forge its output. An io_uring queue armed before
// the freeze could, which is why no tier allows io_uring (runc: Docker's profile; gVisor: off by
// default; microvm: the guest agent's filter, internal/vmguest/iouring.go). Both are documented in
// docs/ARCHITECTURE.md ("Exclusive execs").

// DefaultExclusiveTimeout bounds an exclusive command whose request sets no timeout: the sandbox
// must not stay frozen forever.
const DefaultExclusiveTimeout = 10 * time.Minute

// ExclusiveThawGrace is how long after an exclusive command's timeout the watchdog thaws the
// sandbox even if the command's process has still not been reaped.
const ExclusiveThawGrace = 10 * time.Second

// freezeTimeout bounds the freezing of a sandbox before an exclusive command.
const freezeTimeout = 5 * time.Second

// pfKthread is PF_KTHREAD in /proc/PID/stat's flags: a kernel thread (the microvm tier's guest).
const pfKthread = 0x00200000

// errExclusiveRunning refuses commands and signals while an exclusive command runs.
func errExclusiveRunning() error {
	return errdefs.Conflict("an exclusive command is running in this sandbox; retry when it has ended")
}

// exclusiveGate orders starts against an exclusive command. A plain start read-holds gate across
// its spawn; an exclusive start write-holds it while it claims the sandbox, so that once claimed no
// plain start is still forking a process the freeze could miss.
type exclusiveGate struct {
	gate sync.RWMutex
	// Protected by Server.mu:
	active bool     // an exclusive command is claimed (starting or running) and not yet thawed
	cmd    *command // the exclusive command once started
}

// enterPlain admits a plain (non-exclusive) start; the returned func ends the admission once the
// process is started.
func (s *Server) enterPlain() (func(), error) {
	s.excl.gate.RLock()
	s.mu.Lock()
	active := s.excl.active
	s.mu.Unlock()
	if active {
		s.excl.gate.RUnlock()
		return nil, errExclusiveRunning()
	}
	return s.excl.gate.RUnlock, nil
}

// claimExclusive reserves the sandbox for one exclusive command. The caller must call
// releaseExclusive once the command is thawed (or was never started).
func (s *Server) claimExclusive() error {
	s.excl.gate.Lock()
	defer s.excl.gate.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.excl.active {
		return errdefs.Conflict("another exclusive command is running in this sandbox; retry when it has ended")
	}
	s.excl.active = true
	return nil
}

func (s *Server) releaseExclusive() {
	s.mu.Lock()
	s.excl.active, s.excl.cmd = false, nil
	s.mu.Unlock()
}

// checkSignal refuses a signal to a command other than the exclusive one while one runs: a
// SIGCONT would wake a frozen process, and a SIGKILL of one may wake others (the kernel
// continues a process group it orphans).
func (s *Server) checkSignal(c *command) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.excl.active && s.excl.cmd != c {
		return errExclusiveRunning()
	}
	return nil
}

// frozenSet is what a freeze stopped: the processes to continue at the thaw.
type frozenSet struct {
	once sync.Once
	// pids maps each process the freeze sent SIGSTOP to its start time, so that a pid reused
	// since is not continued.
	pids map[int]uint64
}

// procSample is one process as a scan saw it.
type procSample struct {
	start   uint64
	stopped bool   // every thread is stopped (T, t), dead (Z, X) or in an uninterruptible sleep with SIGSTOP sent
	sig     string // the threads' states and run counts: equal in two scans means it was not scheduled in between
}

// freeze stops every process the agent descends to, but the agent itself, and returns them.
// It fails (having continued what it stopped) when they are not all stopped by the deadline.
//
// Why two clean scans: a scan reads the processes one after another, so B may continue A after A
// was read and then stop itself before B is read, leaving A running behind a clean scan. When two
// consecutive scans find the same processes, each stopped both times and with the same run count
// for each thread (a task must be scheduled to stop again after a SIGCONT), none of them ran
// between its two reads, so all were stopped at once when the first scan ended; from then on none
// can run, since only a running process (none) or the agent can continue one.

func freeze(deadline time.Time) (*frozenSet, error) {
	fs := &frozenSet{pids: make(map[int]uint64)}
	self := os.Getpid()
	var prev map[int]procSample
	backoff := 50 * time.Microsecond
	for {
		cur, err := scanDescendants(self)
		if err != nil {
			fs.thaw()
			return nil, fmt.Errorf("freeze sandbox: %w", err)
		}
		clean := true
		for pid, p := range cur {
			if p.stopped {
				continue
			}
			clean = false
			if _, ok := fs.pids[pid]; !ok {
				fs.pids[pid] = p.start
			}
			syscall.Kill(pid, syscall.SIGSTOP) // ESRCH: it exited
		}
		if clean && samples(prev, cur) {
			return fs, nil
		}
		if clean {
			prev = cur
			continue
		}
		prev = nil
		if time.Now().After(deadline) {
			fs.thaw()
			return nil, errdefs.Unavailable("freeze sandbox: its processes did not all stop within %v; the exclusive command was not run", freezeTimeout)
		}
		time.Sleep(backoff) // let the signalled processes reach their stop
		backoff = min(2*backoff, 5*time.Millisecond)
	}
}

// samples reports whether two scans saw the same processes, none scheduled in between.
func samples(a, b map[int]procSample) bool {
	if a == nil || len(a) != len(b) {
		return false
	}
	for pid, p := range b {
		if q, ok := a[pid]; !ok || q != p {
			return false
		}
	}
	return true
}

// thaw continues the processes fs stopped, once.
func (fs *frozenSet) thaw() {
	fs.once.Do(func() {
		for pid, start := range fs.pids {
			if st, err := readProcStat(pid, pid); err == nil && st.start == start {
				syscall.Kill(pid, syscall.SIGCONT)
			}
		}
	})
}

// procStat is what freezing reads of /proc/PID/stat.
type procStat struct {
	state   byte
	ppid    int
	flags   uint64
	threads int
	start   uint64
}

// readProcStat reads /proc/PID/task/TID/stat (or /proc/PID/stat when tid == pid).
func readProcStat(pid, tid int) (procStat, error) {
	p := "/proc/" + strconv.Itoa(pid) + "/stat"
	if tid != pid {
		p = "/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/stat"
	}
	var buf [1024]byte
	b, err := readSmall(p, buf[:])
	if err != nil {
		return procStat{}, err
	}
	// The name (field 2) is in parentheses and may contain anything: the fields resume after
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("parse %s: no )", p)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("parse %s: %d fields", p, len(f))
	}
	num := func(j int) uint64 { n, _ := strconv.ParseUint(string(f[j]), 10, 64); return n }
	// After the name: state ppid pgrp session tty_nr tpgid flags ... num_threads(17) itrealvalue starttime(19).
	return procStat{state: f[0][0], ppid: int(num(1)), flags: num(6), threads: int(num(17)), start: num(19)}, nil
}

// runCount is the number of times the thread was scheduled (the third field of schedstat), or
// empty where the kernel does not say (gVisor).
func runCount(pid, tid int) string {
	if !haveSchedstat() {
		return ""
	}
	var buf [128]byte
	b, err := readSmall("/proc/"+strconv.Itoa(pid)+"/task/"+strconv.Itoa(tid)+"/schedstat", buf[:])
	if err != nil {
		return ""
	}
	f := bytes.Fields(b)
	if len(f) < 3 {
		return ""
	}
	return string(f[2])
}

// haveSchedstat reports whether the kernel has /proc/PID/schedstat (gVisor has not: a freeze then
// spares itself a failing open per thread and scan).
var haveSchedstat = sync.OnceValue(func() bool {
	_, err := os.Stat("/proc/self/schedstat")
	return err == nil
})

// readSmall reads a small /proc file into buf with one read (a /proc file's content is made at
// that read), without os.File's bookkeeping: a freeze reads a few files per process, several times.
func readSmall(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// scanDescendants samples every process whose parent chain reaches self, kernel threads excluded:
// every process of the sandbox, where self is its PID 1 (or the VM's init); the test binary's
// children in tests.
func scanDescendants(self int) (map[int]procSample, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	stats := make(map[int]procStat, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self {
			continue
		}
		st, err := readProcStat(pid, pid)
		if err != nil || st.flags&pfKthread != 0 {
			continue // gone, or a kernel thread
		}
		stats[pid] = st
	}
	out := make(map[int]procSample)
	for pid, st := range stats {
		// As PID 1 (the sandbox's init) every process is the sandbox's: no parent chain to
		// follow, which an orphan not yet reparented could break for a moment.
		if self != 1 && !descendsFrom(pid, self, stats) {
			continue
		}
		out[pid] = sampleProc(pid, st)
	}
	return out, nil
}

// descendsFrom reports whether pid's parent chain (as stats has it) reaches self.
func descendsFrom(pid, self int, stats map[int]procStat) bool {
	for range len(stats) + 1 {
		st, ok := stats[pid]
		if !ok {
			return false
		}
		if st.ppid == self {
			return true
		}
		pid = st.ppid
	}
	return false
}

// sampleProc samples every thread of one process.
func sampleProc(pid int, st procStat) procSample {
	p := procSample{start: st.start, stopped: true}
	tids := []int{pid}
	if st.threads > 1 {
		if ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task"); err == nil {
			tids = tids[:0]
			for _, e := range ents {
				if tid, err := strconv.Atoi(e.Name()); err == nil {
					tids = append(tids, tid)
				}
			}
			slices.Sort(tids)
		}
	}
	var sig []byte
	for _, tid := range tids {
		ts := st
		if tid != pid {
			var err error
			if ts, err = readProcStat(pid, tid); err != nil {
				continue // the thread exited
			}
		}
		switch ts.state {
		case 'T', 't', 'Z', 'X', 'x':
		case 'D':
			// Blocked in the kernel: a pending SIGSTOP stops it before it runs any of its own code
			// again.
			if !stopPending(pid, tid) {
				p.stopped = false
			}
		default:
			p.stopped = false
		}
		sig = append(sig, ts.state)
		sig = append(sig, runCount(pid, tid)...)
		sig = append(sig, ' ')
	}
	p.sig = string(sig)
	return p
}

// stopPending reports whether SIGSTOP is pending for the thread (or its process).
func stopPending(pid, tid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return false
	}
	bit := uint64(1) << (unix.SIGSTOP - 1)
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || (string(k) != "SigPnd" && string(k) != "ShdPnd") {
			continue
		}
		if n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 16, 64); err == nil && n&bit != 0 {
			return true
		}
	}
	return false
}
