package lxcfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/mountinfo"
)

// Config configures a Server.
type Config struct {
	// Dir is the Server's directory (see the package doc), e.g. <data-dir>/lxcfs.
	Dir string
	// Binary is the lxcfs program; empty: lxcfs on PATH, /usr/bin or /usr/local/bin.
	Binary string
}

// viewBase holds the view of every data directory's LXCFS on this host (ViewDir). It and the
// views are open to every host user for traversal and reading: a sandbox's runc init runs as
// its user namespace's root, an unprivileged host uid, and binds the files itself when it can
// reach them. When it cannot (a view under a 0700 data directory), runc's parent opens each
// file for it, one round trip per file: 10 ms of every create on a 2-CPU host
// (docs/BENCHMARKS.md). What the files show is a sandbox's own view of the host, no secret.
const viewBase = "/run/corral-lxcfs"

// ViewDir is the view of the LXCFS whose directory is dir: a tmpfs of its own at
// /run/corral-lxcfs/<hash of dir's absolute path>, so that two data directories never share
// one.
func ViewDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	sum := sha256.Sum256([]byte(dir))
	return filepath.Join(viewBase, hex.EncodeToString(sum[:6]))
}

// ReadyTimeout bounds how long Start and Files wait for an LXCFS to serve.
const ReadyTimeout = 5 * time.Second

// Bind is one file a sandbox binds read-only: Source (a host path in the view, ViewDir) at
// Target.
type Bind struct{ Source, Target string }

// served maps each file of the view to the path LXCFS serves it at (under mnt/), which is also
// the path it hides inside a sandbox.
var served = []struct{ name, path string }{
	{"cpuinfo", "/proc/cpuinfo"},
	{"diskstats", "/proc/diskstats"},
	{"loadavg", "/proc/loadavg"},
	{"meminfo", "/proc/meminfo"},
	{"stat", "/proc/stat"},
	{"swaps", "/proc/swaps"},
	{"uptime", "/proc/uptime"},
	{"cpu-online", "/sys/devices/system/cpu/online"},
}

// Paths returns the paths inside a sandbox that LXCFS serves.
func Paths() []string {
	out := make([]string, len(served))
	for i, f := range served {
		out[i] = f.path
	}
	return out
}

// Server supervises one LXCFS.
type Server struct {
	cfg  Config
	view string // ViewDir(cfg.Dir)
	log  *slog.Logger
	stop chan struct{}
	done chan struct{}

	mu sync.Mutex
	// ready is closed while an LXCFS serves view/; replaced by an open one when it dies.
	// Protected by mu.
	ready    chan struct{}
	restarts int // protected by mu
	pid      int // protected by mu
	version  string

	warming atomic.Bool // a Warm's stats are running
}

// Start adopts or starts the LXCFS of cfg.Dir and supervises it until Close or Stop.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Server, error) {
	bin, err := findBinary(cfg.Binary)
	if err != nil {
		return nil, err
	}
	cfg.Binary = bin
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return nil, errdefs.Unavailable("no /dev/fuse: LXCFS needs FUSE (modprobe fuse)")
	}
	// Only the directory: mnt/ may hold the dead mount of an LXCFS that died while nobody
	// supervised it (mkdir: EEXIST), which launch detaches before making mnt/ again.
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create lxcfs dir: %w", err)
	}
	// The directory is 0700, but sandboxes' processes read through the binds, never by path.
	s := &Server{cfg: cfg, view: ViewDir(cfg.Dir), log: log.With("component", "lxcfs"), stop: make(chan struct{}), done: make(chan struct{}), ready: make(chan struct{})}
	if out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput(); err == nil {
		s.version = strings.Trim(strings.TrimSpace(string(out)), `"`)
	}
	pidfd, pid, adopted := s.adopt()
	if adopted {
		// The view of an earlier Corral may be writable (makeView).
		if err := readOnlyView(s.view); err != nil {
			unix.Close(pidfd)
			return nil, err
		}
	} else {
		if pidfd, pid, err = s.launch(ctx); err != nil {
			return nil, err
		}
	}
	s.serving(pid)
	s.log.Info("lxcfs serving", "pid", pid, "adopted", adopted, "dir", cfg.Dir, "version", s.version)
	go s.supervise(pidfd)
	return s, nil
}

// Version is `lxcfs --version`.
func (s *Server) Version() string { return s.version }

// Restarts is how many times this Server started LXCFS again after it died.
func (s *Server) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// Pid is the pid of the LXCFS serving now (0 while none does).
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// Files waits for a live LXCFS (at most ReadyTimeout) and returns the binds a sandbox needs.
func (s *Server) Files(ctx context.Context) ([]Bind, error) {
	s.mu.Lock()
	ready := s.ready
	s.mu.Unlock()
	t := time.NewTimer(ReadyTimeout)
	defer t.Stop()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, errdefs.Unavailable("LXCFS is not serving (restarting for over %v; see %s)", ReadyTimeout, filepath.Join(s.cfg.Dir, "lxcfs.log"))
	}
	out := make([]Bind, len(served))
	for i, f := range served {
		out[i] = Bind{Source: filepath.Join(s.view, f.name), Target: f.path}
	}
	return out, nil
}

// Warm refreshes, in the background, the kernel's cached attributes of the view's files, so that
// a sandbox about to bind them finds them cached. runc's init stats each bind's source before it
// mounts it, and for a FUSE file the kernel asks LXCFS unless it answered less than its
// attribute timeout ago (half a second): eight round trips to LXCFS's threads in every create,
// each 0.05 ms when that thread runs on the same CPU and up to 1.5 ms when it must be woken on
// another (measured with the fuse tracepoints on this 2-vCPU VM), about 3 ms of a create in all.
// A create calls Warm when it begins, milliseconds before runc reaches the binds; one Warm runs
// at a time and a call while one runs does nothing. Errors are ignored: the bind reports them.
func (s *Server) Warm() {
	if !s.warming.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.warming.Store(false)
		var st unix.Stat_t
		for _, f := range served {
			_ = unix.Stat(filepath.Join(s.view, f.name), &st)
		}
	}()
}

// Close stops supervising; LXCFS keeps running.
func (s *Server) Close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// Stop ends supervision, stops LXCFS and removes everything under the directory.
func (s *Server) Stop() error {
	s.Close()
	return Remove(s.cfg.Dir)
}

// Remove stops the LXCFS whose pid file is in dir, unmounts everything under dir and its view
// (ViewDir) and removes both.
func Remove(dir string) error {
	if pid := lxcfsPid(dir); pid > 0 {
		if fd, err := unix.PidfdOpen(pid, 0); err == nil {
			// SIGKILL: nothing of LXCFS's state is worth a clean exit (SIGTERM took 2 s), and
			// its mount is detached below.
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			waitExit(fd, 2*time.Second)
			unix.Close(fd)
		}
	}
	view := ViewDir(dir)
	ms, err := mountinfo.UnderAny(view, dir)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := unix.Unmount(m.Point, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", m.Point, err)
		}
	}
	if left, _ := mountinfo.UnderAny(view, dir); len(left) > 0 {
		return fmt.Errorf("remove %s: still mounted: %v", dir, left)
	}
	var errs []error
	for _, d := range []string{view, dir} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", d, err))
		}
	}
	os.Remove(viewBase) // once no data directory's view is left
	return errors.Join(errs...)
}

// supervise waits for the LXCFS behind pidfd to exit and starts the next, until stop.
func (s *Server) supervise(pidfd int) {
	defer close(s.done)
	var recent []time.Time // starts within the last minute, for the backoff
	for {
		for !waitExit(pidfd, 500*time.Millisecond) {
			select {
			case <-s.stop:
				unix.Close(pidfd)
				return
			default:
			}
		}
		unix.Close(pidfd)
		s.mu.Lock()
		s.ready = make(chan struct{})
		s.pid = 0
		s.mu.Unlock()
		s.log.Warn("lxcfs exited; starting another (sandboxes read ENOTCONN from its files meanwhile)", "log", filepath.Join(s.cfg.Dir, "lxcfs.log"))
		for {
			recent = slices.DeleteFunc(recent, func(t time.Time) bool { return time.Since(t) > time.Minute })
			delay := time.Duration(0)
			if n := len(recent); n > 2 {
				delay = min(time.Duration(n-2)*500*time.Millisecond, 5*time.Second)
			}
			select {
			case <-s.stop:
				return
			case <-time.After(delay):
			}
			recent = append(recent, time.Now())
			fd, pid, err := s.launch(context.Background())
			if err != nil {
				s.log.Error("start lxcfs", "err", err)
				continue
			}
			pidfd = fd
			s.mu.Lock()
			s.restarts++
			s.mu.Unlock()
			s.serving(pid)
			s.log.Info("lxcfs restarted", "pid", pid)
			break
		}
	}
}

// serving records that pid serves view/ now.
func (s *Server) serving(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pid = pid
	close(s.ready)
}

// adopt takes over an LXCFS a predecessor left when it still serves every view file.
func (s *Server) adopt() (pidfd, pid int, ok bool) {
	pid = lxcfsPid(s.cfg.Dir)
	if pid <= 0 {
		return -1, 0, false
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, 0, false
	}
	// The pidfd pins the process; check it is still an lxcfs after opening it.
	if lxcfsPid(s.cfg.Dir) != pid || !s.viewLive() {
		unix.Close(fd)
		return -1, 0, false
	}
	return fd, pid, true
}

// viewLive reports whether every view file has a live LXCFS file on top.
func (s *Server) viewLive() bool {
	for _, f := range served {
		// An LXCFS file, not the view's own empty file (a crash between makeView and the
		// binds leaves those), and one that answers.
		var st unix.Statfs_t
		if err := unix.Statfs(filepath.Join(s.view, f.name), &st); err != nil || st.Type != unix.FUSE_SUPER_MAGIC {
			return false
		}
		if _, err := os.ReadFile(filepath.Join(s.view, f.name)); err != nil {
			return false
		}
	}
	return true
}

// launch clears what a dead LXCFS left, starts a new one at mnt/, waits until it serves and binds
// its files over view/'s.
func (s *Server) launch(ctx context.Context) (pidfd, pid int, err error) {
	dir := s.cfg.Dir
	mnt := filepath.Join(dir, "mnt")
	if old := lxcfsPid(dir); old > 0 {
		unix.Kill(old, unix.SIGKILL) // alive but not serving: adopt refused it
	}
	if err := unix.Unmount(mnt, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return -1, 0, fmt.Errorf("detach the old lxcfs mount: %w", err)
	}
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return -1, 0, err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "lxcfs.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, 0, fmt.Errorf("create lxcfs log: %w", err)
	}
	defer logf.Close()
	// -l: per-cgroup load averages; --enable-cfs: CPUs from the CFS quota, not only the cpuset;
	// --enable-pidfd: no pid-reuse races when it reads a reader's cgroup.
	cmd := exec.Command(s.cfg.Binary, "--foreground", "--enable-loadavg", "--enable-cfs", "--enable-pidfd",
		"--pidfile", filepath.Join(dir, "lxcfs.pid"), mnt)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true} // outlives this process and its signals
	if err := cmd.Start(); err != nil {
		return -1, 0, fmt.Errorf("start lxcfs: %w", err)
	}
	pid = cmd.Process.Pid
	pidfd, err = unix.PidfdOpen(pid, 0)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return -1, 0, fmt.Errorf("pidfd of lxcfs: %w", err)
	}
	go cmd.Wait() // reap it; the pidfd tells exit to supervise
	fail := func(err error) (int, int, error) {
		unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		unix.Close(pidfd)
		return -1, 0, fmt.Errorf("%w (lxcfs log: %s)", err, logTail(filepath.Join(dir, "lxcfs.log")))
	}
	deadline := time.Now().Add(ReadyTimeout)
	for !fuseMounted(mnt) {
		if waitExit(pidfd, 0) {
			return fail(errors.New("lxcfs exited at start"))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fail(fmt.Errorf("lxcfs did not mount %s within %v", mnt, ReadyTimeout))
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline: no event for "FUSE mounted"
	}
	if err := s.bindView(mnt); err != nil {
		return fail(err)
	}
	return pidfd, pid, nil
}

// bindView makes the view (once) and binds each of mnt's served files over its view file,
// read-only, on top of whatever a dead LXCFS left there. The bind is made read-only before it is
// attached, so the copies propagated to sandboxes are read-only too. A view a Corral before
// ViewDir left at <dir>/view, which its sandboxes still bind from, gets the files too.
func (s *Server) bindView(mnt string) error {
	if err := os.MkdirAll(viewBase, 0o711); err != nil {
		return err
	}
	if err := os.Chmod(viewBase, 0o711); err != nil {
		return err
	}
	if err := makeView(s.view); err != nil {
		return err
	}
	views := []string{s.view}
	if legacy := filepath.Join(s.cfg.Dir, "view"); mountinfo.IsMountpoint(legacy) {
		views = append(views, legacy)
	}
	for _, v := range views {
		for _, f := range served {
			if err := bindServed(filepath.Join(mnt, f.path), filepath.Join(v, f.name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// makeView mounts the view's tmpfs at view (once), makes its files and makes the mount
// read-only. Sandboxes bind the view's files without options of their own (runc then makes one
// mount call per file, not three): a bind takes its flags from the mount it copies, LXCFS's
// read-only file (bindServed) or, in the moment no LXCFS serves one, this read-only tmpfs. In a
// sandbox with a user namespace (the default) they are locked: the kernel locks the flags it
// copies into a less privileged mount namespace. Without one (--no-userns) they are not, as the
// remount runc made before was not; the sandbox's commands lack CAP_SYS_ADMIN to change them.
func makeView(view string) error {
	if err := os.MkdirAll(view, 0o755); err != nil {
		return err
	}
	if !mountinfo.IsMountpoint(view) {
		if err := unix.Mount("tmpfs", view, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,mode=0755"); err != nil {
			return fmt.Errorf("mount lxcfs view: %w", err)
		}
		// A peer group of its own: out of the parent's (a systemd host's / is shared), and
		// shared, so sandboxes' slave binds of its files receive the next LXCFS's.
		if err := unix.Mount("", view, "", unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make lxcfs view private: %w", err)
		}
		if err := unix.Mount("", view, "", unix.MS_SHARED, ""); err != nil {
			return fmt.Errorf("make lxcfs view shared: %w", err)
		}
		for _, f := range served {
			if err := os.WriteFile(filepath.Join(view, f.name), nil, 0o444); err != nil {
				return fmt.Errorf("create lxcfs view file: %w", err)
			}
		}
	}
	// Also when the view was there already: one an earlier Corral made is writable.
	return readOnlyView(view)
}

// readOnlyView makes the view's mount read-only, nosuid, nodev and noexec (again).
func readOnlyView(view string) error {
	const ro = unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("", view, "", ro, ""); err != nil {
		return fmt.Errorf("make lxcfs view read-only: %w", err)
	}
	return nil
}

// bindServed binds LXCFS's file src read-only over the view file dst.
func bindServed(src, dst string) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("clone lxcfs file %s: %w", src, err)
	}
	defer unix.Close(tree)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("make lxcfs file %s read-only: %w", src, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind lxcfs file %s: %w", src, err)
	}
	return nil
}

// findBinary returns the lxcfs program to run.
func findBinary(bin string) (string, error) {
	if bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", errdefs.Unavailable("lxcfs binary %s: %v", bin, err)
		}
		return bin, nil
	}
	if p, err := exec.LookPath("lxcfs"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/lxcfs", "/usr/local/bin/lxcfs"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errdefs.Unavailable("lxcfs is not installed (apt-get install lxcfs, or scripts/setup.sh)")
}

// lxcfsPid returns the pid in dir's pid file when that process is an lxcfs serving dir's mount
// (never another Corral's, should the pid have been reused), else 0.
func lxcfsPid(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "lxcfs.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0
	}
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil || strings.TrimSpace(string(comm)) != "lxcfs" {
		return 0
	}
	args, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !slices.Contains(strings.Split(string(args), "\x00"), filepath.Join(dir, "mnt")) {
		return 0
	}
	return pid
}

// waitExit waits up to d for the process behind pidfd to exit and reports whether it did.
func waitExit(pidfd int, d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(d.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0
	}
}

// fuseMounted reports whether an lxcfs FUSE mount is at mnt.
func fuseMounted(mnt string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		return false
	}
	return st.Type == unix.FUSE_SUPER_MAGIC
}

// logTail is the last line of the log at path.
func logTail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
