// Package edge is the node agent: the only part of Corral that touches sandboxes on a host. It admits
// and creates sandboxes (layers resolved to directories, a runtime to run them), keeps the in-memory
// view of the running ones with their agent clients, enforces the hard and idle TTLs, notices
// sandboxes that died, re-adopts running sandboxes after its own restart, and serves the sandbox data
// plane (exec, commands, files) over HTTP.
//
// State: the store holds every sandbox record; the edge's memory holds only what can be rebuilt from
// the store and the runtime (agent clients, last activity). Last activity is flushed to the store by
// the reaper, so after a crash the idle clock may restart up to one flush interval early.
//
// Lock order: Edge.mu, then sandbox.mu. Edge.mu guards only the map; lifecycle transitions of one
// sandbox hold its own mu, so slow runtime calls for one sandbox never block another.
package edge

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/cleanup"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/lazy"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/limits"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/trace"
)

// The runtimes a container sandbox can run on (corral.Sandbox.Runtime): the names of the
// runtime backends that run them (runtime.Spec.Runtime).
const (
	RuntimeRunc   = catalog.RuntimeRunc
	RuntimeGVisor = catalog.RuntimeGVisor
)

// Runtime runs sandboxes: the node's runtime backends as one (runtime.Set implements it; the
// package doc of internal/runtime has the lifecycle). The edge reaches the vm tier's screen,
// input, power and console through runtime.Machine when the Runtime implements it.
type Runtime interface {
	// Available is nil when sandboxes of the named runtime can be created here, else why not.
	Available(runtime string) error
	Create(ctx context.Context, spec runtime.Spec) (*runtime.Sandbox, error)
	Open(ctx context.Context, id string) (*runtime.Sandbox, error)
	Status(ctx context.Context, id string) (runtime.Status, error)
	Delete(ctx context.Context, id string) error
	// Kill ends every process of a sandbox and returns once they are gone; what it leaves
	// (files, mounts, cgroups) Delete removes later.
	Kill(ctx context.Context, id string) error
	List(ctx context.Context) ([]string, error)
	Pause(ctx context.Context, id string) (runtime.PauseStats, error)
	Resume(ctx context.Context, id string) (runtime.ResumeStats, error)
	Freeze(ctx context.Context, id string) error
	Thaw(ctx context.Context, id string) error
	UpperDir(id string) (string, error)
	// Fork takes an image of a running sandbox that Create (runtime.Spec.Fork) starts copies
	// from; DropFork removes it (fork.go).
	Fork(ctx context.Context, id string, opts runtime.ForkOptions) (*runtime.ForkImage, error)
	DropFork(img *runtime.ForkImage)
}

// LayerStore holds layers: it mounts them as directories usable as overlay lower dirs, counting
// the sandboxes that use each, and stores new ones (imports, snapshots). internal/layers
// implements it.
type LayerStore interface {
	// Prepare starts fetching a sandbox's layer data (eager: all of it before returning).
	Prepare(ctx context.Context, digests []string, f layers.Fetch) error
	// Finish ends a sandbox's fetching; SandboxStats reports it while it runs.
	Finish(ctx context.Context, sandbox string) (lazy.Stats, error)
	SandboxStats(ctx context.Context, sandbox string) (lazy.Stats, error)
	Stats(ctx context.Context, digest string) (layers.LayerStats, error)
	// FetchMetrics reports the node's chunk cache and per-layer fetch counters (ok false when
	// no lazyd serves this node now).
	FetchMetrics(ctx context.Context) (cache lazy.CacheStats, layers []lazy.Stats, ok bool)
	Acquire(ctx context.Context, digest string) (string, error)
	// Files returns an acquired layer's EROFS image and its extra devices (a split layer's
	// data blob, served by lazyd), for a VM that mounts the layer itself.
	Files(ctx context.Context, digest string) (image string, devices []string, err error)
	Release(digest string) error
	Hold(digest string) bool
	Sweep() (int, error)
	ImportTar(ctx context.Context, r io.Reader) (layers.Blob, error)
	Remove(ctx context.Context, digest string) error
	List(ctx context.Context) ([]layers.Blob, error)
	CollectImages(ctx context.Context) (int, int64, error)
}

// Config configures an Edge. Zero fields take the defaults documented on each.
type Config struct {
	// Node names this host; it is part of every sandbox ID created here. Default "local".
	Node string
	// AgentPath is the host path of the static corral-agent binary.
	AgentPath string
	// Limits is what this node configures of the limits policy (internal/limits): the default
	// and largest writable disk and TTL of a sandbox. Every other default and bound is the
	// policy's own.
	Limits limits.Config
	// Capacity, when set, is the most this node admits: the number of its live sandboxes and
	// the sums of their CPU, memory and disk limits never exceed it (a zero field is no bound).
	// A create over it fails with errdefs.ErrNodeFull (409 node_full), which a cluster's
	// placement takes as "try another node": the edge has the final say.
	Capacity *store.Resources
	// Disk, when set, admits creates against the data dir's filesystem (disk.go): a create whose
	// disk limit does not fit what the node can still promise is refused with node_full.
	Disk *DiskConfig
	// VMAgentWait bounds how long a data-plane call to a vm sandbox waits for the agent of a
	// machine that is still booting (default 5m: a full distribution under TCG).
	VMAgentWait time.Duration
	// Labels describe the node (gpu=h100); a create's node_selector must match them.
	Labels map[string]string
	// FetchMode is the fetch mode of creates that name none (eager, lazy or prefetch); empty
	// leaves it to the layer store's default.
	FetchMode string
	// SharedStore says other edges write the store too (cluster mode): the fncall pools then
	// follow the store's environments, which another edge may create or delete.
	SharedStore bool
	// ReapInterval is how often TTLs, idleness and liveness are checked (default 1s).
	ReapInterval time.Duration
	// Retention is how long records of stopped and failed sandboxes are kept (default 24h). In
	// a cluster (SharedStore) the servers forget them, every node's.
	Retention time.Duration
	// KeepExitedCommands and KeepExitedFor bound how many exited commands each agent keeps for
	// re-attach, and for how long (agent defaults: 64, 10m). They apply to sandboxes created after.
	KeepExitedCommands int
	KeepExitedFor      time.Duration
	// Net enables sandbox networking; nil: every sandbox has loopback only, and NetOff says why
	// (for the error a policy gets).
	Net    *NetConfig
	NetOff string
	// ArtifactDir keeps the files calls keep for later calls (artifacts.go); "" refuses them.
	ArtifactDir string
	// Volumes keeps this node's volume images (internal/volume); nil: volumes are off.
	Volumes VolumeDir
	// SampleInterval is how often every live sandbox's resource use is sampled (default 5s;
	// negative: never). MetricsRing bounds the samples kept per sandbox (default 720: an hour
	// at 5s), MetricsKeep how long a sandbox's samples outlive it (default 1h).
	SampleInterval time.Duration
	MetricsRing    int
	MetricsKeep    time.Duration
	// PerSandboxMetrics adds each sandbox's latest sample to the Prometheus output (one series
	// per sandbox and resource); off, only the node's sums are.
	PerSandboxMetrics bool
	// Events is the bus the edge publishes lifecycle events on; nil: the edge makes its own.
	Events *events.Bus
	// Activity, when set, records what sandboxes did (last activity, usage counters, and their
	// create, first exec, TTL extensions and end for the report) instead of the store: a
	// cluster's servers, over the node channel (activity.go). nil: the store.
	Activity ActivityRecorder
	// Shared is the blob store the layer store keeps its blobs in; published versions are
	// recorded there too, so that every Corral using it sees them (see shared.go). nil: versions
	// are recorded in this node's catalogue only.
	Shared blobstore.Store
	// Settings is where the edge reads what it follows of the API's configuration (settings.go);
	// nil: the store.
	Settings Settings
	// Admissions admits its new sandboxes, Trajectory records their trajectories, and Records
	// what becomes of them after their admission; nil: the store.
	Admissions Admissions
	Trajectory Trajectory
	Records    Records
	// RecordReader reads the records of the node's ended sandboxes; nil: the store.
	RecordReader RecordReader
	// Catalog resolves what a create names in the catalogue, and CatalogReader reads it for the
	// node's own jobs (builds, snapshots) and the requests it serves; nil: the store
	// (catalog.Resolver).
	Catalog       Catalog
	CatalogReader CatalogReader
	// Publisher records the layer versions the edge makes and the environments builds save;
	// nil: the store. Set (a cluster's servers), the node adopts nothing from the shared
	// catalogue: the servers keep the one catalogue, which only a caller may add to.
	Publisher Publisher
	// VolumeCatalog reads and records the versions of its sandboxes' volumes in a cluster
	// (volblob.go), and LayerUse says which layer blobs are in use (gc.go); nil: the store.
	VolumeCatalog VolumeCatalog
	LayerUse      LayerUse
	// Instance names this Corral in the shared catalogue (store.Instance); "": the store's.
	Instance string
	// OwnRecords, when set, returns the records of the sandboxes this node may still run (live,
	// or being deleted), which Start re-adopts or finishes: a cluster's edge has them from its
	// registration. nil: the store's.
	OwnRecords func(ctx context.Context) ([]*store.Sandbox, error)
}

func (c *Config) setDefaults() {
	if c.Node == "" {
		c.Node = "local"
	}
	if c.VMAgentWait <= 0 {
		c.VMAgentWait = 5 * time.Minute
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = time.Second
	}
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	if c.Disk != nil && c.Disk.Overcommit == 0 {
		c.Disk.Overcommit = 1
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = 5 * time.Second
	}
	if c.MetricsRing <= 0 {
		c.MetricsRing = 720
	}
	if c.MetricsKeep <= 0 {
		c.MetricsKeep = time.Hour
	}
}

// checkStoreless checks that a cluster's edge, which holds no store credentials (New's st is
// nil), has everything it would read or write there from the servers instead.
func (c *Config) checkStoreless() error {
	var missing []string
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"Settings", c.Settings != nil}, {"Admissions", c.Admissions != nil}, {"Trajectory", c.Trajectory != nil},
		{"Records", c.Records != nil}, {"RecordReader", c.RecordReader != nil}, {"Catalog", c.Catalog != nil},
		{"CatalogReader", c.CatalogReader != nil}, {"Publisher", c.Publisher != nil}, {"VolumeCatalog", c.VolumeCatalog != nil},
		{"LayerUse", c.LayerUse != nil}, {"Activity", c.Activity != nil}, {"Instance", c.Instance != ""},
		{"OwnRecords", c.OwnRecords != nil}, {"SharedStore", c.SharedStore},
	} {
		if !f.set {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("edge config: an edge without a store takes from the cluster's servers what the store would give, and lacks %s", strings.Join(missing, ", "))
	}
	return nil
}

// nodePattern is a node name: 1-32 lowercase letters, digits and inner hyphens.
const nodePattern = `[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?`

var nodeRE = lazyregexp.New(`^` + nodePattern + `$`)

// Validate checks c after defaults are applied.
func (c *Config) Validate() error {
	if !nodeRE.MatchString(c.Node) {
		return errdefs.Invalid("node", "%q must be 1-32 lowercase letters, digits or hyphens, starting and ending with a letter or digit", c.Node)
	}
	if c.AgentPath == "" {
		return errdefs.Invalid("agent", "the path of corral-agent is required")
	}
	if c.KeepExitedCommands < 0 || c.KeepExitedFor < 0 {
		return errdefs.Invalid("keep-exited", "must not be negative")
	}
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	if c.Disk != nil {
		if c.Disk.Dir == "" {
			return errdefs.Invalid("data-dir", "disk admission needs the data dir")
		}
		if o := c.Disk.Overcommit; o < 0.1 || o > 100 || o != o {
			return errdefs.Invalid("overcommit-disk", "%g is outside [0.1, 100]", o)
		}
	}
	return nil
}

// Edge manages the sandboxes of one node.
type Edge struct {
	cfg Config
	// policy resolves every create's limits and lifetimes (admit), once.
	policy *limits.Policy
	log    *slog.Logger
	store  *store.Store
	// settings is cfg.Settings, or the store's; admissions, traj and records cfg's, or the store.
	settings   Settings
	admissions Admissions
	// resolver resolves creates (cfg.Catalog, or local), and reader reads the catalogue for
	// builds, snapshots, imports and the API's reads (cfg.CatalogReader, or local); local
	// resolves from the node's own store (and adopts from the shared catalogue, corral up).
	resolver Catalog
	reader   CatalogReader
	local    *catalog.Resolver
	// publisher records layer versions and builds' environments (cfg.Publisher, or the store).
	publisher Publisher
	traj      Trajectory
	records   Records
	recRead   RecordReader
	volCat    VolumeCatalog
	layerUse  LayerUse
	// own is the copy of the node's records of sandboxes that have not ended (records.go), which
	// records writes through to.
	own *ownRecords
	rt  Runtime
	// machines is rt as a runtime.Machine (the vm tier); nil when it runs no machines.
	machines runtime.Machine
	layers   LayerStore
	// instance names this Corral's data directory in the shared catalogue (shared.go).
	instance string

	capMu    sync.Mutex  // one admission at a time checks the node's capacity (Config.Capacity)
	volLocks volumeLocks // one fetch or upload of a volume at a time on this node (volblob.go)
	draining atomic.Bool // the node is draining: no new sandboxes, no fncall pools (SetDraining)
	// creating counts the API's creates in flight (claims included) and createdAt is when the
	// last one ended (unix nanoseconds): warm pools fill in the quiet after them (warmQuietWait).
	creating  atomic.Int32
	createdAt atomic.Int64

	fncallMu sync.Mutex
	pools    map[string]*fncallPool // fncall environments by name; protected by fncallMu
	// artifacts holds files calls kept for later calls; nil without Config.ArtifactDir.
	artifacts *artifacts

	mu sync.Mutex
	// live holds the sandboxes in state creating or running on this node. Protected by mu.
	live map[string]*sandbox

	netMu sync.Mutex
	bySrc map[netip.Addr]*netTarget // networked sandboxes by address, for the resolver; protected by netMu

	// catalog is the network service catalog in force (nil: none).
	catalog atomic.Pointer[netpolicy.Catalog]
	// catalogRaw is the saved catalog's JSON in force (syncCatalog compares the store's to it).
	catalogRaw atomic.Pointer[[]byte]

	// layersMu keeps layer trees from being removed (write lock) between a create resolving its
	// layers and recording them (read lock).
	layersMu sync.RWMutex

	// bus carries lifecycle events (observe.go).
	bus *events.Bus
	// ringsMu guards rings: each sandbox's resource samples, kept MetricsKeep after it ends.
	ringsMu sync.Mutex
	rings   map[string]*ring
	// The sampler's own cost and output, for the Prometheus output.
	sampleNanos, samplePasses, sampledSandboxes atomic.Uint64

	// warm holds the warm pools of container sandboxes (pool.go); warmLoop closes warmDone.
	warm     *warmState
	warmDone chan struct{}
	// activity queues what happens once in a sandbox's life for cfg.Activity (activity.go).
	activity activityQueue

	stop        chan struct{}
	done        chan struct{}
	samplerDone chan struct{}
	// steps records exec trajectory entries off the exec's path (steplog.go).
	steps stepWriter
	// cleanups finishes deleted sandboxes' teardowns off the request's path (cleanup.go).
	cleanups cleaner
}

// sandbox is the in-memory side of a live sandbox.
type sandbox struct {
	id    string
	agent *agentrpc.Client
	// outputLimit is passed with every command.
	outputLimit int64
	// lastActivity is the unix time in nanoseconds of the last API call that used the sandbox.
	lastActivity atomic.Int64
	// flushed is the lastActivity value last written to the store by flushActivity.
	flushed atomic.Int64
	// expiresAt is the hard TTL's end in unix nanoseconds, mirrored from the record for the reaper.
	expiresAt atomic.Int64
	// idleTTL is zero when the sandbox has no idle TTL.
	idleTTL time.Duration
	// oomSeen is the memory cgroup's OOM-kill count when it was last looked at.
	oomSeen atomic.Uint64
	// autoPause is zero when the sandbox never pauses by itself.
	autoPause time.Duration
	// paused mirrors the state for the lock-free check on every data-plane call; it changes only
	// with mu held.
	paused atomic.Bool
	// machine: a vm sandbox (tier vm). off mirrors its state "off" as paused does "paused";
	// agentUp is set once its agent answered since the machine last booted (data-plane calls
	// wait for it until then).
	machine      bool
	off, agentUp atomic.Bool
	// cwd and user are the defaults of commands that name none (the base image's config).
	cwd, user string
	// actions counts data-plane calls (for blocked egress attempts per 1000 actions).
	actions atomic.Uint64
	// net is the sandbox's network, nil without one. Set before the sandbox is published.
	net *sandboxNet
	// unheld are layers of a sandbox re-adopted after a restart that were not mounted under the
	// layer store (so it holds no reference on them). Set before the sandbox is published.
	unheld map[string]bool
	// env is added to every command's environment: a sandbox claimed from a warm pool, whose
	// agent started before the create's variables were known (nil otherwise). Set before the
	// sandbox is published.
	env []string
	// fncall names the fncall environment whose pool the sandbox belongs to ("" for ordinary
	// sandboxes). Its agent runs isolated calls only, and the data plane refuses it.
	fncall string

	// project (display path) and tier label its events.
	project, tier string
	// For the report (observe.go): tokens clients reported, whether an exec came yet, blocked
	// egress attempts seen by the sampler, and the counters last written to the usage row.
	tokens       atomic.Int64
	firstExec    atomic.Bool
	blockedSeen  atomic.Uint64
	usageFlushed atomic.Int64
	// oomEvented is the OOM-kill count the last oom event reported.
	oomEvented atomic.Uint64

	// mu serialises lifecycle transitions (stop, TTL change) of this sandbox.
	mu sync.Mutex
	// gone is set once the sandbox left the running state. Protected by mu.
	gone bool
}

func (s *sandbox) touch() { s.lastActivity.Store(time.Now().UnixNano()) }

func newSandbox(rec *store.Sandbox, socket string) *sandbox {
	sb := &sandbox{
		id:          rec.ID,
		agent:       agentrpc.NewClient(socket),
		outputLimit: rec.Limits.OutputBytes,
		idleTTL:     time.Duration(rec.IdleTTLSeconds) * time.Second,
		autoPause:   time.Duration(rec.AutoPauseAfterSeconds) * time.Second,
		cwd:         rec.Cwd,
		user:        rec.User,
		project:     rec.Project,
		tier:        rec.Tier,
	}
	if rec.Tier == TierFncall {
		sb.fncall = rec.Labels[fncallLabel]
	}
	sb.paused.Store(rec.State == model.StatePaused)
	sb.machine = rec.Tier == TierVM
	sb.off.Store(rec.State == model.StateOff)
	sb.lastActivity.Store(rec.LastActivityAt.UnixNano())
	sb.flushed.Store(rec.LastActivityAt.UnixNano())
	sb.expiresAt.Store(rec.ExpiresAt.UnixNano())
	return sb
}

// New returns an Edge. Call Start to re-adopt existing sandboxes and start the reaper.
func New(cfg Config, log *slog.Logger, st *store.Store, rt Runtime, layers LayerStore) (*Edge, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("edge config: %w", err)
	}
	policy, err := limits.New(cfg.Limits)
	if err != nil {
		return nil, fmt.Errorf("edge config: %w", err)
	}
	if st == nil {
		if err := cfg.checkStoreless(); err != nil {
			return nil, err
		}
	}
	e := &Edge{
		cfg: cfg, log: log, store: st, rt: rt, layers: layers, policy: policy,
		live: make(map[string]*sandbox), bySrc: make(map[netip.Addr]*netTarget), pools: make(map[string]*fncallPool),
		stop: make(chan struct{}), done: make(chan struct{}), samplerDone: make(chan struct{}), activity: newActivityQueue(),
		bus: cfg.Events, rings: map[string]*ring{}, warm: newWarmState(), warmDone: make(chan struct{}),
	}
	e.machines, _ = rt.(runtime.Machine)
	e.cleanups.idle.L = &e.cleanups.mu
	if e.bus == nil {
		e.bus = events.New(cfg.Node, events.Config{}, log)
	}
	if e.settings = cfg.Settings; e.settings == nil {
		e.settings = storeSettings{st}
	}
	if e.traj = cfg.Trajectory; e.traj == nil {
		e.traj = st
	}
	if e.admissions = cfg.Admissions; e.admissions == nil {
		e.admissions = st
	}
	if e.publisher = cfg.Publisher; e.publisher == nil {
		e.publisher = st
	}
	if st != nil {
		e.local = &catalog.Resolver{Store: st, Log: log}
		if e.adopts() {
			e.local.Adopt = e.SyncShared
		}
		if !e.clustered() {
			e.local.Node = cfg.Node // a volume lives on the node that made it
		}
	}
	if e.resolver = cfg.Catalog; e.resolver == nil {
		e.resolver = e.local
	}
	if e.reader = cfg.CatalogReader; e.reader == nil {
		e.reader = e.local
	}
	e.own = newOwnRecords()
	records := cfg.Records
	if records == nil {
		records = st
	}
	e.records = writeThrough{Records: records, own: e.own}
	if e.recRead = cfg.RecordReader; e.recRead == nil {
		e.recRead = st
	}
	if e.volCat = cfg.VolumeCatalog; e.volCat == nil {
		e.volCat = storeVolumes{st, cfg.Node}
	}
	if e.layerUse = cfg.LayerUse; e.layerUse == nil {
		e.layerUse = st
	}
	if cfg.ArtifactDir != "" {
		a, err := openArtifacts(cfg.ArtifactDir)
		if err != nil {
			return nil, err
		}
		e.artifacts = a
	}
	return e, nil
}

// Node returns the node name.
func (e *Edge) Node() string { return e.cfg.Node }

// idRE matches sandbox IDs: "sb-", the node name, "-", 16 base32 characters.
var idRE = lazyregexp.New(`^sb-(` + nodePattern + `)-([a-z2-7]{16})$`)

// ValidID reports whether id has the form of a sandbox ID.
func ValidID(id string) bool { return idRE.MatchString(id) }

// NodeOf returns the node named in a sandbox ID, or "" if id is not one.
func NodeOf(id string) string {
	m := idRE.FindStringSubmatch(id)
	if m == nil {
		return ""
	}
	return m[1]
}

func (e *Edge) newID() string {
	var b [10]byte
	rand.Read(b[:])
	return "sb-" + e.cfg.Node + "-" + strings.ToLower(base32.StdEncoding.EncodeToString(b[:]))
}

func checkID(id string) error {
	if !ValidID(id) {
		return errdefs.Invalid("id", "%q is not a sandbox ID (sb-NODE-XXXXXXXXXXXXXXXX)", id)
	}
	return nil
}

// Start re-adopts the sandboxes this node ran before a restart, marks those that died meanwhile as
// failed, removes runtime state nobody owns, and starts the reaper. It must be called once.
func (e *Edge) Start(ctx context.Context) error {
	// Before reconcile: re-adopted sandboxes recompile their policies against it.
	if err := e.loadCatalog(ctx); err != nil {
		return err
	}
	if err := e.reconcile(ctx); err != nil {
		return err
	}
	if err := e.reconcileVolumes(ctx); err != nil {
		return fmt.Errorf("reconcile volumes: %w", err)
	}
	if err := e.loadInstance(ctx); err != nil {
		return fmt.Errorf("edge instance name: %w", err)
	}
	if err := e.shareAll(ctx); err != nil {
		// Not fatal: this node works; other nodes do not see its versions until the next start.
		e.log.Error("record this node's layer versions in the shared catalogue", "err", err)
	}
	if err := e.startPools(ctx); err != nil {
		return fmt.Errorf("start fncall pools: %w", err)
	}
	go e.reaper()
	go e.sampler()
	go e.warmLoop()
	if e.cfg.Activity != nil {
		go e.activityLoop()
	} else {
		close(e.activity.done)
	}
	return nil
}

// Close stops the reaper and the sampler and flushes activity. Sandboxes keep running.
func (e *Edge) Close() {
	close(e.stop)
	<-e.done
	<-e.samplerDone
	<-e.warmDone
	<-e.activity.done
	e.closeCleanups()
	e.steps.close()
	e.flushActivity(context.Background())
}

func (e *Edge) reconcile(ctx context.Context) error {
	own := e.cfg.OwnRecords
	if own == nil {
		own = func(ctx context.Context) ([]*store.Sandbox, error) {
			return e.store.ListSandboxes(ctx, store.SandboxFilter{
				Node: e.cfg.Node, States: []string{model.StateCreating, model.StateRunning, model.StatePaused, model.StateOff, model.StateDeleting},
			})
		}
	}
	recs, err := own(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	// The copy starts as the store has them; what reconcile writes below updates it.
	e.own.load(recs)
	known := make(map[string]bool, len(recs))
	adopted := 0
	for _, rec := range recs {
		known[rec.ID] = true
		log := e.log.With("sandbox", rec.ID)
		if rec.State == model.StateDeleting && rec.Stopping == nil {
			// Never written so (Delete records both at once), but a deleting sandbox is never
			// re-adopted.
			rec.Stopping = &store.StopIntent{State: model.StateStopped, Reason: model.ReasonDeleted, At: time.Now().UTC()}
		}
		if st := rec.Stopping; st != nil {
			// Its teardown was cut short: finish it, with the outcome it was going to record.
			log.Warn("sandbox was being stopped when corral stopped; finishing", "state", st.State, "reason", st.Reason)
			if err := e.rt.Delete(ctx, rec.ID); err != nil {
				log.Error("remove the runtime state of a sandbox being stopped", "err", err)
			}
			e.releaseSlot(rec)
			e.finishFetch(rec.ID)
			rec.NetSlot = nil
			e.uploadLeftVolumes(ctx, rec)
			e.finish(ctx, rec, st.State, st.Reason)
			continue
		}
		if rec.State == model.StateCreating {
			log.Warn("sandbox was being created when corral stopped; removing it")
			e.rt.Delete(ctx, rec.ID)
			e.releaseSlot(rec)
			e.finishFetch(rec.ID) // a lazyd that outlived corral may still count it
			e.finish(ctx, rec, model.StateFailed, reasonInterruptedCreate)
			continue
		}
		rsb, err := e.rt.Open(ctx, rec.ID)
		var st runtime.Status
		if err == nil {
			st, err = e.rt.Status(ctx, rec.ID)
		}
		// Frozen (runc) or checkpointed (gVisor) by a pause that did not get recorded: thawed
		// below, once its network is adopted, rather than left stuck.
		thaw := err == nil && st.State == runtime.StatePaused && rec.State == model.StateRunning
		if err == nil && rec.State == model.StatePaused && st.State == runtime.StateRunning {
			rec.State, rec.PausedAt = model.StateRunning, time.Time{}
			e.records.PutSandbox(ctx, rec)
		}
		switch {
		case err == nil && st.State == runtime.StateOff && rec.State != model.StateOff:
			rec.State = model.StateOff // its QEMU ended while corral was down (machineGone)
			e.records.PutSandbox(ctx, rec)
		case err == nil && st.State == runtime.StateRunning && rec.State == model.StateOff:
			rec.State = model.StateRunning // powered on just before corral stopped
			e.records.PutSandbox(ctx, rec)
		}
		if err != nil || (st.State != runtime.StateRunning && st.State != runtime.StatePaused && st.State != runtime.StateOff) {
			reason := "error: the sandbox's processes exited while corral was down"
			if err == nil && st.OOMKills > 0 {
				reason = model.ReasonOOMKilled
			} else if err != nil {
				reason = "error: sandbox state lost while corral was down: " + err.Error()
			}
			log.Warn("sandbox died while corral was down", "reason", reason)
			e.rt.Delete(ctx, rec.ID)
			e.releaseSlot(rec)
			e.finishFetch(rec.ID)
			e.uploadLeftVolumes(ctx, rec)
			e.finish(ctx, rec, model.StateFailed, reason)
			continue
		}
		sb := newSandbox(rec, rsb.AgentSocket)
		for _, d := range rec.Lower {
			if !e.layers.Hold(d) {
				log.Warn("a layer of a surviving sandbox is not mounted under the layer store; it cannot be unmounted when the sandbox ends", "digest", d)
				if sb.unheld == nil {
					sb.unheld = map[string]bool{}
				}
				sb.unheld[d] = true
			}
		}
		if sb.net, err = e.adoptNetwork(rec); err != nil {
			log.Error("re-attach the sandbox's network; it keeps its namespace but its policy and DNS are not enforced until fixed", "err", err)
		}
		if thaw {
			log.Warn("sandbox found paused though recorded running (a pause cut short); resuming it")
			if sb.net != nil && rec.Runtime == RuntimeGVisor {
				// As in resume: the restored netstack takes the address over from the namespace.
				if err := e.cfg.Net.Manager.Reconfigure(sb.net.slot); err != nil {
					log.Error("give the namespace its address back before the restore", "err", err)
				}
			}
			if _, err := e.rt.Resume(ctx, rec.ID); err != nil {
				log.Error("resume a sandbox found paused", "err", err)
			}
		}
		sb.oomSeen.Store(st.OOMKills)
		sb.oomEvented.Store(st.OOMKills)
		e.mu.Lock()
		e.live[rec.ID] = sb
		e.mu.Unlock()
		if !sb.paused.Load() && !sb.off.Load() {
			e.resumeRecording(sb)
		}
		adopted++
	}
	ids, err := e.rt.List(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list runtime sandboxes: %w", err)
	}
	for _, id := range ids {
		if !known[id] {
			e.log.Warn("removing runtime state of a sandbox the store does not run", "sandbox", id)
			if err := e.rt.Delete(ctx, id); err != nil {
				e.log.Error("remove orphaned sandbox", "sandbox", id, "err", err)
			}
		}
	}
	// Layers mounted for sandboxes that did not survive.
	if n, err := e.layers.Sweep(); err != nil {
		e.log.Error("unmount layers no sandbox uses", "err", err)
	} else if n > 0 {
		e.log.Info("unmounted layers no sandbox uses", "count", n)
	}
	e.log.Info("reconciled sandboxes", "adopted", adopted, "records", len(recs))
	return nil
}

// acquireLayers mounts digests (bottom first) and returns their directories. On error it has
// released what it mounted.
func (e *Edge) acquireLayers(ctx context.Context, digests []string) ([]string, error) {
	dirs := make([]string, 0, len(digests))
	for i, d := range digests {
		p, err := e.layers.Acquire(ctx, d)
		if err != nil {
			for _, m := range digests[:i] {
				e.layers.Release(m)
			}
			return nil, err
		}
		dirs = append(dirs, p)
	}
	return dirs, nil
}

// prepareLayers starts fetching rec's layers as its Fetch mode says (eager waits for all their
// data), then mounts them.
func (e *Edge) prepareLayers(ctx context.Context, rec *store.Sandbox, fill map[string]int64) (_ []string, err error) {
	ctx, span := trace.Start(ctx, trace.LayerFetch, trace.Sandbox(rec.ID), trace.String("corral.fetch", rec.Fetch), trace.Int("corral.layers", len(rec.Lower)))
	defer span.End(&err)
	key := "env:" + rec.Environment
	if rec.Environment == "" {
		key = "layers:" + strings.Join(rec.Lower, ",")
	}
	f := layers.Fetch{Sandbox: rec.ID, Key: key, Mode: rec.Fetch, FillRate: map[string]int64{}}
	for d, rate := range fill {
		switch {
		case rate > 0:
			f.FillRate[d] = rate
		case rate < 0:
			f.FillRate[d] = 0 // never, whatever the node's default
		}
	}
	if err := e.layers.Prepare(ctx, rec.Lower, f); err != nil {
		e.finishFetch(rec.ID)
		return nil, err
	}
	dirs, err := e.acquireLayers(ctx, rec.Lower)
	if err != nil {
		e.finishFetch(rec.ID)
	}
	return dirs, err
}

// finishFetch ends a sandbox's fetching of layer data, logging what it fetched.
func (e *Edge) finishFetch(id string) {
	st, err := e.layers.Finish(context.Background(), id)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			e.log.Warn("end a sandbox's layer fetching", "sandbox", id, "err", err)
		}
		return
	}
	if st.BytesFetched > 0 || st.ReadErrors > 0 {
		e.log.Info("sandbox layer data fetched", "sandbox", id, "bytes_fetched", st.BytesFetched,
			"cache_hits", st.Hits, "cache_misses", st.Misses, "read_errors", st.ReadErrors)
	}
}

// FetchStats reports how a running sandbox's layer data reaches the node.
func (e *Edge) FetchStats(ctx context.Context, id string) (lazy.Stats, error) {
	rec, err := e.Get(ctx, id)
	if err != nil {
		return lazy.Stats{}, err
	}
	st, err := e.layers.SandboxStats(ctx, rec.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return lazy.Stats{Sandbox: rec.ID}, nil // nothing fetched lazily (ended, or layers stored whole)
	}
	return st, err
}

// LayerStats describes a stored layer on this node.
func (e *Edge) LayerStats(ctx context.Context, digest string) (layers.LayerStats, error) {
	return e.layers.Stats(ctx, digest)
}

// releaseLayers drops the references that rec's sandbox held on its layers (all but unheld);
// its overlay is gone.
func (e *Edge) releaseLayers(rec *store.Sandbox, unheld map[string]bool) {
	e.finishFetch(rec.ID)
	for _, d := range rec.Lower {
		if unheld[d] {
			continue // never held: releasing it would take another sandbox's reference
		}
		if err := e.layers.Release(d); err != nil {
			e.log.Warn("release a layer", "sandbox", rec.ID, "digest", d, "err", err)
		}
	}
}

// finish records that a sandbox left the running state.
func (e *Edge) finish(ctx context.Context, rec *store.Sandbox, state, reason string) {
	rec.State, rec.Reason, rec.EndedAt, rec.Stopping = state, reason, time.Now().UTC(), nil
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		e.log.Error("record sandbox end", "sandbox", rec.ID, "state", state, "err", err)
	}
	switch {
	case rec.Tier == TierFncall:
	case e.cfg.Activity != nil:
		e.queueActivity(store.Activity{ID: rec.ID, EndedAt: rec.EndedAt, EndReason: reason})
	default:
		if err := e.store.UsageEnded(context.WithoutCancel(ctx), rec.ID, rec.EndedAt, reason); err != nil {
			e.log.Warn("record usage", "sandbox", rec.ID, "err", err)
		}
	}
	e.ringEnded(rec.ID)
	e.emitEnd(rec, state, reason)
}

// admitOnNode records rec through admission (quotas, idempotency), first checking that the node
// has room for it when it has a capacity. The room taken is counted from the check on
// (admitReleasing), so concurrent creates cannot both take the last room.
func (e *Edge) admitOnNode(ctx context.Context, rec *store.Sandbox, key *store.Idempotency) error {
	if e.draining.Load() {
		return fmt.Errorf("node %s is draining (corral node uncordon %s lets it take sandboxes again): %w", e.cfg.Node, e.cfg.Node, errdefs.ErrNodeFull)
	}
	c := e.cfg.Capacity
	if c == nil && e.cfg.Disk == nil {
		return e.admitRecord(ctx, rec, key)
	}
	e.capMu.Lock()
	defer e.capMu.Unlock()
	err := e.roomLocked(rec, 1)
	if errors.Is(err, errdefs.ErrNodeFull) && e.cleanupsPending() {
		// A delete answers before its cleanup gives the disk back: a create right after it
		// waits for the cleanups pending now (they take a moment), then looks again.
		e.capMu.Unlock()
		wctx, cancel := context.WithTimeout(ctx, cleanupWaitOnFull)
		werr := e.WaitCleanups(wctx)
		cancel()
		e.capMu.Lock()
		if werr == nil {
			err = e.roomLocked(rec, 1)
		}
	}
	if err != nil {
		return err
	}
	return e.admitReleasing([]*store.Sandbox{rec}, func() error { return e.admitRecord(ctx, rec, key) })
}

// roomLocked checks that the node has room for n sandboxes of rec's limits (rec's limits are
// the n's sum). Preconditions: e.capMu is held.
func (e *Edge) roomLocked(rec *store.Sandbox, n int) error {
	c := e.cfg.Capacity
	if e.cfg.Disk != nil {
		if err := e.admitDiskLocked(rec); err != nil {
			return err
		}
	}
	if c == nil {
		return nil
	}
	used := e.withPooled(e.nodeUsage())
	var over []string
	if c.Sandboxes > 0 && used.Sandboxes+n > c.Sandboxes {
		over = append(over, fmt.Sprintf("sandboxes %d of %d", used.Sandboxes, c.Sandboxes))
	}
	if c.CPUs > 0 && used.CPUs+rec.Limits.CPUs > c.CPUs+1e-9 {
		over = append(over, fmt.Sprintf("CPUs %g+%g of %g", used.CPUs, rec.Limits.CPUs, c.CPUs))
	}
	if c.MemoryBytes > 0 && used.MemoryBytes+rec.Limits.MemoryBytes > c.MemoryBytes {
		over = append(over, fmt.Sprintf("memory %d+%d of %d bytes", used.MemoryBytes, rec.Limits.MemoryBytes, c.MemoryBytes))
	}
	if c.DiskBytes > 0 && used.DiskBytes+rec.Limits.DiskBytes > c.DiskBytes {
		over = append(over, fmt.Sprintf("disk %d+%d of %d bytes", used.DiskBytes, rec.Limits.DiskBytes, c.DiskBytes))
	}
	if len(over) > 0 {
		return fmt.Errorf("node %s has no room for sandbox %s (%s): %w", e.cfg.Node, rec.ID, strings.Join(over, "; "), errdefs.ErrNodeFull)
	}
	return nil
}

// Create validates req, resolves its layers, and starts a sandbox. It returns once the sandbox is
// running; its agent answers the first request as soon as it has started.
func (e *Edge) Create(ctx context.Context, req model.CreateRequest) (*store.Sandbox, error) {
	return e.create(ctx, req, false, nil)
}

// reasonInterruptedCreate is the end of a sandbox whose create a crash (or stop) of corral cut
// short: rolled back at the next start.
const reasonInterruptedCreate = "error: corral stopped while the sandbox was being created"

// CreateOnce is Create with an idempotency key: a create that repeats an earlier one (same
// principal, key and request) makes nothing and returns the sandbox the first one made (its
// current record), and replayed reports true. When the first one was cut short by a crash and
// rolled back at the restart, the client never had an answer, so its retry creates anew.
func (e *Edge) CreateOnce(ctx context.Context, req model.CreateRequest, key *store.Idempotency) (rec *store.Sandbox, replayed bool, err error) {
	for try := 0; ; try++ {
		rec, err = e.create(ctx, req, false, key)
		re, ok := errors.AsType[*store.ReplayError](err)
		if !ok {
			return rec, false, err
		}
		if rec = re.Record; rec == nil || NodeOf(rec.ID) == e.cfg.Node {
			// Another node's sandbox comes with its record when the servers answer the
			// replay; the node's own is read from its copy, with its live activity.
			if rec, err = e.Get(ctx, re.SandboxID); err != nil {
				return nil, false, err
			}
		}
		if rec.State == model.StateCreating {
			// The first try is still at work (its client gave up, or its server replica died,
			// while the edge went on): answered when it ends, never as a sandbox half made.
			return nil, false, errdefs.Retryable(errdefs.Unavailable("the create with idempotency key %q is still in progress (sandbox %s); retry", key.Key, rec.ID), time.Second)
		}
		if try > 0 || rec.State != model.StateFailed || rec.Reason != reasonInterruptedCreate {
			return rec, true, nil
		}
		// A concurrent retry that released the key first makes the sandbox; this one then finds
		// the key naming it and answers with it.
		if err := e.admissions.ReleaseIdempotency(ctx, key, rec.ID); err != nil {
			return nil, false, err
		}
		e.log.Info("retry of a create that a crash cut short: creating anew", "interrupted", rec.ID)
	}
}

// create is Create; calls makes a container of an fncall pool (tier fncall), whose agent runs
// isolated calls only.
func (e *Edge) create(ctx context.Context, req model.CreateRequest, calls bool, key *store.Idempotency) (_ *store.Sandbox, err error) {
	ctx, span := trace.Start(ctx, trace.Create, trace.Node(e.cfg.Node))
	defer span.End(&err)
	start := time.Now()
	if !calls {
		e.creating.Add(1)
		defer func() {
			e.createdAt.Store(time.Now().UnixNano())
			e.creating.Add(-1)
		}()
	}
	if key != nil {
		// Most retries find the key before any work (the admission transaction checks again).
		if err := e.admissions.CheckIdempotency(ctx, key); err != nil {
			return nil, err
		}
	}
	actx, aspan := trace.Start(ctx, trace.Admit)
	e.layersMu.RLock()
	adm, err := e.admit(actx, req, calls)
	if err != nil {
		e.layersMu.RUnlock()
		aspan.End(&err)
		return nil, err
	}
	if !calls {
		if rec, ok, err := e.claimWarm(actx, req, adm, key); ok {
			e.layersMu.RUnlock()
			aspan.End(&err)
			if rec != nil {
				span.Set(trace.Sandbox(rec.ID), trace.Project(rec.Project), trace.Tier(rec.Tier), trace.String("corral.claimed", "true"))
			}
			return rec, err
		}
	}
	rec := adm.rec
	span.Set(trace.Sandbox(rec.ID), trace.Project(rec.Project), trace.Tier(rec.Tier))
	// The quotas of the project and its ancestors are checked in the transaction that records it.
	err = e.admitOnNode(actx, rec, key)
	e.layersMu.RUnlock()
	aspan.End(&err)
	if err != nil {
		if _, ok := errors.AsType[*iam.QuotaError](err); ok {
			// No sandbox was made: the event names the project and the quota, not an ID.
			e.bus.Publish(events.Event{Type: events.QuotaRefused, Project: rec.Project, Tier: rec.Tier, Reason: err.Error()})
		}
		return nil, err
	}
	return e.launch(ctx, adm, calls, key, start)
}

// launch starts the sandbox of an admission whose record the store holds (state creating). It
// is the create's story, one resource a step, each step pushing its undo onto a cleanup stack
// as soon as it holds the resource:
//
//  1. the record, written by admission: on failure it ends failed with the cause as its reason,
//     and the idempotency key of a create whose caller went away is released;
//  2. the layers, fetched and mounted (prepareLayers), then the volumes fetched;
//  3. the network slot (attachNetwork), when the policy asks for a network;
//  4. the runtime's sandbox (Runtime.Create; from adm.fork when a fork);
//  5. the live entry and the record's running state; then the services start.
//
// On error the stack unwinds newest first, so the record ends failed and nothing is left.
//
// start is when the create began; the debug log has the time of each step.
func (e *Edge) launch(ctx context.Context, adm *admission, calls bool, key *store.Idempotency, start time.Time) (*store.Sandbox, error) {
	rec := adm.rec
	tAdmitted := time.Now()
	log := e.log.With("sandbox", rec.ID, "project", rec.Project)
	var undo cleanup.Stack
	var cause error // the failure, for the record's reason
	fail := func(err error) (*store.Sandbox, error) {
		cause = err
		undo.Unwind()
		return nil, fmt.Errorf("create sandbox %s: %w", rec.ID, err)
	}
	undo.Push(func() {
		if key != nil && ctx.Err() != nil {
			// Cut short because its caller went away (the client, or the server replica that
			// forwarded it): nobody had an answer, so the key is released and the client's
			// retry makes the sandbox instead of finding this failure.
			if rerr := e.admissions.ReleaseIdempotency(context.WithoutCancel(ctx), key, rec.ID); rerr != nil {
				log.Error("release the idempotency key of a cancelled create", "err", rerr)
			}
		}
	})
	undo.Push(func() { e.finish(context.WithoutCancel(ctx), rec, model.StateFailed, "error: "+cause.Error()) })
	created := ""
	if adm.fork != nil {
		created = "fork of " + adm.fork.Source
	}
	e.emit(events.Created, rec, created)
	e.usageCreated(ctx, rec)
	// The record (state creating) now keeps the layers from deletion; fetch and mount them.
	lower, err := e.prepareLayers(ctx, rec, adm.fill)
	if err != nil {
		log.Error("mount the sandbox's layers", "err", err)
		return fail(err)
	}
	undo.Push(func() { e.releaseLayers(rec, nil) })
	if err := e.fetchVolumes(ctx, rec); err != nil {
		log.Error("fetch the sandbox's volumes", "err", err)
		return fail(err)
	}
	tLayers := time.Now()
	var nw *sandboxNet
	var resolv string
	if adm.net.Mode != model.NetworkNone {
		nctx, nspan := trace.Start(ctx, trace.NetAttach, trace.Sandbox(rec.ID))
		nw, resolv, err = e.attachNetwork(nctx, rec, adm.net)
		nspan.End(&err)
		if err != nil {
			log.Error("create sandbox network", "err", err)
			return fail(err)
		}
		undo.Push(func() {
			e.detachNetwork(rec.ID, nw)
			rec.NetSlot = nil
		})
	}
	spec, err := e.launchSpec(ctx, adm, lower, nw, resolv, calls, log)
	if err != nil {
		return fail(err)
	}
	tNet := time.Now()
	rctx, rspan := trace.Start(ctx, trace.RuntimeNew, trace.Sandbox(rec.ID), trace.Tier(rec.Tier), trace.String("corral.runtime", rec.Runtime))
	rsb, err := e.rt.Create(rctx, spec)
	rspan.End(&err)
	if err != nil {
		log.Error("create sandbox", "err", err)
		return fail(err)
	}
	undo.Push(func() { e.rt.Delete(context.WithoutCancel(ctx), rec.ID) })
	tRuntime := time.Now()
	sb := e.goLive(rec, rsb, nw)
	if rec.Tier == TierMicroVM && adm.fork != nil && adm.fork.Memory {
		rec.Boot = "fork"
	}
	undo.Push(func() { e.dropLive(rec.ID) })
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		// The sandbox runs but the store does not say so: undo, so the two never disagree. Its
		// record ends too (the write failed, often because the client went away and took ctx
		// with it): left in state creating, it would hold its quota and refuse deletes as "not
		// managed yet" until the next restart.
		return fail(err)
	}
	undo.Release()
	if !calls {
		e.startServices(ctx, sb, rec, adm.services, false)
	}
	log.Info("sandbox created", "tier", rec.Tier, "base", rec.Base, "image", rec.Image, "layers", len(lower))
	log.Debug("sandbox create steps", "admit", tAdmitted.Sub(start), "layers", tLayers.Sub(tAdmitted), "network", tNet.Sub(tLayers),
		"runtime", tRuntime.Sub(tNet), "record", time.Since(tRuntime), "total", time.Since(start))
	e.emit(events.Started, rec, "")
	return rec, nil
}

// launchSpec is the runtime spec of adm's sandbox, its layers mounted at lower and its network
// (nil: none) attached; a microvm gets its layers' images, a vm its disk image. It logs why it
// fails.
func (e *Edge) launchSpec(ctx context.Context, adm *admission, lower []string, nw *sandboxNet, resolv string, calls bool, log *slog.Logger) (runtime.Spec, error) {
	rec := adm.rec
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=xterm"}, rec.Env...)
	spec := e.runtimeSpec(rec, lower, env, calls)
	if nw != nil {
		spec.Netns, spec.ResolvConf = nw.slot.Netns, resolv
	}
	var err error
	switch rec.Tier {
	case TierMicroVM:
		if nw != nil {
			spec.Addr, spec.Gateway = nw.slot.SandboxAddr, nw.slot.HostAddr
		}
		if spec.Images, err = e.layerImages(ctx, rec.Lower); err != nil {
			log.Error("find the sandbox's layer images", "err", err)
			return spec, err
		}
	case TierVM:
		if nw != nil {
			spec.Addr, spec.Gateway = nw.slot.SandboxAddr, nw.slot.HostAddr
		}
		if spec.BootDisk, spec.BootDiskFormat, err = vmDiskFile(lower); err != nil {
			log.Error("find the sandbox's disk image", "err", err)
			return spec, err
		}
	}
	spec.Template = adm.template
	spec.Volumes, spec.Fork = e.runtimeVolumes(rec), adm.fork
	return spec, nil
}

// goLive makes the runtime's new sandbox rsb a live sandbox of the edge, its record in state
// running (the caller writes it).
func (e *Edge) goLive(rec *store.Sandbox, rsb *runtime.Sandbox, nw *sandboxNet) *sandbox {
	sb := newSandbox(rec, rsb.AgentSocket)
	sb.net = nw
	sb.touch()
	rec.State = model.StateRunning
	rec.Accelerator = rsb.Accelerator
	if rec.Tier == TierMicroVM {
		rec.Boot = "boot"
		if rsb.Template != "" {
			rec.Boot = "template"
		}
	}
	e.mu.Lock()
	e.live[rec.ID] = sb
	e.mu.Unlock()
	return sb
}

// agentArgs are corral-agent's arguments in every new sandbox.
func (e *Edge) agentArgs(calls bool) []string {
	args := []string{"serve", "--fd", "3"}
	if calls {
		args = append(args, "--calls")
	}
	if e.cfg.KeepExitedCommands > 0 {
		args = append(args, "--retain-exited", strconv.Itoa(e.cfg.KeepExitedCommands))
	}
	if e.cfg.KeepExitedFor > 0 {
		args = append(args, "--retain-for", e.cfg.KeepExitedFor.String())
	}
	return args
}

// admission is a validated create request: the record (state creating, its layers' digests
// bottom first in Lower) and the compiled network policy.
type admission struct {
	rec *store.Sandbox
	net *netpolicy.Compiled
	// fill is each layer's background fill setting (corral.Layer.FillRate), by digest.
	fill map[string]int64
	// template: the sandbox's environment starts its microvms from a template.
	template bool
	// services are the layers' services (services.go), started once the sandbox runs.
	services []model.Service
	// fork, for a copy of a fork (fork.go), is the image the runtime starts it from.
	fork *runtime.ForkImage
}

// admitTier checks that this node offers a create's tier (catalog.Tier; calls: an fncall pool's
// container) and resolves its runtime.
func (e *Edge) admitTier(req model.CreateRequest, calls bool) (tier, runtime string, err error) {
	if tier, err = catalog.Tier(req, calls); err != nil {
		if req.Tier != TierFncall {
			return "", "", errdefs.Invalid("tier", "%q is not a tier: want container, microvm or vm (available here: %s)", req.Tier, strings.Join(e.Tiers(), ", "))
		}
		return "", "", err
	}
	switch tier {
	case TierVM:
		if e.machines == nil {
			return "", "", errdefs.Invalid("tier", "vm is not available on this node: the VM tiers are off")
		}
		if err := e.machines.MachineAvailable(); err != nil {
			return "", "", errdefs.Invalid("tier", "vm is not available on this node: %v", err)
		}
	case TierMicroVM:
		if err := e.rt.Available(RuntimeQEMU); err != nil {
			return "", "", errdefs.Invalid("tier", "microvm is not available on this node: %v", err)
		}
	}
	runtime = req.Runtime
	switch {
	case tier == TierMicroVM || tier == TierVM:
		if runtime != "" && runtime != RuntimeQEMU {
			return "", "", errdefs.Invalid("runtime", "%q: %s sandboxes run on %q", req.Runtime, tier, RuntimeQEMU)
		}
		runtime = RuntimeQEMU
	case runtime == "", runtime == RuntimeRunc:
		runtime = RuntimeRunc
	case runtime == RuntimeGVisor:
		if err := e.rt.Available(RuntimeGVisor); err != nil {
			return "", "", errdefs.Invalid("runtime", "gvisor is not available on this node: %v", err)
		}
	default:
		return "", "", errdefs.Invalid("runtime", "%q: want %q or %q", req.Runtime, RuntimeRunc, RuntimeGVisor)
	}
	return tier, runtime, nil
}

// admit validates a create request and turns it into a record in state creating. What the
// request names in the catalogue is resolved by e.resolver (the servers, on a cluster's edge);
// what depends on the node (its tiers, labels, limits policy, network) here: first what the
// request says itself, then again with its environment's defaults.
func (e *Edge) admit(ctx context.Context, req model.CreateRequest, calls bool) (*admission, error) {
	if _, _, err := e.admitTier(req, calls); err != nil {
		return nil, err
	}
	if err := placement.ValidateLabels("node_selector", req.NodeSelector); err != nil {
		return nil, err
	}
	if !placement.Matches(req.NodeSelector, e.cfg.Labels) {
		return nil, fmt.Errorf("node %s lacks the labels the create asks for (node_selector %v; the node has %v): %w", e.cfg.Node, req.NodeSelector, e.cfg.Labels, errdefs.ErrNodeFull)
	}
	life, err := e.lifetimes(req)
	if err != nil {
		return nil, err
	}
	if len(req.Volumes) > 0 {
		if err := e.volumesOn(); err != nil {
			return nil, err
		}
	}
	res, err := e.resolver.Resolve(ctx, req, calls)
	if err != nil {
		return nil, err
	}
	req = res.Request
	tier, runtime, err := e.admitTier(req, calls)
	if err != nil {
		return nil, err
	}
	// Every limit is resolved here, before anything is allocated: the runtimes get them whole.
	resolved, err := e.policy.Resolve(tier, limits.Limits(req.Limits))
	if err != nil {
		return nil, err
	}
	netc, err := e.compileNetwork(req.Network)
	if err != nil {
		return nil, err
	}
	// The base image's configuration: its environment under the request's (the request wins),
	// its working directory and user as the commands' defaults.
	env := req.Env
	var cwd, user string
	if c := res.ImageConfig; c != nil {
		env = mergeEnv(c.Env, req.Env)
		cwd, user = c.WorkingDir, c.User
	}
	fetch := req.Fetch
	if fetch == "" {
		fetch = e.cfg.FetchMode
	}
	if fetch != "" && !lazy.ValidMode(fetch) {
		return nil, errdefs.Invalid("fetch", "%q: want eager, lazy or prefetch", req.Fetch)
	}
	now := time.Now().UTC()
	id := e.newID()
	host := req.Hostname
	if host == "" {
		host = id
	}
	rec := &store.Sandbox{
		Sandbox: model.Sandbox{
			ID: id, Node: e.cfg.Node, Tier: tier, Runtime: runtime,
			State: model.StateCreating, Image: req.Image,
			Base: req.Base, Workspace: req.Workspace, Toolkits: req.Toolkits, FromSnapshot: req.FromSnapshot, Environment: req.Environment,
			Limits: model.Limits(resolved), Env: env, Labels: req.Labels, Hostname: host, Cwd: cwd, User: user,
			CreatedAt: now, ExpiresAt: now.Add(life.ttl), IdleTTLSeconds: int64(life.idle / time.Second),
			LastActivityAt: now, AutoPauseAfterSeconds: int64(life.autoPause / time.Second), PauseKeepsTTL: life.keepsTTL,
			Network: apiPolicy(netc), Project: iam.Display(res.ProjectPath), Fetch: fetch, Volumes: res.Volumes,
		},
		Lower:     res.Digests,
		ProjectID: res.ProjectID,
		VolumeIDs: res.VolumeIDs,
	}
	return &admission{rec: rec, net: netc, fill: res.Fill, template: res.Template, services: res.Services}, nil
}

// lifetimes are a create's ttl, idle_ttl and auto_pause_after (0: none), resolved by the limits
// policy, and whether a pause keeps the TTL running.
type lifetimes struct {
	ttl, idle, autoPause time.Duration
	keepsTTL             bool
}

func (e *Edge) lifetimes(req model.CreateRequest) (l lifetimes, err error) {
	l.ttl = e.policy.DefaultTTL()
	if req.TTL != "" {
		if l.ttl, err = e.policy.TTL("ttl", req.TTL); err != nil {
			return l, err
		}
	}
	if req.IdleTTL != "" {
		if l.idle, err = e.policy.TTL("idle_ttl", req.IdleTTL); err != nil {
			return l, err
		}
	}
	if req.AutoPauseAfter != "" {
		if l.autoPause, err = e.policy.TTL("auto_pause_after", req.AutoPauseAfter); err != nil {
			return l, err
		}
	}
	l.keepsTTL = req.PauseKeepsTTL == nil || *req.PauseKeepsTTL
	return l, nil
}

// project returns the project at path (as the API gives it; "" is the root), which must exist.
func (e *Edge) project(ctx context.Context, path string) (*store.ProjectRecord, error) {
	if e.store == nil {
		return nil, errors.New("a cluster's edge reads no project: its servers resolve them")
	}
	return catalog.ProjectAt(ctx, e.store, path)
}

// mergeEnv returns base with over's variables replacing or added.
func mergeEnv(base, over []string) []string {
	out := append([]string(nil), base...)
	for _, kv := range over {
		k, _, _ := strings.Cut(kv, "=")
		out = slices.DeleteFunc(out, func(b string) bool { bk, _, _ := strings.Cut(b, "="); return bk == k })
		out = append(out, kv)
	}
	return out
}

// resolveLayer returns the published layer ref (NAME:VERSION or NAME:TAG) names, if project at
// (canonical) sees it, checking its kind (catalog.Resolver.Layer, on the node's own store).
func (e *Edge) resolveLayer(ctx context.Context, field, ref, kind, at string) (model.Layer, error) {
	return catalog.LayerIn(ctx, e.reader, field, ref, kind, at)
}

// CheckBelow validates the versions a new layer of kind, published in project at (canonical),
// stacks on (catalog.CheckBelowIn, as the catalogue reader reads them) and returns them as
// NAME:VERSION, tags resolved.
func (e *Edge) CheckBelow(ctx context.Context, kind, at string, below []string) ([]string, error) {
	return catalog.CheckBelowIn(ctx, e.reader, kind, at, below)
}

// Catalogue returns what reads the catalogue for the requests the node serves: the servers, for
// the request's caller, on a cluster's edge; the node's store under `corral up`.
func (e *Edge) Catalogue() CatalogReader { return e.reader }

// SaveEnvironment validates and saves a named composition of layers.
func (e *Edge) SaveEnvironment(ctx context.Context, env model.Environment) (model.Environment, error) {
	return e.saveEnvironment(ctx, env, false)
}

// BuildSaveEnvironment is SaveEnvironment for a build: it saves environment name of project
// with base (NAME:VERSION) as its base layer, replacing the composition of an environment of
// the same project.
func (e *Edge) BuildSaveEnvironment(ctx context.Context, name, base, project string) error {
	_, err := e.saveEnvironment(ctx, model.Environment{Name: name, Base: base, Project: project}, true)
	return err
}

func (e *Edge) saveEnvironment(ctx context.Context, env model.Environment, replace bool) (model.Environment, error) {
	var err error
	switch {
	case e.local != nil:
		err = e.local.CheckEnvironment(ctx, &env, e.environmentNetwork)
	case !replace:
		return model.Environment{}, errors.New("a cluster's environments are saved by its servers")
	default:
		// A cluster's edge, saving a build's environment: the servers check what the
		// catalogue says of it as they save it, as for one saved through the API.
		err = catalog.CheckEnvironmentDefaults(&env, e.environmentNetwork)
	}
	if err != nil {
		return model.Environment{}, err
	}
	var saved model.Environment
	if replace {
		saved, err = e.publisher.ReplaceEnvironment(ctx, env)
	} else {
		saved, err = e.store.PutEnvironment(ctx, env)
	}
	if err == nil {
		e.settingsWritten(ctx)
	}
	return saved, err
}

// environmentNetwork compiles an environment's network policy as this node would a create's.
func (e *Edge) environmentNetwork(p *model.NetworkPolicy) (*model.NetworkPolicy, error) {
	c, err := e.compileNetwork(p)
	if err != nil {
		return nil, err
	}
	return apiPolicy(c), nil
}

// Get returns a sandbox's record, with its live last activity.
func (e *Edge) Get(ctx context.Context, id string) (*store.Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb := e.lookup(id); sb != nil {
		rec.LastActivityAt = time.Unix(0, sb.lastActivity.Load()).UTC()
		rec = e.withNetStats(rec)
	}
	return rec, nil
}

// List returns the sandboxes matching f.
func (e *Edge) List(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	recs, err := e.store.ListSandboxes(ctx, f)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		if sb := e.lookup(rec.ID); sb != nil {
			rec.LastActivityAt = time.Unix(0, sb.lastActivity.Load()).UTC()
		}
	}
	return recs, nil
}

func (e *Edge) lookup(id string) *sandbox {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.live[id]
}

// active returns a running sandbox for a data-plane call and counts the call as activity. A
// paused sandbox is resumed first; concurrent callers wait for the same resume.
func (e *Edge) active(ctx context.Context, id string) (*sandbox, error) {
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.paused.Load() {
		if _, err := e.resume(ctx, sb, false); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			return nil, err
		}
	}
	if sb.off.Load() {
		return nil, errdefs.Conflict("sandbox %s is powered off: power it on first (corral power %s on)", id, id)
	}
	if sb.machine && !sb.agentUp.Load() {
		if err := e.machines.WaitAgent(ctx, id, e.cfg.VMAgentWait); err != nil {
			return nil, err
		}
		sb.agentUp.Store(true)
	}
	sb.touch()
	return sb, nil
}

// Delete ends a sandbox: when it returns, nothing of the sandbox runs and it no longer counts
// against a quota. A sandbox with volumes, or one of an fncall pool, is torn down before the
// answer (state stopped); any other answers in state "deleting" and its cleanup runs off the
// request's path (cleanup.go), recording state stopped and the deleted event when it finished.
// Deleting a sandbox that already stopped, or is being deleted, returns its record unchanged.
func (e *Edge) Delete(ctx context.Context, id string) (*store.Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return e.endSandbox(ctx, rec, model.ReasonDeleted)
}

// endSandbox ends a sandbox with state stopped and reason (a delete, an expired TTL or idle
// timeout): a live sandbox's processes are killed and the outcome recorded, and the rest of its
// teardown is left to the cleanup workers (cleanup.go), so the caller does not wait for it. A
// sandbox with volumes or an fncall pool's member is stopped in full first (stopSandbox): its
// volumes must be flushed and recovered before the record lets another sandbox attach them.
func (e *Edge) endSandbox(ctx context.Context, rec *store.Sandbox, reason string) (*store.Sandbox, error) {
	sb := e.lookup(rec.ID)
	if sb == nil || len(rec.VolumeIDs) > 0 || sb.fncall != "" {
		if err := e.stopSandbox(ctx, rec, model.StateStopped, reason); err != nil {
			return nil, err
		}
		return e.record(ctx, rec.ID)
	}
	ctx = context.WithoutCancel(ctx)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return e.record(ctx, rec.ID)
	}
	// One write makes the end durable and releases the quota: "deleting" is not a live state,
	// and reconcile finishes a cleanup cut short by a crash with the outcome in Stopping.
	prev, prevReason := rec.State, rec.Reason
	rec.State, rec.Reason = model.StateDeleting, reason
	rec.Stopping = &store.StopIntent{State: model.StateStopped, Reason: reason, At: time.Now().UTC()}
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		rec.State, rec.Reason, rec.Stopping = prev, prevReason, nil
		return nil, fmt.Errorf("record the end of sandbox %s: %w", rec.ID, err)
	}
	e.noticeBlocked(sb) // while its chain's counters are still there
	if err := e.rt.Kill(ctx, rec.ID); err != nil {
		// The cleanup's teardown kills again (and reports what it cannot); the sandbox is
		// out of the live set either way.
		e.log.Error("kill the processes of an ending sandbox", "sandbox", rec.ID, "reason", reason, "err", err)
	}
	e.leaveLive(ctx, sb, rec)
	out := *rec
	e.enqueueCleanup(cleanupJob{rec: rec, net: sb.net, unheld: sb.unheld})
	return &out, nil
}

// stopSandbox ends a live sandbox: runtime state removed, record updated. It is a no-op for a
// sandbox that is no longer live.
func (e *Edge) stopSandbox(ctx context.Context, rec *store.Sandbox, state, reason string) error {
	sb := e.lookup(rec.ID)
	if sb == nil {
		if rec.State == model.StateRunning || rec.State == model.StateCreating {
			// Live in the store but not here: a create in flight, or a record another process owns.
			// Either ends within moments (the create finishes or is rolled back), so the client's
			// retry succeeds: a 503 with Retry-After, which the SDKs repeat on their own.
			return errdefs.Retryable(errdefs.Unavailable("sandbox %s is %s on this node but not managed by it yet; retry", rec.ID, rec.State), time.Second)
		}
		return nil
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	// The outcome goes on record before the teardown starts: a crash in the middle of it then
	// ends as this outcome at the next start (reconcile), not as a sandbox that died.
	rec.Stopping = &store.StopIntent{State: state, Reason: reason, At: time.Now().UTC()}
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		rec.Stopping = nil
		return fmt.Errorf("record the end of sandbox %s: %w", rec.ID, err)
	}
	e.flushVolumes(ctx, rec, sb)
	e.noticeBlocked(sb) // while its chain's counters are still there
	if err := e.rt.Delete(ctx, rec.ID); err != nil {
		e.log.Error("delete sandbox", "sandbox", rec.ID, "err", err)
		return fmt.Errorf("delete sandbox %s: %w", rec.ID, err)
	}
	e.detachNetwork(rec.ID, sb.net)
	e.releaseLayers(rec, sb.unheld)
	// Before the record lets another sandbox attach the volumes.
	e.recoverVolumes(ctx, rec)
	if sb.fncall != "" {
		e.poolGone(rec)
	}
	rec.NetSlot = nil
	e.leaveLive(ctx, sb, rec)
	e.finish(ctx, rec, state, reason)
	e.log.Info("sandbox stopped", "sandbox", rec.ID, "state", state, "reason", reason)
	return nil
}

// SetTTL makes a running sandbox expire ttl from now.
func (e *Edge) SetTTL(ctx context.Context, id, ttl string) (*store.Sandbox, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	d, err := e.policy.TTL("ttl", ttl)
	if err != nil {
		return nil, err
	}
	sb, err := e.ownSandbox(ctx, id) // a TTL change does not resume a paused sandbox
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return nil, errdefs.Conflict("sandbox %s stopped", id)
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	extended := time.Now().UTC().Add(d).After(rec.ExpiresAt)
	rec.ExpiresAt = time.Now().UTC().Add(d)
	rec.LastActivityAt = time.Unix(0, sb.lastActivity.Load()).UTC()
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		return nil, err
	}
	switch {
	case !extended:
	case e.cfg.Activity != nil:
		e.queueActivity(store.Activity{ID: id, TTLExtended: true})
	default:
		if err := e.store.UsageExtended(ctx, id); err != nil {
			e.log.Warn("record usage", "sandbox", id, "err", err)
		}
	}
	sb.expiresAt.Store(rec.ExpiresAt.UnixNano())
	return rec, nil
}

// oomKilledSince reports whether the kernel OOM-killed a process of sb since the last look: a
// command that died of SIGKILL without a timeout is then reported as oom_killed.
func (e *Edge) oomKilledSince(ctx context.Context, sb *sandbox) bool {
	st, err := e.rt.Status(ctx, sb.id)
	if err != nil {
		return false
	}
	for {
		seen := sb.oomSeen.Load()
		if st.OOMKills <= seen {
			return false
		}
		if sb.oomSeen.CompareAndSwap(seen, st.OOMKills) {
			return true
		}
	}
}

// Count returns the number of live sandboxes.
func (e *Edge) Count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.live)
}

// reaper enforces TTLs and notices dead sandboxes until Close.
func (e *Edge) reaper() {
	defer close(e.done)
	t := time.NewTicker(e.cfg.ReapInterval)
	defer t.Stop()
	flush := time.NewTicker(10 * e.cfg.ReapInterval)
	defer flush.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			e.reap(context.Background())
			e.maintainPools()
		case <-flush.C:
			if e.cfg.SharedStore {
				if err := e.syncPools(context.Background()); err != nil {
					e.log.Warn("sync fncall pools", "err", err)
				}
				if err := e.syncCatalog(context.Background()); err != nil {
					e.log.Warn("sync the service catalog", "err", err)
				}
			}
			e.flushActivity(context.Background())
			if !e.cfg.SharedStore {
				e.forgetOld(context.Background())
			}
			if e.artifacts != nil {
				e.artifacts.expire()
			}
		}
	}
}

func (e *Edge) reap(ctx context.Context) {
	now := time.Now()
	for _, sb := range e.liveSandboxes() {
		stop := func(state, reason string) {
			rec, err := e.record(ctx, sb.id)
			if err != nil {
				e.log.Error("reaper: read sandbox", "sandbox", sb.id, "err", err)
				return
			}
			if state == model.StateStopped {
				// An expiry ends like a delete: the teardown runs on the cleanup workers, so
				// many expiring at once do not hold up this loop (and others' TTLs) behind it.
				if _, err := e.endSandbox(ctx, rec, reason); err != nil {
					e.log.Error("reaper: end sandbox", "sandbox", sb.id, "reason", reason, "err", err)
				}
				return
			}
			e.stopSandbox(ctx, rec, state, reason)
		}
		if now.UnixNano() > sb.expiresAt.Load() {
			stop(model.StateStopped, model.ReasonTTLExpired)
			continue
		}
		st, err := e.rt.Status(ctx, sb.id)
		if err == nil && st.State == runtime.StatePaused {
			continue // paused time never counts as idle
		}
		if err == nil && st.State == runtime.StateOff {
			if !sb.off.Load() {
				e.machinePower(ctx, sb, true) // its guest powered it off
			}
			continue
		}
		if err == nil && st.State == runtime.StateRunning && sb.off.Load() {
			e.machinePower(ctx, sb, false) // a power-on whose record failed
		}
		if err == nil && st.OOMKills > sb.oomEvented.Load() {
			// A process of the sandbox was OOM-killed (the sandbox may live on).
			sb.oomEvented.Store(st.OOMKills)
			e.bus.Publish(events.Event{Type: events.OOM, Sandbox: sb.id, Project: sb.project, Tier: sb.tier,
				Reason: fmt.Sprintf("the kernel killed a process for memory (%d kills so far)", st.OOMKills)})
		}
		if err != nil || st.State != runtime.StateRunning {
			reason := "error: the sandbox's processes exited"
			if err != nil {
				reason = "error: " + err.Error()
			} else if st.OOMKills > 0 {
				reason = model.ReasonOOMKilled
			}
			stop(model.StateFailed, reason)
			continue
		}
		idleFor := now.Sub(time.Unix(0, sb.lastActivity.Load()))
		idleStop := sb.idleTTL > 0 && idleFor >= sb.idleTTL
		idlePause := sb.autoPause > 0 && idleFor >= sb.autoPause
		if idleStop || idlePause {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			info, err := sb.agent.Ping(pctx)
			cancel()
			if err == nil && info.Running > 0 {
				sb.touch() // a running command is activity
				continue
			}
			if idleStop {
				stop(model.StateStopped, model.ReasonIdleExpired)
			} else if _, err := e.pause(ctx, sb, true); err != nil && !errors.Is(err, errdefs.ErrConflict) {
				e.log.Error("auto-pause", "sandbox", sb.id, "err", err)
			}
		}
	}
}

// ActivityRecorder records what live sandboxes did (nodeproto.ActivityRecorder).
type ActivityRecorder interface {
	RecordActivity(ctx context.Context, acts []store.Activity) error
}

// flushActivity writes live sandboxes' last activity and usage counters to the store, or sends
// them to cfg.Activity.
func (e *Edge) flushActivity(ctx context.Context) {
	if e.cfg.Activity != nil {
		e.sendActivity(ctx)
		return
	}
	for _, sb := range e.liveSandboxes() {
		e.flushUsage(ctx, sb, false)
		at := sb.lastActivity.Load()
		if at == sb.flushed.Load() {
			continue // nothing new: no store read or write
		}
		sb.mu.Lock()
		if !sb.gone {
			if rec, err := e.record(ctx, sb.id); err == nil {
				rec.LastActivityAt = time.Unix(0, at).UTC()
				if e.records.PutSandbox(ctx, rec) == nil {
					sb.flushed.Store(at)
				}
			}
		}
		sb.mu.Unlock()
	}
}

// sendActivity sends cfg.Activity, in one batch, what changed in the live sandboxes since the
// batch before; what a failed batch held goes with the next.
func (e *Edge) sendActivity(ctx context.Context) {
	type sent struct {
		sb       *sandbox
		at, sum  int64
		counters bool
	}
	queued := e.takeActivity()
	acts := slices.Clone(queued)
	var marks []sent
	for _, sb := range e.liveSandboxes() {
		a := store.Activity{ID: sb.id}
		m := sent{sb: sb, at: sb.lastActivity.Load()}
		if m.at != sb.flushed.Load() {
			a.LastActivityAt = time.Unix(0, m.at).UTC()
		}
		if sb.fncall == "" {
			c, sum := sb.usageCounts()
			if sum != sb.usageFlushed.Load() {
				a.Counters, m.sum, m.counters = &c, sum, true
			}
		}
		if a.LastActivityAt.IsZero() && a.Counters == nil {
			continue
		}
		acts, marks = append(acts, a), append(marks, m)
	}
	if len(acts) == 0 {
		return
	}
	if err := e.cfg.Activity.RecordActivity(ctx, acts); err != nil {
		e.log.Warn("record the live sandboxes' activity; it goes with the next batch", "sandboxes", len(acts), "err", err)
		e.requeueActivity(queued)
		return
	}
	for _, m := range marks {
		m.sb.flushed.Store(m.at)
		if m.counters {
			m.sb.usageFlushed.Store(m.sum)
		}
	}
}

// leaveLive ends sb's life as a live sandbox (sb.mu held): marked gone, out of the live set, its
// usage flushed and its last activity copied to rec, whose end the caller then records.
func (e *Edge) leaveLive(ctx context.Context, sb *sandbox, rec *store.Sandbox) {
	sb.gone = true
	e.dropLive(rec.ID)
	e.flushUsage(ctx, sb, true)
	rec.LastActivityAt = time.Unix(0, sb.lastActivity.Load()).UTC()
}

// dropLive takes sandbox id out of the live set (data-plane calls then find it gone).
func (e *Edge) dropLive(id string) {
	e.mu.Lock()
	delete(e.live, id)
	e.mu.Unlock()
}

// liveSandboxes returns a copy of the live set, for loops that must not hold e.mu.
func (e *Edge) liveSandboxes() []*sandbox {
	e.mu.Lock()
	defer e.mu.Unlock()
	live := make([]*sandbox, 0, len(e.live))
	for _, sb := range e.live {
		live = append(live, sb)
	}
	return live
}

// forgetOld removes records of sandboxes that ended longer ago than the retention period.
func (e *Edge) forgetOld(ctx context.Context) {
	if _, err := e.store.ForgetEnded(ctx, time.Now().Add(-e.cfg.Retention)); err != nil {
		e.log.Warn("forget ended sandboxes", "err", err)
	}
}

// runtimeSpec is what every create asks of the runtime for rec (a fresh create and a warm
// pool's fill alike): its identity, layers, agent, environment and resolved limits. Callers add
// what only they have (network, tier-specific disks, volumes, a fork's image).
func (e *Edge) runtimeSpec(rec *store.Sandbox, lower []string, env []string, calls bool) runtime.Spec {
	return runtime.Spec{
		ID:          rec.ID,
		Hostname:    rec.Hostname,
		Lower:       lower,
		AgentPath:   e.cfg.AgentPath,
		AgentArgs:   e.agentArgs(calls),
		Calls:       calls,
		Env:         env,
		CPUs:        rec.Limits.CPUs,
		MemoryBytes: rec.Limits.MemoryBytes,
		Pids:        rec.Limits.Pids,
		DiskBytes:   rec.Limits.DiskBytes,
		OpenFiles:   uint64(rec.Limits.OpenFiles),
		ShmBytes:    limits.ShmBytes,
		Runtime:     rec.Runtime,
		Workdir:     rec.Cwd,
	}
}
