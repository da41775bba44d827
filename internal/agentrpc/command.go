package agentrpc

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// defaultPath is the search path when neither the sandbox defaults nor the request set PATH.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// command is one process the agent started (or failed to start) and everything kept about it.
//
// Goroutines: one pump per output descriptor (stdout and stderr, or the pty master) copies
// output into out until EOF; await waits for the reaper's status and the pumps, then finalizes
// the command. Both end when the process has exited and its output descriptors reach EOF, or
// ExitGrace after the exit when something else keeps them open (the descriptors are then closed).
type command struct {
	id        string    // immutable
	argv      []string  // immutable
	tag       string    // immutable
	tty       bool      // immutable
	startedAt time.Time // immutable
	pid       int       // immutable after spawn; 0 when the command could not start
	out       *output
	stdin     *stdinPipe  // nil when the command could not start; f is nil without stdin
	ptmx      *os.File    // TTY only
	proc      *procWaiter // nil when the command could not start; for a call, fed by watchCall
	call      *call       // immutable; set for a call's command
	helper    *callHelper // immutable after spawn; the helper running a call's command
	frozen    *frozenSet  // immutable; set for an exclusive command: what to thaw when it ends
	done      chan struct{}

	timedOut atomic.Bool
	killed   atomic.Bool // a client sent SIGKILL: not an OOM kill

	mu sync.Mutex
	// Protected by mu:
	endedAt     time.Time
	exit        *Exit
	timer       *time.Timer // timeout
	watchdog    *time.Timer // an exclusive command's thaw, should it never be reaped
	forgetTimer *time.Timer
	retained    int64 // output memory counted in Server.retained while kept
}

// info returns a snapshot of c.
func (c *command) info() CommandInfo {
	c.mu.Lock()
	ci := CommandInfo{
		ID: c.id, Argv: c.argv, Tag: c.tag, Pid: c.pid, TTY: c.tty, State: CommandRunning,
		StartedAt: c.startedAt, EndedAt: c.endedAt, Exit: c.exit, Exclusive: c.frozen != nil,
	}
	c.mu.Unlock()
	if ci.Exit != nil {
		ci.State = CommandExited
	}
	ci.OutputStart, ci.OutputEnd = c.out.bounds()
	return ci
}

func (c *command) exited() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exit != nil
}

// signal sends sig to the command's process group, unless its leader has already been reaped
// (the group id could then belong to someone else).
func (c *command) signal(sig syscall.Signal) error {
	var before func()
	if sig == syscall.SIGKILL {
		before = func() { c.killed.Store(true) }
	}
	if !c.signalGroup(sig, before) {
		return errdefs.Conflict("command %s has exited", c.id)
	}
	return nil
}

// signalGroup sends sig as signal does and reports whether it did; before is as for
// reaper.signalGroup. A call's command is signalled through its helper, which passes the signal
// on to the command's process group; SIGKILL kills every process of the call.
func (c *command) signalGroup(sig syscall.Signal, before func()) bool {
	switch {
	case c.proc == nil:
		return false
	case c.helper != nil:
		return c.helper.signal(c, sig, before)
	}
	return procReaper.signalGroup(c.proc, c.pid, sig, before)
}

// newCommandID returns a random id, so that ids of an earlier agent run are never reused.
func newCommandID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// stdinPipe is the write side of a command's stdin. Writes are serialized so chunks from
// different writers do not interleave; close never waits for a blocked write (closing the file
// wakes it up).
type stdinPipe struct {
	f      *os.File
	tty    bool       // f is the pty master: closing stdin is a no-op, finalize closes f
	mu     sync.Mutex // serializes writes
	closed atomic.Bool
}

var errStdinClosed = errors.New("stdin is closed")

// noStdin is the stdin of a command started without any: closed from the start.
func noStdin() *stdinPipe {
	p := &stdinPipe{}
	p.closed.Store(true)
	return p
}

func (p *stdinPipe) write(b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return errStdinClosed
	}
	if _, err := p.f.Write(b); err != nil {
		if errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.EIO) {
			return errStdinClosed
		}
		return err
	}
	return nil
}

// close closes stdin at the client's request.
func (p *stdinPipe) close() {
	if p.tty {
		return // a terminal has no end of input; send ^D instead
	}
	if !p.closed.Swap(true) {
		p.f.Close()
	}
}

// shutdown closes stdin for good when the command is finalized.
func (p *stdinPipe) shutdown() {
	if !p.closed.Swap(true) && !p.tty {
		p.f.Close()
	}
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

var pumpBufs = sync.Pool{New: func() any { return new([dataChunk]byte) }}

// start validates req, records a new command and starts it. A command that cannot be started
// (missing program, bad cwd or user) is recorded as exited with Exit.Error; the returned error
// is only for invalid requests, and for starts refused while an exclusive command runs (or, for
// an exclusive one, when the sandbox could not be frozen; see exclusive.go).
func (s *Server) start(req *ExecRequest) (*command, error) {
	if err := s.validateExec(req); err != nil {
		return nil, err
	}
	// Exclusive: claimed now, released by finalize once thawed, or below when nothing started.
	exclusive := false
	if req.Exclusive {
		if err := s.claimExclusive(); err != nil {
			return nil, err
		}
		exclusive = true
		defer func() {
			if exclusive {
				s.releaseExclusive()
			}
		}()
		if req.Timeout == 0 {
			req.Timeout = DefaultExclusiveTimeout
		}
	} else {
		leave, err := s.enterPlain()
		if err != nil {
			return nil, err
		}
		defer leave()
	}
	var cl *call
	if req.Call != nil || s.cfg.Calls {
		var err error
		if cl, err = s.claimCall(req); err != nil {
			return nil, err
		}
		defer cl.mu.Unlock()
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil, errdefs.Unavailable("agent is shutting down")
	}
	s.starting.Add(1)
	s.mu.Unlock()
	defer s.starting.Done()
	limit := req.OutputLimit
	if limit == 0 {
		limit = s.cfg.OutputLimit
	}
	c := &command{
		id: newCommandID(), argv: append([]string(nil), req.Argv...), tag: req.Tag, tty: req.TTY,
		startedAt: time.Now(), out: newOutput(limit), done: make(chan struct{}), call: cl,
	}
	if req.Exclusive {
		fs, err := freeze(time.Now().Add(freezeTimeout))
		if err != nil {
			return nil, err
		}
		// From here finalize thaws and releases the claim, whatever happens to the command.
		c.frozen, exclusive = fs, false
		c.watchdog = time.AfterFunc(req.Timeout+ExclusiveThawGrace, fs.thaw)
	}
	// spawn sets c's process fields; registering c afterwards publishes them to other goroutines
	// (through s.mu), and only then may anything finalize c.
	outputs, exit := s.spawn(c, req)
	s.mu.Lock()
	s.cmds[c.id] = c
	if c.frozen != nil {
		s.excl.cmd = c
	}
	s.mu.Unlock()
	if cl != nil {
		cl.state, cl.cmd = callStarted, c
	}
	if exit != nil {
		s.finalize(c, time.Now(), exit)
		return c, nil
	}
	pumped := make(chan struct{}, len(outputs))
	for _, o := range outputs {
		go c.pump(o.f, o.stream, pumped)
	}
	if req.Timeout > 0 {
		c.mu.Lock()
		c.timer = time.AfterFunc(req.Timeout, func() {
			c.signalGroup(syscall.SIGKILL, func() { c.timedOut.Store(true) })
		})
		c.mu.Unlock()
	}
	s.feedStdin(c, req)
	go s.await(c, outputs, pumped)
	return c, nil
}

// outputFile is a descriptor the agent reads a command's output from.
type outputFile struct {
	f      *os.File
	stream uint8
}

func (s *Server) validateExec(req *ExecRequest) error {
	switch {
	case req == nil || len(req.Argv) == 0:
		return errdefs.Invalid("argv", "must name a program")
	case req.Shell && len(req.Argv) != 1:
		return errdefs.Invalid("argv", "with shell, must be exactly one command line, got %d elements", len(req.Argv))
	case req.Argv[0] == "":
		return errdefs.Invalid("argv", "program name is empty")
	case req.Timeout < 0:
		return errdefs.Invalid("timeout", "must not be negative")
	case req.OutputLimit < 0 || req.OutputLimit > s.cfg.MaxOutputLimit:
		return errdefs.Invalid("output_limit", "must be between 0 and %d", s.cfg.MaxOutputLimit)
	case !req.TTY && (req.Rows != 0 || req.Cols != 0):
		return errdefs.Invalid("rows", "rows and cols need tty")
	case req.Exclusive && (req.Call != nil || s.cfg.Calls):
		return errdefs.Invalid("exclusive", "a call is isolated already; exclusive is for a sandbox's commands")
	}
	for _, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errdefs.Invalid("argv", "contains a NUL byte")
		}
	}
	for _, e := range req.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" || strings.IndexByte(e, 0) >= 0 {
			return errdefs.Invalid("env", "%q is not KEY=VALUE", e)
		}
	}
	if strings.IndexByte(req.Cwd, 0) >= 0 {
		return errdefs.Invalid("cwd", "contains a NUL byte")
	}
	return nil
}

// resolved is how a request's program is started.
type resolved struct {
	path string // the executable
	argv []string
	env  []string
	cwd  string
	id   identity
}

// resolveExec resolves req's user, environment, working directory and program against the
// filesystem the command will see: the sandbox's, or, for a call, the call's own root (the call's
// helper runs it there). A request that cannot start returns its Exit.
func resolveExec(users *userDB, baseEnv []string, req *ExecRequest) (*resolved, *Exit) {
	fail := func(code int, format string, args ...any) (*resolved, *Exit) {
		return nil, &Exit{Code: code, Error: fmt.Sprintf(format, args...)}
	}
	id, err := users.resolve(req.User)
	if err != nil {
		return fail(126, "%v", err)
	}
	env := mergeEnv(baseEnv, []string{"HOME=" + id.home}, req.Env)
	if req.TTY && envValue(env, "TERM") == "" {
		env = append(env, "TERM=xterm-256color")
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = id.home
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			cwd = "/"
		}
	}
	if !filepath.IsAbs(cwd) {
		return fail(126, "cwd %q: not an absolute path", cwd)
	}
	if fi, err := os.Stat(cwd); err != nil {
		return fail(126, "cwd %s: %v", cwd, unwrapPathError(err))
	} else if !fi.IsDir() {
		return fail(126, "cwd %s: not a directory", cwd)
	}
	argv := req.Argv
	if req.Shell {
		argv = []string{"/bin/sh", "-c", req.Argv[0]}
	}
	path, exit := lookPath(argv[0], envValue(env, "PATH"), cwd)
	if exit != nil {
		return nil, exit
	}
	return &resolved{path: path, argv: argv, env: env, cwd: cwd, id: id}, nil
}

// credential is what SysProcAttr.Credential must be for the request's user: nil (stay root)
// when it named none.
func (r *resolved) credential(user string) *syscall.Credential {
	if user == "" {
		return nil
	}
	return &syscall.Credential{Uid: r.id.uid, Gid: r.id.gid, Groups: r.id.groups}
}

// spawn starts c's process and sets c's pid, proc, stdin and ptmx. It returns the descriptors to
// read the output from, or the Exit of a command that could not be started. A call's command is
// started by spawnCall (calls.go).
func (s *Server) spawn(c *command, req *ExecRequest) ([]outputFile, *Exit) {
	if c.call != nil {
		return s.spawnCall(c, req)
	}
	res, exit := resolveExec(s.users, s.cfg.Env, req)
	if exit != nil {
		return nil, exit
	}
	sys := &syscall.SysProcAttr{Credential: res.credential(req.User)}
	childFds, outputs, exit := c.openStdio(req, res.id.uid, sys)
	if exit != nil {
		return nil, exit
	}
	files := make([]uintptr, 3)
	for i := range files {
		files[i] = uintptr(childFds[min(i, len(childFds)-1)])
	}
	attr := &syscall.ProcAttr{Dir: res.cwd, Env: res.env, Files: files, Sys: sys}
	proc := newProcWaiter()
	pid, err := procReaper.start(func() (int, error) {
		pid, err := syscall.ForkExec(res.path, res.argv, attr)
		if err == nil {
			// The agent may run at oom_score_adj -1000; its commands must not inherit that.
			resetOOMScore(pid)
		}
		return pid, err
	}, proc)
	for _, fd := range childFds {
		unix.Close(fd)
	}
	if err != nil {
		for _, o := range outputs {
			o.f.Close()
		}
		c.stdin.shutdown()
		return nil, startExit(res.argv[0], err)
	}
	c.pid, c.proc = pid, proc
	return outputs, nil
}

// openStdio makes the command's stdin, stdout and stderr (a terminal owned by uid with TTY) and
// sets c's stdin and ptmx and the session or process group fields of sys. It returns the child's
// descriptors (one for all three with a terminal; close them once the child is started) and the
// agent's ends to read output from.
func (c *command) openStdio(req *ExecRequest, uid uint32, sys *syscall.SysProcAttr) ([]int, []outputFile, *Exit) {
	fail := func(format string, args ...any) ([]int, []outputFile, *Exit) {
		return nil, nil, &Exit{Code: 126, Error: fmt.Sprintf(format, args...)}
	}
	if req.TTY {
		rows, cols := req.Rows, req.Cols
		if rows == 0 {
			rows = 24
		}
		if cols == 0 {
			cols = 80
		}
		ptmx, pts, err := openPTY(rows, cols)
		if err != nil {
			return fail("open terminal: %v", err)
		}
		unix.Fchown(pts, int(uid), -1) // best effort: the terminal belongs to its user
		c.ptmx = ptmx
		c.stdin = &stdinPipe{f: ptmx, tty: true}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
		return []int{pts}, []outputFile{{ptmx, streamStdout}}, nil
	}
	// Without stdin to write, the child reads /dev/null: one descriptor, no pipe to poll.
	var (
		in      *os.File
		inChild = -1
		err     error
	)
	if len(req.Stdin) > 0 || req.KeepStdinOpen {
		in, inChild, err = pipe(false)
	} else {
		inChild, err = unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return fail("create stdin: %v", err)
	}
	out, outChild, err := pipe(true)
	if err != nil {
		closeAll(in)
		unix.Close(inChild)
		return fail("create stdout pipe: %v", err)
	}
	errf, errChild, err := pipe(true)
	if err != nil {
		closeAll(in, out)
		unix.Close(inChild)
		unix.Close(outChild)
		return fail("create stderr pipe: %v", err)
	}
	c.stdin = noStdin()
	if in != nil {
		c.stdin = &stdinPipe{f: in}
	}
	sys.Setpgid = true
	return []int{inChild, outChild, errChild}, []outputFile{{out, streamStdout}, {errf, streamStderr}}, nil
}

// feedStdin writes the request's stdin bytes and closes stdin unless the client keeps it open.
func (s *Server) feedStdin(c *command, req *ExecRequest) {
	switch {
	case len(req.Stdin) == 0: // nothing to write: stdin is /dev/null, kept open, or a terminal
	default:
		// Lock here, not in the goroutine, so writes from the client queue behind these bytes.
		c.stdin.mu.Lock()
		go func() {
			defer c.stdin.mu.Unlock()
			c.stdin.f.Write(req.Stdin) // an error means the command stopped reading: nothing to do
			if !req.KeepStdinOpen && !req.TTY && !c.stdin.closed.Swap(true) {
				c.stdin.f.Close()
			}
		}()
	}
}

// pump copies one output descriptor into c.out until EOF (or EIO from a pty master whose
// terminal was closed, or the descriptor being closed after the exit grace).
func (c *command) pump(f *os.File, stream uint8, done chan<- struct{}) {
	buf := pumpBufs.Get().(*[dataChunk]byte)
	defer func() {
		pumpBufs.Put(buf)
		done <- struct{}{}
	}()
	for {
		n, err := f.Read(buf[:])
		if n > 0 {
			c.out.write(stream, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// await waits for the process's exit status and for its output to reach EOF, allowing ExitGrace
// for descendants that keep the output open, then finalizes c.
func (s *Server) await(c *command, outputs []outputFile, pumped <-chan struct{}) {
	st := <-c.proc.ch
	ended := time.Now()
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	var report *callReport
	if c.call != nil {
		report = c.call.awaitReport()
	}
	grace := time.NewTimer(s.cfg.ExitGrace)
	for pending := len(outputs); pending > 0; {
		select {
		case <-pumped:
			pending--
		case <-grace.C:
			for _, o := range outputs {
				o.f.Close() // wakes the pumps; the descendants holding the other end get EPIPE
			}
		}
	}
	grace.Stop()
	for _, o := range outputs {
		o.f.Close()
	}
	c.stdin.shutdown()
	s.finalize(c, ended, s.exitFor(c, &st, report))
}

// exitFor describes how the process ended. For a call, report is what its helper said about
// the call's command (nil when the helper was killed before it could say).
func (s *Server) exitFor(c *command, st *procStatus, report *callReport) *Exit {
	e := &Exit{TimedOut: c.timedOut.Load(), CPUTime: st.cpuTime(), MaxRSS: st.maxRSS()}
	var signal syscall.Signal
	switch {
	case report != nil && report.Error != "":
		return &Exit{Code: report.Code, Error: report.Error, TimedOut: e.TimedOut}
	case report != nil:
		e.Code, signal = report.Code, syscall.Signal(report.Signal)
		e.CPUTime, e.MaxRSS = time.Duration(report.CPUNanos), report.MaxRSS
	case st.ws.Signaled():
		signal = st.ws.Signal()
	default:
		e.Code = st.ws.ExitStatus()
	}
	if signal != 0 {
		e.Code = -1
		e.Signal = unix.SignalName(signal)
		if signal == syscall.SIGKILL && !e.TimedOut && !c.killed.Load() {
			e.OOMKilled = s.oomKilledSinceLastCheck()
		}
	}
	return e
}

// finalize records c's exit and wakes everyone waiting for it. Retention is applied first, so a
// client that has seen the exit event also sees its effect on older commands.
func (s *Server) finalize(c *command, ended time.Time, exit *Exit) {
	if c.frozen != nil {
		// Before the exit is published: a client that saw it finds the sandbox running again.
		c.watchdog.Stop()
		c.frozen.thaw()
		s.releaseExclusive()
	}
	c.mu.Lock()
	c.endedAt, c.exit = ended, exit
	c.mu.Unlock()
	s.retain(c)
	c.out.close(exit)
	close(c.done)
}

// startExit turns a fork/exec failure into the exit of a command that never ran: 127 when the
// program does not exist, 126 otherwise.
func startExit(prog string, err error) *Exit {
	code := 126
	if errors.Is(err, fs.ErrNotExist) {
		code = 127
	}
	return &Exit{Code: code, Error: fmt.Sprintf("start %s: %v", prog, unwrapPathError(err))}
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// lookPath finds the program to execute like execvp: a name with a slash is used as is
// (relative to cwd), any other is searched in pathEnv. Relative PATH entries are relative to cwd.
func lookPath(file, pathEnv, cwd string) (string, *Exit) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", startExit(file, err)
		}
		return p, nil
	}
	if pathEnv == "" {
		pathEnv = defaultPath
	}
	var denied error
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		err := checkExecutable(p)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, fs.ErrNotExist) && denied == nil {
			denied = err
		}
	}
	if denied != nil {
		return "", startExit(file, denied)
	}
	return "", &Exit{Code: 127, Error: fmt.Sprintf("start %s: executable file not found in $PATH", file)}
}

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return syscall.EISDIR
	}
	if fi.Mode()&0o111 == 0 {
		return syscall.EACCES
	}
	return nil
}

// mergeEnv joins environment lists; for a repeated key the last entry wins, keeping the
// position of the first.
func mergeEnv(lists ...[]string) []string {
	var out []string
	index := make(map[string]int)
	for _, l := range lists {
		for _, kv := range l {
			k, _, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			if i, seen := index[k]; seen {
				out[i] = kv
				continue
			}
			index[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// pipe returns a pipe whose end kept by the agent is a pollable (non-blocking) *os.File and
// whose end for the child is a blocking descriptor. Both are close-on-exec; ForkExec's dup2
// clears the flag on the child's copy.
func pipe(parentReads bool) (*os.File, int, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, err
	}
	parent, child := p[1], p[0]
	if parentReads {
		parent, child = p[0], p[1]
	}
	if err := unix.SetNonblock(parent, true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, -1, err
	}
	return os.NewFile(uintptr(parent), "pipe"), child, nil
}

// openPTY opens a pseudo-terminal of rows x cols: the master as a pollable *os.File for the
// agent, the terminal as a blocking descriptor for the child.
func openPTY(rows, cols uint16) (*os.File, int, error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	fail := func(err error) (*os.File, int, error) {
		unix.Close(m)
		return nil, -1, err
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		return fail(fmt.Errorf("unlock pty: %w", err))
	}
	// TIOCGPTPEER opens the terminal without a path lookup in /dev/pts (which the sandbox owns).
	pts, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		n, err := unix.IoctlGetUint32(m, unix.TIOCGPTN)
		if err != nil {
			return fail(fmt.Errorf("pty number: %w", err))
		}
		fd, err := unix.Open("/dev/pts/"+strconv.FormatUint(uint64(n), 10), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("open pty: %w", err))
		}
		pts = uintptr(fd)
	}
	if err := unix.IoctlSetWinsize(m, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		unix.Close(int(pts))
		return fail(fmt.Errorf("set terminal size: %w", err))
	}
	return os.NewFile(uintptr(m), "ptmx"), int(pts), nil
}

// resize sets the terminal size of a TTY command; the kernel sends SIGWINCH to its foreground group.
func (c *command) resize(rows, cols uint16) error {
	if c.ptmx == nil {
		return errdefs.Invalid("id", "command %s has no terminal", c.id)
	}
	if c.exited() {
		return errdefs.Conflict("command %s has exited", c.id)
	}
	rc, err := c.ptmx.SyscallConn()
	if err != nil {
		return errdefs.Conflict("command %s has exited", c.id)
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return errdefs.Conflict("command %s has exited", c.id)
	}
	if ierr != nil {
		return fmt.Errorf("resize terminal of %s: %w", c.id, ierr)
	}
	return nil
}

// resetOOMScore sets a started child's oom_score_adj back to 0. Best effort: the child may
// already be gone (it cannot have been reaped yet, so the pid is still its own).
func resetOOMScore(pid int) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	unix.Write(fd, []byte("0"))
	unix.Close(fd)
}
