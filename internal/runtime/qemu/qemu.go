package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guestimage"
	"github.com/corral-dev/corral/internal/inroot"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/runtime/cgroups"
	"github.com/corral-dev/corral/internal/runtime/diskscan"
	"github.com/corral-dev/corral/internal/vmguest"
	"github.com/corral-dev/corral/internal/vmlink"
)

// The accelerators a VM can run on.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// Defaults of Config.
const (
	DefaultQEMU        = "qemu-system-x86_64"
	DefaultUIDBase     = 0x70000000
	DefaultUIDCount    = 1 << 16
	DefaultBootTimeout = 2 * time.Minute
	// MinMemoryBytes is the least memory a VM gets: the kernel and the agent need about 100 MiB.
	MinMemoryBytes = 128 << 20
	// minDiskBytes is the least writable disk of a microvm (an ext4 with its journal).
	minDiskBytes = 64 << 20
	// MaxDevices bounds the virtio devices of one VM: QEMU 7.2's microvm has 24 transports,
	// but a guest with more than 16 stalled in tests (docs/microvm-notes.md §4).
	MaxDevices = 16
	// fixedDevices are the devices every VM has besides its layers: the writable disk, the
	// serial port's bus, the RNG and the network card.
	fixedDevices = 4
)

// Config configures a Runtime. Zero fields take the defaults.
type Config struct {
	// QEMU is the qemu-system-x86_64 binary (default: looked up in PATH); QEMUImg is qemu-img,
	// which makes the vm tier's overlay disks.
	QEMU, QEMUImg string
	// StateDir holds one directory per VM. Keep it short: <StateDir>/<id>/agent.sock must fit
	// in 107 bytes.
	StateDir string
	// KernelDir is the guest kernel laid out by scripts/guest-kernel.sh
	// (default guestimage.DefaultKernelDir); CacheDir holds the built initramfs files.
	KernelDir, CacheDir string
	// Accel is "kvm", "tcg" or "" (auto: KVM when a test boot under it succeeds, else TCG).
	Accel string
	// UIDBase and UIDCount give the range of host uids VMs run as, one per VM.
	UIDBase, UIDCount uint32
	// BootTimeout bounds a boot until the agent answers (default 2m: TCG on a loaded host).
	BootTimeout time.Duration
	// SparseDisks makes microvm disks sparse files instead of allocating their blocks when they
	// are made (runtime.Node.SparseDisks; runc's Config.SparseDisks says what that risks).
	SparseDisks bool
	// Mkfs is mkfs.ext4 (default: looked up in PATH, /usr/sbin and /sbin).
	Mkfs string
	// Debug asks the guest to log its boot to the console (console.log in the VM's directory).
	Debug bool
	// Templates starts new VMs from a snapshot of a template VM of their shape, once one is
	// built, instead of booting them (template.go).
	Templates bool
	// Off refuses new VMs; the Runtime still lists, serves and deletes the VMs it finds.
	Off bool
	// CgroupParent is where each VM's QEMU gets the cgroups <CgroupParent>/<id> (as a container
	// of the runc runtime would): its CPU quota, memory accounting and lazyd's attribution of
	// its reads. Empty: QEMU stays in the cgroups of the process that starts it.
	CgroupParent string
}

// Runtime runs sandboxes as QEMU microvm machines; see the package doc. It is safe for
// concurrent use.
type Runtime struct {
	cfg      Config
	disks    diskscan.Scanner // DiskAllocated's figures
	log      *slog.Logger
	err      error  // why VMs cannot be created here; nil when they can
	accel    string // the accelerator new VMs use
	accelWhy string // why that one (a warning when KVM was wanted but is not usable)
	version  string
	kernel   *guestimage.Kernel
	// machineErr is why vm sandboxes (MachineVM) cannot be created here besides err.
	machineErr error
	cg         *cgroups.Manager // nil: VMs get no cgroups of their own

	mu      sync.Mutex
	locks   map[string]*sync.Mutex   // per VM; protected by mu
	proxies map[string]*vmlink.Proxy // agent socket forwarders, by VM; protected by mu
	uids    map[uint32]string        // uids in use, to the VM; protected by mu
	images  map[string]imageEntry    // boot files by agent path; protected by mu
	// building holds the templates being built; protected by mu. builds counts their
	// goroutines, which ctx (cancelled by Close) ends.
	building map[string]bool
	// failedUntil holds templates that failed, not tried again until then; protected by mu.
	failedUntil map[string]time.Time
	// closed is set by Close; protected by mu.
	closed bool
	// waits holds, by pid, a channel closed once the wait for a vm's QEMU started by this
	// process has been handled (machineExited); protected by mu.
	waits  map[int]chan struct{}
	builds sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

type imageEntry struct {
	key fileKey
	img guestimage.Image
}

type fileKey struct {
	dev, ino   uint64
	size, mtim int64
}

// New prepares a Runtime. It never fails for a host that cannot run VMs: the Runtime then
// refuses creates with the reason (Available), and still lists and deletes what it finds.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Runtime, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.StateDir == "" {
		return nil, errdefs.Invalid("StateDir", "required")
	}
	if cfg.KernelDir == "" {
		cfg.KernelDir = guestimage.DefaultKernelDir
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(cfg.StateDir, ".boot")
	}
	if cfg.UIDBase == 0 {
		cfg.UIDBase = DefaultUIDBase
	}
	if cfg.UIDCount == 0 {
		cfg.UIDCount = DefaultUIDCount
	}
	if cfg.BootTimeout <= 0 {
		cfg.BootTimeout = DefaultBootTimeout
	}
	switch cfg.Accel {
	case "", AccelKVM, AccelTCG:
	default:
		return nil, errdefs.Invalid("Accel", "%q: want kvm, tcg or empty (auto)", cfg.Accel)
	}
	r := &Runtime{cfg: cfg, log: log.With("tier", "microvm"), locks: map[string]*sync.Mutex{},
		proxies: map[string]*vmlink.Proxy{}, uids: map[uint32]string{}, images: map[string]imageEntry{},
		building: map[string]bool{}, failedUntil: map[string]time.Time{}, waits: map[int]chan struct{}{}}
	r.ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	// Root's alone: QEMU opens no path in them (every file is a descriptor it is given).
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	os.Chmod(cfg.StateDir, 0o700)
	// The boot files in it are 0644, read by the VMs' own uids through descriptors; the
	// directory keeps every other host user out.
	if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
		return nil, err
	}
	os.Chmod(cfg.CacheDir, 0o700)
	r.removeTemplates()
	r.removeForkLeftovers()
	ids, err := r.List(ctx)
	if err != nil {
		return nil, err
	}
	inUse := map[string]bool{}
	for _, id := range ids {
		if st, err := r.readState(id); err == nil {
			r.uids[st.UID] = id
			for _, f := range st.Files {
				if f.Role == "initrd" || f.Role == "agent-disk" {
					inUse[f.Path] = true
				}
			}
		}
	}
	r.killOrphans(ids)
	// Initramfs files of earlier agent builds that no VM needs (a paused one restarts with its
	// own): built again on demand.
	old, _ := filepath.Glob(filepath.Join(cfg.CacheDir, "initrd-*.cpio.gz"))
	agents, _ := filepath.Glob(filepath.Join(cfg.CacheDir, "agent-*.img"))
	old = append(old, agents...)
	for _, p := range old {
		if !inUse[p] {
			os.Remove(p)
		}
	}
	// Also with the tiers off: VMs of an earlier run may still print.
	r.builds.Add(1)
	go r.capConsoles(r.ctx)
	if cfg.CgroupParent != "" {
		if r.cg, err = cgroups.NewManager(cfg.CgroupParent); err != nil {
			r.log.Warn("microvms get no cgroups of their own: CPU quotas are not enforced", "err", err)
		}
	}
	if cfg.Off {
		r.err = errdefs.Unavailable("the VM tiers are off (corral up --no-microvm)")
		return r, nil
	}
	r.err = r.probe(ctx)
	if r.err == nil {
		r.machineErr = r.probeMachine()
	}
	if r.err != nil {
		r.log.Warn("microvm sandboxes are unavailable on this node", "err", r.err)
	} else if r.accel == AccelTCG {
		r.log.Warn("microvm sandboxes run under TCG (software emulation): several times slower than KVM", "why", r.accelWhy)
	}
	return r, nil
}

// RuntimeName is what runtime.Spec.Runtime names for this backend: microvms, and with a
// BootDisk full machines (the vm tier).
const RuntimeName = "qemu"

// Factory builds the qemu backend (a runtime.Factory): opts is a *Config (nil: the defaults)
// whose node fields it sets from node: StateDir and CacheDir under node.DataDir (vms/,
// vmboot/), CgroupParent and SparseDisks.
func Factory(ctx context.Context, node runtime.Node, opts any, log *slog.Logger) (runtime.Runtime, error) {
	cfg, err := runtime.OptionsOf[Config](opts)
	if err != nil {
		return nil, err
	}
	cfg.StateDir = filepath.Join(node.DataDir, "vms")
	cfg.CacheDir = filepath.Join(node.DataDir, "vmboot")
	cfg.CgroupParent, cfg.SparseDisks = node.CgroupParent, node.SparseDisks
	r, err := New(ctx, *cfg, log)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// DiskHeld is DiskAllocated: a VM's disks are sparse, promised by their sandboxes' limits.
func (r *Runtime) DiskHeld() (promised, allocated int64) { return 0, r.DiskAllocated() }

// Runtimes is RuntimeName alone.
func (r *Runtime) Runtimes() []string { return []string{RuntimeName} }

// Available returns nil when VMs can be created here, else why not.
func (r *Runtime) Available(name string) error {
	if name != RuntimeName {
		return errdefs.Unavailable("qemu does not run %q", name)
	}
	return r.err
}

var (
	_ runtime.Runtime     = (*Runtime)(nil)
	_ runtime.Pauser      = (*Runtime)(nil)
	_ runtime.Snapshotter = (*Runtime)(nil)
	_ runtime.Forker      = (*Runtime)(nil)
	_ runtime.UsageReader = (*Runtime)(nil)
	_ runtime.Machine     = (*Runtime)(nil)
	_ runtime.DiskHolder  = (*Runtime)(nil)
)

// Accelerator returns the accelerator new VMs use and why it was chosen.
func (r *Runtime) Accelerator() (accel, why string) { return r.accel, r.accelWhy }

// Version returns QEMU's version line.
func (r *Runtime) Version() string { return r.version }

// probe finds QEMU, the guest kernel and mkfs.ext4, and chooses the accelerator.
func (r *Runtime) probe(ctx context.Context) error {
	q := r.cfg.QEMU
	if q == "" {
		q = DefaultQEMU
	}
	p, err := exec.LookPath(q)
	if err != nil {
		return fmt.Errorf("QEMU (%s) is not installed: run scripts/setup.sh: %w", q, errdefs.ErrUnavailable)
	}
	r.cfg.QEMU = p
	out, err := exec.CommandContext(ctx, p, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %v: %w", p, err, errdefs.ErrUnavailable)
	}
	r.version, _, _ = strings.Cut(string(out), "\n")
	if r.cfg.Mkfs == "" {
		for _, c := range []string{"mkfs.ext4", "/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
			if p, err := exec.LookPath(c); err == nil {
				r.cfg.Mkfs = p
				break
			}
		}
		if r.cfg.Mkfs == "" {
			return fmt.Errorf("mkfs.ext4 not found (install e2fsprogs): %w", errdefs.ErrUnavailable)
		}
	}
	k, err := guestimage.LoadKernel(r.cfg.KernelDir)
	if err != nil {
		return fmt.Errorf("guest kernel: %v: %w", err, errdefs.ErrUnavailable)
	}
	r.kernel = k
	r.accel, r.accelWhy = r.chooseAccel(ctx)
	if r.accel == "" {
		return fmt.Errorf("accelerator: %s: %w", r.accelWhy, errdefs.ErrUnavailable)
	}
	return nil
}

// chooseAccel picks KVM when /dev/kvm opens and the guest kernel boots under it within a
// short timeout (a nested or paravirtual KVM may open but hang a stock kernel), else TCG. With
// Config.Accel "kvm" a failure leaves no accelerator ("").
func (r *Runtime) chooseAccel(ctx context.Context) (string, string) {
	if r.cfg.Accel == AccelTCG {
		return AccelTCG, "configured"
	}
	why := ""
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		why = "/dev/kvm: " + err.Error()
	} else {
		f.Close()
		// The test boot takes up to 15 s when KVM hangs; its answer holds until the host, QEMU
		// or the kernel changes, so it is kept for this boot of the host (on /run).
		key := r.probeKey()
		if ok, cachedWhy, hit := readProbe(key); hit {
			if ok {
				return AccelKVM, "KVM booted the guest kernel (test boot remembered since host boot)"
			}
			why = cachedWhy + " (test boot remembered since host boot)"
		} else if err := r.bootProbe(ctx); err != nil {
			why = "KVM test boot: " + err.Error()
			writeProbe(key, false, why)
		} else {
			writeProbe(key, true, "")
			return AccelKVM, "KVM booted the guest kernel"
		}
	}
	if r.cfg.Accel == AccelKVM {
		return "", "configured kvm, but " + why
	}
	return AccelTCG, why
}

// probeFile keeps KVM test boot results for this boot of the host.
const probeFile = "/run/corral/kvm-probe.json"

// probeKey names what a test boot's answer depends on: QEMU, the guest kernel, the host kernel.
func (r *Runtime) probeKey() string {
	var uts unix.Utsname
	unix.Uname(&uts)
	fi, _ := os.Stat(r.kernel.Image)
	var size, mtime int64
	if fi != nil {
		size, mtime = fi.Size(), fi.ModTime().UnixNano()
	}
	return fmt.Sprintf("%s|%s|%d|%d|%s|%s", r.version, r.kernel.Image, size, mtime, unix.ByteSliceToString(uts.Release[:]), unix.ByteSliceToString(uts.Version[:]))
}

type probeResult struct {
	Key string `json:"key"`
	KVM bool   `json:"kvm"`
	Why string `json:"why,omitempty"`
}

// readProbe returns the remembered test boot for key, if any.
func readProbe(key string) (ok bool, why string, hit bool) {
	b, err := os.ReadFile(probeFile)
	if err != nil {
		return false, "", false
	}
	var p probeResult
	if json.Unmarshal(b, &p) != nil || p.Key != key {
		return false, "", false
	}
	return p.KVM, p.Why, true
}

// writeProbe remembers a test boot (best effort: without it the next start boots again).
func writeProbe(key string, ok bool, why string) {
	b, _ := json.Marshal(probeResult{Key: key, KVM: ok, Why: why})
	if os.MkdirAll(filepath.Dir(probeFile), 0o700) != nil {
		return
	}
	tmp := fmt.Sprintf("%s.%d", probeFile, os.Getpid())
	if os.WriteFile(tmp, b, 0o600) == nil {
		os.Rename(tmp, probeFile)
	}
}

// bootProbe boots the guest kernel alone under KVM: without a root filesystem it panics
// ("VFS: Unable to mount root fs"), which proves it ran. A hang is killed after 15 s.
func (r *Runtime) bootProbe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.cfg.QEMU, "-M", "microvm", "-accel", "kvm", "-cpu", "host", "-m", "128",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-kernel", r.kernel.Image, "-append", "console=ttyS0 panic=-1 pci=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	out, _ := cmd.CombinedOutput()
	if bytes.Contains(out, []byte("VFS:")) || bytes.Contains(out, []byte("Kernel panic")) {
		return nil
	}
	if ctx.Err() != nil {
		return errors.New("no kernel output within 15s")
	}
	return fmt.Errorf("QEMU exited: %s", tail(out, 300))
}

// vmState is <dir>/vm.json: what is needed to find, restart (resume) and delete the VM.
type vmState struct {
	ID  string `json:"id"`
	UID uint32 `json:"uid"`
	// Pid and PidStart (the process's start time, /proc/PID/stat field 22) identify the QEMU
	// process; 0 while paused.
	Pid      int    `json:"pid,omitempty"`
	PidStart uint64 `json:"pid_start,omitempty"`
	Accel    string `json:"accel"`
	// Args are QEMU's arguments; Files are opened again in this order for a restart, as the
	// descriptors 3, 4, ... that Args name.
	Args  []string  `json:"args"`
	Files []vmFile  `json:"files"`
	Netns string    `json:"netns,omitempty"`
	Since time.Time `json:"since"`
	// CPUs is the VM's CFS quota (its cgroup), which -smp rounds up to whole vCPUs.
	CPUs float64 `json:"cpus,omitempty"`
	// MemoryLimit is its cgroup's memory limit: the guest's memory plus QEMU's overhead
	// (qemuMemoryLimit); 0 (a VM made before it was set) is none.
	MemoryLimit int64 `json:"memory_limit,omitempty"`
	// FileLimit is QEMU's RLIMIT_FSIZE: the larger of the disk and the memory (plus the
	// migration stream's 8 bytes per page), plus 64 MiB.
	FileLimit int64 `json:"file_limit"`
	// Paused: the VM is a memory snapshot in snapshot.bin and no process runs.
	Paused bool `json:"paused,omitempty"`
	// Template names the template the VM was restored from; empty: it booted.
	Template string `json:"template,omitempty"`
	// Machine is MachineVM for a vm sandbox, empty for a microvm.
	Machine string `json:"machine,omitempty"`
	// Off: the vm is powered off (no process; its disk stays).
	Off bool `json:"off,omitempty"`
	// dir, when set, is where QEMU's log goes instead of the sandbox's directory (a template's).
	dir string
}

// vmFile is a file QEMU gets as a descriptor (3, 4, ... in vmState.Files order): QEMU opens no
// path of the host's itself, so it needs no access to the data directory.
type vmFile struct {
	// Role is layer, upper, upper-ro, volume, volume-fd-ro, volume-ro, tap, private-tap (a template's), kernel, initrd, config,
	// console, qmp or ctl; a vm's also disk-base, disk, disk-ro, agent-disk and machine-config.
	Role string `json:"role"`
	Path string `json:"path,omitempty"`
	// Serial is a disk's virtio-blk serial, by which the guest finds it.
	Serial string `json:"serial,omitempty"`
}

// open returns f's descriptor for a new QEMU process of st.
func (f vmFile) open(st *vmState) (*os.File, error) {
	switch f.Role {
	case "tap":
		return openTap(st.Netns)
	case "upper", "disk", "volume":
		return os.OpenFile(f.Path, os.O_RDWR|unix.O_CLOEXEC, 0)
	case "private-tap":
		return openPrivateTap()
	case "console":
		// QEMU reopens it through /proc/self/fd as its own uid.
		c, err := os.OpenFile(f.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, err
		}
		if err := c.Chown(int(st.UID), int(st.UID)); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	case "qmp", "ctl":
		// A listening socket QEMU accepts on (chardev socket fd=).
		os.Remove(f.Path)
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: f.Path, Net: "unix"})
		if err != nil {
			return nil, err
		}
		ln.SetUnlinkOnClose(false)
		defer ln.Close()
		return ln.File()
	default:
		return os.OpenFile(f.Path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	}
}

const (
	stateFile    = "vm.json"
	snapshotFile = "snapshot.bin"
	agentSocket  = "agent.sock"
	maxSocket    = 107
)

var idRE = lazyregexp.New(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

func (r *Runtime) dir(id string) string { return filepath.Join(r.cfg.StateDir, id) }

func (r *Runtime) lock(id string) func() {
	l := r.vmMutex(id)
	l.Lock()
	return l.Unlock
}

// tryLock is lock without waiting: ok is false when another call holds the VM.
func (r *Runtime) tryLock(id string) (unlock func(), ok bool) {
	l := r.vmMutex(id)
	if !l.TryLock() {
		return nil, false
	}
	return l.Unlock, true
}

func (r *Runtime) vmMutex(id string) *sync.Mutex {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		r.locks[id] = l
	}
	return l
}

func (r *Runtime) readState(id string) (*vmState, error) {
	b, err := os.ReadFile(filepath.Join(r.dir(id), stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.NotFound("sandbox %s has no VM", id)
	} else if err != nil {
		return nil, err
	}
	var st vmState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("sandbox %s: %s: %w", id, stateFile, err)
	}
	return &st, nil
}

func (r *Runtime) writeState(st *vmState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	p := filepath.Join(r.dir(st.ID), stateFile)
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return err
	}
	return syncFile(filepath.Dir(p))
}

// claim makes id a new VM: it takes the VM's lock (unlock releases it), a uid and the VM's
// directory. On error nothing is left and the lock is released; after it, a failed create calls
// abandon.
func (r *Runtime) claim(id string) (uid uint32, unlock func(), err error) {
	dir := r.dir(id)
	if sock := filepath.Join(dir, agentSocket); len(sock) > maxSocket {
		return 0, nil, errdefs.Invalid("ID", "agent socket path %s is %d bytes, over the %d-byte unix socket limit", sock, len(sock), maxSocket)
	}
	unlock = r.lock(id)
	if _, err := os.Lstat(dir); err == nil {
		unlock()
		return 0, nil, errdefs.Conflict("sandbox %s already exists", id)
	}
	if uid, err = r.allocUID(id); err != nil {
		unlock()
		return 0, nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		r.freeUID(id)
		unlock()
		return 0, nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	return uid, unlock, nil
}

// abandon removes what a failed create of VM id made (its lock held): the process, the
// directory, the uid.
func (r *Runtime) abandon(ctx context.Context, id string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := r.destroy(cctx, id); err != nil {
		r.log.Error("clean up failed create", "sandbox", id, "err", err)
	}
}

// Has reports whether id is a VM of this Runtime.
func (r *Runtime) Has(id string) bool {
	if !idRE.MatchString(id) {
		return false
	}
	_, err := os.Lstat(r.dir(id))
	return err == nil
}

// List returns the IDs of the VMs in StateDir, paused ones included.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(r.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && idRE.MatchString(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// allocUID reserves the lowest free uid of the range for id.
func (r *Runtime) allocUID(id string) (uint32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := uint32(0); i < r.cfg.UIDCount; i++ {
		u := r.cfg.UIDBase + i
		if _, used := r.uids[u]; !used {
			r.uids[u] = id
			return u, nil
		}
	}
	return 0, fmt.Errorf("all %d VM uids are in use: %w", r.cfg.UIDCount, errdefs.ErrExhausted)
}

func (r *Runtime) freeUID(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for u, owner := range r.uids {
		if owner == id {
			delete(r.uids, u)
		}
	}
}

// bootImage returns the kernel and initramfs for the agent at path, building the initramfs
// once per agent binary.
func (r *Runtime) bootImage(ctx context.Context, path string) (guestimage.Image, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return guestimage.Image{}, errdefs.Invalid("AgentPath", "%s: %v", path, err)
	}
	key := fileKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtim: st.Mtim.Nano()}
	r.mu.Lock()
	e, ok := r.images[path]
	r.mu.Unlock()
	if ok && e.key == key {
		return e.img, nil
	}
	img, err := guestimage.Build(ctx, r.kernel, path, r.cfg.CacheDir)
	if err != nil {
		return img, fmt.Errorf("build the guest's initramfs: %w", err)
	}
	r.mu.Lock()
	r.images[path] = imageEntry{key: key, img: img}
	r.mu.Unlock()
	return img, nil
}

// Create boots a VM for spec and returns once its agent answers; see the package doc.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (_ *runtime.Sandbox, err error) {
	if r.err != nil {
		return nil, r.err
	}
	if err := r.validate(&spec); err != nil {
		return nil, err
	}
	if spec.BootDisk != "" {
		return r.createMachine(ctx, spec)
	}
	// The guest refuses a volume path through a symlink too; checking the layers here makes
	// that a clear refusal before anything boots.
	for _, v := range spec.Volumes {
		if err := inroot.CheckLayers(spec.Lower, v.Path); err != nil {
			return nil, fmt.Errorf("volume at %s: %w", v.Path, err)
		}
	}
	// A boot that never answers (or a QEMU that hangs) ends here rather than holding the
	// sandbox in "creating".
	ctx, cancel := context.WithTimeout(ctx, r.cfg.BootTimeout+30*time.Second)
	defer cancel()
	id := spec.ID
	dir := r.dir(id)
	// A copy restored from a fork's memory runs its source's kernel and initramfs (fork.go).
	forked := spec.Fork != nil && spec.Fork.Memory
	var kernel, initrd string
	if forked {
		kernel, initrd, err = forkBootFiles(spec.Fork)
	} else {
		var img guestimage.Image
		img, err = r.bootImage(ctx, spec.AgentPath)
		kernel, initrd = img.Kernel, img.Initrd
	}
	if err != nil {
		return nil, err
	}
	uid, unlock, err := r.claim(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	defer func() {
		if err != nil {
			r.abandon(ctx, id)
		}
	}()
	upper := filepath.Join(dir, "upper.img")
	// makeUpper makes the writable disk: a copy of a fork's, else a new one.
	makeUpper := func(ctx context.Context) error {
		if spec.Fork != nil {
			return r.forkDisk(ctx, spec.Fork, upper)
		}
		return r.makeDisk(ctx, upper, spec.DiskBytes)
	}
	if err := makeUpper(ctx); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	gcfg, files, err := r.guestConfig(&spec, upper)
	if err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	cfgPath := filepath.Join(dir, "guest.json")
	b, _ := json.Marshal(gcfg)
	// QEMU reopens it through /proc/self/fd as the VM's uid: that uid's alone (it holds the env).
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := os.Chown(cfgPath, int(uid), int(uid)); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	files = append(files, vmFile{Role: "kernel", Path: kernel}, vmFile{Role: "initrd", Path: initrd},
		vmFile{Role: "config", Path: cfgPath}, vmFile{Role: "console", Path: filepath.Join(dir, "console.log")},
		vmFile{Role: "qmp", Path: filepath.Join(dir, "qmp.sock")}, vmFile{Role: "ctl", Path: filepath.Join(dir, "ctl.sock")})
	st := &vmState{ID: id, UID: uid, Accel: r.accel, Files: files, Netns: spec.Netns, Since: time.Now().UTC(), CPUs: spec.CPUs, MemoryLimit: qemuMemoryLimit(spec.MemoryBytes, r.accel, tcgCacheMiB, 0),
		FileLimit: max(spec.DiskBytes, spec.MemoryBytes+spec.MemoryBytes/256) + 64<<20}
	st.Args = r.args(&spec, files, false)
	if forked && !sameShape(st.Args, filesOf(spec.Fork).source.Args) {
		return nil, fmt.Errorf("create sandbox %s: its VM would differ from its fork's source %s (memory, vCPUs, layers, network card or accelerator), which its memory image needs: %w", id, spec.Fork.Source, errdefs.ErrConflict)
	}
	if err := r.writeState(st); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if forked {
		if err := r.restoreFork(ctx, st, spec.Fork, gcfg); err != nil {
			return nil, fmt.Errorf("create sandbox %s: %w", id, err)
		}
		r.log.Info("microvm restored from a fork", "sandbox", id, "source", spec.Fork.Source, "accel", st.Accel, "pid", st.Pid, "uid", st.UID)
		return r.sandbox(st), nil
	}
	key := ""
	// A template's VMs share its devices: a VM with volumes has devices of its own, so it boots.
	if (r.cfg.Templates || spec.Template) && len(spec.Volumes) == 0 {
		key = r.templateKey(&spec, files)
	}
	if snap := r.templateSnapshot(key); key != "" && snap != "" {
		st.Template = key
		if err := r.restoreTemplate(ctx, st, snap, gcfg); err != nil {
			// Boot instead, and drop the template for a while.
			r.log.Error("restore a microvm from its template failed; booting it", "sandbox", id, "template", key, "err", err)
			r.templateFailed(key)
			if kerr := kill(ctx, st); kerr != nil {
				return nil, fmt.Errorf("create sandbox %s: %w", id, errors.Join(err, kerr))
			}
			st.Template, st.Pid, st.PidStart = "", 0, 0
		}
	}
	if st.Template == "" {
		if err := r.start(ctx, st, false); err != nil {
			return nil, fmt.Errorf("create sandbox %s: %w", id, err)
		}
	}
	if err := r.recordAccel(ctx, st); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w%s%s", id, err, r.qemuLogTail(id), r.consoleTail(id))
	}
	if err := r.awaitBoot(ctx, st, upper, makeUpper); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if key != "" && st.Template == "" {
		r.kickTemplate(key, spec, files)
	}
	r.log.Info("microvm started", "sandbox", id, "accel", st.Accel, "template", st.Template, "pid", st.Pid, "uid", st.UID)
	return r.sandbox(st), nil
}

func (r *Runtime) validate(spec *runtime.Spec) error {
	if !idRE.MatchString(spec.ID) {
		return errdefs.Invalid("ID", "%q: want 1-64 of [A-Za-z0-9_.-], starting with a letter or digit", spec.ID)
	}
	if spec.Runtime != "" && spec.Runtime != RuntimeName {
		return errdefs.Invalid("Runtime", "%q: this backend runs %q", spec.Runtime, RuntimeName)
	}
	if spec.BootDisk != "" {
		return r.validateMachine(spec)
	}
	if spec.Calls {
		return errdefs.Invalid("Calls", "calls run in containers, not VMs")
	}
	if len(spec.Images) == 0 {
		return errdefs.Invalid("Images", "a VM needs at least one layer image")
	}
	if spec.Fork != nil && filesOf(spec.Fork) == nil {
		return errdefs.Invalid("Fork", "the fork image of %s was not taken by the qemu backend", spec.Fork.Source)
	}
	if spec.Fork != nil && len(spec.Volumes) > 0 {
		return errdefs.Invalid("Volumes", "a fork's copy has no volumes")
	}
	n := fixedDevices + len(spec.Volumes)
	for _, l := range spec.Images {
		n += 1 + len(l.Devices)
	}
	if n > MaxDevices {
		return errdefs.Invalid("layers", "%d layers and %d volumes need %d virtio devices with the VM's own, over the %d a VM may have: use fewer layers (a split layer takes two) or volumes",
			len(spec.Images), len(spec.Volumes), n, MaxDevices)
	}
	for _, v := range spec.Volumes {
		if err := runtime.CheckVolumePath("volumes.path", v.Path); err != nil {
			return err
		}
	}
	// The limits come resolved by admission (internal/limits, whose microvm minimums are these);
	// one below what a VM can boot with is the caller's bug, not the user's.
	if err := checkLimits(spec, MinMemoryBytes, minDiskBytes); err != nil {
		return err
	}
	if spec.Netns != "" && (!spec.Addr.Is4() || !spec.Gateway.Is4()) {
		return errdefs.Invalid("Addr", "a VM with a network namespace needs its IPv4 address and gateway")
	}
	return nil
}

// checkLimits checks the invariants of a spec's limits: resolved (none zero) and no less than
// the VM can run with.
func checkLimits(spec *runtime.Spec, minMemory, minDisk int64) error {
	switch {
	case !(spec.CPUs > 0):
		return fmt.Errorf("spec of %s: CPUs %v is not a resolved limit", spec.ID, spec.CPUs)
	case spec.MemoryBytes < minMemory:
		return fmt.Errorf("spec of %s: MemoryBytes %d is not a resolved limit (a VM needs at least %d MiB)", spec.ID, spec.MemoryBytes, minMemory>>20)
	case spec.DiskBytes < minDisk:
		return fmt.Errorf("spec of %s: DiskBytes %d is not a resolved limit (want at least %d MiB)", spec.ID, spec.DiskBytes, minDisk>>20)
	case spec.Pids <= 0 || spec.OpenFiles == 0:
		return fmt.Errorf("spec of %s: Pids %d, OpenFiles %d are not resolved limits", spec.ID, spec.Pids, spec.OpenFiles)
	}
	return nil
}

// makeDisk makes the VM's writable disk: a file of size bytes (its size is the limit), its blocks
// allocated unless Config.SparseDisks (as a runc sandbox's, see runc's disk.go), formatted ext4
// on the host, so the guest mounts it at once.
func (r *Runtime) makeDisk(ctx context.Context, path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if r.cfg.SparseDisks {
		err = f.Truncate(size)
	} else {
		err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	}
	f.Close()
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("allocate a %d-byte disk: the host filesystem of %s is full: %w", size, r.cfg.StateDir, errdefs.ErrNodeFull)
	}
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	out, err := exec.CommandContext(ctx, r.cfg.Mkfs, "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("disk: mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// guestConfig is what the guest's init reads (vmguest.Config) and the files QEMU gets.
func (r *Runtime) guestConfig(spec *runtime.Spec, upper string) (*vmguest.Config, []vmFile, error) {
	c := &vmguest.Config{
		Hostname:    spec.Hostname,
		Env:         spec.Env,
		AgentArgs:   guestAgentArgs(spec.AgentArgs),
		UpperSerial: "upper",
		Pids:        spec.Pids,
		OpenFiles:   spec.OpenFiles,
		ShmBytes:    spec.ShmBytes,
	}
	c.Hostname = guestHostname(spec)
	var files []vmFile
	for i, l := range spec.Images {
		gl := vmguest.Layer{Serial: "l" + strconv.Itoa(i)}
		files = append(files, vmFile{Role: "layer", Path: l.Image, Serial: gl.Serial})
		for j, d := range l.Devices {
			serial := gl.Serial + "d" + strconv.Itoa(j)
			gl.Devices = append(gl.Devices, serial)
			files = append(files, vmFile{Role: "layer", Path: d, Serial: serial})
		}
		c.Layers = append(c.Layers, gl)
	}
	// QEMU looks in a disk's fd set for a descriptor of the access mode it opens with, and it
	// opens the writable disk both read-only (to probe it) and read-write.
	files = append(files, vmFile{Role: "upper", Path: upper, Serial: c.UpperSerial}, vmFile{Role: "upper-ro", Path: upper, Serial: c.UpperSerial})
	// Volumes: a read-write one as the writable disk (both access modes in its fd set), a
	// read-only one as a layer (readonly=on).
	for i, v := range spec.Volumes {
		gv := vmguest.Volume{Serial: "v" + strconv.Itoa(i), Path: v.Path, ReadOnly: v.ReadOnly}
		if v.ReadOnly {
			files = append(files, vmFile{Role: "volume-ro", Path: v.Image, Serial: gv.Serial})
		} else {
			files = append(files, vmFile{Role: "volume", Path: v.Image, Serial: gv.Serial}, vmFile{Role: "volume-fd-ro", Path: v.Image, Serial: gv.Serial})
		}
		c.Volumes = append(c.Volumes, gv)
	}
	c.Workdir = spec.Workdir
	if spec.Netns != "" {
		files = append(files, vmFile{Role: "tap"})
		c.Net = &vmguest.Net{MAC: guestMAC, Address: spec.Addr.String() + "/30", Gateway: spec.Gateway.String()}
	}
	var err error
	if c.ResolvConf, err = readResolvConf(spec); err != nil {
		return nil, nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	return c, files, nil
}

// guestHostname is the VM's hostname: the spec's, else its ID (cut to 63 bytes).
func guestHostname(spec *runtime.Spec) string {
	if spec.Hostname != "" {
		return spec.Hostname
	}
	return spec.ID[:min(len(spec.ID), 63)]
}

// readResolvConf returns the content of the spec's resolv.conf (the edge's resolver), which the
// guest writes itself: "" without one.
func readResolvConf(spec *runtime.Spec) (string, error) {
	if spec.ResolvConf == "" {
		return "", nil
	}
	b, err := os.ReadFile(spec.ResolvConf)
	if err != nil {
		return "", fmt.Errorf("resolv.conf: %w", err)
	}
	return string(b), nil
}

// recordAccel asks a VM's QEMU, just started, what really runs it (QMP query-kvm) and records
// that; an error means its monitor does not answer.
func (r *Runtime) recordAccel(ctx context.Context, st *vmState) error {
	q, err := dialQMP(ctx, filepath.Join(r.dir(st.ID), "qmp.sock"))
	if err != nil {
		return err
	}
	accel, aerr := q.accelerator(ctx)
	q.Close()
	if aerr == nil && accel != st.Accel {
		st.Accel = accel
		r.writeState(st)
	}
	return nil
}

// guestAgentArgs are the agent's serve flags in the guest: it serves on the virtio-serial port,
// never on an inherited descriptor or a path.
func guestAgentArgs(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--fd" || a == "--listen":
			i++
		case strings.HasPrefix(a, "--fd=") || strings.HasPrefix(a, "--listen="):
		default:
			out = append(out, a)
		}
	}
	return out
}

// guestMAC is every VM's MAC address. Each VM is alone on the bridge of its own network
// namespace, so they need not differ, and a VM restored from a template keeps the template's
// (virtio-net migrates it).
const guestMAC = "52:54:00:c0:44:01"

// args is QEMU's command line for the VM; files are the descriptors 3, 4, ... in order. A
// template's differs from its sandboxes' only in its name.
func (r *Runtime) args(spec *runtime.Spec, files []vmFile, template bool) []string {
	mib := spec.MemoryBytes >> 20
	cpus := int(math.Ceil(spec.CPUs))
	if cpus < 1 {
		cpus = 1
	}
	cmdline := "console=ttyS0 panic=-1 quiet pci=off"
	name := "corral-" + spec.ID
	if template {
		name = "corral-template"
	}
	a := []string{"-name", name, "-M", "microvm"}
	if r.accel == AccelKVM {
		a = append(a, "-accel", "kvm", "-cpu", "host")
	} else {
		// microvm has no HPET or ACPI PM timer: under TCG the TSC calibration against the PIT
		// can fail and hang the boot (docs/microvm-notes.md §1).
		// The translation cache is bounded (QEMU's default reserves 1 GiB and fills it over a
		// long run), so that QEMU fits its memory cgroup (qemuMemoryLimit).
		a = append(a, "-accel", "tcg,thread=multi,tb-size="+strconv.Itoa(tcgCacheMiB))
		// tsc=reliable: with no other timer to check the TSC against, the guest kernel would
		// keep it unverified and run on refined-jiffies, a clock of 4 ms steps. Clock reads
		// then repeat, and whatever draws on them collides: glibc's resolver gave its A and
		// AAAA queries the same ID from two equal readings, so one answer was taken for the
		// other and the name did not resolve (TestRedTeamNetwork's microvm failures).
		cmdline += " tsc_early_khz=2000000 tsc=reliable"
	}
	if r.cfg.Debug {
		cmdline += " corral.debug"
	}
	a = append(a, "-m", strconv.FormatInt(mib, 10), "-smp", strconv.Itoa(cpus),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-append", cmdline,
		"-object", "rng-random,id=rng,filename=/dev/urandom", "-device", "virtio-rng-device,rng=rng",
		"-device", "virtio-serial-device")
	for i, f := range files {
		fd := strconv.Itoa(3 + i)
		self := "/proc/self/fd/" + fd
		switch f.Role {
		case "upper-ro", "volume-fd-ro":
			a = append(a, "-add-fd", "fd="+fd+",set="+strconv.Itoa(i))
		case "layer", "upper", "volume", "volume-ro":
			set := strconv.Itoa(i + 1)
			// No image locks: each file is this VM's alone or read-only, as the runtime
			// arranges, and a restore's activation of the disk trips over QEMU's own lock on
			// the fd set's other descriptor.
			drive := "id=" + f.Serial + ",file=/dev/fdset/" + set + ",if=none,format=raw,file.locking=off"
			switch f.Role {
			case "upper":
				// The disk's blocks are allocated when it is made (makeDisk): a guest's discard
				// must not punch them out again, or its later writes would need blocks the host
				// may no longer have (QEMU then stops the VM on ENOSPC).
				discard := "ignore"
				if r.cfg.SparseDisks {
					discard = "unmap"
				}
				drive += ",discard=" + discard + ",aio=threads"
			case "volume":
				drive += ",aio=threads" // no discard: a volume's blocks stay allocated (its size is charged)
			default:
				drive += ",readonly=on"
			}
			a = append(a, "-add-fd", "fd="+fd+",set="+set, "-drive", drive,
				"-device", "virtio-blk-device,drive="+f.Serial+",serial="+f.Serial)
		case "tap", "private-tap":
			a = append(a, "-netdev", "tap,id=net0,fd="+fd, "-device", "virtio-net-device,netdev=net0,mac="+guestMAC)
		case "kernel":
			a = append(a, "-kernel", self)
		case "initrd":
			a = append(a, "-initrd", self)
		case "config":
			a = append(a, "-fw_cfg", "name="+vmguest.ConfigFwCfg+",file="+self)
		case "console":
			a = append(a, "-chardev", "file,id=con,append=on,path="+self, "-serial", "chardev:con")
		case "qmp":
			a = append(a, "-chardev", "socket,id=qmp,fd="+fd+",server=on,wait=off", "-mon", "chardev=qmp,mode=control")
		case "ctl":
			a = append(a, "-chardev", "socket,id=ctl,fd="+fd+",server=on,wait=off",
				"-device", "virtserialport,chardev=ctl,name="+vmguest.PortName)
		}
	}
	// QEMU's own seccomp filter, on top of running as an unprivileged uid of its own.
	a = append(a, "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	return a
}

// start runs QEMU for st (as st.UID, in a session of its own so that it outlives a restart of
// corral), incoming a migration when restore is set. It records the process in st.
func (r *Runtime) start(ctx context.Context, st *vmState, restore bool) error {
	dir := r.dir(st.ID)
	if st.dir != "" {
		dir = st.dir
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	// The console log is appended to across QEMU runs (resumes, power cycles); past consoleKeep
	// it moves to console.log.1 (replacing the one before), so two runs' worth stay at most.
	if c := filepath.Join(dir, "console.log"); fileSize(c) > consoleKeep {
		os.Rename(c, c+".1")
	}
	for _, vf := range st.Files {
		f, err := vf.open(st)
		if err != nil {
			return fmt.Errorf("%s: %w", vf.Role, err)
		}
		files = append(files, f)
	}
	// Appended to, so a resume keeps what the earlier process said.
	logf, err := os.OpenFile(filepath.Join(dir, "qemu.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- %s: QEMU starts (restore %v)\n", time.Now().UTC().Format(time.RFC3339), restore)
	args := st.Args
	if restore {
		args = append(slices.Clone(args), "-incoming", "defer")
	}
	cmd := exec.Command(r.cfg.QEMU, args...)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = files
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setsid: true,
		// A network namespace of its own (loopback only: the guest's card is the tap, a
		// descriptor) and an IPC namespace: a guest that broke into QEMU reaches no host
		// socket and leaves no IPC object for the next owner of the uid.
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC,
		Credential: &syscall.Credential{Uid: st.UID, Gid: st.UID, Groups: []uint32{}},
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start QEMU: %w", err)
	}
	pid := cmd.Process.Pid
	// Reap it when it ends while this process runs; after a restart of corral, init does. A vm
	// whose QEMU exits cleanly of itself was powered off by its guest.
	handled := make(chan struct{})
	r.mu.Lock()
	r.waits[pid] = handled
	r.mu.Unlock()
	go func() {
		err := cmd.Wait()
		if st.Machine == MachineVM {
			r.machineExited(st.ID, pid, err == nil)
		}
		close(handled)
		r.mu.Lock()
		delete(r.waits, pid)
		r.mu.Unlock()
	}()
	// Every file QEMU writes (the disk, the snapshot, the console log a guest could flood)
	// stays within FileLimit; no core dumps.
	unix.Prlimit(pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: uint64(st.FileLimit), Max: uint64(st.FileLimit)}, nil)
	unix.Prlimit(pid, unix.RLIMIT_CORE, &unix.Rlimit{}, nil)
	// The uid is this VM's alone, so this bounds its threads (vCPUs, I/O workers).
	unix.Prlimit(pid, unix.RLIMIT_NPROC, &unix.Rlimit{Cur: 512, Max: 512}, nil)
	start, err := procStart(pid)
	if err != nil {
		unix.Kill(pid, unix.SIGKILL)
		return fmt.Errorf("QEMU exited at once:%s", fileTail(filepath.Join(dir, "qemu.log"), "qemu"))
	}
	if r.cg != nil && st.dir == "" {
		if err := r.cg.Join(st.ID, pid, st.CPUs, 0, st.MemoryLimit); err != nil {
			unix.Kill(pid, unix.SIGKILL)
			return fmt.Errorf("QEMU's cgroup: %w", err)
		}
	}
	st.Pid, st.PidStart = pid, start
	if st.dir != "" {
		return nil
	}
	return r.writeState(st)
}

// tcgCacheMiB is the TCG translation cache of a VM under TCG.
const tcgCacheMiB = 128

// qemuMemoryLimit is the memory cgroup limit of a VM with guest bytes of memory: the guest's
// RAM (all of it may become resident), QEMU's own heap, device buffers and I/O threads (64 MiB
// plus 1/32 of the guest for its page tables and dirty bitmaps), extra (a vm's firmware and
// display) and, under TCG, the translation cache of tcgMiB. Past it the kernel reclaims QEMU's
// page cache first (its disk reads and writes), then kills QEMU: the VM ends and its sandbox
// fails, and the host's memory stays bounded.
func qemuMemoryLimit(guest int64, accel string, tcgMiB int, extra int64) int64 {
	n := guest + guest/32 + 64<<20 + extra
	if accel == AccelTCG {
		n += int64(tcgMiB) << 20
	}
	return n
}

// consoleKeep is the size past which a VM's console log is rotated when QEMU starts.
const consoleKeep = 8 << 20

// consoleCap bounds a VM's console log within one QEMU run: past it, its last consoleCap/2
// bytes move to console.log.1 and console.log starts again, so the two files hold at most
// 1.5×consoleCap (plus what a guest prints within consoleCheck). QEMU appends (O_APPEND), so
// its next write lands at the start of the emptied file.
const (
	consoleCap   = 8 << 20
	consoleCheck = 500 * time.Millisecond
)

// capConsoles keeps every VM's console log within consoleCap until ctx ends. builds counts it.
func (r *Runtime) capConsoles(ctx context.Context) {
	defer r.builds.Done()
	t := time.NewTicker(consoleCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		logs, _ := filepath.Glob(filepath.Join(r.cfg.StateDir, "*", "console.log"))
		for _, c := range logs {
			if fileSize(c) > consoleCap {
				if err := capConsole(c, consoleCap/2); err != nil {
					r.log.Warn("cap a VM's console log", "path", c, "err", err)
				}
			}
		}
	}
}

// capConsole moves the last keep bytes of the console log at path to path.1 and empties path.
// What QEMU writes between the copy and the truncation is lost (a few bytes of a flood).
func capConsole(path string, keep int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	tail := make([]byte, min(keep, fi.Size()))
	if _, err := f.ReadAt(tail, fi.Size()-int64(len(tail))); err != nil {
		return err
	}
	if err := os.WriteFile(path+".1.tmp", tail, 0o600); err != nil {
		return err
	}
	if err := os.Rename(path+".1.tmp", path+".1"); err != nil {
		return err
	}
	return f.Truncate(0)
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// procStart returns the start time of pid (field 22 of /proc/PID/stat), which tells a process
// from a later one with a recycled pid.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("bad stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, errors.New("bad stat")
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, errors.New("exited")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether st's QEMU process still runs.
func alive(st *vmState) bool {
	if st.Pid == 0 {
		return false
	}
	s, err := procStart(st.Pid)
	return err == nil && s == st.PidStart
}

// awaitBoot waits for a new VM's agent. A boot takes seconds, even under TCG on a loaded host; a
// cold boot (not a template's restore) whose agent has not answered in half the boot timeout is
// taken as hung in the guest and tried once more from the start, on a new writable disk (made
// by makeUpper), with what is left of the timeout. The first boot's console goes to the log.
func (r *Runtime) awaitBoot(ctx context.Context, st *vmState, upper string, makeUpper func(context.Context) error) error {
	if st.Template != "" {
		return r.waitAgent(ctx, st, r.cfg.BootTimeout)
	}
	first := r.cfg.BootTimeout / 2
	err := r.waitAgent(ctx, st, first)
	if !errors.Is(err, errAgentSilent) || ctx.Err() != nil {
		return err
	}
	r.log.Warn("a microvm's agent did not answer; booting it again", "sandbox", st.ID, "after", first, "console", r.consoleTail(st.ID))
	if err := kill(ctx, st); err != nil {
		return err
	}
	st.Pid, st.PidStart = 0, 0
	if err := os.Remove(upper); err != nil {
		return fmt.Errorf("boot again: %w", err)
	}
	if err := makeUpper(ctx); err != nil {
		return fmt.Errorf("boot again: %w", err)
	}
	if err := r.start(ctx, st, false); err != nil {
		return fmt.Errorf("boot again: %w", err)
	}
	if err := r.recordAccel(ctx, st); err != nil {
		return fmt.Errorf("boot again: %w%s%s", err, r.qemuLogTail(st.ID), r.consoleTail(st.ID))
	}
	return r.waitAgent(ctx, st, r.cfg.BootTimeout-first)
}

// errAgentSilent is waitAgent's error when QEMU runs but its guest's agent never answered.
var errAgentSilent = errors.New("the VM's agent did not answer")

// waitAgent waits until the agent answers through the VM's agent socket, or QEMU exits, or
// timeout passes (errAgentSilent).
func (r *Runtime) waitAgent(ctx context.Context, st *vmState, timeout time.Duration) error {
	if _, err := r.proxy(st.ID); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := agentrpc.NewClient(filepath.Join(r.dir(st.ID), agentSocket))
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Ping(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		if !alive(st) {
			return fmt.Errorf("the VM stopped before its agent answered:%s%s", r.qemuLogTail(st.ID), r.consoleTail(st.ID))
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w within %s (last: %v):%s", errAgentSilent, timeout, err, r.consoleTail(st.ID))
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// proxy returns the VM's agent socket forwarder, starting it if needed.
func (r *Runtime) proxy(id string) (*vmlink.Proxy, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.proxies[id]; p != nil {
		return p, nil
	}
	if r.closed {
		return nil, errdefs.Unavailable("the VM runtime is closed")
	}
	dir := r.dir(id)
	sock := filepath.Join(dir, agentSocket)
	os.Remove(sock)
	p, err := vmlink.NewProxy(sock, filepath.Join(dir, "ctl.sock"), r.log.With("sandbox", id))
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	r.proxies[id] = p
	return p, nil
}

func (r *Runtime) closeProxy(id string) {
	r.mu.Lock()
	p := r.proxies[id]
	delete(r.proxies, id)
	r.mu.Unlock()
	if p != nil {
		p.Close()
	}
}

func (r *Runtime) sandbox(st *vmState) *runtime.Sandbox {
	dir := r.dir(st.ID)
	return &runtime.Sandbox{ID: st.ID, Pid: st.Pid, AgentSocket: filepath.Join(dir, agentSocket), Dir: dir,
		AgentLog: filepath.Join(dir, "console.log"), Accelerator: st.Accel, Template: st.Template}
}

// Open returns a VM that exists (after a restart of corral, for one that outlived it) and
// makes its agent socket answer again.
func (r *Runtime) Open(ctx context.Context, id string) (*runtime.Sandbox, error) {
	if !idRE.MatchString(id) {
		return nil, errdefs.Invalid("ID", "%q is not a sandbox ID", id)
	}
	unlock := r.lock(id)
	defer unlock()
	st, err := r.readState(id)
	if err != nil {
		return nil, err
	}
	if _, err := r.proxy(id); err != nil {
		return nil, err
	}
	return r.sandbox(st), nil
}

// Status reports the VM's state; MemoryBytes is QEMU's resident memory (the guest's RAM it
// has touched, plus QEMU's own).
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Status, error) {
	st, err := r.readState(id)
	if err != nil {
		return runtime.Status{}, err
	}
	switch {
	case st.Paused:
		return runtime.Status{State: runtime.StatePaused}, nil
	case st.Off:
		return runtime.Status{State: runtime.StateOff}, nil
	case alive(st):
		s := runtime.Status{State: runtime.StateRunning, Pid: st.Pid, MemoryBytes: rss(st.Pid)}
		if r.frozen(id) {
			s.State = runtime.StatePaused
		}
		return s, nil
	case st.Machine == MachineVM:
		// Its QEMU exited since the state was read: a clean exit was the guest powering off,
		// recorded by machineExited (waited for when it has not run yet).
		r.exitHandled(st.Pid)
		if r.machineGone(id) {
			return runtime.Status{State: runtime.StateOff}, nil
		}
	}
	return runtime.Status{State: runtime.StateStopped}, nil
}

// frozen reports whether the VM's vCPUs were stopped (Freeze, or a pause under way) and not
// let run again: the marker file is written before the QMP stop.
func (r *Runtime) frozen(id string) bool {
	_, err := os.Stat(filepath.Join(r.dir(id), "frozen"))
	return err == nil
}

// rss returns the resident memory of pid in bytes (0 if unknown).
func rss(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Delete stops the VM and removes everything it had: the process (and with it its tap), its
// agent socket forwarder, its directory (disk, snapshot, sockets, logs) and its uid. Deleting
// an unknown sandbox is not an error.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if !idRE.MatchString(id) {
		return errdefs.Invalid("ID", "%q is not a sandbox ID", id)
	}
	unlock := r.lock(id)
	defer unlock()
	return r.destroy(ctx, id)
}

// Kill ends sandbox id's QEMU process and returns once it is gone; its directory, cgroup and
// uid stay until Delete (the edge kills a deleted sandbox before it answers, and removes the
// rest off the request's path).
func (r *Runtime) Kill(ctx context.Context, id string) error {
	if !idRE.MatchString(id) {
		return errdefs.Invalid("ID", "%q is not a sandbox ID", id)
	}
	unlock := r.lock(id)
	defer unlock()
	st, err := r.readState(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	return kill(ctx, st)
}

func (r *Runtime) destroy(ctx context.Context, id string) error {
	r.closeProxy(id)
	var errs []error
	if st, err := r.readState(id); err == nil {
		if err := kill(ctx, st); err != nil {
			errs = append(errs, err)
		}
	}
	if r.cg != nil {
		if err := r.cg.Remove(id, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(r.dir(id)); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		r.freeUID(id)
		r.mu.Lock()
		delete(r.locks, id)
		r.mu.Unlock()
	}
	return errors.Join(errs...)
}

// kill ends st's QEMU process (SIGKILL through a pidfd, so a recycled pid is never hit) and
// waits until it is gone.
func kill(ctx context.Context, st *vmState) error {
	if !alive(st) {
		return nil
	}
	fd, err := unix.PidfdOpen(st.Pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil // gone already
	} else if err != nil {
		return fmt.Errorf("kill QEMU %d: %w", st.Pid, err)
	}
	defer unix.Close(fd)
	if !alive(st) {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill QEMU %d: %w", st.Pid, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The pidfd becomes readable when the process exits.
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pfd, 100)
		if n > 0 {
			// Exited; it may still be a zombie until its parent reaps it, which is fine.
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("QEMU %d did not exit after SIGKILL", st.Pid)
		}
	}
}

// UpperDir: a VM's writable layer is a disk inside the guest, not a host directory.
func (r *Runtime) UpperDir(id string) (string, error) {
	return "", errdefs.Invalid("sandbox", "%s is a VM: its writable layer is a disk inside the VM; layer snapshots of VMs are not supported", id)
}

func tail(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// consoleTail and qemuLogTail quote the end of the guest's console and QEMU's own log for an
// error message.
func (r *Runtime) consoleTail(id string) string { return r.fileTail(id, "console.log", "console") }
func (r *Runtime) qemuLogTail(id string) string { return r.fileTail(id, "qemu.log", "qemu") }

func (r *Runtime) fileTail(id, name, what string) string {
	return fileTail(filepath.Join(r.dir(id), name), what)
}

func fileTail(path, what string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const n = 1500
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(fi.Size()-n, 0)
	}
	b := make([]byte, n)
	k, _ := f.Read(b)
	t := tail(b[:k], n)
	if t == "" {
		return ""
	}
	return "\n--- " + what + " (end) ---\n" + t
}

// Close stops the agent socket forwarders and template builds and removes the templates. The
// VMs run on: a later Runtime's Open serves them again.
func (r *Runtime) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.builds.Wait()
	r.removeTemplates()
	r.mu.Lock()
	ps := r.proxies
	r.proxies = map[string]*vmlink.Proxy{}
	r.mu.Unlock()
	for _, p := range ps {
		p.Close()
	}
	return nil
}

// killOrphans ends QEMU processes of this Runtime's uid range that no VM records (a crash
// between starting QEMU and recording it, a template build cut short): their uids are handed
// out again, and a process of the same uid could reach the next VM's.
func (r *Runtime) killOrphans(ids []string) {
	known := map[int]bool{}
	for _, id := range ids {
		if st, err := r.readState(id); err == nil && alive(st) {
			known[st.Pid] = true
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || known[pid] {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(strings.TrimPrefix(l, "Uid:"))
			if !strings.HasPrefix(l, "Uid:") || len(f) == 0 {
				continue
			}
			uid, err := strconv.ParseUint(f[0], 10, 32)
			if err == nil && uint32(uid) >= r.cfg.UIDBase && uint32(uid)-r.cfg.UIDBase < r.cfg.UIDCount {
				r.log.Warn("ending a QEMU process no VM records", "pid", pid, "uid", uid)
				unix.Kill(pid, unix.SIGKILL)
			}
			break
		}
	}
}

// DiskAllocated is the bytes the VMs' writable disks (a microvm's upper.img, a vm's qcow2
// overlay) take on the host's filesystem, for the edge's disk promise, which asks on every
// create: each image is read at most once a diskAllocatedAge (diskscan), as they grow while
// their guests write. A figure that old undercounts, and the free space, read on every
// admission, already lacks what it misses: the promise then has less room, never more.
func (r *Runtime) DiskAllocated() int64 {
	return r.disks.Scan(r.cfg.StateDir, []string{"upper.img", "disk.qcow2"}, diskAllocatedAge).Allocated
}

const diskAllocatedAge = time.Second

// Usage reads what a VM sandbox uses now: its QEMU's cgroups (CPU time, memory, tasks) and the
// bytes its writable disk has allocated on the host (the guest's writes; a sparse file's
// allocation, not what the guest's filesystem counts as used).
func (r *Runtime) Usage(id string) (runtime.Usage, error) {
	if r.cg == nil {
		return runtime.Usage{}, errdefs.Unavailable("VMs get no cgroups on this host")
	}
	u, err := r.cg.Usage(id)
	if err != nil {
		return u, err
	}
	for _, name := range []string{"upper.img", "disk.qcow2"} {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(r.dir(id), name), &st) == nil {
			u.DiskBytes = st.Blocks * 512
			break
		}
	}
	return u, nil
}
