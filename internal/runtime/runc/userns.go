package runc

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/usernsinit"
)

// User namespaces (Config.UserNS).
//
// A runc sandbox's root is an unprivileged host uid: the sandbox runs in a user namespace that
// maps its ids 0..UserNSSize-1 to a range of host ids of its own (a slot), the same for uids and
// gids. The namespace is made by a short-lived helper, the agent's binary run as
// internal/usernsinit's HelperCmd, cloned by a thread whose effective uid is the slot's first uid: so
// the namespace's owner is that uid, not root, and everything the kernel counts per user
// (inotify instances and watches, mqueue bytes, processes) is counted against the sandbox, at
// every level, never against the host's root. The helper sets the namespace's own inotify
// limits (Budgets), which only a holder of CAP_SYS_RESOURCE in it can change and the sandbox
// lacks, and runc joins the namespace by its path.
//
// The layers, the writable disk's upper and work directories, stay as they are on disk: the
// overlay is given idmapped mounts of them (mount_setattr MOUNT_ATTR_IDMAP with the
// namespace), so the sandbox sees its files owned by its own ids and writes inside ids to its
// disk: a snapshot of the upper directory stores inside ids, as without a user namespace.
//
// The overlay is mounted at <rootsDir>/<id>/rootfs instead of the bundle's rootfs: runc's
// container process, already in the namespace, bind-mounts the rootfs by path, and so needs to
// traverse every directory above it, which the data directory (0700, root's) does not allow.
// rootsDir is 0711 and root's, and <id> is 0700 and the slot's root's, so no other host user
// and no other sandbox can go further.
//
// Slots are recorded in the sandbox's directory (usernsFile): a restarted Runtime reads them
// back before it hands out any, and a slot is free again only once its sandbox's directory is
// gone, so two live sandboxes never share one.

// UserNSSize is how many ids each sandbox's user namespace maps.
const UserNSSize = 1 << 16

const (
	usernsFile       = "userns" // in the sandbox's directory: its slot
	defaultRootsBase = "/run/corral-roots"
)

// UserNS turns on user namespaces for runc sandboxes (see above).
type UserNS struct {
	// UIDBase is the first host uid (and gid) of the Slots ranges of UserNSSize ids; they must
	// be this Runtime's alone (internal/hostreg hands one out per data dir).
	UIDBase uint32
	Slots   int
	// RootsDir holds the sandboxes' rootfs mount points; default /run/corral-roots/<hash of
	// StateDir>.
	RootsDir string
	// Budgets are the per-sandbox kernel budgets.
	Budgets Budgets
}

// Budgets are the limits the kernel counts per user, which a user namespace owned by the
// sandbox's own uid makes per sandbox. Zero fields take the defaults.
type Budgets struct {
	// InotifyInstances and InotifyWatches are the user namespace's max_inotify_instances and
	// max_inotify_watches (/proc/sys/user).
	InotifyInstances, InotifyWatches int64
	// MsgQueueBytes is RLIMIT_MSGQUEUE: POSIX message queue bytes of each of its users.
	MsgQueueBytes int64
	// Procs is RLIMIT_NPROC: processes (threads included) of each of its users; 0 is twice the
	// sandbox's Pids, so that its pids cgroup stays what stops it as a whole.
	Procs int64
}

// Defaults for Budgets. The inotify ones are the host defaults of a stock kernel for one user.
const (
	DefaultInotifyInstances = 128
	DefaultInotifyWatches   = 65536
	DefaultMsgQueueBytes    = 819200
)

func (b *Budgets) setDefaults() {
	if b.InotifyInstances == 0 {
		b.InotifyInstances = DefaultInotifyInstances
	}
	if b.InotifyWatches == 0 {
		b.InotifyWatches = DefaultInotifyWatches
	}
	if b.MsgQueueBytes == 0 {
		b.MsgQueueBytes = DefaultMsgQueueBytes
	}
}

// Validate reports the first budget out of the kernel's range, by its field name.
func (b Budgets) Validate() error {
	b.setDefaults()
	for _, f := range []struct {
		name string
		v    int64
	}{{"InotifyInstances", b.InotifyInstances}, {"InotifyWatches", b.InotifyWatches}} {
		// The ucount limits are ints in the kernel.
		if f.v < 1 || f.v > math.MaxInt32 {
			return errdefs.Invalid(f.name, "%d is out of range [1, %d]", f.v, math.MaxInt32)
		}
	}
	if b.MsgQueueBytes < 1 || b.MsgQueueBytes > math.MaxInt64/2 {
		return errdefs.Invalid("MsgQueueBytes", "%d is out of range [1, %d]", b.MsgQueueBytes, int64(math.MaxInt64/2))
	}
	if b.Procs < 0 || b.Procs > math.MaxInt32 {
		return errdefs.Invalid("Procs", "%d is out of range [0, %d]", b.Procs, math.MaxInt32)
	}
	return nil
}

func (u *UserNS) validate() error {
	if u.Slots < 1 {
		return errdefs.Invalid("UserNS.Slots", "%d: want at least 1", u.Slots)
	}
	if u.UIDBase == 0 {
		return errdefs.Invalid("UserNS.UIDBase", "0 would map a sandbox's root to the host's")
	}
	if end := uint64(u.UIDBase) + uint64(u.Slots)*UserNSSize; end > 0xFFFF0000 {
		return errdefs.Invalid("UserNS.Slots", "%d ranges from %d end at %d, past the last usable uid", u.Slots, u.UIDBase, end)
	}
	if u.RootsDir != "" && (!filepath.IsAbs(u.RootsDir) || filepath.Clean(u.RootsDir) != u.RootsDir) {
		return errdefs.Invalid("UserNS.RootsDir", "must be a clean absolute path, got %q", u.RootsDir)
	}
	return u.Budgets.Validate()
}

// slots hands out user-namespace slots.
type slots struct {
	mu   sync.Mutex
	used map[int]string // slot -> sandbox ID; protected by mu
	n    int
}

// take returns the lowest free slot for id.
func (s *slots) take(id string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.n {
		if _, ok := s.used[i]; !ok {
			s.used[i] = id
			return i, nil
		}
	}
	return 0, fmt.Errorf("all %d of this node's user-namespace id ranges are in use: delete a sandbox: %w", s.n, errdefs.ErrExhausted)
}

// release frees id's slot, if it holds one.
func (s *slots) release(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, o := range s.used {
		if o == id {
			delete(s.used, i)
		}
	}
}

// assign makes slot, taken for the pool (poolOwner), id's.
func (s *slots) assign(slot int, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used[slot] = id
}

// releaseSlot frees slot.
func (s *slots) releaseSlot(slot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.used, slot)
}

// slotOf returns id's slot.
func (s *slots) slotOf(id string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, o := range s.used {
		if o == id {
			return i, true
		}
	}
	return 0, false
}

// initUserNS sets up user namespaces when configured (and the roots directory always): reads
// back the slots of sandboxes left by an earlier process and probes that this host can make
// them. On a failed probe r.usernsErr says why and new sandboxes are made without
// (UserNSStatus reports it), never half-made.
func (r *Runtime) initUserNS(ctx context.Context) {
	sum := sha256.Sum256([]byte(r.cfg.StateDir))
	r.rootsDir = filepath.Join(defaultRootsBase, hex.EncodeToString(sum[:6]))
	u := r.cfg.UserNS
	if u == nil {
		return
	}
	if u.RootsDir == "" {
		u.RootsDir = r.rootsDir
	}
	r.rootsDir = u.RootsDir
	u.Budgets.setDefaults()
	r.slots = &slots{used: map[int]string{}, n: u.Slots}
	ents, _ := os.ReadDir(r.cfg.StateDir)
	for _, e := range ents {
		if slot, ok := readSlot(filepath.Join(r.cfg.StateDir, e.Name(), usernsFile)); ok && slot < u.Slots {
			r.slots.used[slot] = e.Name()
		}
	}
	if err := r.probeUserNS(ctx); err != nil {
		r.usernsErr = errdefs.Unavailable("this host cannot give sandboxes user namespaces with idmapped mounts (%v): they run without (corral up --no-userns makes that the configuration)", err)
		return
	}
	r.gvisorUnprivileged = true
}

func readSlot(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return n, err == nil && n >= 0
}

// probeUserNS makes the roots directory, a user namespace and an idmapped mount of StateDir's
// filesystem with it. (What else a Create needs, the owner's thread and the helper, fails that
// Create cleanly if it fails.)
func (r *Runtime) probeUserNS(ctx context.Context) error {
	dirs := []string{r.rootsDir}
	if filepath.Dir(r.rootsDir) == defaultRootsBase {
		dirs = []string{defaultRootsBase, r.rootsDir}
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	// A process stopped in a new user namespace before it runs anything (traced at its exec:
	// runc's way), which is enough to hold one for the idmapped mount.
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(r.cfg.UserNS.UIDBase), Size: UserNSSize}}
	proc, err := os.StartProcess("/proc/self/exe", []string{"corral-userns-probe"}, &os.ProcAttr{Sys: &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWUSER, UidMappings: m, GidMappings: m, Ptrace: true,
	}})
	if err != nil {
		return fmt.Errorf("make a user namespace: %w", err)
	}
	defer func() {
		proc.Kill()
		proc.Wait()
	}()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", proc.Pid))
	if err != nil {
		return err
	}
	defer ns.Close()
	fd, err := idmappedTree(r.cfg.StateDir, ns)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

// UserNSStatus says whether sandboxes get user namespaces: "" when on, else why not.
func (r *Runtime) UserNSStatus() string {
	switch {
	case r.cfg.UserNS == nil:
		return "corral up --no-userns"
	case r.usernsErr != nil:
		return r.usernsErr.Error()
	}
	return ""
}

// UserNS returns the configuration in use (defaults applied), or nil when sandboxes get no
// user namespace.
func (r *Runtime) UserNS() *UserNS {
	if r.cfg.UserNS == nil || r.usernsErr != nil {
		return nil
	}
	u := *r.cfg.UserNS
	return &u
}

func (r *Runtime) slotBase(slot int) uint32 {
	return r.cfg.UserNS.UIDBase + uint32(slot)*UserNSSize
}

// HostUID returns the host uid that sandbox id's root runs as: 0 without a user namespace.
func (r *Runtime) HostUID(id string) uint32 {
	if r.slots == nil {
		return 0
	}
	if slot, ok := r.slots.slotOf(id); ok {
		return r.slotBase(slot)
	}
	return 0
}

// rootDir is where id's rootfs is mounted when it has a user namespace. Known without
// Config.UserNS too, so that a Runtime started without them still deletes such sandboxes.
func (r *Runtime) rootDir(id string) string { return filepath.Join(r.rootsDir, id) }

// usernsHandle is a user namespace being set up for a sandbox: the helper process that holds
// it, and a descriptor of it.
type usernsHandle struct {
	cmd   *exec.Cmd
	stdin io.Closer
	ns    *os.File // /proc/<helper>/ns/user
	path  string   // the same, for runc to join while the helper lives
}

// close ends the helper; the namespace lives on while a process (the sandbox's) or a
// descriptor holds it.
func (h *usernsHandle) close() {
	h.ns.Close()
	h.stdin.Close()
	h.cmd.Process.Kill()
	h.cmd.Wait()
}

// startUserns makes a user namespace owned by host uid base that maps 0..UserNSSize-1 to
// base..base+UserNSSize-1 (uids and gids), with the inotify budgets set in it.
//
// The helper is usernsinit.HelperCmd of corral-runcd when it does it in C (r.nsHelper), else of
// agent, the agent binary's memfd.
func (r *Runtime) startUserns(ctx context.Context, base uint32, agent *os.File) (_ *usernsHandle, err error) {
	b := r.cfg.UserNS.Budgets
	bin, name := r.nsHelper, "corral-runcd"
	if bin == "" {
		bin, name = agentFDPath(agent), "corral-agent"
	}
	cmd := exec.CommandContext(ctx, bin, usernsinit.HelperCmd,
		"max_inotify_instances="+strconv.FormatInt(b.InotifyInstances, 10),
		"max_inotify_watches="+strconv.FormatInt(b.InotifyWatches, 10))
	cmd.Args[0] = name
	cmd.Env = []string{}
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: UserNSSize}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: m, GidMappings: m,
		// The sandbox's root sets its processes' supplementary groups (exec as another user).
		GidMappingsEnableSetgroups: true,
		// No Pdeathsig: it fires when the creating thread ends, which startAsOwner's does at
		// once. The helper ends when its standard input closes, with this process if need be.
		Setpgid: true,
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer inR.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		inW.Close()
		return nil, err
	}
	defer outR.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, outW
	err = startAsOwner(cmd, base)
	outW.Close()
	if err != nil {
		inW.Close()
		return nil, fmt.Errorf("start user namespace helper: %w", err)
	}
	h := &usernsHandle{cmd: cmd, stdin: inW}
	defer func() {
		if err != nil {
			h.stdin.Close()
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	line, rerr := bufio.NewReader(outR).ReadString('\n')
	if line != "ok\n" {
		return nil, fmt.Errorf("user namespace helper: %q %v", strings.TrimSpace(line), rerr)
	}
	h.path = "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user"
	if h.ns, err = os.Open(h.path); err != nil {
		return nil, fmt.Errorf("open user namespace: %w", err)
	}
	return h, nil
}

// startAsOwner starts cmd from a thread whose effective uid and gid are owner, so that the user
// namespace cmd's clone makes is owned by owner. The thread keeps its capabilities across the
// change (SECBIT_NO_SETUID_FIXUP), as writing cmd's id maps needs CAP_SETUID; it is locked and
// never unlocked, so Go ends it with the goroutine and no other goroutine runs with its ids.
func startAsOwner(cmd *exec.Cmd, owner uint32) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := becomeOwner(owner); err != nil {
			errc <- err
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// becomeOwner sets the calling thread's effective (and so file system) uid and gid to owner,
// keeping its capabilities. Preconditions: the thread is locked and never unlocked (Go then
// ends it with its goroutine).
func becomeOwner(owner uint32) error {
	const secbitNoSetuidFixup = 1 << 2
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, secbitNoSetuidFixup, 0, 0, 0); err != nil {
		return fmt.Errorf("keep capabilities: %w", err)
	}
	const keep = 0xFFFFFFFF // (uid_t)-1: leave as is
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(owner), keep); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(owner), keep); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	return nil
}

// idmap is what an idmapped overlay needs: the user namespace and its owner.
type idmap struct {
	ns    *os.File
	owner uint32
}

// idmappedTree returns a detached copy of the mount tree at path (not recursive), idmapped
// with the user namespace ns. Closing the descriptor frees it.
func idmappedTree(path string, ns *os.File) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("clone mount %s: %w", path, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		var st unix.Statfs_t
		fsType := "?"
		if unix.Statfs(path, &st) == nil {
			fsType = "0x" + strconv.FormatInt(int64(st.Type), 16)
		}
		return -1, fmt.Errorf("idmapped mount of %s (filesystem type %s): %w", path, fsType, err)
	}
	return fd, nil
}

// prepareRootDir makes <RootsDir>/<id>/rootfs, <id> owned by the sandbox's root.
func (r *Runtime) prepareRootDir(id string, base uint32) (string, error) {
	d := r.rootDir(id)
	if err := os.Mkdir(d, 0o700); err != nil {
		return "", fmt.Errorf("create root dir: %w", err)
	}
	if err := os.Chown(d, int(base), int(base)); err != nil {
		return "", fmt.Errorf("chown root dir: %w", err)
	}
	rootfs := filepath.Join(d, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return "", fmt.Errorf("create rootfs: %w", err)
	}
	return rootfs, nil
}

// removeRootsDir removes RootsDir when no sandbox is left in it.
func (r *Runtime) removeRootsDir() {
	if r.rootsDir != "" {
		os.Remove(r.rootsDir)
	}
}

// usernsSpec is what a sandbox's spec needs of its user namespace.
type usernsSpec struct {
	handle *usernsHandle
	path   string // the namespace to join
	rootfs string // the overlay's mount point
	owner  uint32 // the host uid and gid of the sandbox's root, the namespace's owner
	sysfs  string // a sysfs of the sandbox's network namespace, to bind at /sys; "": mount one
	// agentRlimits: the agent sets the sandbox's rlimits on itself (internal/rlimitenv), as runc
	// cannot from outside the namespace without CAP_SYS_RESOURCE.
	agentRlimits bool
}

// claimUserns takes a slot for id, records it in dir and makes its user namespace: one made
// ahead (usernspool.go) when there is one, else now with agent (the binary at agentPath, which
// the pool's refill then uses).
// Preconditions: id's lock is held and dir is id's; on error, destroy releases the slot.
func (r *Runtime) claimUserns(ctx context.Context, id, dir, agentPath string, agent *os.File) (*usernsHandle, uint32, error) {
	r.nsAgentPath.Store(agentPath)
	p, pooled := r.takePooledUserns(id, agentPath)
	slot := p.slot
	if !pooled {
		var err error
		if slot, err = r.slots.take(id); errors.Is(err, errdefs.ErrExhausted) {
			if p, pooled = r.awaitPooledUserns(ctx, id, agentPath); pooled {
				slot, err = p.slot, nil
			} else {
				// The wait may have freed one: a namespace of another agent binary, ended.
				slot, err = r.slots.take(id)
			}
		}
		if err != nil {
			return nil, 0, err
		}
	}
	// Only now: a refill kicked before this create held its slot could take the last free one.
	r.kickUserns()
	if err := os.WriteFile(filepath.Join(dir, usernsFile), []byte(strconv.Itoa(slot)+"\n"), 0o600); err != nil {
		if pooled {
			p.h.close()
		}
		return nil, 0, fmt.Errorf("record user namespace slot: %w", err)
	}
	base := r.slotBase(slot)
	if pooled {
		return p.h, base, nil
	}
	h, err := r.startUserns(ctx, base, agent)
	if err != nil {
		return nil, 0, err
	}
	return h, base, nil
}

// mountSysfsIn mounts a read-only sysfs at target as seen from the network namespace netns.
func mountSysfsIn(netns, target string) error {
	if err := os.Mkdir(target, 0o555); err != nil {
		return fmt.Errorf("create sysfs mount point: %w", err)
	}
	return overlayOnThread(func() error {
		f, err := os.Open(netns)
		if err != nil {
			return fmt.Errorf("open network namespace: %w", err)
		}
		defer f.Close()
		// The thread is never reused (overlayOnThread), so it may stay in netns.
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter network namespace %s: %w", netns, err)
		}
		fsfd, err := unix.Fsopen("sysfs", unix.FSOPEN_CLOEXEC)
		if err != nil {
			return fmt.Errorf("fsopen sysfs: %w", err)
		}
		defer unix.Close(fsfd)
		if err := unix.FsconfigCreate(fsfd); err != nil {
			return fmt.Errorf("create sysfs: %w%s", err, fsMessages(fsfd))
		}
		mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
		if err != nil {
			return fmt.Errorf("fsmount sysfs: %w", err)
		}
		defer unix.Close(mfd)
		if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("move sysfs mount to %s: %w", target, err)
		}
		return nil
	})
}

func (r *Runtime) budgets() Budgets {
	if r.cfg.UserNS == nil {
		return Budgets{}
	}
	return r.cfg.UserNS.Budgets
}

// initNSHelper has user namespaces made by corral-runcd's helper (cmd/corral-runcd's
// usernsinit.c: the same protocol, without a Go runtime's start, about 2 ms of CPU less per
// namespace) when Config.Runcd is set and makes one as a sandbox's would be made: as the first
// slot's uid, which must be able to execute it (a binary under a directory only root may
// search cannot be); else the agent's helper makes them.
func (r *Runtime) initNSHelper(ctx context.Context) {
	if r.cfg.Runcd == "" || r.UserNS() == nil {
		return
	}
	r.nsHelper = r.cfg.Runcd
	h, err := r.startUserns(ctx, r.slotBase(0), nil)
	if err != nil {
		r.nsHelper = ""
		r.log.Warn("user namespaces are made by the agent's helper, not corral-runcd's", "bin", r.cfg.Runcd, "err", err)
		return
	}
	h.close()
}

// agentFDPath is the path that executes the agent binary's memfd, valid in this process and,
// until it executes, in any child it forks.
func agentFDPath(agent *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(agent.Fd())) }

// asOwner runs fn on a thread of its own whose filesystem ids are owner's, so what fn makes in
// a tree idmapped with the sandbox's user namespace belongs to the sandbox's root (the host's
// root has no id inside, and the kernel refuses it with EOVERFLOW). The thread is never given
// back to the Go scheduler: it ends with fn's goroutine.
func asOwner(owner uint32, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread's ids stay changed until it exits
		if _, err := unix.SetfsgidRetGid(int(owner)); err != nil {
			errc <- fmt.Errorf("setfsgid: %w", err)
			return
		}
		if _, err := unix.SetfsuidRetUid(int(owner)); err != nil {
			errc <- fmt.Errorf("setfsuid: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
