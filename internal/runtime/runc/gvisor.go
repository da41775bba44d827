package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/vmlink"
)

// gVisor. A sandbox created with Spec.Runtime EngineGVisor runs under gVisor's runsc instead of
// runc: same bundle (overlay rootfs on the sandbox's ext4 disk, limits, cgroups), same agent,
// different boundary: the sandbox's syscalls are served by gVisor's user-space kernel (the
// sentry), not the host's. What differs, and why:
//
//   - The agent cannot accept on an inherited host socket under gVisor (accept returns EINVAL),
//     and a socket file anywhere in the sandbox (gVisor's --host-uds) is one its root can
//     connect to, unlink and replace. So the agent has no socket at all: it serves one vmlink
//     session (yamux over a resynchronized byte stream, as a microVM's agent does on its
//     virtio-serial port) on its stdin and stdout, two pipes whose host ends a small holder
//     process keeps (`corral-agent hold`, vmlink.Hold: one per sandbox, in its own session and in
//     the sandbox's cgroup, run from the host copy of the agent binary below). The holder serves
//     the stream on <dir>/ctl.sock, one client at a time, as QEMU's chardev server does; the
//     runtime runs a vmlink.Proxy from <dir>/agent.sock (what the edge dials, as for runc) to it.
//     Both sockets are in <dir> (0700), which the sandbox does not mount. Inside, the agent moves
//     the pipes to close-on-exec descriptors and puts /dev/null in their places: no path, no
//     socket, no inherited descriptor leads to the link, and the agent is non-dumpable, so its
//     /proc/1/fd is closed to the sandbox's root (gVisor also refuses to reopen a host pipe's
//     or socket's descriptor through /proc). The holder and its pipes outlive corral up; a new
//     corral up's Open starts a new Proxy, whose handshake resynchronizes the stream.
//   - The agent binary is bind-mounted read-only at /.corral-agent from a host copy in
//     <StateDir>/.agents/ (one per agent version, made from the sealed memfd, kept while any
//     gVisor sandbox may need it: restore opens it again). runsc's --exec-fd would avoid the
//     copy, but gVisor cannot checkpoint a process that maps a file given that way.
//   - runsc runs with --overlay2=none, so every write reaches the host overlay on the sandbox's
//     disk (the disk limit holds and the upper dir is the real writable layer), and
//     --network=none (loopback only) unless the sandbox joins a prepared namespace (Spec.Netns):
//     then --network=sandbox, gVisor's netstack configured from that namespace's interfaces,
//     with the host's nftables rules applying to its traffic as to a runc sandbox's.
//   - Pause is `runsc checkpoint` to <dir>/checkpoint: the sandbox's processes and memory are
//     gone, 100% of its memory returned (the holder, whose pipe ends then read EOF, is killed
//     with what is left in the cgroup); the image stays on the host's disk (StateDir), not the
//     sandbox's. Host pipes save and restore: gVisor saves the container's stdio by number and,
//     on restore, binds them to the restoring process's stdin, stdout and stderr (runsc/boot/
//     restore.go, fsimpl/host: a pipe's host descriptor is remapped on load, its unread bytes
//     kept). So Resume is `runsc restore` from that image with fresh pipes, a new holder on their
//     host ends, and the Proxy's next connection resynchronizes the stream; nothing is asked of
//     the agent before a checkpoint (there is no quiesce to reach).
//   - Freeze (for snapshots) is refused: gVisor keeps file data in the sentry's own cache, so
//     the host's upper dir is not a consistent view of the sandbox's files while it runs.
//
// <dir>/engine holds "gvisor" for such a sandbox (absent: runc); <dir>/checkpointed exists
// while its checkpoint image is complete and the sandbox is paused.

// Engine names the OCI runtime that runs a sandbox.
type Engine string

// The engines a Runtime knows.
const (
	EngineRunc   Engine = "runc"
	EngineGVisor Engine = "gvisor"
)

// Defaults for the gVisor fields of Config.
const (
	DefaultRunsc         = "/var/cache/corral/runsc/v0.0.0-20260905035102-160fafc42237/runsc" // scripts/install-runsc.sh
	DefaultRunscRoot     = "/run/corral/runsc"
	DefaultRunscPlatform = "systrap"
)

const (
	engineFile       = "engine"
	checkpointedFile = "checkpointed"
	checkpointDir    = "checkpoint"
	networkFile      = "network"        // a gVisor sandbox with a network namespace of its own (Spec.Netns)
	gvisorAgentPath  = "/.corral-agent" // the agent binary, bind-mounted read-only
	agentCopiesDir   = ".agents"        // under StateDir
	ctlSocketName    = "ctl.sock"       // the holder's socket, in the sandbox's directory
	gvisorReadyWait  = 10 * time.Second // how long Create and Resume wait for the agent to answer
)

// engineOf reads which engine runs id (runc when no marker is present).
func (r *Runtime) engineOf(id string) Engine {
	b, err := os.ReadFile(filepath.Join(r.dir(id), engineFile))
	if err == nil && strings.TrimSpace(string(b)) == string(EngineGVisor) {
		return EngineGVisor
	}
	return EngineRunc
}

// GVisor reports whether gVisor sandboxes can be created here, and its version, or why not.
func (r *Runtime) GVisor() (version string, err error) {
	if r.runscErr != nil {
		return "", r.runscErr
	}
	return r.runscVersion, nil
}

// initGVisor checks the runsc binary; a missing one only disables the engine.
func (r *Runtime) initGVisor(ctx context.Context) {
	if r.cfg.Runsc == "" {
		r.cfg.Runsc = DefaultRunsc
	}
	if _, err := os.Stat(r.cfg.Runsc); err != nil {
		r.runscErr = errdefs.Unavailable("gVisor is not installed here (%s: %v): run scripts/install-runsc.sh", r.cfg.Runsc, err)
		return
	}
	out, err := exec.CommandContext(ctx, r.cfg.Runsc, "--version").Output()
	if err != nil {
		r.runscErr = errdefs.Unavailable("%s --version: %v", r.cfg.Runsc, err)
		return
	}
	r.runscVersion, _, _ = strings.Cut(string(out), "\n")
	if err := os.MkdirAll(r.cfg.RunscRoot, 0o700); err != nil {
		r.runscErr = fmt.Errorf("create %s: %w", r.cfg.RunscRoot, err)
	}
}

// runscCmd returns runsc with the global flags every call must repeat identically (restore
// must see the flags the sandbox was created with), a minimal environment and its own process
// group.
func (r *Runtime) runscCmd(ctx context.Context, logPath string, args ...string) *exec.Cmd {
	return r.runscCmdNet(ctx, logPath, "none", args...)
}

// runscCmdNet is runscCmd with runsc's --network mode: "none" (loopback only) or "sandbox" (gVisor's
// netstack, configured from the interfaces of the namespace the spec names).
func (r *Runtime) runscCmdNet(ctx context.Context, logPath, network string, args ...string) *exec.Cmd {
	full := []string{
		"--root", r.cfg.RunscRoot, "--platform", r.cfg.RunscPlatform,
		"--overlay2", "none", "--network", network,
	}
	if r.gvisorUnprivileged {
		// The Sentry then reaches files only through the gofer, and runsc runs it as the host's
		// nobody in a user namespace of its own (with direct file access it stays host root).
		full = append(full, "--directfs=false")
	}
	if logPath != "" {
		full = append(full, "--log", logPath, "--log-format", "json")
	}
	cmd := exec.CommandContext(ctx, r.cfg.Runsc, append(full, args...)...)
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func (r *Runtime) runscRun(ctx context.Context, logPath string, args ...string) error {
	cmd := r.runscCmd(ctx, logPath, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if logPath != "" {
			if last := lastRuncError(logPath); !strings.HasPrefix(last, "(") {
				msg = last
			}
		}
		return fmt.Errorf("runsc %s: %w: %s", args[0], err, msg)
	}
	return nil
}

// startGVisor is Create's runsc half: the bundle at dir is ready (rootfs mounted, config.json
// written), bin is the host copy of the agent. It starts the sandbox on a new link (see the
// package comment above) and waits for the agent to answer.
func (r *Runtime) startGVisor(ctx context.Context, id, dir, bin string, logf *os.File) error {
	l, err := newGVisorLink()
	if err != nil {
		return err
	}
	defer l.close()
	cmd := r.runscCmdNet(ctx, filepath.Join(dir, "runsc.log"), gvisorNetwork(dir), "run", "--detach", "--bundle", dir,
		"--pid-file", filepath.Join(dir, "init.pid"), id)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = l.agentIn, l.agentOut, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc run: %w: %s", err, lastRuncError(filepath.Join(dir, "runsc.log")))
	}
	if err := r.startHolder(id, bin, l, logf); err != nil {
		return err
	}
	if _, err := r.gvisorProxy(id); err != nil {
		return err
	}
	return waitAgent(ctx, socketPath(r.cfg.StateDir, id), filepath.Join(dir, diskMount, "agent.log"))
}

// gvisorLink is the pair of pipes a gVisor sandbox's agent serves on: agentIn and agentOut
// become its stdin and stdout; hostIn (what it writes) and hostOut (what it reads) go to its
// holder.
type gvisorLink struct {
	agentIn, agentOut, hostIn, hostOut *os.File
}

func newGVisorLink() (*gvisorLink, error) {
	toAgentR, toAgentW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("agent link: %w", err)
	}
	fromAgentR, fromAgentW, err := os.Pipe()
	if err != nil {
		toAgentR.Close()
		toAgentW.Close()
		return nil, fmt.Errorf("agent link: %w", err)
	}
	return &gvisorLink{agentIn: toAgentR, agentOut: fromAgentW, hostIn: fromAgentR, hostOut: toAgentW}, nil
}

// close closes this process's copies of the pipes (the sandbox and the holder keep theirs).
func (l *gvisorLink) close() {
	for _, f := range []*os.File{l.agentIn, l.agentOut, l.hostIn, l.hostOut} {
		f.Close()
	}
}

// startHolder starts `bin hold` on the host ends of l, serving <dir>/ctl.sock, in its own session
// and in id's cgroups (so that a pause or delete, which kill what is left there, end it too, and
// its few MiB count as the sandbox's). Preconditions: id's lock is held; the sandbox runs.
func (r *Runtime) startHolder(id, bin string, l *gvisorLink, logf *os.File) error {
	ctl := filepath.Join(r.dir(id), ctlSocketName)
	os.Remove(ctl)
	lis, err := listenUnix(ctl)
	if err != nil {
		return err
	}
	defer lis.Close()
	cmd := exec.Command(bin, "hold")
	cmd.Dir = "/"
	cmd.Env = []string{}
	cmd.Stderr = logf
	cmd.ExtraFiles = []*os.File{lis, l.hostIn, l.hostOut} // fds 3, 4, 5
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the agent link's holder: %w", err)
	}
	go cmd.Wait() // reap it while this process runs; after a restart, init does
	if err := r.cg.Join(id, cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		return fmt.Errorf("the agent link's holder: %w", err)
	}
	return nil
}

// gvisorProxy returns the forwarder from id's agent socket to its holder, starting it if needed.
func (r *Runtime) gvisorProxy(id string) (*vmlink.Proxy, error) {
	r.proxyMu.Lock()
	defer r.proxyMu.Unlock()
	if p := r.proxies[id]; p != nil {
		return p, nil
	}
	p, err := vmlink.NewProxy(socketPath(r.cfg.StateDir, id), filepath.Join(r.dir(id), ctlSocketName), r.log.With("sandbox", id))
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	r.proxies[id] = p
	return p, nil
}

// closeProxy stops id's forwarder, if any.
func (r *Runtime) closeProxy(id string) {
	r.proxyMu.Lock()
	p := r.proxies[id]
	delete(r.proxies, id)
	r.proxyMu.Unlock()
	if p != nil {
		p.Close()
	}
}

// gvisorAgentBin returns the host copy of the agent that the gVisor sandbox in dir binds in (its
// config.json's mount at gvisorAgentPath): its holder runs it too.
func gvisorAgentBin(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return "", err
	}
	var spec struct {
		Process struct{ Args []string }
		Mounts  []struct{ Destination, Source string }
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", fmt.Errorf("config.json: %w", err)
	}
	if !slices.Contains(spec.Process.Args, "--stdio") {
		return "", errors.New("its agent does not serve on stdio")
	}
	for _, m := range spec.Mounts {
		if m.Destination == gvisorAgentPath {
			return m.Source, nil
		}
	}
	return "", fmt.Errorf("config.json has no mount at %s", gvisorAgentPath)
}

// gvisorAgentCopy returns the host copy of the agent in img for bind-mounting, making it once.
func (r *Runtime) gvisorAgentCopy(img *agentImage) (string, error) {
	k := img.key
	name := fmt.Sprintf("%x-%x-%x-%x", k.dev, k.ino, k.size, k.mtimeNsec)
	dir := filepath.Join(r.cfg.StateDir, agentCopiesDir)
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	src := io.NewSectionReader(img.f, 0, k.size)
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return "", fmt.Errorf("copy agent: %w", err)
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return p, os.Rename(tmp.Name(), p)
}

// removeGVisorLeftovers removes what gVisor sandboxes share once none is left: the agent
// copies, and the empty network namespace runsc bind-mounts in its root for --network=none.
func (r *Runtime) removeGVisorLeftovers() {
	ents, _ := os.ReadDir(r.cfg.StateDir)
	for _, e := range ents {
		if e.IsDir() && validID(e.Name()) && r.engineOf(e.Name()) == EngineGVisor {
			return
		}
	}
	os.RemoveAll(filepath.Join(r.cfg.StateDir, agentCopiesDir))
	if out, err := r.runscCmd(context.Background(), "", "list", "-quiet").Output(); r.runscErr == nil && err == nil && len(strings.TrimSpace(string(out))) == 0 {
		p := filepath.Join(r.cfg.RunscRoot, "null-netns")
		if err := unix.Unmount(p, unix.MNT_DETACH); err == nil || errors.Is(err, unix.EINVAL) {
			os.Remove(p)
		}
	}
}

// gvisorNetwork is the --network mode of the gVisor sandbox in dir: "sandbox" when it joined a
// prepared namespace (the networkFile marker), else "none".
func gvisorNetwork(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, networkFile)); err == nil {
		return "sandbox"
	}
	return "none"
}

// waitAgent waits until the agent answers a ping at sock.
func waitAgent(ctx context.Context, sock, logPath string) error {
	ctx, cancel := context.WithTimeout(ctx, gvisorReadyWait)
	defer cancel()
	c := agentrpc.NewClient(sock)
	delay := 500 * time.Microsecond
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Ping(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent did not answer within %v (%v); its log: %s", gvisorReadyWait, err, tailFile(logPath, 512))
		case <-time.After(delay):
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// tailFile returns up to n last bytes of path, for error messages.
func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(unreadable)"
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "(unreadable)"
	}
	off := max(st.Size()-n, 0)
	b := make([]byte, st.Size()-off)
	f.ReadAt(b, off)
	if len(b) == 0 {
		return "(empty)"
	}
	return strings.TrimSpace(string(b))
}

// pauseGVisor checkpoints the sandbox to disk; see the package comment above.
// Preconditions: id's lock is held; id is running.
func (r *Runtime) pauseGVisor(ctx context.Context, id string, st runtime.Status) (runtime.PauseStats, error) {
	start := time.Now()
	stats := runtime.PauseStats{MemoryBefore: st.MemoryBytes}
	dir := r.dir(id)
	img := filepath.Join(dir, checkpointDir)
	os.RemoveAll(img)
	if err := os.Mkdir(img, 0o700); err != nil {
		return stats, fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	err := r.runscRun(ctx, filepath.Join(dir, "runsc.log"), "checkpoint", "--image-path", img, "--exclude-committed-zero-pages", id)
	if err != nil {
		os.RemoveAll(img)
		return stats, fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	stats.Freeze = time.Since(start)
	if err := writeFileSync(filepath.Join(dir, checkpointedFile), []byte(time.Now().UTC().Format(time.RFC3339Nano)+"\n")); err != nil {
		return stats, fmt.Errorf("pause sandbox %s: checkpoint saved but not marked: %w", id, err)
	}
	// The checkpointed container is stopped; restore needs its ID free.
	if err := r.runscRun(ctx, "", "delete", "--force", id); err != nil {
		r.log.Warn("runsc delete after checkpoint", "id", id, "err", err)
	}
	// Anything still charged (page cache of files the gofer read) is dropped with the processes,
	// the link's holder among them (its pipes to the sandbox are closed already).
	r.cg.KillAll(id, 5*time.Second)
	os.Remove(filepath.Join(dir, ctlSocketName))
	stats.MemoryAfter, _ = r.cg.MemUsage(id)
	if stats.MemoryBefore > stats.MemoryAfter {
		stats.MemoryReturned = stats.MemoryBefore - stats.MemoryAfter
	}
	stats.Duration = time.Since(start)
	r.log.Debug("gvisor sandbox checkpointed", "id", id, "total", stats.Duration, "memory_before", stats.MemoryBefore, "memory_after", stats.MemoryAfter)
	return stats, nil
}

// resumeGVisor restores the sandbox from its checkpoint and waits for the agent.
// Preconditions: id's lock is held; id is checkpointed.
func (r *Runtime) resumeGVisor(ctx context.Context, id string) (runtime.ResumeStats, error) {
	start := time.Now()
	var stats runtime.ResumeStats
	dir := r.dir(id)
	img := filepath.Join(dir, checkpointDir)
	if r.hasRunscState(id) {
		r.runscRun(ctx, "", "delete", "--force", id) // a crash between checkpoint and delete
	}
	logf, err := os.OpenFile(filepath.Join(dir, diskMount, "agent.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return stats, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	defer logf.Close()
	bin, err := gvisorAgentBin(dir)
	if err != nil {
		return stats, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	err = r.restoreGVisor(ctx, id, img, bin, logf, func() {
		// From here the sandbox runs: the checkpoint is spent.
		os.Remove(filepath.Join(dir, checkpointedFile))
		os.RemoveAll(img)
	})
	if err != nil {
		return stats, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	stats.Duration = time.Since(start)
	r.log.Debug("gvisor sandbox restored", "id", id, "total", stats.Duration)
	return stats, nil
}

// restoreGVisor restores sandbox id from the checkpoint image img on a new agent link, starts
// its holder and proxy and waits for the agent; restored runs once runsc restore succeeded
// (nil: nothing). bin is the host copy of the agent its spec binds in. Preconditions: id's lock
// is held; its bundle is ready and it has no runsc state.
func (r *Runtime) restoreGVisor(ctx context.Context, id, img, bin string, logf *os.File, restored func()) error {
	dir := r.dir(id)
	logPath := filepath.Join(dir, "runsc.log")
	// The restored agent's stdin and stdout are new pipes (see the package comment above).
	l, err := newGVisorLink()
	if err != nil {
		return err
	}
	defer l.close()
	// --background: the sandbox runs while its memory is still being read in (the image is
	// uncompressed), so a restore does not wait for the whole image.
	cmd := r.runscCmdNet(ctx, logPath, gvisorNetwork(dir), "restore", "--detach", "--background", "--image-path", img, "--bundle", dir,
		"--pid-file", filepath.Join(dir, "init.pid"), id)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = l.agentIn, l.agentOut, logf
	if err := cmd.Run(); err != nil {
		r.runscRun(context.WithoutCancel(ctx), "", "delete", "--force", id)
		return fmt.Errorf("runsc restore: %w: %s", err, lastRuncError(logPath))
	}
	if restored != nil {
		restored()
	}
	if err := r.startHolder(id, bin, l, logf); err != nil {
		return err
	}
	if _, err := r.gvisorProxy(id); err != nil {
		return err
	}
	return waitAgent(ctx, socketPath(r.cfg.StateDir, id), filepath.Join(dir, diskMount, "agent.log"))
}

// openGVisor is Open for a gVisor sandbox: a running one is reached again through its holder,
// which outlived the process that started it. Preconditions: id's lock is held.
func (r *Runtime) openGVisor(ctx context.Context, id string) (*runtime.Sandbox, error) {
	dir := r.dir(id)
	if _, err := gvisorAgentBin(dir); err != nil {
		// Made by a corral before the agent's link moved out of the sandbox (its agent listens on
		// /.corral/agent.sock, with no holder): it cannot be reached or restored the new way.
		return nil, errdefs.NotFound("sandbox %s cannot be re-adopted (%v; made by an older corral?): Delete it", id, err)
	}
	sb := &runtime.Sandbox{ID: id, AgentSocket: socketPath(r.cfg.StateDir, id), Dir: dir, AgentLog: filepath.Join(dir, diskMount, "agent.log")}
	if _, err := os.Lstat(filepath.Join(dir, checkpointedFile)); err == nil {
		// Paused: no process, no runsc state. The Proxy serves the socket (and refuses calls)
		// until Resume starts a holder.
		if _, err := r.gvisorProxy(id); err != nil {
			return nil, err
		}
		return sb, nil
	}
	if !r.hasRunscState(id) {
		return nil, errdefs.NotFound("sandbox %s has no runsc state and no checkpoint (interrupted create?): Delete it", id)
	}
	pid, err := readPid(filepath.Join(dir, "init.pid"))
	if err != nil {
		return nil, errdefs.NotFound("sandbox %s: %v (interrupted create?): Delete it", id, err)
	}
	st, err := r.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	if st.State == runtime.StateRunning {
		sb.Pid = pid
	}
	if _, err := r.gvisorProxy(id); err != nil {
		return nil, err
	}
	return sb, nil
}

// destroyGVisor removes runsc's state of id. Preconditions: id's lock is held; its processes
// (the holder among them) are killed.
func (r *Runtime) destroyGVisor(ctx context.Context, id string) error {
	if !r.hasRunscState(id) {
		return nil
	}
	if r.runscErr != nil {
		return fmt.Errorf("runsc state of %s left behind: %w", id, r.runscErr)
	}
	if err := r.runscRun(ctx, "", "delete", "--force", id); err != nil {
		if r.hasRunscState(id) {
			r.log.Warn("runsc delete failed; removing its state", "id", id, "err", err)
			return r.removeRunscState(id)
		}
	}
	return nil
}

// runscStateFiles are what runsc keeps in its root for a sandbox whose root container is id:
// <id>_sandbox:<id>.state and .lock, and its control socket runsc-<id>.sock.
func (r *Runtime) runscStateFiles(id string) []string {
	root := r.cfg.RunscRoot
	return []string{
		filepath.Join(root, id+"_sandbox:"+id+".state"),
		filepath.Join(root, id+"_sandbox:"+id+".lock"),
		filepath.Join(root, "runsc-"+id+".sock"),
	}
}

func (r *Runtime) hasRunscState(id string) bool {
	_, err := os.Lstat(r.runscStateFiles(id)[0])
	return err == nil
}

func (r *Runtime) removeRunscState(id string) error {
	var errs []error
	for _, p := range r.runscStateFiles(id) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
