package agentrpc

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
)

// Calls: the fncall tier's isolation inside one warm container.
//
// An agent started with --calls (Config.Calls) runs in a sandbox whose bundle also gives it
// CAP_SYS_ADMIN, and runs every command as a call; plain commands are refused, since they would
// inherit that capability. A call's life:
//
//	CallPrep(id, size)  mounts a tmpfs of size at <CallsDir>/<id> with upper/, work/ and root/.
//	                    The edge writes the call's input files under upper/ with the file ops.
//	Exec or Start       with Call set: a call helper (below) runs the command. On a thread of
//	                    its own it unshares new mount, IPC, UTS and cgroup namespaces, mounts an
//	                    overlay of the container's root (lower) and upper/ at root/, gives it /dev,
//	                    /proc, /sys and the sandbox's bound /etc files, pivots into it, drops to the
//	                    sandbox's capability set and seccomp policy, and starts the command from
//	                    there. It reaps everything; when the command exits it kills every other
//	                    process of its PID namespace (it is that namespace's init), reaps them and
//	                    reports the command's status and the call's usage. Output, stdin, timeouts
//	                    and signals go through the agent as for any command: the agent passes
//	                    signals to the helper as messages, and SIGKILL (a timeout, a client's, an
//	                    early CallEnd) kills every process of the call.
//	CallEnd(id)         kills the call's processes if its command still runs and waits for it,
//	                    unmounts the tmpfs (everything the call wrote), removes the directory,
//	                    forgets the command, and checks the container: any process living directly
//	                    in the sandbox's PID namespace but the agent, and any mount under CallsDir
//	                    no call owns, is killed or detached and reported (CallEnd.Clean false).
//
// A call with nothing to stage and nothing to read afterwards can be all three in one Exec
// (CallSpec.Prepare and End): the agent prepares it (and makes the directories asked for in its
// root), runs its command, and once the exit event is sent ends it and sends CallEnd's result
// as a reply frame on the same connection (Session.CallEnd).
//
// Call helpers are the agent itself, re-executed (Config.SelfExe call-init, callinit.go) as the
// first process of a new PID namespace and of a mount namespace whose copy of CallsDir is a slave
// of the agent's (so calls prepared later appear in it). Starting one (an execve of the agent and
// the Go runtime's start) costs several times a call's other work, so a helper serves one call
// after another, and is started ahead of the first: calls of one helper share its PID namespace,
// which is empty but for the helper between them. Concurrent calls each take a helper; up to
// maxIdleHelpers wait between calls. The command's capabilities and filter are set on the call's
// thread only: the helper's other threads keep CAP_SYS_ADMIN for later calls, and nothing of a
// call can reach them (the helper is not dumpable; no call process has CAP_SYS_PTRACE).
//
// CallsDir itself is a small tmpfs the agent mounts at the first CallPrep, so that calls leave
// nothing on the container's disk, and a call's root (whose lower layer is the container's root
// filesystem without its mounts) sees an empty directory there.
//
// Known gap: a call can read /proc/1/mountinfo, the helper's own mount table, which is the
// sandbox's (its processes see it in any sandbox) plus the directories of the calls prepared in
// it at the time: their ids, nothing of their files.
//
// Concurrency: calls are independent; several may be prepared and running at once. Server.calls
// (under Server.mu) maps ids to calls; each call's own state is under call.mu, which CallPrep, a
// start and CallEnd hold while they work on it, so they are serialised per call. The idle helpers
// are under Server.helperMu; a helper's owner and its socket's writes under callHelper.mu. Each
// call's command has one goroutine, watchCall, that reads its helper's report, ending with it.
// Lock order: call.mu, then Server.mu (then command.mu, output.mu); call.mu, then callHelper.mu,
// then the reaper's locks; Server.helperMu is a leaf.

// DefaultCallsDir is where calls are prepared inside the sandbox.
const DefaultCallsDir = "/.corral-calls"

// CallInitArg is the first argument with which the agent re-executes itself as a call's helper.
const CallInitArg = "call-init"

// callCloneFlags are the namespaces a call helper starts in (each call also gets new mount, IPC,
// UTS and cgroup namespaces of its own: see startCommand).
const callCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWPID

var callIDRE = lazyregexp.New(`^[a-z0-9-]{1,64}$`)

// validCallID reports whether id can name a call: 1-64 of [a-z0-9-].
func validCallID(id string) bool { return callIDRE.MatchString(id) }

type callState int

const (
	callPreparing callState = iota // CallPrep is mounting
	callReady                      // prepared, no command yet
	callStarted                    // its command was started (or failed to start)
	callEnded                      // CallEnd is done; the call is gone from Server.calls
)

// call is one prepared call.
type call struct {
	id, dir string // immutable
	// report receives the helper's report on the call (nil if it had none: it died); set by
	// spawnCall before the command's goroutines start, immutable after.
	report chan *callReport

	mu sync.Mutex
	// Protected by mu:
	state callState
	cmd   *command // set once started
}

// callSpec is what the agent tells a call helper about a call (msgCall).
type callSpec struct {
	Dir     string      `json:"dir"`
	Exec    ExecRequest `json:"exec"` // argv, shell, env, cwd, user
	BaseEnv []string    `json:"base_env"`
	EtcDir  string      `json:"etc_dir"`
	// Binds are files the sandbox has bound over its root filesystem (/etc/resolv.conf): the
	// call's root shows the file below them, so the helper binds them again.
	Binds []string `json:"binds,omitempty"`
	// ProcFUSE are the FUSE files mounted over the sandbox's /proc (LXCFS's), which the helper
	// binds over the call's new /proc.
	ProcFUSE []string `json:"proc_fuse,omitempty"`
	ShmBytes int64    `json:"shm_bytes"`

	dropCaps []int // set by the helper: capsBeyondSandbox
}

// callReport is what a call helper tells the agent when a call's command has exited and the
// call's other processes are dead, or when it could not start the command.
type callReport struct {
	Code   int    `json:"code"`
	Signal int    `json:"signal,omitempty"`
	Error  string `json:"error,omitempty"`
	// CPUNanos is the CPU time of every process of the call (all are reaped by the helper);
	// MaxRSS the command's peak (with the descendants it waited for).
	CPUNanos int64 `json:"cpu_ns,omitempty"`
	MaxRSS   int64 `json:"max_rss,omitempty"`
	// HelperCPUNanos is the CPU time of the helper and all its calls so far: the base for the
	// usage of a later call whose helper dies before it can report.
	HelperCPUNanos int64 `json:"helper_cpu_ns,omitempty"`
}

// maxCallMessage bounds a message read from a helper's socket pair.
const maxCallMessage = 4 << 20

// callRootSize is the size of the tmpfs at CallsDir: it holds only the calls' mount points.
const callRootSize = 64 << 10

// callPrep prepares the call id with a tmpfs of size bytes and returns its directory.
func (s *Server) callPrep(id string, size int64) (string, error) {
	switch {
	case !s.cfg.Calls:
		return "", errdefs.Invalid("op", "this sandbox does not run fncalls (its agent was started without --calls)")
	case !validCallID(id):
		return "", errdefs.Invalid("id", "call id %q: want 1-64 of [a-z0-9-]", id)
	case size <= 0:
		return "", errdefs.Invalid("size", "must be positive, got %d", size)
	}
	cl := &call{id: id, dir: filepath.Join(s.cfg.CallsDir, id)}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	s.mu.Lock()
	switch {
	case s.closing:
		s.mu.Unlock()
		return "", errdefs.Unavailable("agent is shutting down")
	case s.calls[id] != nil:
		s.mu.Unlock()
		return "", errdefs.Conflict("call %s is already prepared: end it first", id)
	}
	s.calls[id] = cl
	s.mu.Unlock()
	if err := s.mountCall(cl.dir, size); err != nil {
		s.mu.Lock()
		delete(s.calls, id)
		s.mu.Unlock()
		cl.state = callEnded
		return "", fmt.Errorf("prepare call %s: %w", id, err)
	}
	cl.state = callReady
	s.refillHelpers()
	return cl.dir, nil
}

// prepareInline prepares the call of an exec request that asks for it (CallSpec.Prepare): as
// CallPrep, then the directories asked for under its upper/, and points the request at the
// call's directory. The directories are made on the call's fresh tmpfs, before anything of the
// call runs, so there is nothing on the way to guard against (checkCallPath).
func (s *Server) prepareInline(req *ExecRequest) error {
	if req == nil || req.Call == nil || req.Call.Prepare == nil {
		return nil
	}
	p := req.Call.Prepare
	dirs := make([]string, len(p.Dirs))
	for i, d := range p.Dirs {
		var err error
		if dirs[i], err = cleanPath("call.prepare.dirs", d); err != nil {
			return err
		}
	}
	dir, err := s.callPrep(p.ID, p.Size)
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if _, err := s.mkdir(dir+"/upper"+d, WriteOptions{Parents: true}); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			return fmt.Errorf("call %s: make %s: %w", p.ID, d, err)
		}
	}
	req.Call.Dir = dir
	return nil
}

// mountCall makes dir a fresh tmpfs of size bytes holding upper/ (owned and moded like the
// container's root, as the overlay's root takes its attributes from it), work/ and root/.
func (s *Server) mountCall(dir string, size int64) error {
	if err := s.ensureCallsRoot(); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	opts := "mode=0755,size=" + strconv.FormatInt(size, 10)
	if err := unix.Mount("corral-call", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		os.Remove(dir)
		return fmt.Errorf("mount tmpfs at %s: %w", dir, err)
	}
	err := func() error {
		var root unix.Stat_t
		if err := unix.Stat("/", &root); err != nil {
			return fmt.Errorf("stat /: %w", err)
		}
		for _, d := range []string{"upper", "work", "root"} {
			if err := unix.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
				return fmt.Errorf("create %s: %w", d, err)
			}
		}
		upper := filepath.Join(dir, "upper")
		if err := unix.Chown(upper, int(root.Uid), int(root.Gid)); err != nil {
			return fmt.Errorf("chown %s: %w", upper, err)
		}
		if err := unix.Chmod(upper, root.Mode&0o7777); err != nil {
			return fmt.Errorf("chmod %s: %w", upper, err)
		}
		return nil
	}()
	if err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		os.Remove(dir)
	}
	return err
}

// ensureCallsRoot mounts the tmpfs at CallsDir (mode 0700) once.
func (s *Server) ensureCallsRoot() error {
	s.callsRootMu.Lock()
	defer s.callsRootMu.Unlock()
	if s.callsRootReady {
		return nil
	}
	d := s.cfg.CallsDir
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create %s: %w", d, err)
	}
	// The image may have put something else there; never mount through a symbolic link.
	var st unix.Stat_t
	if err := unix.Lstat(d, &st); err != nil {
		return fmt.Errorf("stat %s: %w", d, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory", d)
	}
	opts := "mode=0700,size=" + strconv.Itoa(callRootSize)
	if err := unix.Mount("corral-calls", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mount tmpfs at %s: %w", d, err)
	}
	// Shared, so that the calls' tmpfs mounted here later reach the call helpers, whose copy of
	// this mount is a slave (nothing propagates back).
	if err := unix.Mount("", d, "", unix.MS_SHARED, ""); err != nil {
		unix.Unmount(d, unix.MNT_DETACH)
		return fmt.Errorf("make %s shared: %w", d, err)
	}
	s.callsRootReady = true
	return nil
}

// claimCall checks that req may start a command in this agent and, for a call, returns the call
// with its mu held and its state ready: the caller starts the command and unlocks.
func (s *Server) claimCall(req *ExecRequest) (*call, error) {
	switch {
	case req.Call == nil:
		return nil, errdefs.Invalid("call", "this sandbox runs fncalls only: prepare a call (CallPrep) and set the request's call")
	case !s.cfg.Calls:
		return nil, errdefs.Invalid("call", "this sandbox does not run fncalls (its agent was started without --calls)")
	case req.TTY:
		return nil, errdefs.Invalid("tty", "a call cannot have a terminal")
	}
	id, ok := strings.CutPrefix(req.Call.Dir, s.cfg.CallsDir+"/")
	if !ok || !validCallID(id) {
		return nil, errdefs.Invalid("call", "dir %q is not a call's directory (use what CallPrep returned)", req.Call.Dir)
	}
	s.mu.Lock()
	cl := s.calls[id]
	s.mu.Unlock()
	if cl == nil {
		return nil, errdefs.NotFound("call %s (prepare it with CallPrep)", id)
	}
	cl.mu.Lock()
	if cl.state != callReady {
		cl.mu.Unlock()
		if cl.state == callEnded {
			return nil, errdefs.NotFound("call %s (prepare it with CallPrep)", id)
		}
		return nil, errdefs.Conflict("call %s has run its command already: a call runs one command", id)
	}
	return cl, nil
}

// callEnvironment is what every call in this sandbox needs to know about it, read once.
type callEnvironment struct {
	binds, procFUSE []string
	shmBytes        int64
}

func (s *Server) callEnv() callEnvironment {
	s.callEnvOnce.Do(func() {
		s.callEnvCache.shmBytes = 64 << 20
		var st unix.Statfs_t
		if unix.Statfs("/dev/shm", &st) == nil && st.Blocks > 0 {
			s.callEnvCache.shmBytes = int64(st.Blocks) * st.Bsize
		}
		s.callEnvCache.binds = boundEtcFiles("/proc/self/mountinfo")
		s.callEnvCache.procFUSE = procFUSEFiles("/proc/self/mountinfo")
	})
	return s.callEnvCache
}

// boundEtcFiles lists which of /etc/resolv.conf, /etc/hosts and /etc/hostname are mount points
// in mountinfo.
func boundEtcFiles(mountinfo string) []string {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		switch mp := fields[4]; mp {
		case "/etc/resolv.conf", "/etc/hosts", "/etc/hostname":
			out = append(out, mp)
		}
	}
	return out
}

// procFUSEFiles lists the FUSE files mounted over /proc in mountinfo (LXCFS's, see
// internal/lxcfs): they are the sandbox's for its life, so the agent reads them once for every
// call, instead of each call's helper reading its mount table.
func procFUSEFiles(mountinfo string) []string {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 || !strings.HasPrefix(post, "fuse.") || !strings.HasPrefix(f[4], "/proc/") || strings.Contains(f[4], "\\") {
			continue
		}
		out = append(out, f[4])
	}
	return out
}

// spawnCall starts c, a call's command, through a helper (see the top of this file). It sets c's
// pid (the helper's), proc (fed by watchCall) and stdin, and returns the descriptors to read
// output from, or the Exit of a call whose helper could not be started.
func (s *Server) spawnCall(c *command, req *ExecRequest) ([]outputFile, *Exit) {
	env := s.callEnv()
	spec, err := json.Marshal(&callSpec{
		Dir:     c.call.dir,
		Exec:    ExecRequest{Argv: req.Argv, Shell: req.Shell, Env: req.Env, Cwd: req.Cwd, User: req.User},
		BaseEnv: s.cfg.Env, EtcDir: s.cfg.EtcDir, Binds: env.binds, ProcFUSE: env.procFUSE, ShmBytes: env.shmBytes,
	})
	if err != nil {
		return nil, &Exit{Code: 126, Error: fmt.Sprintf("encode the call: %v", err)}
	}
	// Only the descriptors matter here: the helper starts the command in its own process group.
	childFds, outputs, exit := c.openStdio(req, 0, &syscall.SysProcAttr{})
	if exit != nil {
		return nil, exit
	}
	fail := func(err error) ([]outputFile, *Exit) {
		for _, o := range outputs {
			o.f.Close()
		}
		c.stdin.shutdown()
		return nil, &Exit{Code: 126, Error: fmt.Sprintf("start the call: %v", err)}
	}
	var h *callHelper
	// An idle helper may have died unnoticed (its status not reaped yet): then try another.
	for try := 0; ; try++ {
		if h, err = s.takeHelper(); err != nil {
			break
		}
		if err = h.start(c, spec, childFds); err == nil {
			break
		}
		h.kill()
		if try == 2 {
			break
		}
	}
	for _, fd := range childFds {
		unix.Close(fd) // the helper has its own
	}
	if err != nil {
		return fail(err)
	}
	c.pid, c.helper, c.proc = h.pid, h, newProcWaiter()
	c.call.report = make(chan *callReport, 1)
	go s.watchCall(h, c)
	return outputs, nil
}

// callHelper is a started call helper: the agent's child, init of its own PID namespace, serving
// one call at a time (callinit.go). Its lifetime: started by startHelper (ahead of a call, by
// refillHelpers, or when a call finds none idle), owned by one call at a time (from start to
// watchCall's end), idle in Server.idle in between; killed when more than maxIdleHelpers would
// be idle, when it fails, when it does not end a killed call in time, and when the agent shuts
// down.
type callHelper struct {
	pid  int           // immutable
	proc *procWaiter   // immutable; the helper's own status, from the reaper
	conn *net.UnixConn // immutable; reads: watchCall only; writes: under mu

	mu sync.Mutex
	// Protected by mu:
	owner     *command    // the command of the call it serves, nil when idle
	seq       uint32      // number of the call it serves or served last (both sides count)
	cpuBase   int64       // the helper's CPU time after its last call
	killTimer *time.Timer // the owner's SIGKILL's deadline
}

// maxIdleHelpers is how many idle helpers are kept for the next calls: each is a Go process of
// about 5 MiB and a few threads, charged to the sandbox's memory and pids limits.
const maxIdleHelpers = 2

// callKillGrace is how long a helper has to end a call it was told to kill; then the helper is
// killed itself (and the call with its PID namespace).
const callKillGrace = 5 * time.Second

// start sends the helper c's call: spec, with the command's stdin, stdout and stderr (the
// descriptors in stdio, still the caller's to close).
func (h *callHelper) start(c *command, spec []byte, stdio []int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.owner = c
	h.seq++
	msg := append([]byte{msgCall}, binary.BigEndian.AppendUint32(nil, uint32(len(spec)))...)
	msg = append(msg, spec...)
	n, _, err := h.conn.WriteMsgUnix(msg[:5], unix.UnixRights(stdio...), nil)
	if err == nil && n != 5 {
		err = io.ErrShortWrite
	}
	if err == nil {
		_, err = h.conn.Write(msg[5:])
	}
	return err
}

// signal tells the helper to pass sig on to owner's command, unless the helper has finished with
// owner's call (and may serve another). SIGKILL kills every process of the call; if the call
// has not ended callKillGrace later, the helper is killed. before runs as for
// reaper.signalGroup, just before the message is sent.
func (h *callHelper) signal(owner *command, sig syscall.Signal, before func()) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.owner != owner || h.proc.reaped.Load() {
		return false
	}
	if before != nil {
		before()
	}
	var msg [13]byte
	msg[0] = msgSignal
	binary.BigEndian.PutUint32(msg[1:], 8)
	binary.BigEndian.PutUint32(msg[5:], h.seq)
	binary.BigEndian.PutUint32(msg[9:], uint32(sig))
	if _, err := h.conn.Write(msg[:]); err != nil {
		// The helper is gone or broken: the call goes with it.
		return procReaper.signalGroup(h.proc, h.pid, syscall.SIGKILL, nil)
	}
	if sig == syscall.SIGKILL && h.killTimer == nil {
		h.killTimer = time.AfterFunc(callKillGrace, func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.owner == owner {
				procReaper.signalGroup(h.proc, h.pid, syscall.SIGKILL, nil)
			}
		})
	}
	return true
}

// kill ends the helper.
func (h *callHelper) kill() {
	procReaper.signalGroup(h.proc, h.pid, syscall.SIGKILL, nil)
	h.conn.Close()
}

// receive reads the helper's report on a call.
func (h *callHelper) receive() (*callReport, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(h.conn, hdr[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxCallMessage {
		return nil, fmt.Errorf("report of %d bytes", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(h.conn, b); err != nil {
		return nil, err
	}
	var r callReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// watchCall waits for the helper's report on c's call, or for the helper's end. It then hands the
// report to c.call.report and the command's status to c.proc, and gives the helper back (or lets
// go of a dead one). It is c's only waiter: it stands in for the reaper.
func (s *Server) watchCall(h *callHelper, c *command) {
	rep, err := h.receive()
	var st procStatus
	dead := err != nil
	if dead {
		// The helper died (its end of the socket closed with it) or is broken: either way the
		// call is over, and its processes are gone with the helper's PID namespace.
		h.kill()
		st = <-h.proc.ch
	}
	h.mu.Lock()
	h.owner = nil
	if h.killTimer != nil {
		h.killTimer.Stop()
		h.killTimer = nil
	}
	if dead {
		// The helper's usage is that of all its calls: this one's is what it used since the
		// last. Its peak memory may be an earlier call's: known only for a first call.
		cpu := max(st.cpuTime()-time.Duration(h.cpuBase), 0)
		st.ru.Utime, st.ru.Stime = syscall.NsecToTimeval(cpu.Nanoseconds()), syscall.Timeval{}
		if h.seq > 1 {
			st.ru.Maxrss = 0
		}
	} else {
		h.cpuBase = rep.HelperCPUNanos
	}
	h.mu.Unlock()
	if !dead {
		s.putHelper(h)
	}
	c.call.report <- rep
	c.proc.reaped.Store(true)
	c.proc.ch <- st
}

// startHelper starts a call helper.
func (s *Server) startHelper() (*callHelper, error) {
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/null: %w", err)
	}
	defer unix.Close(null)
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket pair: %w", err)
	}
	defer unix.Close(pair[1])
	conn, err := socketConn(pair[0])
	if err != nil {
		return nil, fmt.Errorf("socket pair: %w", err)
	}
	attr := &syscall.ProcAttr{
		// One P: a helper's work is sequential, and its threads count against the sandbox's
		// pids limit. Its commands get their own environment.
		Dir: "/", Env: []string{"GOMAXPROCS=1"}, Files: []uintptr{uintptr(null), uintptr(null), uintptr(null), uintptr(pair[1])},
		// Its own process group: the agent signals a call's command through the helper's group.
		Sys: &syscall.SysProcAttr{Cloneflags: callCloneFlags, Setpgid: true},
	}
	proc := newProcWaiter()
	pid, err := procReaper.start(func() (int, error) {
		pid, err := syscall.ForkExec(s.cfg.SelfExe, []string{"corral-agent", CallInitArg}, attr)
		if err == nil {
			resetOOMScore(pid)
		}
		return pid, err
	}, proc)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("start the call helper %s: %w", s.cfg.SelfExe, err)
	}
	return &callHelper{pid: pid, proc: proc, conn: conn}, nil
}

// socketConn makes the socket descriptor fd (taken over) a *net.UnixConn.
func socketConn(fd int) (*net.UnixConn, error) {
	f := os.NewFile(uintptr(fd), "call-helper")
	defer f.Close()
	nc, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		nc.Close()
		return nil, errors.New("not a unix socket")
	}
	return uc, nil
}

// Helpers are started ahead of time: starting one costs an execve of the agent and the Go
// runtime's start, the largest part of a call otherwise. A helper must be started after CallsDir
// is mounted: it sees the calls prepared later through mount propagation (CallsDir is shared, the
// helper's copy a slave).

// refillHelpers starts a helper unless one is idle or starting, or the agent is closing.
func (s *Server) refillHelpers() {
	s.helperMu.Lock()
	if s.helpersClosed || len(s.idle) > 0 || s.helperStarting != nil {
		s.helperMu.Unlock()
		return
	}
	done := make(chan struct{})
	s.helperStarting = done
	s.helperWG.Add(1)
	s.helperMu.Unlock()
	go func() {
		defer s.helperWG.Done()
		h, err := s.startHelper()
		if err != nil {
			s.log.Debug("start a call helper", "err", err)
		}
		s.helperMu.Lock()
		s.helperStarting = nil
		close(done)
		s.helperMu.Unlock()
		if h != nil {
			s.putHelper(h)
		}
	}()
}

// takeHelper returns an idle helper, waiting for one that is starting, or starts one.
func (s *Server) takeHelper() (*callHelper, error) {
	for {
		s.helperMu.Lock()
		var h *callHelper
		if n := len(s.idle); n > 0 {
			h, s.idle = s.idle[n-1], s.idle[:n-1]
		}
		starting := s.helperStarting
		s.helperMu.Unlock()
		switch {
		case h != nil && !h.proc.reaped.Load():
			return h, nil
		case h != nil: // it died while idle (an OOM kill): try the next
			h.conn.Close()
		case starting != nil:
			<-starting
		default:
			return s.startHelper()
		}
	}
}

// putHelper keeps an idle helper for the next call, or kills it when enough are kept or the
// agent is closing.
func (s *Server) putHelper(h *callHelper) {
	s.helperMu.Lock()
	keep := !s.helpersClosed && len(s.idle) < maxIdleHelpers
	if keep {
		s.idle = append(s.idle, h)
	}
	s.helperMu.Unlock()
	if !keep {
		h.kill()
	}
}

// stopHelpers stops starting helpers, waits for one being started and kills the idle ones (the
// busy ones go with their calls' commands).
func (s *Server) stopHelpers() {
	s.helperMu.Lock()
	s.helpersClosed = true
	s.helperMu.Unlock()
	s.helperWG.Wait()
	s.helperMu.Lock()
	idle := s.idle
	s.idle = nil
	s.helperMu.Unlock()
	for _, h := range idle {
		h.kill()
	}
}

// awaitReport returns the helper's report once the helper has exited. Its end of the socket
// closed with it, so the report is there at once; the bound only guards against a bug.
func (cl *call) awaitReport() *callReport {
	select {
	case r := <-cl.report:
		return r
	case <-time.After(5 * time.Second):
		return nil
	}
}

// callEndWait bounds how long CallEnd waits for a killed call's command to be finalized.
const callEndWait = 10 * time.Second

// callUnmountWait is how long CallEnd retries an unmount that is busy before it detaches the
// tmpfs and reports the call unclean.
const callUnmountWait = time.Second

// callEnd ends the call id; see the top of this file.
func (s *Server) callEnd(id string) (CallEnd, error) {
	if !validCallID(id) {
		return CallEnd{}, errdefs.Invalid("id", "call id %q: want 1-64 of [a-z0-9-]", id)
	}
	s.mu.Lock()
	cl := s.calls[id]
	s.mu.Unlock()
	if cl == nil {
		return CallEnd{}, errdefs.NotFound("call %s", id)
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.state == callEnded {
		return CallEnd{}, errdefs.NotFound("call %s", id)
	}
	var problems []string
	if c := cl.cmd; c != nil && c.proc != nil {
		if !c.exited() {
			c.signal(syscall.SIGKILL) // fails harmlessly if it has just exited
		}
		select {
		case <-c.done:
		case <-time.After(callEndWait):
			problems = append(problems, fmt.Sprintf("the call's command (helper pid %d) did not end within %v of SIGKILL", c.pid, callEndWait))
		}
	}
	err := unix.Unmount(cl.dir, 0)
	// The call's mount namespace (a thread of the helper) may let go of the tmpfs a moment after
	// the command's exit was reported: EBUSY for a short while is not a leftover.
	for deadline := time.Now().Add(callUnmountWait); errors.Is(err, unix.EBUSY) && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		err = unix.Unmount(cl.dir, 0)
	}
	if err != nil {
		if derr := unix.Unmount(cl.dir, unix.MNT_DETACH); derr != nil {
			problems = append(problems, fmt.Sprintf("unmount %s: %v; detach: %v", cl.dir, err, derr))
		} else {
			problems = append(problems, fmt.Sprintf("unmount %s: %v; detached it instead", cl.dir, err))
		}
	}
	if err := os.Remove(cl.dir); err != nil {
		problems = append(problems, fmt.Sprintf("remove %s: %v", cl.dir, err))
	}
	problems = append(problems, s.killLeftovers()...)
	s.mu.Lock()
	delete(s.calls, id)
	problems = append(problems, s.strayCallMountsLocked()...)
	if c := cl.cmd; c != nil && c.exited() {
		s.forgetLocked(c)
	}
	s.mu.Unlock()
	cl.state = callEnded
	s.refillHelpers()
	return CallEnd{Clean: len(problems) == 0, Problems: problems}, nil
}

// checkCallPath guards the file operation op on path p of a calls agent. Under CallsDir only a
// prepared call's upper/ is open, and only while the call's command is not running: before (the
// edge stages input) and after (it reads output, when every process of the call is dead). What
// the call left there is hostile: a symbolic link anywhere on the way would lead the agent (root,
// seeing every call's directory) elsewhere, so none is followed. Other paths are the container's,
// which calls cannot write.
func (s *Server) checkCallPath(op, p string) error {
	if !s.cfg.Calls {
		return nil
	}
	p, err := cleanPath("path", p)
	if err != nil {
		return err
	}
	rest, ok := strings.CutPrefix(p, s.cfg.CallsDir)
	if !ok || (rest != "" && rest[0] != '/') {
		return nil
	}
	id, sub, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
	s.mu.Lock()
	cl := s.calls[id]
	s.mu.Unlock()
	if cl == nil || !validCallID(id) {
		return errdefs.Invalid("path", "%s: under %s, only a prepared call's upper/ is open to file operations", p, s.cfg.CallsDir)
	}
	if sub != "upper" && !strings.HasPrefix(sub, "upper/") {
		return errdefs.Invalid("path", "%s: only the call's upper/ is open to file operations", p)
	}
	cl.mu.Lock()
	running := cl.cmd != nil && cl.cmd.proc != nil && !cl.cmd.exited()
	ended := cl.state == callEnded
	cl.mu.Unlock()
	switch {
	case ended:
		return errdefs.NotFound("call %s", id)
	case running:
		return errdefs.Conflict("call %s is running: its files are open before its command starts and after it ends", id)
	}
	// Every existing component below upper/ must be a directory, the last one (when the
	// operation would follow it) a regular file or directory; none a symbolic link.
	follows := op != opStat && op != opRemove && op != opMove
	dir := cl.dir + "/upper"
	comps := strings.Split(strings.TrimPrefix(strings.TrimPrefix(sub, "upper"), "/"), "/")
	for i, c := range comps {
		if c == "" {
			continue
		}
		dir += "/" + c
		fi, err := os.Lstat(dir)
		if err != nil {
			return nil // the operation itself reports what is missing
		}
		last := i == len(comps)-1
		if fi.Mode()&os.ModeSymlink != 0 && (!last || follows) {
			return fmt.Errorf("%s: %s is a symbolic link the call made; not followed: %w", p, dir, errdefs.ErrDenied)
		}
		if !last && !fi.IsDir() {
			return nil // the operation reports ENOTDIR
		}
	}
	return nil
}

// killLeftovers kills and reports every process that lives directly in the agent's PID
// namespace, other than the agent. In a sandbox that runs calls the agent starts nothing there:
// each call's processes are in the call's own PID namespace (NSpid has two levels), which dies
// with its helper. A process the scan finds can only have come from outside (runc exec) or from
// a call that escaped its namespace. The scan is skipped when the agent is not PID 1 (then the
// namespace is not the sandbox's alone: a test).
func (s *Server) killLeftovers() []string {
	self := os.Getpid()
	if self != 1 {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return []string{fmt.Sprintf("list processes: %v", err)}
	}
	var problems []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if _, leftover := leftoverProcess(pid); !leftover {
			continue
		}
		// The pid may have been reused since the scan: signal through a pidfd, after checking
		// again that the process it pins is still one to kill.
		pfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone
		}
		if comm, leftover := leftoverProcess(pid); leftover {
			unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0)
			problems = append(problems, fmt.Sprintf("leftover process %d %s", pid, comm))
		}
		unix.Close(pfd)
	}
	return problems
}

// leftoverProcess reads /proc/<pid>/status: a live (not zombie) process whose NSpid has one
// level is a leftover. It returns the process's name.
func leftoverProcess(pid int) (string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "", false
	}
	var name, state, nspid string
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		switch string(k) {
		case "Name":
			name = string(bytes.TrimSpace(v))
		case "State":
			state = string(bytes.TrimSpace(v))
		case "NSpid":
			nspid = string(bytes.TrimSpace(v))
		}
	}
	if nspid == "" || strings.HasPrefix(state, "Z") || strings.HasPrefix(state, "X") {
		return name, false
	}
	return name, len(strings.Fields(nspid)) == 1
}

// strayCallMountsLocked detaches and reports every mount under CallsDir that no prepared call
// owns. Preconditions: s.mu held (s.calls is consulted).
func (s *Server) strayCallMountsLocked() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{fmt.Sprintf("read mountinfo: %v", err)}
	}
	prefix := s.cfg.CallsDir + "/"
	var problems []string
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		fields := strings.Fields(string(line))
		if len(fields) < 5 {
			continue
		}
		rest, ok := strings.CutPrefix(fields[4], prefix)
		if !ok {
			continue
		}
		id, _, _ := strings.Cut(rest, "/")
		if s.calls[id] != nil {
			continue
		}
		err := unix.Unmount(fields[4], unix.MNT_DETACH)
		problems = append(problems, fmt.Sprintf("mount left at %s (detached: %v)", fields[4], err == nil))
	}
	return problems
}
