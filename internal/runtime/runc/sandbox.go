package runc

import (
	"bufio"
	"context"
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

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/cleanup"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/inroot"
	"github.com/corral-dev/corral/internal/lxcfs"
	"github.com/corral-dev/corral/internal/runtime"
)

const (
	maxSocketPath = 107 // sun_path is 108 bytes including the terminating NUL
	socketName    = "agent.sock"
)

func socketPath(stateDir, id string) string { return filepath.Join(stateDir, id, socketName) }

// Create makes and starts a sandbox; see the package doc for its guarantees. Its steps:
// checks, the disk claimed as the sandbox's directory (claimDisk), the user namespace, the
// rootfs (mountRootfs), then runc or runsc. Once the directory is the sandbox's, destroy is the
// undo on the cleanup stack: it removes every resource the directory holds, in the order
// teardown needs (processes, runc or runsc state, mounts and loop devices, the user-namespace
// slot only once its files are gone, cgroups), so the steps after it push nothing of their own.
func (r *Runtime) Create(ctx context.Context, rspec runtime.Spec) (_ *runtime.Sandbox, err error) {
	start := time.Now()
	spec := Spec(rspec)
	if err := spec.normalize(r.maxOpenFiles); err != nil {
		return nil, err
	}
	id := spec.ID
	dir := r.dir(id)
	sock := socketPath(r.cfg.StateDir, id)
	if len(sock) > maxSocketPath {
		return nil, errdefs.Invalid("ID", "agent socket path %s is %d bytes, over the %d-byte unix socket limit: use a shorter ID or StateDir",
			sock, len(sock), maxSocketPath)
	}
	if spec.engine() == EngineGVisor && r.runscErr != nil {
		return nil, r.runscErr
	}
	unlock := r.locks.lock(id)
	defer unlock()
	r.creating.Add(1)
	defer func() {
		r.createdAt.Store(time.Now().UnixNano())
		if r.creating.Add(-1) == 0 {
			r.kickRefill()
			r.kickUserns()
		}
	}()

	// Stat only: `runc state` would cost a runc start on the hot path.
	if _, err := os.Lstat(dir); err == nil {
		return nil, errdefs.Conflict("sandbox %s already exists", id)
	}
	if _, err := os.Lstat(filepath.Join(r.cfg.RuncRoot, id)); err == nil {
		return nil, errdefs.Conflict("sandbox %s already has runc state (left by a crash?): Delete it first", id)
	}
	if r.hasRunscState(id) {
		return nil, errdefs.Conflict("sandbox %s already has runsc state (left by a crash?): Delete it first", id)
	}
	if r.cfg.LXCFS != nil && spec.engine() == EngineRunc {
		r.cfg.LXCFS.Warm() // while the disk, namespace and rootfs are made
	}
	agent, err := r.agents.acquire(spec.AgentPath)
	if err != nil {
		return nil, err
	}
	defer r.agents.release(agent)

	var undo cleanup.Stack
	defer undo.Unwind()
	pooled, err := r.claimDisk(ctx, &spec, dir)
	if err != nil {
		return nil, err
	}
	tDisk := time.Now()
	// From here on the directory is ours: destroy undoes everything on failure.
	undo.Push(func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := r.destroy(cctx, id); derr != nil {
			r.log.Error("clean up failed create", "id", id, "err", derr)
			err = errors.Join(err, fmt.Errorf("clean up: %w", derr))
		}
	})

	rootfs := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	var ux *usernsSpec
	if r.cfg.UserNS != nil && r.usernsErr == nil && spec.engine() == EngineRunc {
		h, base, err := r.claimUserns(ctx, id, dir, spec.AgentPath, agent.f)
		if err != nil {
			return nil, fmt.Errorf("create sandbox %s: %w", id, err)
		}
		defer h.close()
		if rootfs, err = r.prepareRootDir(id, base); err != nil {
			return nil, fmt.Errorf("create sandbox %s: %w", id, err)
		}
		ux = &usernsSpec{handle: h, path: h.path, rootfs: rootfs, owner: base, agentRlimits: !r.capSysResource}
	}
	tUserns := time.Now()
	if err := mountRootfs(&spec, dir, rootfs, ux); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	tMount := time.Now()
	logPath := filepath.Join(dir, diskMount, "agent.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	defer logf.Close()
	if spec.engine() == EngineGVisor {
		if err := r.createGVisor(ctx, &spec, dir, agent, logf); err != nil {
			return nil, fmt.Errorf("create sandbox %s: %w", id, err)
		}
	} else if err := r.createRunc(ctx, &spec, dir, sock, agent, logf, ux); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	pid, err := readPid(filepath.Join(dir, "init.pid"))
	if err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	undo.Release()
	r.log.Debug("sandbox created", "id", id, "engine", spec.engine(), "pid", pid, "pooled_disk", pooled,
		"disk", tDisk.Sub(start), "userns", tUserns.Sub(tDisk), "overlay", tMount.Sub(tUserns), "runc", time.Since(tMount), "total", time.Since(start))
	return &runtime.Sandbox{ID: id, Pid: pid, AgentSocket: sock, Dir: dir, AgentLog: logPath, HostUID: r.HostUID(id)}, nil
}

// claimDisk takes a formatted disk for spec's sandbox (a copy of its fork's, or one from the
// pool or made now) and renames its directory to dir, the sandbox's. On error nothing is left;
// pooled says the disk came from the pool.
func (r *Runtime) claimDisk(ctx context.Context, spec *Spec, dir string) (pooled bool, err error) {
	id := spec.ID
	var slot string
	if spec.Fork != nil {
		slot, err = r.forkSlot(ctx, spec.Fork)
	} else {
		slot, pooled, err = r.takeSlot(ctx, spec.DiskBytes)
	}
	if err != nil {
		return false, fmt.Errorf("create sandbox %s: make disk: %w", id, err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, slot, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE); err != nil {
		terr := teardownDir(context.WithoutCancel(ctx), slot)
		if errors.Is(err, unix.EEXIST) {
			return false, errors.Join(errdefs.Conflict("sandbox %s already exists", id), terr)
		}
		return false, errors.Join(fmt.Errorf("create sandbox %s: claim disk: %w", id, err), terr)
	}
	return pooled, nil
}

// mountRootfs mounts spec's overlay at rootfs (its writable layer on the sandbox's disk in
// dir) and its volumes, and makes its working directory; with ux, as the sandbox's user
// namespace owns them. What it mounted stays for the caller's teardown (destroy) on error.
func mountRootfs(spec *Spec, dir, rootfs string, ux *usernsSpec) error {
	disk := filepath.Join(dir, diskMount)
	var im *idmap
	if ux != nil {
		im = &idmap{ns: ux.handle.ns, owner: ux.owner}
	}
	if err := mountOverlay(rootfs, spec.Lower, filepath.Join(disk, "upper"), filepath.Join(disk, "work"), im); err != nil {
		return err
	}
	// Mountpoints and the working directory are made in the container's rootfs, as its root.
	mkdir := func(p string, follow bool) error { return inroot.Mkdir(rootfs, p, follow) }
	if im != nil {
		plain := mkdir
		mkdir = func(p string, follow bool) error { return asOwner(im.owner, func() error { return plain(p, follow) }) }
	}
	vols := bindDir(dir, ux)
	if err := mountVolumes(vols, rootfs, spec.Volumes, mkdir); err != nil {
		return err
	}
	if im != nil {
		// A volume keeps inside ids on disk, like the writable layer: its mount is idmapped
		// with the sandbox's user namespace.
		if err := idmapVolumes(vols, len(spec.Volumes), im.ns); err != nil {
			return err
		}
	}
	if spec.Workdir != "" {
		if err := mkdir(filepath.Clean(spec.Workdir), true); err != nil {
			return fmt.Errorf("working directory %s: %w", spec.Workdir, err)
		}
	}
	return nil
}

// createRunc is Create's runc half: the rootfs is mounted at dir/rootfs.
func (r *Runtime) createRunc(ctx context.Context, spec *Spec, dir, sock string, agent *agentImage, logf *os.File, ux *usernsSpec) error {
	lis, err := listenUnix(sock)
	if err != nil {
		return err
	}
	defer lis.Close()
	var facts []lxcfs.Bind
	if r.cfg.LXCFS != nil {
		if facts, err = r.cfg.LXCFS.Files(ctx); err != nil {
			return err
		}
	}
	if ux != nil && spec.Netns != "" {
		// sysfs shows the network namespace of whoever mounts it, and a sandbox's user namespace
		// does not own the egress one, so the kernel refuses it the mount: it gets one made here.
		ux.sysfs = filepath.Join(filepath.Dir(ux.rootfs), "sys")
		if err := mountSysfsIn(spec.Netns, ux.sysfs); err != nil {
			return err
		}
	}
	var owner uint32
	if ux != nil {
		owner = ux.owner
	}
	srcs := bindDir(dir, ux)
	hosts, err := hostsMount(srcs, owner)
	if err != nil {
		return err
	}
	config, err := r.tmpl.render(spec, r.cgroupPath(spec.ID), nil, facts, ux, r.budgets(), append(volumeMounts(srcs, spec), hosts)...)
	if err != nil {
		return fmt.Errorf("render spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), config, 0o600); err != nil {
		return err
	}
	started := false
	if r.engine != nil && !r.createStart {
		// As runc run --detach below, in corral-runcd's process.
		pid, err := r.engine.run(ctx, r.cfg.RuncRoot, spec.ID, dir, logf, []*os.File{lis, agent.f})
		switch {
		case err == nil:
			if err := writePidFile(filepath.Join(dir, "init.pid"), pid); err != nil {
				return err
			}
			started = true
		case errors.Is(err, errEngineDown):
			// Nothing was started: this create is the runc binary's.
			r.log.Warn("corral-runcd unavailable; this create runs runc run --detach", "id", spec.ID, "err", err)
		default:
			return fmt.Errorf("runc run (corral-runcd): %w", err)
		}
	}
	if !started {
		if err := r.runcStart(ctx, spec.ID, dir, logf, lis, agent.f); err != nil {
			return err
		}
	}
	r.detachStarted(spec.ID, rootfsOf(dir, ux), filepath.Join(srcs, "etc"), sysfsOf(ux))
	return nil
}

// runcStart starts the bundle in dir with the runc binary: `runc run --detach` (or `create`
// then `start`, createStart), lis and agent as fds 3 and 4. runc run --detach returns once the
// agent runs. The container gets runc's stdio: stdin /dev/null (exec's default), stdout and
// stderr the log file, never a pipe to us.
func (r *Runtime) runcStart(ctx context.Context, id, dir string, logf, lis, agent *os.File) error {
	runcLog := filepath.Join(dir, "runc.log")
	verb := []string{"run", "--detach"}
	if r.createStart {
		verb = []string{"create"}
	}
	args := append([]string{"--log", runcLog, "--log-format", "json"}, verb...)
	cmd := r.runcCmd(ctx, append(args, "--bundle", dir, "--pid-file", filepath.Join(dir, "init.pid"), "--preserve-fds", "2", id)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{lis, agent} // fds 3 and 4
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runc %s: %w: %s", verb[0], err, lastRuncError(runcLog))
	}
	if r.createStart {
		if err := r.runcCmd(ctx, "--log", runcLog, "--log-format", "json", "start", id).Run(); err != nil {
			return fmt.Errorf("runc start: %w: %s", err, lastRuncError(runcLog))
		}
	}
	return nil
}

// detachStarted lazily unmounts, on the host, the mounts a started runc sandbox's container has
// its own copies of (its root, the /etc/hosts tmpfs, the sysfs of its network namespace;
// "" skips one): its mount namespace keeps them, and nothing on the host reads them again (its
// disk, with the writable layer, stays mounted). Each sandbox left three to five mounts in
// the host's table, and runc reads that table and copies it into every new container's mount
// namespace: with 300 sandboxes on a node a create's runc took 7 ms longer. Each is made
// private first, so that its unmount cannot propagate to the sandbox's copy (on a host whose
// mounts are shared). A failure leaves the mount for destroy.
func (r *Runtime) detachStarted(id string, mounts ...string) {
	for _, m := range mounts {
		if m == "" {
			continue
		}
		err := unix.Mount("", m, "", unix.MS_PRIVATE, "")
		if err == nil {
			err = unix.Unmount(m, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) {
			r.log.Warn("detach a started sandbox's host mount", "id", id, "mount", m, "err", err)
		}
	}
}

// rootfsOf is where Create mounted the sandbox's rootfs.
func rootfsOf(dir string, ux *usernsSpec) string {
	if ux != nil {
		return ux.rootfs
	}
	return filepath.Join(dir, "rootfs")
}

// sysfsOf is the sysfs Create mounted for runc to bind at /sys, or "" when runc mounts its own.
func sysfsOf(ux *usernsSpec) string {
	if ux == nil {
		return ""
	}
	return ux.sysfs
}

// createGVisor is Create's gVisor half (see gvisor.go): the rootfs is mounted at dir/rootfs.
func (r *Runtime) createGVisor(ctx context.Context, spec *Spec, dir string, agent *agentImage, logf *os.File) error {
	if err := os.WriteFile(filepath.Join(dir, engineFile), []byte(EngineGVisor+"\n"), 0o600); err != nil {
		return err
	}
	if spec.Netns != "" {
		if err := os.WriteFile(filepath.Join(dir, networkFile), []byte(spec.Netns+"\n"), 0o600); err != nil {
			return err
		}
	}
	bin, err := r.gvisorAgentCopy(agent)
	if err != nil {
		return err
	}
	if spec.Fork != nil && spec.Fork.Memory {
		// The checkpoint maps the agent the source ran: the copies bind in the same file.
		bin = filesOf(spec.Fork).agentBin
	}
	hosts, err := hostsMount(dir, 0)
	if err != nil {
		return err
	}
	config, err := r.tmpl.render(spec, r.cgroupPath(spec.ID), &gvisorPaths{agentBin: bin}, nil, nil, Budgets{}, append(volumeMounts(dir, spec), hosts)...)
	if err != nil {
		return fmt.Errorf("render spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), config, 0o600); err != nil {
		return err
	}
	if spec.Fork != nil && spec.Fork.Memory {
		return r.restoreGVisor(ctx, spec.ID, filesOf(spec.Fork).checkpoint, bin, logf, nil)
	}
	return r.startGVisor(ctx, spec.ID, dir, bin, logf)
}

// listenUnix creates a listening unix socket at path; the file is 0600 in a 0700 directory.
func listenUnix(path string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), path)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		f.Close()
		return nil, fmt.Errorf("bind agent socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("chmod agent socket: %w", err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		f.Close()
		return nil, fmt.Errorf("listen on agent socket: %w", err)
	}
	return f, nil
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("read pid file %s: bad content %q", path, b)
	}
	return pid, nil
}

// lastRuncError returns the last error runc logged, which names what failed inside runc.
func lastRuncError(logPath string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return "(no runc log)"
	}
	defer f.Close()
	var last string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e struct{ Level, Msg string }
		if json.Unmarshal(sc.Bytes(), &e) == nil && (e.Level == "error" || e.Level == "fatal") {
			last = e.Msg
		}
	}
	if last == "" {
		return "(runc logged no error)"
	}
	return last
}

// runcState is the part of `runc state` output used here.
type runcState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
}

func (r *Runtime) runcState(ctx context.Context, id string) (*runcState, error) {
	if _, err := os.Lstat(filepath.Join(r.cfg.RuncRoot, id)); errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.NotFound("runc container %s", id)
	}
	out, err := r.runcOutput(ctx, "state", id)
	if err != nil {
		return nil, fmt.Errorf("runc state %s: %w", id, err)
	}
	var st runcState
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("runc state %s: %w", id, err)
	}
	return &st, nil
}

// Open re-adopts a sandbox made by an earlier process; see the package doc.
func (r *Runtime) Open(ctx context.Context, id string) (*runtime.Sandbox, error) {
	if !validID(id) {
		return nil, errdefs.Invalid("ID", "%q is not a valid sandbox ID", id)
	}
	unlock := r.locks.lock(id)
	defer unlock()
	dir := r.dir(id)
	if r.engineOf(id) == EngineGVisor {
		return r.openGVisor(ctx, id)
	}
	_, dirErr := os.Lstat(dir)
	st, err := r.runcState(ctx, id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound) && errors.Is(dirErr, fs.ErrNotExist):
		return nil, errdefs.NotFound("sandbox %s", id)
	case errors.Is(err, errdefs.ErrNotFound):
		return nil, errdefs.NotFound("sandbox %s has only partial state (interrupted create?): Delete it", id)
	case err != nil:
		return nil, err
	case dirErr != nil:
		return nil, errdefs.NotFound("sandbox %s has runc state but no directory: Delete it", id)
	case st.Status == "created":
		return nil, errdefs.NotFound("sandbox %s was created but never started (interrupted create?): Delete it", id)
	}
	sock := socketPath(r.cfg.StateDir, id)
	if _, err := os.Lstat(sock); err != nil {
		return nil, errdefs.NotFound("sandbox %s has no agent socket (interrupted create?): Delete it", id)
	}
	pid := st.Pid
	if st.Status == "stopped" {
		pid = 0
	}
	return &runtime.Sandbox{ID: id, Pid: pid, AgentSocket: sock, Dir: dir, AgentLog: filepath.Join(dir, diskMount, "agent.log"), HostUID: r.HostUID(id)}, nil
}

// Status reports the sandbox's state from its cgroup; see the package doc.
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Status, error) {
	if !validID(id) {
		return runtime.Status{}, errdefs.Invalid("ID", "%q is not a valid sandbox ID", id)
	}
	if _, err := os.Lstat(filepath.Join(r.dir(id), checkpointedFile)); err == nil {
		mem, _ := r.cg.MemUsage(id)
		return runtime.Status{State: runtime.StatePaused, MemoryBytes: mem}, nil
	}
	var st runtime.Status
	var err error
	// The agent is pid 1 of the sandbox's pid namespace: when it dies, the kernel kills every
	// other process there, so "running" is "the recorded init pid is still in our cgroup"; once
	// seen so, a pidfd of it tells until it exits (liveInits).
	pid, live := r.inits.alive(id)
	if !live {
		if !r.cg.Exists(id) {
			if _, err := os.Lstat(r.dir(id)); err == nil {
				return runtime.Status{State: runtime.StateStopped}, nil
			}
			return runtime.Status{}, errdefs.NotFound("sandbox %s", id)
		}
		var perr error
		pid, perr = readPid(filepath.Join(r.dir(id), "init.pid"))
		fd := -1
		if perr == nil {
			fd = openPidfd(pid) // before the cgroup's list: then it names the process listed
		}
		procs, err := r.cg.Procs(id)
		if err != nil {
			if fd >= 0 {
				unix.Close(fd)
			}
			return runtime.Status{}, fmt.Errorf("status of %s: %w", id, err)
		}
		if live = perr == nil && slices.Contains(procs, pid); live {
			r.inits.note(id, pid, fd)
		} else if fd >= 0 {
			unix.Close(fd)
		}
	}
	st.MemoryBytes, st.OOMKills, st.UnderOOM, err = r.cg.MemStats(id)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return runtime.Status{}, fmt.Errorf("status of %s: %w", id, err)
	}
	st.State = runtime.StateStopped
	if live {
		st.State, st.Pid = runtime.StateRunning, pid
		if r.cg.Frozen(id) {
			st.State = runtime.StatePaused
		}
	}
	return st, nil
}

// Delete destroys the sandbox and everything it owns on the host; see the package doc.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if !validID(id) {
		return errdefs.Invalid("ID", "%q is not a valid sandbox ID", id)
	}
	unlock := r.locks.lock(id)
	defer unlock()
	return r.destroy(ctx, id)
}

// Kill SIGKILLs every process of sandbox id (the agent, its commands and, on gVisor, the sandbox
// and gofer) and returns once none is left. The files, mounts and cgroups stay until Delete: the
// edge kills a deleted sandbox before it answers and removes the rest off the request's path.
func (r *Runtime) Kill(ctx context.Context, id string) error {
	if !validID(id) {
		return errdefs.Invalid("ID", "%q is not a valid sandbox ID", id)
	}
	unlock := r.locks.lock(id)
	defer unlock()
	r.stopPrefetch(id)
	return r.cg.KillAll(id, 10*time.Second)
}

// destroy removes every trace of id, whatever state it is in. Preconditions: id's lock is held.
func (r *Runtime) destroy(ctx context.Context, id string) error {
	start := time.Now()
	r.stopPrefetch(id)
	r.closeProxy(id)
	var errs []error
	// Every process is killed first (through the cgroup, by pidfd), so what `runc delete` would
	// still do is remove its state directory and the cgroups (Remove, below, does those): no
	// runc process is started for it (a Go program's start: 3-6% of a sandbox's CPU,
	// docs/BENCHMARKS.md).
	if err := r.cg.KillAll(id, 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	r.inits.drop(id)
	tKill := time.Now()
	runcDir := filepath.Join(r.cfg.RuncRoot, id)
	if len(errs) == 0 {
		if err := os.RemoveAll(runcDir); err != nil {
			errs = append(errs, fmt.Errorf("remove runc state: %w", err))
		}
	} else if _, err := os.Lstat(runcDir); err == nil {
		// Something survived the kill: runc tries too, and its state stays for the next try.
		if _, err := r.runcOutput(ctx, "delete", "--force", id); err != nil {
			r.log.Warn("runc delete --force after a failed kill", "id", id, "err", err)
		}
	}
	if err := r.destroyGVisor(ctx, id); err != nil {
		errs = append(errs, err)
	}
	tRunc := time.Now()
	// Both directories at once: one read of the mount table per unmount pass, no scan of every
	// loop device (teardownDirs).
	if err := teardownDirs(ctx, r.rootDir(id), r.dir(id)); err != nil {
		errs = append(errs, err)
	} else {
		r.disks.Forget(r.cfg.StateDir, id) // a sandbox made again under this ID has a disk of its own
		if r.slots != nil {
			r.slots.release(id) // only now: its processes and files are gone
		}
	}
	tUnmount := time.Now()
	if err := r.cg.Remove(id, 5*time.Second); err != nil {
		errs = append(errs, err)
	}
	// Again: a Status that read the cgroup before the kill may have kept a pidfd since.
	r.inits.drop(id)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	r.log.Debug("sandbox deleted", "id", id, "kill", tKill.Sub(start), "runc", tRunc.Sub(tKill),
		"unmount", tUnmount.Sub(tRunc), "cgroups", time.Since(tUnmount), "total", time.Since(start))
	return nil
}
