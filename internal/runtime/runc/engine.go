package runc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/runcd"
)

// engine runs corral-runcd (cmd/corral-runcd) for Create: one long-lived process that starts
// containers with runc's libcontainer, so a create does not pay a `runc run --detach` process
// (its exec, Go start and config parsing: ~15 ms of 43 on the development VM, measured side by
// side). Everything else (exec, kill, pause, delete, state) is still the runc binary's, on the
// same --root: the engine is used only when its libcontainer is the runc binary's version.
// It is started with the runtime and again by a create that finds it dead; its containers do not
// depend on it (their inits are reparented when it exits, as `runc run --detach` leaves them).
type engine struct {
	bin, sock   string
	runcVersion string // the runc binary's `runc --version` first line
	log         *slog.Logger

	mu  sync.Mutex
	cur *runcdProc // the corral-runcd started last, or nil; protected by mu
	// closed is set by close: no corral-runcd is started after it; protected by mu.
	closed bool
	// started counts the processes started; one after the first checks the binary's version
	// again (it may have been replaced on disk). Protected by mu.
	started int
}

// runcdProc is one corral-runcd process.
type runcdProc struct {
	cmd   *exec.Cmd
	stdin *os.File      // its stdin's write end: closing it tells it to stop
	done  chan struct{} // closed when it exited
}

func (p *runcdProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// initEngine sets r.engine when Config.Runcd can start this runtime's containers: its
// libcontainer is the runc binary's, and runc compiles no seccomp profile of theirs
// (corral-runcd is built without libseccomp; Corral compiles its own profiles).
func (r *Runtime) initEngine(ctx context.Context) {
	if r.cfg.Runcd == "" {
		return
	}
	if r.tmpl.seccompBPF == "" || r.tmpl.callsSeccompBPF == "" {
		r.log.Info("runc sandboxes start with runc run --detach: runc compiles their seccomp profile (SeccompInRunc or SeccompAllArches)")
		return
	}
	e, err := newEngine(ctx, r.cfg.Runcd, r.cfg.RuncRoot, r.version, r.log)
	if err != nil {
		r.log.Warn("runc sandboxes start with runc run --detach, not corral-runcd", "err", err)
		return
	}
	r.engine = e
	r.log.Info("runc sandboxes start through corral-runcd", "bin", e.bin)
	// Started now rather than by the first create, which would wait for it; a failure here
	// is retried by the next create.
	if _, err := e.ensure(); err != nil {
		r.log.Warn("start corral-runcd", "err", err)
	}
}

// newEngine returns an engine for bin if its libcontainer is runcVersion ("runc version X",
// the runc binary's first line), else nil and why not.
func newEngine(ctx context.Context, bin, runRoot, runcVersion string, log *slog.Logger) (*engine, error) {
	e := &engine{bin: bin, sock: filepath.Join(runRoot, "runcd.sock"), runcVersion: runcVersion, log: log}
	if err := e.checkVersion(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// checkVersion checks that the binary's libcontainer is the runc binary's.
func (e *engine) checkVersion(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, e.bin, "version").Output()
	if err != nil {
		return fmt.Errorf("%s version: %w", e.bin, err)
	}
	if v := strings.TrimSpace(string(out)); v != e.runcVersion {
		return fmt.Errorf("%s has libcontainer of %q, the runc binary is %q", e.bin, v, e.runcVersion)
	}
	return nil
}

// errEngineDown is a request that never reached corral-runcd (it could not be started, or
// refused twice): nothing was started, and the create may go to the runc binary instead.
var errEngineDown = errors.New("corral-runcd is not running")

// run creates and starts a container as `runc --root root run --detach --bundle bundle id` with
// stdout and stderr to stdio and extra as fds 3 onwards, and returns its init's pid.
func (e *engine) run(ctx context.Context, root, id, bundle string, stdio *os.File, extra []*os.File) (int, error) {
	req := runcd.Request{Root: root, ID: id, Bundle: bundle}
	for attempt := 0; ; attempt++ {
		p, err := e.ensure()
		if err != nil {
			return 0, err
		}
		pid, err := runcd.Run(ctx, e.sock, req, stdio, extra)
		if err == nil || !errors.Is(err, runcd.ErrUnreachable) {
			return pid, err
		}
		if attempt > 0 {
			return 0, fmt.Errorf("%w: %v", errEngineDown, err)
		}
		// It died since the last create, or lost its socket: start another, once.
		e.log.Warn("corral-runcd unreachable; starting it again", "pid", p.cmd.Process.Pid, "err", err)
		e.stopped(p)
	}
}

// ensure returns the running corral-runcd, started unless one runs.
func (e *engine) ensure() (*runcdProc, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("%w: the runtime is closed", errEngineDown)
	}
	if e.cur != nil && !e.cur.exited() {
		return e.cur, nil
	}
	e.cur = nil
	if e.started > 0 {
		if err := e.checkVersion(context.Background()); err != nil {
			return nil, fmt.Errorf("%w: %v", errEngineDown, err)
		}
	}
	os.Remove(e.sock)
	lis, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: e.sock, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("%w: listen on %s: %v", errEngineDown, e.sock, err)
	}
	lis.SetUnlinkOnClose(false) // corral-runcd serves it; this process only hands it over
	lf, err := lis.File()
	lis.Close()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errEngineDown, err)
	}
	defer lf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errEngineDown, err)
	}
	defer pr.Close()
	cmd := exec.Command(e.bin, "serve")
	cmd.Env = childEnv()
	cmd.Dir = "/" // nothing of corrald's working directory held, and no Getwd that can fail
	cmd.Stdin = pr
	cmd.ExtraFiles = []*os.File{lf} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		pw.Close()
		return nil, fmt.Errorf("%w: %v", errEngineDown, err)
	}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return nil, fmt.Errorf("%w: start %s: %v", errEngineDown, e.bin, err)
	}
	done := make(chan struct{})
	go func() {
		e.logLines(stderr)
		err := cmd.Wait()
		e.log.Info("corral-runcd exited", "pid", cmd.Process.Pid, "err", err)
		close(done)
	}()
	e.cur = &runcdProc{cmd: cmd, stdin: pw, done: done}
	e.started++
	e.log.Info("corral-runcd started", "pid", cmd.Process.Pid, "bin", e.bin, "socket", e.sock)
	return e.cur, nil
}

// logLines logs what corral-runcd (and libcontainer in it) writes on stderr.
func (e *engine) logLines(r io.Reader) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		e.log.Warn("corral-runcd", "line", s.Text())
	}
}

// stopped forgets p, a corral-runcd that no longer answers, unless another has replaced it
// already (a concurrent create found it first). It is told to stop, not killed: it may still
// be finishing creates it accepted.
func (e *engine) stopped(p *runcdProc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur == p {
		p.stdin.Close()
		e.cur = nil
	}
}

// close tells corral-runcd to stop and waits for it: it finishes the creates it has begun.
func (e *engine) close() {
	e.mu.Lock()
	p := e.cur
	e.cur, e.closed = nil, true
	e.mu.Unlock()
	// The socket goes even when this process never started one: it may be the socket of an
	// earlier process's corral-runcd.
	defer os.Remove(e.sock)
	if p == nil {
		return
	}
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		e.log.Warn("corral-runcd did not stop within 30s; killing it", "pid", p.cmd.Process.Pid)
		p.cmd.Process.Kill()
		<-p.done
	}
}

// writePidFile writes pid as runc's --pid-file does: the number alone, renamed into place.
func writePidFile(path string, pid int) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path))
	if err := os.WriteFile(tmp, []byte(fmt.Sprint(pid)), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
