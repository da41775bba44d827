// Package daemon runs `corral up`: one process with the API server, the edge of this host, the
// embedded SQLite store and the local layer store, all under one data directory. It owns startup
// order (store, token, layers, runtime, edge reconcile, then the listener, so /healthz answers only
// when everything is ready) and shutdown (the listener and reaper stop; sandboxes keep running).
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/build"
	"github.com/corral-dev/corral/internal/clusterauth"
	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/egress/dns"
	"github.com/corral-dev/corral/internal/egress/proxy"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/hostreg"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/limits"
	"github.com/corral-dev/corral/internal/lxcfs"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/runtime/backends"
	"github.com/corral-dev/corral/internal/runtime/cgroups"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/trace"
	"github.com/corral-dev/corral/internal/volume"
	"github.com/corral-dev/corral/internal/webhook"
)

// Version is the Corral version, set at build time with -ldflags.
var Version = "dev"

// Config configures `corral up`.
// FetchConfig configures the fetching of layer data on a node.
type FetchConfig struct {
	// Mode is the default fetch mode: eager, lazy or prefetch (the default).
	Mode string
	// CacheSize bounds the node's chunk cache (default 10 GiB).
	CacheSize int64
	// Timeout bounds a sandbox's read waiting on the blob store; it then gets EIO (default 30 s).
	Timeout time.Duration
	// FillRate fetches the rest of a prefetch sandbox's layers in the background at this many
	// bytes per second (default 0: not at all).
	FillRate int64
	// InProcess serves lazyd inside this process instead of as its own (tests).
	InProcess bool
}

// layers turns the fetch settings into the layer store's, with the command that starts lazyd.
func (f FetchConfig) layers(dataDir, spec string) (layers.LazyConfig, error) {
	lc := layers.LazyConfig{Mode: f.Mode, FillRate: f.FillRate, CacheMax: f.CacheSize, ReadTimeout: f.Timeout}
	if f.InProcess {
		return lc, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return lc, fmt.Errorf("find this executable to start lazyd: %w", err)
	}
	lc.Command = []string{exe, "lazyd", "--dir", filepath.Join(dataDir, "layers", "lazy"), "--blob-store", spec}
	if f.CacheSize > 0 {
		lc.Command = append(lc.Command, "--cache-size", strconv.FormatInt(f.CacheSize, 10))
	}
	if f.Timeout > 0 {
		lc.Command = append(lc.Command, "--read-timeout", f.Timeout.String())
	}
	return lc, nil
}

type Config struct {
	// DataDir holds the store, layers, sandbox state and admin.token. Default /var/lib/corral.
	DataDir string
	// Listen is the API's address. Default 127.0.0.1:7070.
	Listen string
	// Node names this host in sandbox IDs. Default "local".
	Node string
	// Runc is the runc binary; default: $CORRAL_RUNC, else the newest build cached by
	// scripts/install-runc.sh under /var/cache/corral/runc, else runc on PATH.
	Runc string
	// Runsc is gVisor's runsc binary; default: $CORRAL_RUNSC, else the build scripts/install-runsc.sh
	// caches (runc.DefaultRunsc). Without it gVisor sandboxes are refused; runc ones still work.
	Runsc string
	// MicroVM configures the microvm tier (QEMU).
	MicroVM MicroVMConfig
	// Agent is the static corral-agent binary; default: corral-agent beside this executable.
	Agent string
	// Runcd is corral-runcd (internal/runcd): runc sandboxes start through it when its
	// libcontainer is the runc binary's version. Default: corral-runcd beside this executable
	// when there; "off": a `runc run --detach` per sandbox.
	Runcd string
	// CgroupParent is the cgroup under which sandboxes' cgroups are made. Empty: the host
	// registry's choice for this data dir (/corral for the default data dir).
	CgroupParent string
	// Registry is the host-wide registry of Corral instances (default /run/corral).
	Registry string
	// ReserveMemory is the host memory the sandboxes together may not use (kept for Corral and
	// the host): 0 is max(512 MiB, 5% of the host).
	ReserveMemory int64
	// Down makes Run remove everything of the data dir from the host instead of serving
	// (`corral down`): it ends every sandbox, and with them their mounts, loop devices, cgroups,
	// network namespaces, veths, nftables tables and processes, stops lazyd and gives back the
	// data dir's host registry claim. The store and layers stay.
	Down bool
	// NoReserve keeps no share of the host for Corral: no control cgroup, no memory limit on
	// the sandboxes' parent.
	NoReserve bool
	// DefaultTTL and MaxTTL bound sandbox lifetimes (defaults 1h and 7 days).
	DefaultTTL, MaxTTL time.Duration
	// MaxLayerBytes bounds the expanded size of one imported layer. Default 16 GiB.
	MaxLayerBytes int64
	// LayerLinger is how long a layer no sandbox uses stays mounted, its page cache warm for the
	// next sandbox (layers.Config.Linger). 0: unmounted with its last sandbox.
	LayerLinger time.Duration
	// Fetch configures how layer data reaches this node (lazyd and its chunk cache).
	Fetch FetchConfig
	// BlobStore is where layer images and the shared layer catalogue live (blobstore.Open):
	// "dir:/path" (local disk or a shared mount) or "s3://bucket/prefix?endpoint=...". Default
	// dir:<DataDir>/blobs. Every Corral given the same store shares its layers.
	BlobStore string
	// Store is the database: a PostgreSQL URL (postgres://USER@HOST:PORT/DB?sslmode=disable) or a
	// SQLite file. Default <DataDir>/corral.db; none on a cluster's edge.
	Store string
	// DiskPool is how many writable disks of the default size are kept formatted ahead. Default 4.
	DiskPool int
	// SandboxDisk is the writable disk of a sandbox whose create names none (default 1 GiB);
	// MaxSandboxDisk the most one sandbox may ask for, whatever its project's quota (default
	// 64 GiB).
	SandboxDisk, MaxSandboxDisk int64
	// OvercommitDisk is how far the node's disk promise may exceed what the data dir's filesystem
	// can hold (edge.DiskConfig; default 1). In cluster mode Cluster.Overcommit.Disk says it.
	OvercommitDisk float64
	// TrajectoryMax bounds each sandbox's stored trajectory (default 64 MiB): past it the outputs
	// of its oldest finished steps are dropped, the steps kept.
	TrajectoryMax int64
	// SparseDisks makes writable disks sparse instead of allocating them when made
	// (runtime.Node.SparseDisks): denser, but a full host disk can lose acknowledged writes.
	SparseDisks bool
	// KeepExitedCommands and KeepExitedFor bound the exited commands each sandbox's agent keeps for
	// re-attach (agent defaults: 64 commands, 10 minutes).
	KeepExitedCommands int
	KeepExitedFor      time.Duration
	// AuditRetention is how long audit entries are kept. Default 90 days.
	AuditRetention time.Duration
	// SandboxRetention is how long records of ended sandboxes are kept (default 24h; a
	// cluster's servers keep them for their own --sandbox-retention).
	SandboxRetention time.Duration
	// E2B serves E2B's API beside Corral's (off unless E2B.Listen is set).
	E2B E2BConfig
	// Cluster, when set, makes this an edge of a cluster (`corral edge`): it opens no store
	// (Store must be empty) and works through the servers' node channel.
	Cluster *ClusterConfig
	// Observe configures per-sandbox metrics, events and webhooks.
	Observe ObserveConfig
	// Net configures sandbox networking.
	Net NetConfig
	// NoLXCFS runs container sandboxes without LXCFS: they then read the host's /proc/meminfo,
	// cpuinfo, stat, uptime, loadavg and diskstats (benchmarks compare with and without).
	NoLXCFS bool
	// NoFavorDynMods leaves cgroup v2's favordynmods option as the host has it; by default a
	// node turns it on at start (cgroups.FavorDynMods: a sandbox's start then moves its init
	// into its cgroups in microseconds instead of an RCU grace period).
	NoFavorDynMods bool
	// NoUserNS runs container sandboxes without user namespaces: their root is the host's
	// (for hosts that cannot make them; Corral also falls back by itself, and says so).
	NoUserNS bool
	// SandboxBudgets are each container sandbox's per-user kernel budgets (with user
	// namespaces; zero fields take runc's defaults).
	SandboxBudgets backends.Budgets
	// OTLPEndpoint is the OTLP/HTTP receiver traces are sent to (trace.Config.Endpoint); empty:
	// $OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing.
	OTLPEndpoint string
}

// MicroVMConfig configures the microvm tier. The tier is on wherever QEMU and the guest kernel
// (scripts/setup.sh installs both) are present.
type MicroVMConfig struct {
	// Off turns the tier off.
	Off bool
	// QEMU is qemu-system-x86_64 (default: on PATH); KernelDir the guest kernel laid out by
	// scripts/guest-kernel.sh (default /var/cache/corral/guest-kernel/current).
	QEMU, KernelDir string
	// Accel is "kvm", "tcg" or "" (auto: KVM when it boots the guest, else TCG).
	Accel string
	// Debug makes guests log their boot to their console.log.
	Debug bool
	// Templates starts microVMs from a snapshot of a booted template VM of their shape.
	Templates bool
}

func (c *Config) setDefaults() {
	if c.DataDir == "" {
		c.DataDir = "/var/lib/corral"
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7070"
	}
	if c.Node == "" {
		c.Node = "local"
	}
	if c.DiskPool == 0 {
		c.DiskPool = 4
	}
	if c.SandboxDisk == 0 {
		c.SandboxDisk = limits.DefaultDiskBytes
	}
	if c.MaxSandboxDisk == 0 {
		c.MaxSandboxDisk = limits.MaxDiskBytes
	}
	if c.OvercommitDisk == 0 {
		c.OvercommitDisk = 1
	}
	if c.TrajectoryMax == 0 {
		c.TrajectoryMax = store.DefaultTrajectoryBytes
	}
	if c.AuditRetention == 0 {
		c.AuditRetention = 90 * 24 * time.Hour
	}
	if c.Cluster != nil {
		c.Cluster.setDefaults()
	}
}

// limits is what this node configures of the limits policy.
func (c *Config) limits() limits.Config {
	return limits.Config{DefaultDiskBytes: c.SandboxDisk, MaxDiskBytes: c.MaxSandboxDisk, DefaultTTL: c.DefaultTTL, MaxTTL: c.MaxTTL}
}

// Validate checks c and resolves the runc and agent binaries.
func (c *Config) Validate() error {
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return errdefs.Invalid("data-dir", "%v", err)
	}
	c.DataDir = abs
	if c.Cluster != nil {
		// An edge holds no store credentials, and E2B's API is its servers' to serve.
		if c.Store != "" {
			return errdefs.Invalid("store", "a cluster's edge opens no store: it reads and writes through the cluster's servers")
		}
		if c.E2B.Listen != "" {
			return errdefs.Invalid("e2b-listen", "a cluster serves E2B's API from its servers (corral server --e2b-listen), not from an edge")
		}
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return errdefs.Invalid("listen", "%q is not HOST:PORT", c.Listen)
	}
	if c.Runsc == "" {
		c.Runsc = os.Getenv("CORRAL_RUNSC")
	}
	if c.Runc == "" {
		c.Runc = FindRunc()
	}
	if c.Runc == "" {
		return errdefs.Invalid("runc", "no runc found: run scripts/install-runc.sh (make setup) or pass --runc")
	}
	if err := c.limits().Validate(); err != nil {
		return err
	}
	if c.TrajectoryMax < 1<<20 || c.TrajectoryMax > 1<<40 {
		return errdefs.Invalid("trajectory-max", "%d bytes is outside [1 MiB, 1 TiB]", c.TrajectoryMax)
	}
	if o := c.OvercommitDisk; !(o >= 0.1 && o <= 100) {
		return errdefs.Invalid("overcommit-disk", "%g is outside [0.1, 100]", o)
	}
	if c.Cluster != nil {
		if _, err := nodeproto.LeaseTTL(c.Cluster.LeaseTTL.Milliseconds()); err != nil {
			return errdefs.Invalid("lease-ttl", "%v is outside [%v, %v]", c.Cluster.LeaseTTL, nodeproto.MinLeaseTTL, nodeproto.MaxLeaseTTL)
		}
	}
	if c.Agent == "" {
		self, err := os.Executable()
		if err != nil {
			return errdefs.Invalid("agent", "cannot locate corral-agent: %v", err)
		}
		c.Agent = filepath.Join(filepath.Dir(self), "corral-agent")
	}
	if c.Agent, err = filepath.Abs(c.Agent); err != nil {
		return errdefs.Invalid("agent", "%v", err)
	}
	if !isRegular(c.Agent) {
		return errdefs.Invalid("agent", "corral-agent not found at %s (build it with `make build`, or pass --agent)", c.Agent)
	}
	switch c.Runcd {
	case "off":
	case "":
		// Beside this executable when there; without it, runc run --detach as before.
		if self, err := os.Executable(); err == nil {
			if p := filepath.Join(filepath.Dir(self), "corral-runcd"); isRegular(p) {
				c.Runcd = p
			}
		}
	default:
		if c.Runcd, err = filepath.Abs(c.Runcd); err != nil {
			return errdefs.Invalid("runcd", "%v", err)
		}
		if !isRegular(c.Runcd) {
			return errdefs.Invalid("runcd", "corral-runcd not found at %s (build it with `make build`, or pass --runcd off)", c.Runcd)
		}
	}
	return trace.Config{Endpoint: c.OTLPEndpoint}.Validate()
}

func isRegular(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// claimHost takes this data dir's claim in the host registry and fills cfg's cgroup parent, net
// tag and pool from it. Explicit values are checked against every other instance's.
func claimHost(cfg *Config) (hostreg.Claim, error) {
	reg, err := hostreg.Open(cfg.Registry)
	if err != nil {
		return hostreg.Claim{}, err
	}
	claim, err := reg.Acquire(hostreg.Request{DataDir: cfg.DataDir, Tag: cfg.Net.Tag, Pool: cfg.Net.Pool, CgroupParent: cfg.CgroupParent})
	if err != nil {
		return claim, fmt.Errorf("claim host resources for data dir %s: %w", cfg.DataDir, err)
	}
	cfg.CgroupParent, cfg.Net.Tag, cfg.Net.Pool = claim.CgroupParent, claim.Tag, claim.Pool
	return claim, nil
}

// FindRunc returns the runc binary Corral should use, or "": $CORRAL_RUNC, else the version
// scripts/install-runc.sh pins (backends.DefaultRunc), else runc on PATH.
func FindRunc() string {
	if p := os.Getenv("CORRAL_RUNC"); p != "" {
		return p
	}
	if _, err := os.Stat(backends.DefaultRunc); err == nil {
		return backends.DefaultRunc
	}
	if p, err := exec.LookPath("runc"); err == nil {
		return p
	}
	return ""
}

// Run starts Corral and serves until ctx ends. ready, if not nil, is closed once /healthz answers.
func Run(ctx context.Context, cfg Config, log *slog.Logger, ready chan<- string) error {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("corral up must run as root (it mounts filesystems and drives runc)")
	}
	PrivateUmask()
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir %s: %w", cfg.DataDir, err)
	}
	if !cfg.Down {
		service := "corral-up"
		if cfg.Cluster != nil {
			service = "corral-edge"
		}
		stopTracing, err := trace.Setup(ctx, trace.Config{Endpoint: cfg.OTLPEndpoint, Service: service, Node: cfg.Node}, log)
		if err != nil {
			return err
		}
		defer func() {
			// What is still batched goes out, within a bound: a receiver that is down must not
			// hold up a shutdown.
			sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			stopTracing(sctx)
		}()
	}
	// A data dir it cannot write is refused before anything is written; `corral down` goes on,
	// since removing what a data dir holds is what frees its filesystem.
	if !cfg.Down {
		if err := checkDataDirFS(cfg.DataDir); err != nil {
			return err
		}
	}
	// One corral per data dir: a second one would adopt, reap and tear down the first's sandboxes
	// and networks. The lock goes with the process, however it ends.
	lockPath := filepath.Join(cfg.DataDir, "corral.lock")
	_, statErr := os.Stat(lockPath)
	lock, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("lock data dir: %w", err)
	}
	defer lock.Close()
	if cfg.Down {
		if err := stopHolder(ctx, lock, log); err != nil {
			return err
		}
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(lock.Name())
		return fmt.Errorf("another corral up is running with data dir %s (pid %s): stop it first", cfg.DataDir, strings.TrimSpace(string(holder)))
	}
	// The lock is the flock, which ends with its holder: a pid left in the file by one that died
	// (kill -9, a crash, a reboot) is stale and taken over.
	holder, _ := os.ReadFile(lockPath)
	if len(strings.TrimSpace(string(holder))) > 0 {
		log.Info("data dir lock was left by a corral up that is gone; taking it over", "pid", strings.TrimSpace(string(holder)))
	}
	// refuse ends a start that found its data dir or store unusable, leaving the lock file as it
	// was: a refused start changes nothing.
	refuse := func(err error) error {
		if errors.Is(statErr, os.ErrNotExist) {
			os.Remove(lockPath)
		} else {
			lock.Truncate(0)
			lock.WriteAt(holder, 0)
		}
		return err
	}
	if err := lock.Truncate(0); err != nil {
		return fmt.Errorf("lock data dir: %w", err)
	}
	if _, err := fmt.Fprintf(lock, "%d\n", os.Getpid()); err != nil {
		return fmt.Errorf("lock data dir: write pid: %w", err)
	}
	// A data dir an older Corral made (or one the operator's umask opened) is closed to the
	// host's other users before anything in it is used.
	if _, err := SecureDataDir(cfg.DataDir, log); err != nil {
		return err
	}
	// The store before anything of the host is claimed: a store that is not this data dir's is
	// refused with nothing changed. A cluster's edge opens none: it holds no store credentials,
	// and reads and writes what it needs through the servers' node channel.
	var st *store.Store
	newSQLite, newOwner := false, false
	if cfg.Cluster == nil {
		if cfg.Store == "" {
			cfg.Store = filepath.Join(cfg.DataDir, "corral.db")
		}
		// What this start makes of the store, a refusal below takes away again.
		_, dbErr := os.Stat(cfg.Store)
		newSQLite = !store.IsPostgres(cfg.Store) && errors.Is(dbErr, os.ErrNotExist)
		_, ownerErr := os.Stat(filepath.Join(cfg.DataDir, ownerFile))
		newOwner = errors.Is(ownerErr, os.ErrNotExist)
		st, err = store.Open(ctx, cfg.Store)
		if err != nil {
			if store.IsPostgres(cfg.Store) {
				err = fmt.Errorf("store %s: %w", redactDSN(cfg.Store), err)
			}
			return refuse(err)
		}
		defer st.Close()
		if err := checkStoreOwner(ctx, st, cfg.DataDir, redactDSN(cfg.Store)); err != nil {
			return refuse(err)
		}
	}
	// Host resources no two Corrals may share (network tag and pool, NFLOG group, cgroup parent,
	// VM uids) come from the host registry, keyed by the data dir.
	claim, err := claimHost(&cfg)
	if err != nil {
		if st != nil {
			st.Close()
		}
		if newSQLite {
			for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
				os.Remove(cfg.Store + suffix)
			}
		}
		if newOwner {
			os.Remove(filepath.Join(cfg.DataDir, ownerFile))
		}
		return refuse(err)
	}
	log.Info("host resources of this data dir", "net_tag", claim.Tag, "net_pool", claim.Pool, "nflog_group", claim.LogGroup,
		"cgroup_parent", claim.CgroupParent, "vm_uid_base", claim.VMUIDBase)
	// Corral's own share of the host: its cgroup outweighs all sandboxes' CPU, and the sandboxes
	// together leave it memory headroom, so a host full of busy sandboxes still answers.
	if !cfg.NoReserve {
		if res, err := cgroups.DefaultReservation(cfg.CgroupParent, cfg.ReserveMemory); err != nil {
			log.Warn("no share of the host reserved for corral", "err", err)
		} else {
			if err := cgroups.Reserve(cfg.CgroupParent, res, os.Getpid()); err != nil {
				log.Warn("share of the host for corral only partly reserved", "err", err)
			} else {
				log.Info("share of the host reserved for corral", "cgroup", res.Control, "cpu_shares", res.CPUShares, "sandbox_memory_bytes", res.MemoryBytes)
			}
			defer func() {
				// Out of the control cgroup, so it can go (lazyd, if it still serves, keeps it).
				cgroups.ReleaseControl(cfg.CgroupParent, res, os.Getpid())
			}()
		}
	}
	log = log.With("node", cfg.Node)
	reserve := newDiskReserve(cfg.DataDir, log)
	if !cfg.Down {
		reserve.make()
		if st != nil {
			st.OnFull(reserve.release)
		}
		go reserve.keep(ctx)
	}
	if cfg.Cluster == nil {
		st.SetTrajectoryLimit(cfg.TrajectoryMax)
		// Quota usage counters are rebuilt from the sandbox rows at every start: whatever
		// happened before, admission starts from the truth. (A cluster's servers do it at
		// theirs, and write the admin token.)
		if err := st.RecountUsage(ctx); err != nil {
			return err
		}
		if err := EnsureAdminToken(ctx, st, filepath.Join(cfg.DataDir, "admin.token"), log); err != nil {
			return err
		}
	}
	if cfg.BlobStore == "" {
		cfg.BlobStore = "dir:" + filepath.Join(cfg.DataDir, "blobs")
	}
	blobs, err := blobstore.Open(ctx, cfg.BlobStore)
	if err != nil {
		return fmt.Errorf("blob store: %w", err)
	}
	log.Info("blob store", "location", blobs.String())
	lazyCfg, err := cfg.Fetch.layers(cfg.DataDir, cfg.BlobStore)
	if err != nil {
		return err
	}
	// The layer store opens once the node's instance name is known (a cluster's edge has it
	// from its registration), and closes after the runtimes, as it opened before them.
	var ls *layers.Store
	defer func() {
		if ls != nil {
			ls.Close()
		}
	}()
	if !cfg.Down {
		favorDynMods(cfg, log)
	}
	lx, lxcfsOff := startLXCFS(ctx, cfg, log)
	rcfg := &backends.RuncConfig{Runc: cfg.Runc, Runsc: cfg.Runsc, DiskPool: cfg.DiskPool}
	if cfg.Runcd != "off" {
		rcfg.Runcd = cfg.Runcd
	}
	if lx != nil {
		rcfg.LXCFS = lx
	}
	if !cfg.NoUserNS {
		rcfg.UserNS = &backends.UserNS{UIDBase: claim.SandboxUIDBase, Slots: hostreg.SandboxUIDSlots, Budgets: cfg.SandboxBudgets}
	}
	// The VM backend is built even when its tiers are off: it still finds, serves and deletes
	// the VMs a run with them on left.
	vcfg := &backends.QEMUConfig{
		Off: cfg.MicroVM.Off, UIDBase: claim.VMUIDBase, UIDCount: hostreg.VMUIDCount,
		QEMU: cfg.MicroVM.QEMU, KernelDir: cfg.MicroVM.KernelDir, Accel: cfg.MicroVM.Accel, Debug: cfg.MicroVM.Debug,
		Templates: cfg.MicroVM.Templates,
	}
	node0 := runtime.Node{DataDir: cfg.DataDir, CgroupParent: cfg.CgroupParent, DefaultDiskBytes: cfg.SandboxDisk, SparseDisks: cfg.SparseDisks}
	runtimes, err := backends.Open(ctx, node0, map[string]any{"runc": rcfg, "qemu": vcfg}, log)
	if err != nil {
		if lx != nil {
			lx.Close()
		}
		return err
	}
	defer runtimes.Close()
	defer stopLXCFS(runtimes.Backend(edge.RuntimeRunc), lx, filepath.Join(cfg.DataDir, "lxcfs"), log)
	var node *store.Node
	var reg *registration
	if cfg.Cluster != nil {
		// Before the edge writes anything: its writes are fenced with this incarnation's epoch.
		var names []string
		for _, n := range runtimes.Runtimes() {
			if runtimes.Available(n) == nil {
				names = append(names, n)
			}
		}
		tiers := []string{edge.TierContainer, edge.TierFncall}
		if runtimes.Available(edge.RuntimeQEMU) == nil {
			tiers = append(tiers, edge.TierMicroVM)
		}
		if runtimes.MachineAvailable() == nil {
			tiers = append(tiers, edge.TierVM)
		}
		if reg, err = registerNode(ctx, cfg, tiers, names, diskAllocated(diskHolders(runtimes)), log); err != nil {
			return err
		}
		node = reg.node
	}
	// The lease is renewed from now on, whatever the start takes; the loop acts on the edge and
	// its settings once they exist (hb).
	hb := &heartbeats{}
	hbErr := make(chan error, 1)
	if node != nil {
		hbCtx, stopHB := context.WithCancel(ctx)
		defer stopHB()
		go func() {
			defer close(hbErr)
			if err := heartbeat(hbCtx, cfg, node.Epoch, hb, log); err != nil {
				hbErr <- err
			}
		}()
	} else {
		close(hbErr)
	}
	instance, own := "", func(ctx context.Context) ([]*store.Sandbox, error) {
		return st.ListSandboxes(ctx, store.SandboxFilter{Node: cfg.Node, States: store.OwnStates()})
	}
	if reg != nil {
		instance, own = reg.instance, func(context.Context) ([]*store.Sandbox, error) { return reg.records, nil }
	} else if instance, err = st.Instance(ctx, cfg.Node); err != nil {
		return err
	}
	if ls, err = layers.Open(layers.Config{Dir: filepath.Join(cfg.DataDir, "layers"), MaxBytes: cfg.MaxLayerBytes, Linger: cfg.LayerLinger, Blobs: blobs, Instance: instance, Lazy: lazyCfg}, log); err != nil {
		return err
	}
	lookup := func(netip.Addr) (dns.Sandbox, bool) { return dns.Sandbox{}, false }
	proxyLookup := func(netip.Addr) (proxy.Sandbox, bool) { return proxy.Sandbox{}, false }
	dropped := func(src, dst netip.Addr, proto string, port uint16, reason string, at time.Time) {}
	netCfg, nw, err := startNetwork(ctx, cfg, claim.LogGroup, own, &lookup, &proxyLookup, &dropped, log)
	netOff := ""
	if err != nil {
		// Corral still runs: sandboxes get loopback only, and a policy is refused with this reason.
		log.Error("sandbox networking is off", "err", err)
		netOff = err.Error()
	} else if netCfg == nil {
		netOff = "corral up --no-net"
	}
	defer nw.close()
	ecfg := edge.Config{
		Node: cfg.Node, AgentPath: cfg.Agent,
		Limits:             cfg.limits(),
		KeepExitedCommands: cfg.KeepExitedCommands, KeepExitedFor: cfg.KeepExitedFor, Net: netCfg, NetOff: netOff,
		Shared: blobs, ArtifactDir: filepath.Join(cfg.DataDir, "artifacts"), FetchMode: cfg.Fetch.Mode,
		Retention: cfg.SandboxRetention,
	}
	ecfg.Disk = &edge.DiskConfig{Dir: cfg.DataDir, Overcommit: cfg.OvercommitDisk, Keep: reserveBytes, Holders: diskHolders(runtimes)}
	bus := events.New(cfg.Node, events.Config{}, log)
	ecfg.Events, ecfg.SampleInterval, ecfg.MetricsKeep, ecfg.PerSandboxMetrics = bus, cfg.Observe.SampleInterval, cfg.Observe.MetricsKeep, cfg.Observe.PerSandbox
	// The bus's store writer outlives the edge's Close (deferred before it), so its last events
	// are written.
	busCtx, stopBus := context.WithCancel(context.WithoutCancel(ctx))
	busDone := make(chan struct{})
	var recorder events.Recorder = st
	if reg != nil {
		recorder = cfg.Cluster.Servers.EventRecorder(node.Epoch) // the servers record them
	}
	go func() { defer close(busDone); bus.Run(busCtx, recorder) }()
	defer func() { stopBus(); <-busDone }()
	ecfg.Instance = instance
	if reg != nil {
		// Everything the edge would read or write in a store comes from the servers: they
		// admit, resolve and record its sandboxes, record their activity and trajectories,
		// publish the layers it makes, read the catalogue for its jobs, keep its volumes'
		// versions, say which layer blobs are in use, and send the configuration it follows,
		// fetched before the edge starts (it loads the service catalog and starts the fncall
		// pools).
		srv := cfg.Cluster.Servers
		sc := srv.Config()
		if err := retryUnavailable(ctx, "fetch the configuration from the servers", func() error { _, err := sc.Follow(ctx, ""); return err }, log); err != nil {
			return err
		}
		ecfg.Settings = sc
		hb.settings.Store(sc)
		ecfg.OwnRecords = own
		ecfg.Activity, ecfg.Trajectory, ecfg.Records, ecfg.RecordReader = srv.ActivityRecorder(node.Epoch), srv.Steps(node.Epoch), srv.Records(node.Epoch), srv.Records(node.Epoch)
		ecfg.Admissions, ecfg.Catalog, ecfg.CatalogReader, ecfg.Publisher = srv.Admissions(node.Epoch), srv.Catalog(), srv.CatalogReader(), srv.Publisher()
		ecfg.VolumeCatalog, ecfg.LayerUse = srv.Volumes(node.Epoch), srv.Digests()
		ecfg.Capacity, ecfg.Labels, ecfg.SharedStore = cfg.Cluster.admissible(node.Capacity), cfg.Cluster.Labels, true
		// The edge's disk promise has the final say on disk (edge.DiskConfig), with the same
		// figure the node registered (hostCapacity).
		ecfg.Capacity.DiskBytes, ecfg.Disk.Overcommit = 0, cfg.Cluster.Overcommit.Disk
	}
	// Volumes: local images on one node; in a cluster, cached copies of versions in the blob
	// store (edge/volblob.go).
	vols, err := volume.Open(filepath.Join(cfg.DataDir, "volumes"), "")
	if err != nil {
		return err
	}
	ecfg.Volumes = vols
	// A volume's image is allocated in full: promised and taken from the filesystem at once.
	ecfg.Disk.Holders = append(ecfg.Disk.Holders, func() edge.DiskHeld {
		n, err := vols.Bytes()
		if err != nil {
			log.Warn("count the volumes' disk", "err", err)
		}
		return edge.DiskHeld{Promised: n, Allocated: n}
	})
	e, err := edge.New(ecfg, log, st, runtimes, ls)
	if err != nil {
		return err
	}
	lookup, proxyLookup, dropped = e.ResolverLookup, e.ProxyLookup, e.LoggedDrop
	if (node != nil && node.State == store.NodeDraining) || cfg.Down {
		e.SetDraining(true) // before its pools start
	}
	if err := e.Start(ctx); err != nil {
		return err
	}
	defer e.Close()
	hb.edge.Store(e) // the heartbeats tell it whether it drains, and when the settings change
	defer hb.edge.Store(nil)
	if cfg.Down {
		// Everything ends here; the deferred closes then release the network, the disk pool,
		// lazyd and the reservation, and Down the cgroups and the claim.
		return down(ctx, cfg, e, st, log)
	}
	info := apiserver.Info{
		Version: Version, Node: cfg.Node, Runtime: edge.RuntimeRunc, RuntimePath: cfg.Runc,
		DataDir: cfg.DataDir, CgroupVersion: cgroupVersion(),
	}
	facts, err := backends.Describe(ctx, runtimes)
	if err != nil {
		return err
	}
	info.RuntimeVersion, info.Runtimes = facts.RuntimeVersion, facts.Runtimes
	info.GVisorVersion, info.GVisorUnavailable = facts.GVisorVersion, facts.GVisorUnavailable
	info.UserNS, info.UserNSUnavailable = facts.UserNS, facts.UserNSUnavailable
	info.QEMUVersion, info.MicroVMUnavailable, info.VMUnavailable = facts.QEMUVersion, facts.MicroVMUnavailable, facts.VMUnavailable
	info.MicroVMAccelerator, info.MicroVMAcceleratorWhy = facts.MicroVMAccelerator, facts.MicroVMAcceleratorWhy
	if netOff != "" {
		info.NetworkOff = netOff
	} else {
		info.NetworkPool = netCfg.Pool
	}
	if lx != nil {
		info.LXCFSVersion = lx.Version()
	} else {
		info.LXCFSUnavailable = lxcfsOff
	}
	info.Tiers = e.Tiers()
	api := apiserver.New(log, st, e, ls, info)
	api.SetBuilds(build.NewJobs(ctx, e, e.Node(), log.With("component", "build")), filepath.Join(cfg.DataDir, "builds"))
	if reg != nil {
		// The servers record its audit entries, sent off the requests' path; what is queued
		// when the edge stops is sent after the API has stopped (this defer runs after it).
		audits := cfg.Cluster.Servers.AuditQueue(log.With("component", "audit"))
		api.SetAuditor(audits)
		auditCtx, stopAudits := context.WithCancel(context.WithoutCancel(ctx))
		auditsDone := make(chan struct{})
		go func() { defer close(auditsDone); audits.Run(auditCtx) }()
		defer func() { stopAudits(); <-auditsDone }()
	}
	if cfg.Cluster == nil {
		// What runs where the API is served; a cluster's servers run it (internal/cluster).
		go api.Prune(ctx, cfg.AuditRetention)
		hooks := webhook.New(cfg.Observe.Webhooks, log, st, bus)
		go hooks.Run(ctx)
		api.SetWebhooks(hooks)
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	clusterTLS := cfg.Cluster != nil && cfg.Cluster.TLS != nil
	if clusterTLS {
		// Callers come authenticated by the cluster's servers (internal/nodeproto): no token
		// is looked up here.
		api.ServeClusterServers()
	}
	handler := api.Handler()
	var tlsCfg *tls.Config
	if clusterTLS {
		// Only the cluster's servers are served; probes may ask /healthz.
		handler = clusterauth.RequireServer(handler, "/healthz")
		tlsCfg = cfg.Cluster.TLS
	}
	srv := &http.Server{
		TLSConfig:         tlsCfg, // HTTP/2 on it: servers' pings find a dead link in seconds
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 3)
	go func() {
		if tlsCfg != nil {
			errc <- srv.ServeTLS(lis, "", "")
			return
		}
		errc <- srv.Serve(lis)
	}()
	if cfg.E2B.Listen != "" {
		// The gateway calls the API in process, unless the API is only for the cluster's
		// servers (mutual TLS): then it goes through the listener like any client.
		inproc := handler
		if tlsCfg != nil {
			inproc = nil
		}
		stopE2B, err := startE2B(ctx, cfg, st, lis.Addr(), inproc, log, errc)
		if err != nil {
			srv.Close()
			return err
		}
		defer stopE2B()
	}
	go func() {
		if err, ok := <-hbErr; ok {
			errc <- err
		}
	}()
	log.Info("corral is up", "listen", lis.Addr().String(), "data_dir", cfg.DataDir,
		"runc", info.RuntimeVersion, "agent", cfg.Agent, "version", Version)
	if ready != nil {
		ready <- lis.Addr().String()
	}
	select {
	case err := <-errc:
		// Nothing is served while the deferred flushes (events, audit entries) run.
		srv.Close()
		if errors.Is(err, store.ErrFenced) {
			log.Error("stopping: another incarnation holds this node, or it was declared lost; restart to register again", "err", err)
			return err
		}
		return fmt.Errorf("serve API: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down; sandboxes keep running")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn("shutdown", "err", err)
	}
	return nil
}

// EnsureAdminToken makes sure the root principal has a token and that adminPath holds one.
func EnsureAdminToken(ctx context.Context, st *store.Store, adminPath string, log *slog.Logger) error {
	if b, err := os.ReadFile(adminPath); err == nil {
		tok := strings.TrimSpace(string(b))
		if t, err := st.TokenByHash(ctx, apiserver.HashToken(tok)); err == nil && t.Principal == store.RootPrincipal && t.RevokedAt.IsZero() {
			return nil
		}
		log.Warn("admin.token does not match the store; issuing a new admin token", "path", adminPath)
	}
	tok, _ := iam.NewToken()
	tmp := adminPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(tok+"\n"), 0o600); err != nil {
		return fmt.Errorf("write admin token: %w", err)
	}
	if err := st.AddRootToken(ctx, apiserver.HashToken(tok)); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, adminPath); err != nil {
		return fmt.Errorf("write admin token: %w", err)
	}
	log.Info("created admin token", "path", adminPath)
	return nil
}

func cgroupVersion() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "v2"
	}
	if _, err := os.Stat("/sys/fs/cgroup/unified"); err == nil {
		return "v1 (hybrid)"
	}
	return "v1"
}

// favorDynMods turns on cgroup v2's favordynmods for the node's sandbox starts, or says why not.
func favorDynMods(cfg Config, log *slog.Logger) {
	if cfg.NoFavorDynMods {
		return
	}
	mp, changed, err := cgroups.FavorDynMods()
	switch {
	case errors.Is(err, cgroups.ErrNoCgroup2):
		log.Info("cgroup favordynmods not available: the host has no cgroup v2 hierarchy, so each sandbox's start waits for an RCU grace period (about 6 ms) to join its cgroups")
	case err != nil:
		log.Warn("cgroup favordynmods not turned on: each sandbox's start waits for an RCU grace period (about 6 ms) to join its cgroups", "err", err)
	case changed:
		log.Info("cgroup favordynmods turned on, for the whole host until it reboots: a sandbox's start joins its cgroups without waiting for an RCU grace period (corral up --no-favordynmods does not turn it on)", "mount", mp)
	}
}

// startLXCFS starts (or adopts) this data dir's LXCFS. Without one, container sandboxes read the
// host's figures: a warning, and the reason for `corral info`.
func startLXCFS(ctx context.Context, cfg Config, log *slog.Logger) (*lxcfs.Server, string) {
	if cfg.NoLXCFS {
		return nil, "corral up --no-lxcfs"
	}
	lx, err := lxcfs.Start(ctx, lxcfs.Config{Dir: filepath.Join(cfg.DataDir, "lxcfs")}, log)
	if err != nil {
		log.Warn("LXCFS is off: container sandboxes see the host's /proc/meminfo, cpuinfo, stat, uptime, loadavg and diskstats", "err", err)
		return nil, err.Error()
	}
	return lx, ""
}

// stopLXCFS ends supervision at shutdown. LXCFS keeps serving while any sandbox is left (the next
// corral up adopts it); with none, it is stopped and its directory removed. A run without LXCFS
// removes what an earlier run's left, once no sandbox needs it.
func stopLXCFS(rt runtime.Runtime, lx *lxcfs.Server, dir string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ids, err := rt.List(ctx)
	if err != nil || len(ids) > 0 {
		if lx != nil {
			lx.Close()
		}
		return
	}
	if lx != nil {
		err = lx.Stop()
	} else {
		err = lxcfs.Remove(dir)
	}
	if err != nil {
		log.Warn("stop lxcfs", "err", err)
	}
}

// ObserveConfig configures per-sandbox metrics (internal/edge observe.go); zero fields take the
// edge's defaults.
type ObserveConfig struct {
	SampleInterval time.Duration
	MetricsKeep    time.Duration
	PerSandbox     bool
	// Webhooks tunes webhook delivery (timeouts, attempts, backoff).
	Webhooks webhook.Config
}
