package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lxcfs"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/runtime/cgroups"
	"github.com/corral-dev/corral/internal/runtime/diskscan"
	"github.com/corral-dev/corral/internal/vmlink"
)

// Defaults for Config and Spec fields left zero.
const (
	DefaultRunc         = "/var/cache/corral/runc/v1.5.3/runc" // built by scripts/install-runc.sh
	DefaultStateDir     = "/var/lib/corral/sandboxes"
	DefaultRuncRoot     = "/run/corral/runc"
	DefaultCgroupParent = "/corral"
	DefaultDiskBytes    = 1 << 30
	DefaultDiskPool     = 4

	minDiskBytes     = 8 << 20
	agentOOMScoreAdj = -1000 // below this mkfs.ext4 makes a uselessly small filesystem
)

// Config configures a Runtime. Zero fields take the defaults above.
type Config struct {
	// Runc is the runc binary. Use a current release: Debian's 1.1.5 predates the 2025 fixes.
	Runc string
	// StateDir holds one directory per sandbox (and .pool/ for ready disks). Keep it short: the
	// agent socket <StateDir>/<id>/agent.sock must fit in 107 bytes.
	StateDir string
	// RuncRoot is runc's --root (its state); best on tmpfs.
	RuncRoot string
	// CgroupParent is the cgroup path under which each sandbox gets <CgroupParent>/<id>.
	CgroupParent string
	// DefaultDiskBytes is the size of the pooled disks: the node's default sandbox disk, so a
	// Spec of that DiskBytes takes one ready.
	DefaultDiskBytes int64
	// DiskPool is how many formatted and mounted disks of DefaultDiskBytes are kept ready; 0 means
	// DefaultDiskPool, negative means no pool (every Create runs mkfs).
	DiskPool int
	// SparseDisks makes writable disks sparse files instead of allocating their blocks when they
	// are made (see disk.go): faster to make and denser on the host, but a host filesystem that
	// fills can then lose writes a sandbox was told succeeded. Only for hosts whose disk is
	// overcommitted on purpose.
	SparseDisks bool
	// Mkfs is mkfs.ext4; empty means look it up in PATH, /usr/sbin and /sbin.
	Mkfs string
	// SeccompAllArches keeps the sub-architectures of Docker's seccomp profile (x86 and x32 on
	// amd64), for sandboxes that run 32-bit binaries. Off, only the native architecture's
	// syscalls are allowed, which is stricter and ~25 ms faster per Create on this host kind.
	SeccompAllArches bool
	// SeccompInRunc leaves Docker's seccomp profile to runc, which compiles it with libseccomp
	// in every container's init (6-9 ms of CPU per start here, scripts/bench-seccomp-start.sh). Off (the default), the
	// profile is compiled once (internal/seccompbpf) and the agent installs the program on
	// itself first thing; profiles it cannot compile exactly (SeccompAllArches) go to runc.
	SeccompInRunc bool

	// Runcd is corral-runcd (cmd/corral-runcd): when set, and its libcontainer is the version of
	// Runc, runc sandboxes are started through it instead of a `runc run --detach` each
	// (engine.go). Empty, or another version: runc run --detach.
	Runcd string

	// Runsc is gVisor's runsc binary; empty means DefaultRunsc. When it is missing, gVisor
	// sandboxes are refused (errdefs.ErrUnavailable) and runc ones work as before.
	Runsc string
	// RunscRoot is runsc's --root (its state); RunscPlatform its --platform (systrap works
	// without KVM and inside VMs; kvm needs /dev/kvm).
	RunscRoot, RunscPlatform string

	// LXCFS, when set, serves runc sandboxes their own /proc/meminfo, cpuinfo, stat, uptime,
	// loadavg, diskstats, swaps and /sys/devices/system/cpu/online (internal/lxcfs); a Create
	// fails when it cannot (never a sandbox without them). gVisor sandboxes have the Sentry's
	// own /proc and /sys and do not use it.
	LXCFS HostFacts

	// UserNS, when set, runs each runc sandbox in a user namespace of its own (userns.go). When
	// the host cannot make them (probed by New), sandboxes are made without and UserNSStatus
	// says why. nil: sandboxes' root is the host's.
	UserNS *UserNS
}

// HostFacts gives the files a sandbox binds over the host's /proc and /sys facts
// (*lxcfs.Server).
type HostFacts interface {
	Files(ctx context.Context) ([]lxcfs.Bind, error)
	// Warm readies the files for the binds of a create about to run, in the background.
	Warm()
}

func (c *Config) setDefaults() {
	if c.Runc == "" {
		c.Runc = DefaultRunc
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.RuncRoot == "" {
		c.RuncRoot = DefaultRuncRoot
	}
	if c.CgroupParent == "" {
		c.CgroupParent = DefaultCgroupParent
	}
	if c.DefaultDiskBytes == 0 {
		c.DefaultDiskBytes = DefaultDiskBytes
	}
	if c.DiskPool == 0 {
		c.DiskPool = DefaultDiskPool
	}
	if c.RunscRoot == "" {
		c.RunscRoot = DefaultRunscRoot
	}
	if c.RunscPlatform == "" {
		c.RunscPlatform = DefaultRunscPlatform
	}
}

// Validate reports the first invalid field after defaults are applied.
func (c Config) Validate() error {
	c.setDefaults()
	for _, f := range []struct{ name, val string }{
		{"Runc", c.Runc}, {"StateDir", c.StateDir}, {"RuncRoot", c.RuncRoot}, {"CgroupParent", c.CgroupParent},
		{"RunscRoot", c.RunscRoot},
	} {
		if !filepath.IsAbs(f.val) || filepath.Clean(f.val) != f.val || f.val == "/" {
			return errdefs.Invalid(f.name, "must be a clean absolute path other than /, got %q", f.val)
		}
	}
	for _, f := range []struct{ name, val string }{{"RuncRoot", c.RuncRoot}, {"RunscRoot", c.RunscRoot}} {
		if strings.HasPrefix(f.val+"/", c.StateDir+"/") || strings.HasPrefix(c.StateDir+"/", f.val+"/") {
			return errdefs.Invalid(f.name, "must not be inside StateDir or contain it")
		}
	}
	if c.RuncRoot == c.RunscRoot {
		return errdefs.Invalid("RunscRoot", "must differ from RuncRoot")
	}
	if c.Runsc != "" && (!filepath.IsAbs(c.Runsc) || filepath.Clean(c.Runsc) != c.Runsc) {
		return errdefs.Invalid("Runsc", "must be a clean absolute path, got %q", c.Runsc)
	}
	// The shortest possible socket path must fit; longer IDs are checked by Create.
	if n := len(socketPath(c.StateDir, "x")); n > maxSocketPath {
		return errdefs.Invalid("StateDir", "too long: %s/<id>/agent.sock must fit in %d bytes (sun_path)", c.StateDir, maxSocketPath)
	}
	if c.DefaultDiskBytes < minDiskBytes {
		return errdefs.Invalid("DefaultDiskBytes", "must be at least %d", minDiskBytes)
	}
	if c.UserNS != nil {
		return c.UserNS.validate()
	}
	return nil
}

// Runtime creates and destroys runc sandboxes. See the package doc for the lifecycle.
type Runtime struct {
	cfg     Config
	log     *slog.Logger
	version string
	tmpl    *template
	// maxOpenFiles is the highest RLIMIT_NOFILE runc can give the agent here.
	maxOpenFiles uint64
	// createStart makes Create use `runc create` + `runc start` instead of `runc run --detach`;
	// only TestCreateLatency sets it, to measure the difference.
	createStart bool
	// engine starts runc containers when Config.Runcd is usable (engine.go), else nil.
	engine *engine
	// nsHelper is Config.Runcd when it makes user namespaces (initNSHelper), else empty: the
	// agent's helper makes them.
	nsHelper string
	cg       *cgroups.Layout
	agents   agentCache
	formats  diskFormats
	locks    idLocks

	poolDir string
	ready   chan string // paths of ready pool slots; receive-only for Create, filled by refill
	refill  chan struct{}
	// creating counts the Creates in flight and createdAt is when the last one ended (unix
	// nanoseconds): the pools' refills wait for a quiet moment (refillWait).
	creating  atomic.Int32
	createdAt atomic.Int64
	// nsReady holds user namespaces made ahead (usernspool.go), refilled on nsRefill with the
	// agent binary a Create last named (nsAgentPath, a string).
	nsReady     chan pooledUserns
	nsRefill    chan struct{}
	nsAgentPath atomic.Value
	// nsMaking counts namespaces the refill holds a slot for and has not put in nsReady yet;
	// nsMade is signalled (without blocking) when one is done, made or failed.
	nsMaking atomic.Int32
	nsMade   chan struct{}
	stop     context.CancelFunc
	wg       sync.WaitGroup // the refill goroutine
	closeMu  sync.Once

	// bg ends when Close begins; it bounds the prefetches Resume leaves running.
	bg         context.Context
	prefetchMu sync.Mutex
	prefetches map[string]*prefetchRun // running prefetch by sandbox ID; protected by prefetchMu
	prefetchWG sync.WaitGroup          // the prefetch goroutines
	// noPrefetch makes Resume skip the prefetch; only TestPauseLatency sets it, to measure it.
	noPrefetch bool

	runscVersion string // first line of `runsc --version`
	runscErr     error  // why gVisor sandboxes cannot be created here, or nil

	// capSysResource: this process has CAP_SYS_RESOURCE (runc can set the rlimits of a
	// process in another user namespace).
	capSysResource bool
	slots          *slots           // user-namespace slots; nil without Config.UserNS
	disks          diskscan.Scanner // DiskUse's figures
	inits          liveInits        // pidfds of running sandboxes' inits, for Status
	rootsDir       string           // UserNS.RootsDir, or its default when there is no Config.UserNS
	// gvisorUnprivileged runs gVisor's Sentry unprivileged (--directfs=false): with Config.UserNS
	// on a host that can make user namespaces.
	gvisorUnprivileged bool
	usernsErr          error // why Config.UserNS cannot be honoured here, or nil

	proxyMu sync.Mutex
	proxies map[string]*vmlink.Proxy // gVisor agent socket forwarders, by sandbox; protected by proxyMu
}

// New checks the host and prepares a Runtime; see the package doc. ctx bounds only New itself;
// the pool's goroutine lives until Close.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Runtime, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.UserNS != nil {
		u := *cfg.UserNS
		cfg.UserNS = &u // initUserNS fills in defaults
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Mkfs == "" {
		p, err := findMkfs()
		if err != nil {
			return nil, err
		}
		cfg.Mkfs = p
	}
	r := &Runtime{cfg: cfg, log: log, poolDir: filepath.Join(cfg.StateDir, ".pool")}
	r.locks.m = map[string]*idLock{}
	r.prefetches = map[string]*prefetchRun{}
	r.agents.imgs = map[string]*agentImage{}
	r.formats = diskFormats{mkfs: cfg.Mkfs, scratch: r.poolDir}
	r.proxies = map[string]*vmlink.Proxy{}

	out, err := r.runcOutput(ctx, "--version")
	if err != nil {
		return nil, fmt.Errorf("run %s --version: %w", cfg.Runc, err)
	}
	r.version, _, _ = strings.Cut(string(out), "\n")
	if r.cg, err = cgroups.Read(cfg.CgroupParent); err != nil {
		return nil, err
	}
	r.initGVisor(ctx)
	// The agent must survive its sandbox's OOM kills, so it gets oom_score_adj -1000 (and resets
	// its children to 0). Without CAP_SYS_RESOURCE (some container hosts) runc cannot write that.
	// Raising RLIMIT_NOFILE past this process's hard limit needs the same capability.
	var oomAdj *int
	r.maxOpenFiles = readUint("/proc/sys/fs/nr_open", 1<<20)
	r.capSysResource = canLowerOOMScore()
	if r.capSysResource {
		oomAdj = ptr(agentOOMScoreAdj)
	} else {
		var lim unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil {
			r.maxOpenFiles = min(r.maxOpenFiles, lim.Max)
		}
		log.Warn("no CAP_SYS_RESOURCE: the agent keeps this process's oom_score_adj and may be OOM-killed, and OpenFiles is capped by this process's hard limit",
			"max_open_files", r.maxOpenFiles)
	}
	if r.tmpl, err = newTemplate(oomAdj, cfg.SeccompAllArches, !cfg.SeccompInRunc); err != nil {
		return nil, err
	}
	for _, d := range []string{cfg.StateDir, cfg.RuncRoot, r.poolDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	r.initUserNS(ctx)
	r.initNSHelper(ctx)
	r.initEngine(ctx)
	// Pool slots of an earlier process are not worth auditing; destroy and make fresh ones.
	if err := r.clearPool(ctx); err != nil {
		log.Warn("remove stale disk pool slots", "err", err)
	}
	r.removeForkLeftovers()
	log.Info("runc runtime ready", "runc", cfg.Runc, "version", r.version, "cgroup", r.cg.Mode,
		"state_dir", cfg.StateDir, "disk_pool", max(cfg.DiskPool, 0), "disk_bytes", cfg.DefaultDiskBytes)
	switch {
	case r.usernsErr != nil:
		log.Error("runc sandboxes run without user namespaces", "err", r.usernsErr)
	case cfg.UserNS != nil:
		helper := "corral-agent"
		if r.nsHelper != "" {
			helper = r.nsHelper
		}
		log.Info("runc sandboxes run in user namespaces", "uid_base", cfg.UserNS.UIDBase, "slots", cfg.UserNS.Slots,
			"roots", cfg.UserNS.RootsDir, "budgets", fmt.Sprintf("%+v", cfg.UserNS.Budgets), "helper", helper)
	}
	if r.runscErr != nil {
		log.Warn("gVisor sandboxes unavailable", "err", r.runscErr)
	} else {
		log.Info("gVisor ready", "runsc", r.cfg.Runsc, "version", r.runscVersion, "platform", cfg.RunscPlatform)
	}

	poolCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.stop, r.bg = stop, poolCtx
	r.ready = make(chan string, max(cfg.DiskPool, 0))
	r.refill = make(chan struct{}, 1)
	if cfg.DiskPool > 0 {
		r.wg.Add(1)
		go r.refillPool(poolCtx)
		r.kickRefill()
	}
	r.nsRefill = make(chan struct{}, 1)
	r.nsMade = make(chan struct{}, 1)
	if cfg.UserNS != nil && r.usernsErr == nil {
		r.nsReady = make(chan pooledUserns, usernsPoolSize)
		r.wg.Add(1)
		go r.refillUserns(poolCtx)
	}
	return r, nil
}

// Close stops the pool refill and any prefetch, and destroys the pool's disks. Sandboxes keep
// running.
func (r *Runtime) Close() error {
	var err error
	r.closeMu.Do(func() {
		// Under prefetchMu: a Resume then either started its prefetch already or sees bg ended.
		r.prefetchMu.Lock()
		r.stop()
		r.prefetchMu.Unlock()
		r.wg.Wait()
		r.closeUsernsPool()
		if r.engine != nil {
			r.engine.close()
		}
		r.prefetchWG.Wait()
		err = r.clearPool(context.Background())
		if err == nil {
			os.Remove(r.poolDir) // so that StateDir is empty when no sandbox is left
		}
		r.proxyMu.Lock()
		ps := r.proxies
		r.proxies = map[string]*vmlink.Proxy{}
		r.proxyMu.Unlock()
		for _, p := range ps {
			p.Close() // the sandboxes' holders keep their links for the next process
		}
		r.removeGVisorLeftovers()
		r.removeRootsDir()
		r.agents.close()
		r.inits.close()
	})
	return err
}

// Factory builds the runc backend (a runtime.Factory): opts is a *Config (nil: the defaults)
// whose node fields it sets from node: StateDir, RuncRoot and RunscRoot under node.DataDir
// (sandboxes/, runc/, runsc/), CgroupParent, DefaultDiskBytes and SparseDisks.
func Factory(ctx context.Context, node runtime.Node, opts any, log *slog.Logger) (runtime.Runtime, error) {
	cfg, err := runtime.OptionsOf[Config](opts)
	if err != nil {
		return nil, err
	}
	cfg.StateDir = filepath.Join(node.DataDir, "sandboxes")
	cfg.RuncRoot = filepath.Join(node.DataDir, "runc")
	cfg.RunscRoot = filepath.Join(node.DataDir, "runsc")
	cfg.CgroupParent, cfg.DefaultDiskBytes, cfg.SparseDisks = node.CgroupParent, node.DefaultDiskBytes, node.SparseDisks
	r, err := New(ctx, *cfg, log)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Runtimes are the engines this backend runs (runtime.Spec.Runtime), runc the default.
func (r *Runtime) Runtimes() []string { return []string{string(EngineRunc), string(EngineGVisor)} }

// Available is nil for runc, and for gVisor when runsc works here (GVisor says why not).
func (r *Runtime) Available(name string) error {
	switch Engine(name) {
	case EngineRunc:
		return nil
	case EngineGVisor:
		_, err := r.GVisor()
		return err
	}
	return errdefs.Unavailable("runc does not run %q", name)
}

// Has reports whether id has a state directory here.
func (r *Runtime) Has(id string) bool {
	if !validID(id) {
		return false
	}
	_, err := os.Stat(r.dir(id))
	return err == nil
}

var (
	_ runtime.Runtime     = (*Runtime)(nil)
	_ runtime.Pauser      = (*Runtime)(nil)
	_ runtime.Snapshotter = (*Runtime)(nil)
	_ runtime.Forker      = (*Runtime)(nil)
	_ runtime.UsageReader = (*Runtime)(nil)
	_ runtime.DiskHolder  = (*Runtime)(nil)
)

// DiskHeld is DiskUse for the edge's disk promise: the pool's disks are promised, and every
// disk's blocks are allocated.
func (r *Runtime) DiskHeld() (promised, allocated int64) {
	u := r.DiskUse()
	return u.Pooled, u.Allocated
}

// Version is the first line of `runc --version`, e.g. "runc version 1.3.3".
func (r *Runtime) Version(ctx context.Context) (string, error) { return r.version, nil }

// List returns the IDs that have any state: a directory in StateDir, runc state, or a cgroup.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	ids := map[string]bool{}
	ents, err := os.ReadDir(r.cfg.StateDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list %s: %w", r.cfg.StateDir, err)
	}
	for _, e := range ents {
		if e.IsDir() && validID(e.Name()) {
			ids[e.Name()] = true
		}
	}
	out, err := r.runcOutput(ctx, "list", "-q")
	if err != nil {
		return nil, fmt.Errorf("runc list: %w", err)
	}
	for _, id := range strings.Fields(string(out)) {
		ids[id] = true
	}
	if r.runscErr == nil {
		out, err := r.runscCmd(ctx, "", "list", "-quiet").Output()
		if err != nil {
			return nil, fmt.Errorf("runsc list: %w", err)
		}
		for _, id := range strings.Fields(string(out)) {
			ids[id] = true
		}
	}
	if r.rootsDir != "" {
		ents, _ := os.ReadDir(r.rootsDir)
		for _, e := range ents {
			if e.IsDir() && validID(e.Name()) {
				ids[e.Name()] = true
			}
		}
	}
	for _, id := range r.cg.Children() {
		if validID(id) {
			ids[id] = true
		}
	}
	list := make([]string, 0, len(ids))
	for id := range ids {
		list = append(list, id)
	}
	slices.Sort(list)
	return list, nil
}

func (r *Runtime) dir(id string) string { return filepath.Join(r.cfg.StateDir, id) }

func (r *Runtime) cgroupPath(id string) string { return path.Join(r.cfg.CgroupParent, id) }

// runcCmd returns runc with --root set, a minimal environment and its own process group.
// The environment is not inherited: runc passes LISTEN_FDS descriptors and the NOTIFY_SOCKET
// socket into the container when it sees them.
func (r *Runtime) runcCmd(ctx context.Context, args ...string) *exec.Cmd {
	var full []string
	if len(args) == 0 || args[0] != "--version" {
		full = append(full, "--root", r.cfg.RuncRoot)
	}
	cmd := exec.CommandContext(ctx, r.cfg.Runc, append(full, args...)...)
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// childEnv is the whole environment of the runtime's helpers (runc, runsc, corral-runcd):
// a PATH, nothing of this process's.
func childEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
}

// runcOutput runs runc and returns its stdout; a failure carries runc's stderr.
func (r *Runtime) runcOutput(ctx context.Context, args ...string) ([]byte, error) {
	cmd := r.runcCmd(ctx, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return out, fmt.Errorf("%w: %s", err, msg)
		}
		return out, err
	}
	return out, nil
}

func readUint(path string, def uint64) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return def
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return def
	}
	return n
}

func findMkfs() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errdefs.Unavailable("mkfs.ext4 not found: install e2fsprogs")
}

// idLocks serialises operations on one ID.
type idLocks struct {
	mu sync.Mutex
	m  map[string]*idLock // protected by mu
}

type idLock struct {
	mu   sync.Mutex
	refs int // protected by idLocks.mu
}

func (l *idLocks) lock(id string) (unlock func()) {
	l.mu.Lock()
	e := l.m[id]
	if e == nil {
		e = &idLock{}
		l.m[id] = e
	}
	e.refs++
	l.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
}
