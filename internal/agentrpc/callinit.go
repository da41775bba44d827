package agentrpc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// callHelperFD is the helper's end of its socket pair with the agent.
const callHelperFD = 3

// callHelperName is the helper's process name, NUL-terminated.
var callHelperName = []byte("corral-call\x00")

// Messages from the agent to a helper: a type byte, a 4-byte big-endian length, the payload.
const (
	// msgCall carries a callSpec (JSON), with the command's stdin, stdout and stderr attached to
	// its first byte (SCM_RIGHTS). Calls are numbered from 1 in the order they are sent.
	msgCall = 'C'
	// msgSignal carries the number of the call it is for and a signal (4 bytes each, big
	// endian): the helper passes it on to that call's command, SIGKILL to every process of the
	// call. One for a call that has ended is dropped.
	msgSignal = 'S'
)

// CallInit is `corral-agent call-init`, a call helper (see calls.go). The agent starts it as the
// first process of a new PID namespace and of its own mount namespace, with /dev/null on
// descriptors 0-2 and its end of a socket pair on descriptor 3. The helper then serves calls, one
// at a time, until the agent closes the socket: for each msgCall it runs the call and, once the
// command has exited and every other process of the namespace is dead, writes back its
// callReport (a 4-byte big-endian length, then JSON). It runs only agent code but for the
// commands it starts. It returns the process's exit status: 0 when the agent closed the socket,
// 126 when it could not serve.
func CallInit() int {
	// The main thread never changes namespaces, root or credentials: each call gets its own
	// thread for that. It is also the one /proc/1 shows.
	runtime.LockOSThread()
	// Before anything else, as the agent does (Harden): no process of a call may ptrace this
	// one or open its /proc/1/{mem,environ,fd/*,exe}.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return 126
	}
	// Seen as /proc/1/comm inside the call ("exe" otherwise, after the name it was executed by).
	unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&callHelperName[0])), 0, 0, 0)
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "corral-agent call-init: only the agent starts this, in a new PID namespace")
		return 2
	}
	// Signals reach the helper only from the calls' processes (the agent sends messages): all
	// are dropped. A handled signal is still delivered to a namespace's init, so those whose Go
	// runtime default ends, crashes or stops it are trapped (trappedSignals); the runtime drops
	// the rest itself.
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, trappedSignals()...)
	go func() {
		for range sigs {
		}
	}()
	if err := prepareHelper(); err != nil {
		writeMessage(callHelperFD, &callReport{Code: 126, Error: "call setup: " + err.Error()})
		return 126
	}
	dropCaps := capsBeyondSandbox()
	ctl := &callControl{}
	calls := make(chan receivedCall)
	go ctl.read(callHelperFD, calls) // ends when the agent closes the socket
	for rc := range calls {
		if rc.err != nil {
			writeMessage(callHelperFD, &callReport{Code: 126, Error: fmt.Sprintf("call setup: receive the call: %v", rc.err)})
			return 126
		}
		rc.spec.dropCaps = dropCaps
		rep := serveCall(rc.spec, rc.stdio, ctl)
		if err := writeMessage(callHelperFD, rep); err != nil {
			return 126
		}
	}
	return 0
}

// prepareHelper is what the helper does once, before its first call.
func prepareHelper() error {
	if err := closeOnExecInherited(); err != nil {
		return err
	}
	// The agent may run at oom_score_adj -1000; calls must not inherit that. Raising it needs no
	// privilege.
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("0"), 0); err != nil {
		return fmt.Errorf("reset oom_score_adj: %w", err)
	}
	// Receive the agent's new mounts (the calls prepared under CallsDir, a shared mount) without
	// sending any back.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts slaves: %w", err)
	}
	return nil
}

// receivedCall is a msgCall as read, or the error that ended reading.
type receivedCall struct {
	spec  *callSpec
	stdio []int
	err   error
}

// callControl is the helper's view of the call it serves, shared by the goroutine that reads the
// agent's messages (signals) and the one that serves calls.
type callControl struct {
	mu sync.Mutex
	// Protected by mu:
	seq     uint32           // the current call's number
	pid     int              // its command once started, 0 before and after
	done    bool             // the command has exited: signals are dropped
	killed  bool             // SIGKILL arrived before the command was started
	pending []syscall.Signal // other signals that did
}

// read reads the agent's messages from fd: calls go to calls, signals are handled at once. It
// closes calls at the end of the socket, after sending a receivedCall with the error if reading
// failed otherwise.
func (ctl *callControl) read(fd int, calls chan<- receivedCall) {
	defer close(calls)
	for {
		typ, payload, fds, err := readControlMessage(fd)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			calls <- receivedCall{err: err}
			return
		}
		switch {
		case typ == msgCall:
			rc := receivedCall{stdio: fds}
			var spec callSpec
			switch {
			case len(fds) != 3:
				rc.err = fmt.Errorf("got %d descriptors, want 3", len(fds))
			case json.Unmarshal(payload, &spec) != nil || !strings.HasPrefix(spec.Dir, "/") || len(spec.Exec.Argv) == 0:
				rc.err = errors.New("malformed call spec")
			}
			rc.spec = &spec
			ctl.mu.Lock()
			ctl.seq++
			ctl.pid, ctl.done, ctl.killed, ctl.pending = 0, false, false, nil
			ctl.mu.Unlock()
			calls <- rc
			if rc.err != nil {
				return
			}
		case typ == msgSignal && len(payload) == 8:
			ctl.signal(binary.BigEndian.Uint32(payload), syscall.Signal(binary.BigEndian.Uint32(payload[4:])))
		default:
			calls <- receivedCall{err: fmt.Errorf("unexpected message %q of %d bytes", typ, len(payload))}
			return
		}
	}
}

// signal handles the agent's signal sig for call seq.
func (ctl *callControl) signal(seq uint32, sig syscall.Signal) {
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	switch {
	case seq != ctl.seq || ctl.done:
	case ctl.pid != 0:
		deliver(ctl.pid, sig)
	case sig == unix.SIGKILL:
		ctl.killed = true
	default:
		ctl.pending = append(ctl.pending, sig)
	}
}

// started records the command's pid and delivers what came before it.
func (ctl *callControl) started(pid int) {
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	ctl.pid = pid
	if ctl.killed {
		deliver(pid, unix.SIGKILL)
	}
	for _, sig := range ctl.pending {
		deliver(pid, sig)
	}
	ctl.pending = nil
}

// finished records that the call's command has exited (or never started).
func (ctl *callControl) finished() {
	ctl.mu.Lock()
	ctl.pid, ctl.done = 0, true
	ctl.mu.Unlock()
}

// deliver sends sig to the command pid's process group (to the command alone once it has left
// it); SIGKILL goes to every process of the namespace but the helper, as for any command whose
// process group is killed, and the call's background processes with it.
func deliver(pid int, sig syscall.Signal) {
	if sig == unix.SIGKILL {
		unix.Kill(-1, unix.SIGKILL)
		return
	}
	if unix.Kill(-pid, sig) == unix.ESRCH {
		unix.Kill(pid, sig)
	}
}

// readControlMessage reads one message from the agent: io.EOF when the socket closed between
// messages.
func readControlMessage(fd int) (byte, []byte, []int, error) {
	var hdr [5]byte
	oob := make([]byte, unix.CmsgSpace(3*4))
	var fds []int
	got := 0
	for got < len(hdr) {
		n, oobn, _, _, err := unix.Recvmsg(fd, hdr[got:], oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, nil, nil, err
		}
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return 0, nil, nil, err
			}
			for i := range msgs {
				if more, err := unix.ParseUnixRights(&msgs[i]); err == nil {
					fds = append(fds, more...)
				}
			}
		}
		if n == 0 {
			if got == 0 && len(fds) == 0 {
				return 0, nil, nil, io.EOF
			}
			return 0, nil, nil, io.ErrUnexpectedEOF
		}
		got += n
	}
	size := binary.BigEndian.Uint32(hdr[1:])
	if size > maxCallMessage {
		return 0, nil, nil, fmt.Errorf("message of %d bytes", size)
	}
	b := make([]byte, size)
	if err := readFull(fd, b); err != nil {
		return 0, nil, nil, err
	}
	return hdr[0], b, fds, nil
}

func readFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		b = b[n:]
	}
	return nil
}

// writeMessage writes v as JSON after its 4-byte big-endian length.
func writeMessage(fd int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	msg := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	msg = append(msg, b...)
	for len(msg) > 0 {
		n, err := unix.Write(fd, msg)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		msg = msg[n:]
	}
	return nil
}

// serveCall runs one call: its command is started from a thread of its own (startCommand) with
// stdio as its stdin, stdout and stderr; once it has exited, every other process left in the
// namespace is killed and reaped, so the helper is alone again for the next call.
func serveCall(spec *callSpec, stdio []int, ctl *callControl) *callReport {
	var before unix.Rusage
	unix.Getrusage(unix.RUSAGE_CHILDREN, &before)
	rep := runCommand(spec, stdio, ctl)
	ctl.finished()
	killAll()
	// CPU: every process of the call the helper reaped (background ones included).
	var after, self unix.Rusage
	unix.Getrusage(unix.RUSAGE_CHILDREN, &after)
	unix.Getrusage(unix.RUSAGE_SELF, &self)
	if rep.Error == "" {
		rep.CPUNanos = after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano()
	}
	rep.HelperCPUNanos = self.Utime.Nano() + self.Stime.Nano() + after.Utime.Nano() + after.Stime.Nano()
	return rep
}

// runCommand starts the call's command and waits for it.
func runCommand(spec *callSpec, stdio []int, ctl *callControl) *callReport {
	started := make(chan startedCommand, 1)
	go startCommand(spec, stdio, started)
	st := <-started
	for _, fd := range stdio {
		unix.Close(fd) // the command's now; the helper holds no end of its pipes
	}
	if st.report != nil {
		return st.report
	}
	ctl.started(st.pid)
	ws, ru, err := waitCommand(st.pid)
	if err != nil {
		return &callReport{Code: 126, Error: "call: " + err.Error()}
	}
	// Peak memory: the command's, with the descendants it waited for, as wait4 tells for any
	// command.
	rep := &callReport{MaxRSS: ru.Maxrss * 1024}
	if ws.Signaled() {
		rep.Signal = int(ws.Signal())
	} else {
		rep.Code = ws.ExitStatus()
	}
	return rep
}

// startedCommand is the outcome of startCommand: the command's pid, or the report of a call
// whose command could not be started.
type startedCommand struct {
	pid    int
	report *callReport
}

// startCommand sets up the call on the calling goroutine's own thread and starts its command
// from there: the thread gets new mount, IPC, UTS and cgroup namespaces, the call's root, the
// sandbox's capability set and the call's seccomp filter, all of which the command inherits. The
// thread stays locked: when the goroutine returns, the Go runtime ends it, and the helper's other
// threads never had any of it.
func startCommand(spec *callSpec, stdio []int, out chan<- startedCommand) {
	runtime.LockOSThread()
	setup := func(err error) {
		out <- startedCommand{report: &callReport{Code: 126, Error: "call setup: " + err.Error()}}
	}
	const perCall = unix.CLONE_NEWNS | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP
	if err := unix.Unshare(perCall); err != nil {
		setup(fmt.Errorf("new namespaces: %w", err))
		return
	}
	if err := enterCallRoot(spec); err != nil {
		setup(err)
		return
	}
	res, exit := resolveExec(&userDB{dir: spec.EtcDir}, spec.BaseEnv, &spec.Exec)
	if exit != nil {
		out <- startedCommand{report: &callReport{Code: exit.Code, Error: exit.Error}}
		return
	}
	if err := dropToSandboxCaps(spec.dropCaps); err != nil {
		setup(err)
		return
	}
	if err := installCallFilter(); err != nil {
		setup(err)
		return
	}
	attr := &syscall.ProcAttr{
		Dir: res.cwd, Env: res.env, Files: []uintptr{uintptr(stdio[0]), uintptr(stdio[1]), uintptr(stdio[2])},
		Sys: &syscall.SysProcAttr{Setpgid: true, Credential: res.credential(spec.Exec.User)},
	}
	pid, err := syscall.ForkExec(res.path, res.argv, attr)
	if err != nil {
		e := startExit(res.argv[0], err)
		out <- startedCommand{report: &callReport{Code: e.Code, Error: e.Error}}
		return
	}
	out <- startedCommand{pid: pid}
}

// waitCommand reaps children (every orphan of the call comes to this process) until the command
// itself has exited, and returns its status and usage.
func waitCommand(pid int) (unix.WaitStatus, unix.Rusage, error) {
	for {
		var ws unix.WaitStatus
		var ru unix.Rusage
		p, err := unix.Wait4(-1, &ws, unix.WALL, &ru)
		switch {
		case err == unix.EINTR:
		case err != nil:
			return 0, ru, fmt.Errorf("wait for the command: %w", err)
		case p == pid:
			return ws, ru, nil
		}
	}
}

// killAll kills every process of the helper's PID namespace but itself (kill(-1) from its
// init) and reaps them, again until none is left: one may have forked while the first round
// went by.
func killAll() {
	for {
		unix.Kill(-1, unix.SIGKILL)
		if _, err := unix.Wait4(-1, nil, unix.WALL, nil); err == unix.ECHILD {
			return
		}
	}
}

// enterCallRoot builds the call's root in the calling thread's new mount namespace and makes it
// the thread's root. In order:
//
//  1. every mount private, so nothing propagates to or from the sandbox any more;
//  2. upper/tmp an opaque directory of mode 1777: the call's /tmp starts empty (whatever was
//     staged there aside) and lives on the call's tmpfs;
//  3. overlay at root/: lower the sandbox's root filesystem, upper and work on the call's tmpfs;
//  4. /dev: the sandbox's, bound read-only (device nodes still work), with a new devpts instance,
//     a new tmpfs at /dev/shm (the sandbox's size) and a new mqueue (of the call's IPC namespace);
//  5. /proc: a new proc of the helper's PID namespace, masked and read-only where the sandbox's is;
//  6. /sys: the sandbox's (read-only, with its masks), bound read-only;
//  7. the files the sandbox binds over its root (/etc/resolv.conf), bound read-only again;
//  8. pivot_root into root/ and detach the old root: the sandbox's own mounts, other calls'
//     directories among them, are gone from this namespace.
func enterCallRoot(spec *callSpec) error {
	upper, work, root := spec.Dir+"/upper", spec.Dir+"/work", spec.Dir+"/root"
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// In a sandbox with a user namespace of its own (internal/runtime/runc/userns.go) the
	// kernel keeps trusted.* xattrs from its root: the overlay then keeps its own in user.*.
	userxattr := inUserNSOnce()
	if err := prepareCallTmp(upper+"/tmp", userxattr); err != nil {
		return err
	}
	opts := "lowerdir=/,upperdir=" + upper + ",workdir=" + work
	if userxattr {
		opts += ",userxattr"
	}
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", root, err)
	}
	const hidden = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	steps := []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
		optional         bool // skipped when dst does not exist
	}{
		{"/dev", "/dev", "", unix.MS_BIND | unix.MS_REC, "", false},
		{"", "/dev", "", unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID, "", false},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5", true},
		{"shm", "/dev/shm", "tmpfs", hidden, "mode=1777,size=" + strconv.FormatInt(spec.ShmBytes, 10), true},
		{"mqueue", "/dev/mqueue", "mqueue", hidden, "", true},
		{"proc", "/proc", "proc", hidden, "", false},
	}
	for _, st := range steps {
		dst := root + st.dst
		if st.optional {
			if _, err := os.Lstat(dst); err != nil {
				continue
			}
		}
		if err := unix.Mount(st.src, dst, st.fstype, st.flags, st.data); err != nil {
			return fmt.Errorf("mount %s (%s) at %s: %w", st.src, st.fstype, st.dst, err)
		}
	}
	if err := maskProc(root, spec.ProcFUSE); err != nil {
		return err
	}
	if err := bindReadOnly("/sys", root+"/sys", true); err != nil {
		return err
	}
	for _, f := range spec.Binds {
		if _, err := os.Stat(root + f); err != nil {
			continue // the call's root has no file to bind over
		}
		if err := bindReadOnly(f, root+f, false); err != nil {
			return err
		}
	}
	return pivotInto(root)
}

// prepareCallTmp makes dir an empty-looking /tmp for the call: created (or kept, with what the
// edge staged in it) with mode 1777, and marked opaque so the overlay hides the lower /tmp.
func prepareCallTmp(dir string, userxattr bool) error {
	if err := unix.Mkdir(dir, 0o1777); err != nil && err != unix.EEXIST {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("stat %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if err := unix.Chmod(dir, 0o1777); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	name := "trusted.overlay.opaque"
	if userxattr {
		name = "user.overlay.opaque"
	}
	if err := unix.Setxattr(dir, name, []byte("y"), 0); err != nil {
		return fmt.Errorf("make %s opaque: %w", dir, err)
	}
	return nil
}

// procPlan is what maskProc does to a new /proc: which of the masked paths exist on this
// kernel, and as what, and which read-only paths exist. It is the same for every call (a new
// proc of the same kernel), so a helper works it out at its first call.
type procPlan struct {
	maskDirs, maskFiles, readonly []string
}

var (
	procPlanOnce sync.Once
	procPlanDone procPlan // set by procPlanOnce
)

// procPlanFor returns the helper's procPlan, worked out on the new /proc under root the first
// time.
func procPlanFor(root string) procPlan {
	procPlanOnce.Do(func() {
		for _, p := range append(maskedPaths, hostFactPaths...) {
			if !strings.HasPrefix(p, "/proc/") {
				continue
			}
			var st unix.Stat_t
			if err := unix.Lstat(root+p, &st); err != nil {
				continue // not on this kernel
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				procPlanDone.maskDirs = append(procPlanDone.maskDirs, p)
			} else {
				procPlanDone.maskFiles = append(procPlanDone.maskFiles, p)
			}
		}
		for _, p := range readonlyPaths {
			if !strings.HasPrefix(p, "/proc/") {
				continue
			}
			if _, err := os.Lstat(root + p); err == nil {
				procPlanDone.readonly = append(procPlanDone.readonly, p)
			}
		}
	})
	return procPlanDone
}

// maskProc repeats the sandbox's /proc policy on the call's new /proc under root: its masks,
// its read-only paths and the FUSE files bound over its /proc (fuse, rebound from the
// sandbox's).
func maskProc(root string, fuse []string) error {
	plan := procPlanFor(root)
	for _, p := range plan.maskDirs {
		if err := unix.Mount("tmpfs", root+p, "tmpfs", unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range plan.maskFiles {
		if err := unix.Mount(root+"/dev/null", root+p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range plan.readonly {
		if err := bindReadOnly(root+p, root+p, true); err != nil {
			return err
		}
	}
	// Last: LXCFS's /proc/swaps goes on top of the mask, as in the sandbox.
	return rebindProcFUSE(root, fuse)
}

// rebindProcFUSE binds each of the FUSE files mounted over the sandbox's /proc (LXCFS's, see
// internal/lxcfs; the agent lists them, procFUSEFiles) over the same file of the call's new
// /proc under root, read-only.
func rebindProcFUSE(root string, fuse []string) error {
	for _, f := range fuse {
		if _, err := os.Lstat(root + f); err != nil {
			continue
		}
		if err := bindReadOnly(f, root+f, false); err != nil {
			return err
		}
	}
	return nil
}

// bindReadOnly binds src (recursively with rec) at dst and makes the bind read-only, nosuid,
// nodev and noexec.
func bindReadOnly(src, dst string, rec bool) error {
	flags := uintptr(unix.MS_BIND)
	if rec {
		flags |= unix.MS_REC
	}
	if err := unix.Mount(src, dst, "", flags, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, dst, err)
	}
	ro := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("", dst, "", ro, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", dst, err)
	}
	return nil
}

// pivotInto makes root the calling thread's root (its mount namespace's) and detaches the old
// one (runc's way: pivot_root(".", ".") stacks the old root over the new one, whence it is
// unmounted).
func pivotInto(root string) error {
	oldRoot, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /: %w", err)
	}
	defer unix.Close(oldRoot)
	newRoot, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(newRoot)
	if err := unix.Fchdir(newRoot); err != nil {
		return fmt.Errorf("chdir %s: %w", root, err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root %s: %w", root, err)
	}
	if err := unix.Fchdir(oldRoot); err != nil {
		return fmt.Errorf("chdir to the old root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	return nil
}

// inUserNSOnce is inUserNS, read once by a helper (a process stays in its user namespace).
var inUserNSOnce = sync.OnceValue(inUserNS)

// inUserNS reports whether this process runs in a user namespace other than the host's: one
// whose uid map is not the identity of every id.
func inUserNS() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return !(len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295")
}
