package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/corral-dev/corral/internal/blobstore/versitygw"
	"github.com/minio/minio-go/v7"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	corral "github.com/corral-dev/corral/sdk/go"
)

// LazyConfig sizes a `corral bench lazy` run. Zero fields take the defaults.
type LazyConfig struct {
	// Corral is the corral binary to start `corral up` with; Rootfs the busybox base layer's
	// directory (scripts/busybox-rootfs.sh makes one). Both are required.
	Corral, Rootfs string
	// Versitygw is the S3 server binary (default: $CORRAL_VERSITYGW, then the cache of
	// scripts/install-versitygw.sh, then PATH).
	Versitygw string
	// ImageMiB is the size of the synthetic toolkit layer (default 1024).
	ImageMiB int
	// Delay is added to every request to the blob store by the proxy in front of it (default
	// 10 ms; negative: none).
	Delay time.Duration
	// BandwidthMBps caps the blob store's responses, all connections together, in MB/s (default
	// 0: no cap).
	BandwidthMBps float64
	// Concurrency lists how many sandboxes are started at once in the first-output cells
	// (default 1, 8, 32).
	Concurrency []int
	// Samples is the least number of sandboxes measured per first-output cell: each concurrency N
	// runs ceil(Samples/N) fresh nodes per mode (default 8).
	Samples int
	// Percents are the tasks: each reads that share of the image's bytes. The first is the
	// first-output task; completion is measured for all (default 5, 30, 100).
	Percents []int
	// CompletionRounds is how many fresh nodes per mode measure each completion task other
	// than the first-output one (default 3).
	CompletionRounds int
	// CPUs and MemoryMiB are each sandbox's limits (default 0.25 and 128).
	CPUs      float64
	MemoryMiB int64
	// FillRate is the nodes' --fetch-fill-rate in bytes per second (default 0: no background fill).
	FillRate int64
	// Seed makes the image and the tasks' file choice (default 1).
	Seed uint64
	// Dir is where the run's work directory is made (default: the system's temp dir).
	Dir string
	// Prewarm makes each cold round start lazyd and fetch the layers' chunk tables (corral layer
	// stats) before its concurrent creates, and adds the time that took to every sandbox's
	// figures: concurrent first creates on a cold node race writing the same table file
	// (internal/layers ensureTable's temp name is per process), and all but one fail.
	Prewarm bool
}

func (c LazyConfig) withDefaults() LazyConfig {
	if c.ImageMiB == 0 {
		c.ImageMiB = 1024
	}
	if c.Delay == 0 {
		c.Delay = 10 * time.Millisecond
	}
	if c.Delay < 0 {
		c.Delay = 0
	}
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{1, 8, 32}
	}
	if c.Samples == 0 {
		c.Samples = 8
	}
	if len(c.Percents) == 0 {
		c.Percents = []int{5, 30, 100}
	}
	if c.CompletionRounds == 0 {
		c.CompletionRounds = 3
	}
	if c.CPUs == 0 {
		c.CPUs = 0.25
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 128
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	return c
}

// Validate checks a configuration after defaults.
func (c LazyConfig) Validate() error {
	switch {
	case c.Corral == "":
		return errdefs.Invalid("corral", "the corral binary to start is required")
	case c.Rootfs == "":
		return errdefs.Invalid("rootfs", "the base layer's directory is required (scripts/busybox-rootfs.sh makes one)")
	case c.ImageMiB < 64:
		return errdefs.Invalid("image_mib", "must be at least 64, got %d", c.ImageMiB)
	case c.BandwidthMBps < 0:
		return errdefs.Invalid("bandwidth", "must not be negative, got %v", c.BandwidthMBps)
	case c.Samples < 1:
		return errdefs.Invalid("samples", "must be positive, got %d", c.Samples)
	case c.CompletionRounds < 1:
		return errdefs.Invalid("completion_rounds", "must be positive, got %d", c.CompletionRounds)
	case c.CPUs <= 0:
		return errdefs.Invalid("cpus", "must be positive, got %v", c.CPUs)
	case c.MemoryMiB < 32:
		return errdefs.Invalid("memory_mib", "must be at least 32, got %d", c.MemoryMiB)
	case c.FillRate < 0:
		return errdefs.Invalid("fill_rate", "must not be negative, got %d", c.FillRate)
	}
	for _, n := range c.Concurrency {
		if n < 1 || n > 256 {
			return errdefs.Invalid("concurrency", "each must be 1-256, got %d", n)
		}
		// corral up admits 4 CPU limits per CPU.
		if float64(n)*c.CPUs > float64(4*runtime.NumCPU())+1e-9 {
			return errdefs.Invalid("cpus", "%d sandboxes of %g CPU exceed what corral up admits on %d CPUs (4 CPU limits per CPU): lower --cpus", n, c.CPUs, runtime.NumCPU())
		}
	}
	for i, p := range c.Percents {
		if p < 1 || p > 100 || (i > 0 && p <= c.Percents[i-1]) {
			return errdefs.Invalid("percents", "must be ascending, each 1-100, got %v", c.Percents)
		}
	}
	return nil
}

// The fetch modes, in the order cells are reported; eager is every ratio's reference.
var lazyModes = []string{"eager", "lazy", "prefetch"}

// LazyResult is what one `corral bench lazy` run measured.
type LazyResult struct {
	Date      string  `json:"date"`
	Host      string  `json:"host"`
	Kernel    string  `json:"kernel"`
	CPUs      int     `json:"cpus"`
	MemoryGiB float64 `json:"memory_gib"`

	DelayMs          float64 `json:"blob_delay_ms"`
	BandwidthMBps    float64 `json:"blob_bandwidth_mb_per_s,omitempty"`
	Concurrency      []int   `json:"concurrency"`
	Samples          int     `json:"samples"`
	CompletionRounds int     `json:"completion_rounds"`
	SandboxCPUs      float64 `json:"sandbox_cpus"`
	SandboxMiB       int64   `json:"sandbox_memory_mib"`
	FillRate         int64   `json:"fetch_fill_rate"`
	Seed             uint64  `json:"seed"`
	Prewarm          bool    `json:"prewarm_tables"`

	Image LazyImage `json:"image"`
	// GenerateSeconds, ImportSeconds and RecordSeconds are the set-up: writing the image,
	// importing base and toolkit through one node, recording the prefetch profiles.
	GenerateSeconds float64 `json:"generate_seconds"`
	ImportSeconds   float64 `json:"import_seconds"`
	RecordSeconds   float64 `json:"record_seconds"`
	WallSeconds     float64 `json:"wall_seconds"`

	// Cells are every measure; ratios compare each with eager's cell of the same kind, node
	// state, concurrency and task.
	Cells []LazyCell `json:"cells"`
	Goals []LazyGoal `json:"goals"`
	// Leftovers lists what was still on the host after the cleanup (empty when clean).
	Leftovers []string `json:"leftovers"`
	Notes     []string `json:"notes"`
}

// LazyImage describes the synthetic toolkit layer.
type LazyImage struct {
	Bytes      int64 `json:"bytes"`
	Files      int   `json:"files"`
	SmallFiles int   `json:"small_files"`
	SmallBytes int64 `json:"small_bytes"`
	LargeFiles int   `json:"large_files"`
	// DataBlobBytes and Chunks describe the layer's data blob as the node sees it.
	DataBlobBytes int64      `json:"data_blob_bytes"`
	Chunks        int        `json:"chunks"`
	Tasks         []LazyTask `json:"tasks"`
}

// LazyTask is one task's file list.
type LazyTask struct {
	Percent int     `json:"percent"`
	Files   int     `json:"files"`
	Bytes   int64   `json:"bytes"`
	Share   float64 `json:"share"` // Bytes / image bytes
	Command string  `json:"command"`
}

// Kinds of cells.
const (
	cellFirstOutput = "first_output" // N sandboxes at once run the first task; create → "ready"
	cellCompletion  = "completion"   // one sandbox on a cold node runs a task; create → exit
)

// LazyCell is one measure: a mode on a node state at a concurrency, for a task.
type LazyCell struct {
	Kind        string `json:"kind"`
	Mode        string `json:"mode"`
	Node        string `json:"node"` // cold or warm
	Concurrency int    `json:"concurrency"`
	Percent     int    `json:"percent"`
	// Rounds is how many nodes (cold) or second rounds on them (warm) the samples come from.
	Rounds int `json:"rounds"`
	// Latency is from the create call to the task's "ready" (its exit); Create the create call,
	// Task the exec after it.
	Latency Stats `json:"latency"`
	Create  Stats `json:"create"`
	Task    Stats `json:"task"`
	// Prewarm, when set, is the per-round time of starting lazyd and fetching the chunk tables
	// before the creates (LazyConfig.Prewarm); it is included in Latency and Create.
	Prewarm *Stats `json:"prewarm,omitempty"`
	// RatioP50 and RatioP99 are Latency against eager's (below 1: faster than eager).
	RatioP50 float64 `json:"ratio_p50_vs_eager"`
	RatioP99 float64 `json:"ratio_p99_vs_eager"`
	// Bytes are per round (the mean of the rounds); the ratios against eager's.
	Bytes        LazyBytes `json:"bytes"`
	DiskRatio    float64   `json:"disk_written_ratio_vs_eager"`
	FetchedRatio float64   `json:"fetched_ratio_vs_eager"`
	// SameAs, for a completion cell, names the first-output cell whose samples it shows (the
	// first task at concurrency 1 on a cold node is both).
	SameAs string `json:"same_as,omitempty"`
}

// LazyBytes are what one round cost the node and the blob store.
type LazyBytes struct {
	// NodeWritten is write_bytes (/proc/<pid>/io) of the node's corral up and its lazyd
	// during the round: bytes they caused to be written to the disk.
	NodeWritten  int64 `json:"node_disk_written"`
	LazydWritten int64 `json:"lazyd_disk_written"`
	// CacheDu is the chunk cache's size on disk after the round (du).
	CacheDu int64 `json:"cache_du"`
	// Fetched, Fetches, CacheHits, CacheMisses and Prefetch* are the base's and the toolkit's
	// fetch statistics (corral layer stats) over the round.
	Fetched        int64 `json:"bytes_fetched"`
	Fetches        int64 `json:"fetches"`
	CacheHits      int64 `json:"cache_hits"`
	CacheMisses    int64 `json:"cache_misses"`
	PrefetchBytes  int64 `json:"prefetch_bytes"`
	PrefetchChunks int64 `json:"prefetch_chunks"`
	PrefetchUsed   int64 `json:"prefetch_used_chunks"`
	// BlobRequests and BlobBytes are every request to the blob store through the proxy (data,
	// metadata images, tables, profiles, the catalogue) and the bytes of their answers.
	BlobRequests int64 `json:"blob_requests"`
	BlobBytes    int64 `json:"blob_bytes"`
	// FetchP50Ms and FetchP99Ms are the upper bounds of the buckets of lazyd's ranged-read
	// latency histogram (base + toolkit) holding those quantiles over the round (-1: above the
	// last bound).
	FetchP50Ms float64 `json:"fetch_latency_p50_ms"`
	FetchP99Ms float64 `json:"fetch_latency_p99_ms"`

	latBounds []float64 // the histogram's bucket bounds
	latCounts []int64   // its counts over the round (or rounds)
}

// LazyGoal is one of the goals, checked.
type LazyGoal struct {
	Goal        string  `json:"goal"`
	Mode        string  `json:"mode"`
	Concurrency int     `json:"concurrency,omitempty"`
	Percent     int     `json:"percent,omitempty"`
	Want        string  `json:"want"`
	P50         float64 `json:"p50"`
	P99         float64 `json:"p99,omitempty"`
	Pass        bool    `json:"pass"`
	PassP99     bool    `json:"pass_p99"`
}

// Names the run gives the layers, their files, its cgroup, net tag and bucket.
const (
	lazyRoot        = "opt/lzb"
	lazyBaseName    = "lzb-base"
	lazyTKName      = "lzb-tk"
	lazyVersion     = "1"
	lazyCgroup      = "/corral-bench-lazy"
	lazyNetTag      = "lz"
	lazyBucket      = "corral-bench"
	lazyTaskTimeout = "20m"
)

func lazyEnvName(pct int) string { return fmt.Sprintf("lzb-%d", pct) }

// lazyTaskCommand reads the files of the task's list and then prints "ready". xargs batches the
// paths, so the list's length is no limit and no process is started per file.
func lazyTaskCommand(pct int) string {
	return fmt.Sprintf("xargs cat < /%s/task/list-%d > /dev/null && echo ready", lazyRoot, pct)
}

// Lazy measures lazy loading of layer data (issue 4): an S3 blob store (versitygw on a tmpfs)
// behind a proxy that adds Delay to every request, a synthetic toolkit of ImageMiB imported
// once, then fresh `corral up` nodes per cell, each started cold (empty data dir, page cache
// dropped) and measured again warm. It needs root, and removes what it started on error and
// cancellation too; what the cleanup could not remove is listed in Leftovers (the result is
// returned with an error then).
func Lazy(ctx context.Context, cfg LazyConfig, log *slog.Logger) (res *LazyResult, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("corral bench lazy starts corral up nodes and drops the page cache: run it as root")
	}
	if _, err := os.Stat(filepath.Join(cfg.Rootfs, "bin", "busybox")); err != nil {
		return nil, fmt.Errorf("rootfs %s has no bin/busybox (scripts/busybox-rootfs.sh makes one): %w", cfg.Rootfs, err)
	}
	if cfg.Versitygw == "" {
		if cfg.Versitygw, err = versitygw.Find(); err != nil {
			return nil, err
		}
	}
	started := time.Now()
	host, _ := os.Hostname()
	var uts unix.Utsname
	unix.Uname(&uts)
	res = &LazyResult{
		Date: time.Now().UTC().Format(time.RFC3339), Host: host, Kernel: unix.ByteSliceToString(uts.Release[:]),
		CPUs: runtime.NumCPU(), MemoryGiB: float64(meminfoBytes("MemTotal")) / (1 << 30),
		DelayMs: float64(cfg.Delay) / float64(time.Millisecond), BandwidthMBps: cfg.BandwidthMBps,
		Concurrency: cfg.Concurrency, Samples: cfg.Samples, CompletionRounds: cfg.CompletionRounds,
		SandboxCPUs: cfg.CPUs, SandboxMiB: cfg.MemoryMiB, FillRate: cfg.FillRate, Seed: cfg.Seed, Prewarm: cfg.Prewarm,
		Cells: []LazyCell{}, Goals: []LazyGoal{}, Leftovers: []string{},
	}
	res.Notes = lazyNotes(cfg)
	work, err := os.MkdirTemp(cfg.Dir, "crl-lz-") // short: sandbox paths below it hold unix sockets
	if err != nil {
		return nil, err
	}
	r := &lazyRun{cfg: cfg, log: log, work: work, res: res}
	defer func() {
		res.Leftovers = append(res.Leftovers, r.close(err != nil)...)
		res.WallSeconds = time.Since(started).Seconds()
		if len(res.Leftovers) > 0 {
			err = errors.Join(err, fmt.Errorf("left on the host after the cleanup: %s", strings.Join(res.Leftovers, "; ")))
		}
	}()
	if err := r.setup(ctx); err != nil {
		return res, err
	}
	if err := r.measure(ctx); err != nil {
		return res, err
	}
	r.finish()
	return res, nil
}

func lazyNotes(cfg LazyConfig) []string {
	bw := "no bandwidth cap"
	if cfg.BandwidthMBps > 0 {
		bw = fmt.Sprintf("a cap of %g MB/s over all connections", cfg.BandwidthMBps)
	}
	return []string{
		fmt.Sprintf("Blob store: versitygw (posix backend on a tmpfs, so dropping the page cache leaves the store warm) behind a Go reverse proxy on loopback that adds %s to every request before forwarding it, with %s; every node uses it as s3://%s.", cfg.Delay, bw, lazyBucket),
		"Image: a synthetic toolkit of incompressible random files (seeded): ~28% of bytes in 1-64 KiB files in package directories, the rest in 8-64 MiB files, imported with --kind toolkit over a busybox base by one node (import writes to the blob store). Tasks read whole packages and large files chosen at random (seeded, nested: the 5% list is the start of the 30% list, and so on) with `xargs cat < LIST > /dev/null && echo ready`.",
		"Cold node: a fresh corral up with an empty data dir (no metadata, no chunk cache), started after sync and drop_caches; its disk pool is waited full before the round. Warm: the same node's second round of the same cell, after drop_caches (page cache, EROFS and FUSE included), its chunk cache as the first round left it. Every cold node also adopts the layers from the shared catalogue (by saving the environments) before the round.",
		"Prefetch profiles: before any cell, each task ran once in lazy mode on the importing node (page cache dropped first); deleting the sandbox saved its recorded reads as its environment's profile in the blob store (profiles/...), so each cold prefetch node fetches what that earlier run read. Every lazy and prefetch sandbox also records, and merges what it read into the same profile.",
		"Latency is per sandbox, from the create call to the task's exit after printing ready (first output = the first task's ready); p50/p99 are nearest-rank over every sandbox of the cell's rounds, so with few samples p99 is the maximum. Ratios divide by eager's figure of the same kind, node state, concurrency and task, measured in this run; below 1 is better than eager.",
		prewarmNote(cfg.Prewarm),
		"Disk bytes written: write_bytes of /proc/<pid>/io of the node's corral up plus its lazyd over the round (sampled while both run, before the sandboxes are deleted): the chunk cache, the local metadata images and tables, the store, and the disk refills (mkfs) that start during the round. Fetched: bytes_fetched of corral layer stats (base + toolkit); blob requests/bytes: everything through the proxy.",
	}
}

func prewarmNote(on bool) string {
	if !on {
		return "Cold rounds start with nothing on the node: the first creates start lazyd and fetch the chunk tables themselves."
	}
	return "Cold rounds: before the creates, corral layer stats of base and toolkit start lazyd and fetch their chunk tables (a workaround: concurrent first creates on a cold node race writing the same table file and fail); the time it took is added to every sandbox's latency and create time, as every create would wait for it."
}

// lazyRun is one run's state, used by the run's goroutine only.
type lazyRun struct {
	cfg  LazyConfig
	log  *slog.Logger
	work string
	res  *LazyResult

	tmpfs   string // the blob store's tmpfs mount
	s3      *versitygw.Server
	proxy   *delayProxy
	spec    string   // the nodes' --blob-store
	nodeEnv []string // the nodes' environment: S3 credentials
	image   imagePlan
	nodeSeq int
	node    *lazyNode // the node now running, if any

	// samples per cell key, over rounds
	samples map[cellKey]*cellSamples
}

type cellKey struct {
	kind, mode, node string
	n, pct           int
}

type cellSamples struct {
	lat, create, task, prewarm []time.Duration
	bytes                      []LazyBytes
}

func (r *lazyRun) add(k cellKey, out roundOut) {
	if r.samples == nil {
		r.samples = map[cellKey]*cellSamples{}
	}
	s := r.samples[k]
	if s == nil {
		s = &cellSamples{}
		r.samples[k] = s
	}
	s.lat = append(s.lat, out.lat...)
	s.create = append(s.create, out.create...)
	s.task = append(s.task, out.task...)
	s.bytes = append(s.bytes, out.bytes)
	if out.prewarm > 0 {
		s.prewarm = append(s.prewarm, out.prewarm)
	}
}

// setup starts the blob store and its proxy, writes the image, imports it and records the
// prefetch profiles.
func (r *lazyRun) setup(ctx context.Context) error {
	imgBytes := int64(r.cfg.ImageMiB) << 20
	r.tmpfs = filepath.Join(r.work, "s3")
	if err := os.Mkdir(r.tmpfs, 0o700); err != nil {
		return err
	}
	size := 2*imgBytes + 512<<20 // the data blob, multipart parts in flight, metadata, profiles
	if err := unix.Mount("tmpfs", r.tmpfs, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		r.tmpfs = ""
		return fmt.Errorf("mount a tmpfs for the blob store: %w", err)
	}
	var err error
	if r.s3, err = versitygw.Start(ctx, r.cfg.Versitygw, r.tmpfs, lazyBucket); err != nil {
		return err
	}
	if r.proxy, err = startDelayProxy(strings.TrimPrefix(r.s3.Endpoint, "http://"), r.cfg.Delay, r.cfg.BandwidthMBps*1e6); err != nil {
		return err
	}
	r.spec = fmt.Sprintf("s3://%s?endpoint=http://%s&region=%s", lazyBucket, r.proxy.addr, versitygw.Region)
	r.nodeEnv = append(os.Environ(), "AWS_ACCESS_KEY_ID="+r.s3.Access, "AWS_SECRET_ACCESS_KEY="+r.s3.Secret)
	r.log.Info("blob store up", "versitygw", r.s3.Endpoint, "proxy", r.proxy.addr, "delay", r.cfg.Delay)

	start := time.Now()
	r.image = planImage(r.cfg.Seed, imgBytes)
	lists := selectTasks(r.image, r.cfg.Seed, r.cfg.Percents)
	tree := filepath.Join(r.work, "image")
	r.log.Info("writing the image", "mib", r.cfg.ImageMiB, "files", len(r.image.files))
	if err := writeImage(tree, r.image, lists, r.cfg.Seed); err != nil {
		return fmt.Errorf("write the image: %w", err)
	}
	r.res.GenerateSeconds = time.Since(start).Seconds()
	r.res.Image = LazyImage{Bytes: r.image.total, Files: len(r.image.files), SmallFiles: r.image.smallFiles,
		SmallBytes: r.image.small, LargeFiles: len(r.image.files) - r.image.smallFiles}
	for _, pct := range r.cfg.Percents {
		var b int64
		for _, i := range lists[pct] {
			b += r.image.files[i].size
		}
		r.res.Image.Tasks = append(r.res.Image.Tasks, LazyTask{Percent: pct, Files: len(lists[pct]), Bytes: b,
			Share: float64(b) / float64(r.image.total), Command: lazyTaskCommand(pct)})
	}

	// The importing node also records the profiles; it is thrown away before any measure.
	n, err := r.startNode(ctx, "importer", 1, false)
	if err != nil {
		return err
	}
	start = time.Now()
	r.log.Info("importing base and toolkit through the importing node")
	if err := importLayerDir(ctx, n.c, r.cfg.Rootfs, lazyBaseName, lazyVersion, corral.KindBase); err != nil {
		return err
	}
	if err := importLayerDir(ctx, n.c, tree, lazyTKName, lazyVersion, corral.KindToolkit); err != nil {
		return err
	}
	r.res.ImportSeconds = time.Since(start).Seconds()
	os.RemoveAll(tree) // in the blob store now
	if err := r.saveEnvs(ctx, n); err != nil {
		return err
	}
	start = time.Now()
	for _, pct := range r.cfg.Percents {
		r.log.Info("recording the prefetch profile", "task_percent", pct)
		if err := dropPageCache(); err != nil {
			return err
		}
		if _, err := r.round(ctx, n, pct, "lazy", 1, false); err != nil {
			return fmt.Errorf("record the profile of the %d%% task: %w", pct, err)
		}
	}
	r.res.RecordSeconds = time.Since(start).Seconds()
	st, err := n.c.LayerStats(ctx, lazyTKName, lazyVersion, "")
	if err != nil {
		return fmt.Errorf("layer stats on the importing node: %w", err)
	}
	if st.Fetch != nil {
		r.res.Image.DataBlobBytes, r.res.Image.Chunks = st.Fetch.DataSize, st.Fetch.Chunks
	}
	if st.Format != "erofs-split" {
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("The toolkit was stored as %q, not erofs-split: nothing was fetched lazily.", st.Format))
	}
	if left := r.stopNode(ctx, n); len(left) > 0 {
		return fmt.Errorf("the importing node left: %s", strings.Join(left, "; "))
	}
	profiles, err := r.listKeys(ctx, "profiles/")
	if err != nil {
		return err
	}
	if len(profiles) < len(r.cfg.Percents) {
		return fmt.Errorf("the recording runs left %d prefetch profiles in the blob store, want one per task (%d) at least: %v", len(profiles), len(r.cfg.Percents), profiles)
	}
	r.log.Info("profiles recorded", "objects", len(profiles))
	return nil
}

// saveEnvs saves one environment per task on n: base + toolkit under names that give each
// task its own prefetch profile. On a fresh node this adopts the layers from the shared
// catalogue.
func (r *lazyRun) saveEnvs(ctx context.Context, n *lazyNode) error {
	for _, pct := range r.cfg.Percents {
		env := corral.Environment{Name: lazyEnvName(pct), Base: lazyBaseName + ":" + lazyVersion, Toolkits: []string{lazyTKName + ":" + lazyVersion}}
		if _, err := n.c.SaveEnvironment(ctx, env); err != nil {
			return fmt.Errorf("save environment %s on %s: %w", env.Name, n.name, err)
		}
	}
	return nil
}

// measure runs every cell.
func (r *lazyRun) measure(ctx context.Context) error {
	first := r.cfg.Percents[0]
	for _, n := range r.cfg.Concurrency {
		rounds := (r.cfg.Samples + n - 1) / n
		for round := range rounds {
			for _, mode := range rotate(lazyModes, round) {
				r.log.Info("first-output cell", "mode", mode, "concurrency", n, "round", round+1, "of", rounds)
				node, err := r.startNode(ctx, fmt.Sprintf("n%d", r.nodeSeq), n, true)
				if err != nil {
					return err
				}
				for _, state := range []string{"cold", "warm"} {
					out, err := r.round(ctx, node, first, mode, n, state == "cold")
					if err != nil {
						return fmt.Errorf("%s, %s node, %d at once: %w", mode, state, n, err)
					}
					r.add(cellKey{cellFirstOutput, mode, state, n, first}, out)
					r.log.Info("measured", "mode", mode, "node", state, "concurrency", n, "p50_ms", summarise(out.lat).P50,
						"max_ms", summarise(out.lat).Max, "disk_written_mib", mib(out.bytes.NodeWritten), "fetched_mib", mib(out.bytes.Fetched))
				}
				if left := r.stopNode(ctx, node); len(left) > 0 {
					return fmt.Errorf("node %s left: %s", node.name, strings.Join(left, "; "))
				}
			}
		}
	}
	for _, pct := range r.cfg.Percents {
		if pct == first && slices.Contains(r.cfg.Concurrency, 1) {
			continue // the first-output cell at concurrency 1, cold, is this measure
		}
		for round := range r.cfg.CompletionRounds {
			for _, mode := range rotate(lazyModes, round) {
				r.log.Info("completion cell", "mode", mode, "task_percent", pct, "round", round+1)
				node, err := r.startNode(ctx, fmt.Sprintf("n%d", r.nodeSeq), 1, true)
				if err != nil {
					return err
				}
				out, err := r.round(ctx, node, pct, mode, 1, true)
				if err != nil {
					return fmt.Errorf("%s, %d%% task: %w", mode, pct, err)
				}
				r.add(cellKey{cellCompletion, mode, "cold", 1, pct}, out)
				r.log.Info("measured", "mode", mode, "task_percent", pct, "ms", summarise(out.lat).P50,
					"disk_written_mib", mib(out.bytes.NodeWritten), "fetched_mib", mib(out.bytes.Fetched))
				if left := r.stopNode(ctx, node); len(left) > 0 {
					return fmt.Errorf("node %s left: %s", node.name, strings.Join(left, "; "))
				}
			}
		}
	}
	return nil
}

// rotate returns s turned left by k: rounds take turns at going first.
func rotate(s []string, k int) []string {
	k %= len(s)
	return append(slices.Clone(s[k:]), s[:k]...)
}

// finish turns the samples into cells, ratios and goals.
func (r *lazyRun) finish() {
	first := r.cfg.Percents[0]
	cell := func(k cellKey, s *cellSamples) LazyCell {
		c := LazyCell{Kind: k.kind, Mode: k.mode, Node: k.node, Concurrency: k.n, Percent: k.pct, Rounds: len(s.bytes),
			Latency: summarise(s.lat), Create: summarise(s.create), Task: summarise(s.task), Bytes: meanBytes(s.bytes)}
		if len(s.prewarm) > 0 {
			p := summarise(s.prewarm)
			c.Prewarm = &p
		}
		return c
	}
	var cells []LazyCell
	for _, n := range r.cfg.Concurrency {
		for _, state := range []string{"cold", "warm"} {
			for _, mode := range lazyModes {
				if s := r.samples[cellKey{cellFirstOutput, mode, state, n, first}]; s != nil {
					cells = append(cells, cell(cellKey{cellFirstOutput, mode, state, n, first}, s))
				}
			}
		}
	}
	for _, pct := range r.cfg.Percents {
		for _, mode := range lazyModes {
			if s := r.samples[cellKey{cellCompletion, mode, "cold", 1, pct}]; s != nil {
				cells = append(cells, cell(cellKey{cellCompletion, mode, "cold", 1, pct}, s))
			} else if s := r.samples[cellKey{cellFirstOutput, mode, "cold", 1, pct}]; s != nil {
				c := cell(cellKey{cellCompletion, mode, "cold", 1, pct}, s)
				c.SameAs = fmt.Sprintf("%s %s cold 1", cellFirstOutput, mode)
				cells = append(cells, c)
			}
		}
	}
	applyRatios(cells)
	r.res.Cells = cells
	r.res.Goals = lazyGoals(cells)
}

// applyRatios sets each cell's ratios against eager's cell of the same kind, node state,
// concurrency and task.
func applyRatios(cells []LazyCell) {
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	for i := range cells {
		c := &cells[i]
		j := slices.IndexFunc(cells, func(e LazyCell) bool {
			return e.Mode == "eager" && e.Kind == c.Kind && e.Node == c.Node && e.Concurrency == c.Concurrency && e.Percent == c.Percent
		})
		if j < 0 {
			continue
		}
		e := cells[j]
		c.RatioP50, c.RatioP99 = ratio(c.Latency.P50, e.Latency.P50), ratio(c.Latency.P99, e.Latency.P99)
		c.DiskRatio = ratio(float64(c.Bytes.NodeWritten), float64(e.Bytes.NodeWritten))
		c.FetchedRatio = ratio(float64(c.Bytes.Fetched), float64(e.Bytes.Fetched))
	}
}

// lazyGoals checks the goals on cells with their ratios set: with the small working
// set (the first task), cold first output with prefetch at least 3x faster than eager and disk bytes
// written at least 50% lower; at 100% read, lazy and prefetch no worse than 1.2x eager.
func lazyGoals(cells []LazyCell) []LazyGoal {
	goals := []LazyGoal{}
	find := func(kind, mode, node string, n, pct int) *LazyCell {
		for i := range cells {
			c := &cells[i]
			if c.Kind == kind && c.Mode == mode && c.Node == node && c.Concurrency == n && c.Percent == pct {
				return c
			}
		}
		return nil
	}
	inv := func(x float64) float64 {
		if x == 0 {
			return 0
		}
		return 1 / x
	}
	for _, c := range cells {
		if c.Kind != cellFirstOutput || c.Node != "cold" || c.Mode != "prefetch" || c.RatioP50 == 0 {
			continue
		}
		s50, s99 := inv(c.RatioP50), inv(c.RatioP99)
		goals = append(goals, LazyGoal{Goal: "cold time to first output: eager ÷ prefetch", Mode: c.Mode, Concurrency: c.Concurrency,
			Percent: c.Percent, Want: ">= 3x", P50: s50, P99: s99, Pass: s50 >= 3, PassP99: s99 >= 3})
	}
	for _, c := range cells {
		if c.Kind != cellFirstOutput || c.Node != "cold" || c.Mode != "prefetch" || c.DiskRatio == 0 {
			continue
		}
		goals = append(goals, LazyGoal{Goal: "cold disk bytes written: prefetch ÷ eager", Mode: c.Mode, Concurrency: c.Concurrency,
			Percent: c.Percent, Want: "<= 0.5", P50: c.DiskRatio, Pass: c.DiskRatio <= 0.5, PassP99: c.DiskRatio <= 0.5})
	}
	for _, mode := range []string{"lazy", "prefetch"} {
		c := find(cellCompletion, mode, "cold", 1, 100)
		if c == nil || c.RatioP50 == 0 {
			continue
		}
		goals = append(goals, LazyGoal{Goal: "100% read, completion time: " + mode + " ÷ eager", Mode: mode, Concurrency: 1, Percent: 100,
			Want: "<= 1.2x", P50: c.RatioP50, P99: c.RatioP99, Pass: c.RatioP50 <= 1.2, PassP99: c.RatioP99 <= 1.2})
	}
	return goals
}

func meanBytes(bs []LazyBytes) LazyBytes {
	if len(bs) == 0 {
		return LazyBytes{}
	}
	var s LazyBytes
	for _, b := range bs {
		s.NodeWritten += b.NodeWritten
		s.LazydWritten += b.LazydWritten
		s.CacheDu += b.CacheDu
		s.Fetched += b.Fetched
		s.Fetches += b.Fetches
		s.CacheHits += b.CacheHits
		s.CacheMisses += b.CacheMisses
		s.PrefetchBytes += b.PrefetchBytes
		s.PrefetchChunks += b.PrefetchChunks
		s.PrefetchUsed += b.PrefetchUsed
		s.BlobRequests += b.BlobRequests
		s.BlobBytes += b.BlobBytes
		s.latBounds = b.latBounds
		s.latCounts = addCounts(s.latCounts, b.latCounts, 1)
	}
	n := int64(len(bs))
	return LazyBytes{FetchP50Ms: histQuantile(s.latBounds, s.latCounts, 0.5), FetchP99Ms: histQuantile(s.latBounds, s.latCounts, 0.99), NodeWritten: s.NodeWritten / n, LazydWritten: s.LazydWritten / n, CacheDu: s.CacheDu / n,
		Fetched: s.Fetched / n, Fetches: s.Fetches / n, CacheHits: s.CacheHits / n, CacheMisses: s.CacheMisses / n,
		PrefetchBytes: s.PrefetchBytes / n, PrefetchChunks: s.PrefetchChunks / n, PrefetchUsed: s.PrefetchUsed / n,
		BlobRequests: s.BlobRequests / n, BlobBytes: s.BlobBytes / n}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// lazyNode is one `corral up` of the run.
type lazyNode struct {
	name, dir string
	proc      *benchProc
	c         *corral.Client
}

// startNode starts a fresh `corral up` on an empty data dir, after dropping the page cache,
// with pool ready disks, and waits until it serves (and, when envs, has saved the tasks'
// environments, adopting the layers, and filled its disk pool).
func (r *lazyRun) startNode(ctx context.Context, name string, pool int, envs bool) (*lazyNode, error) {
	r.nodeSeq++
	if err := dropPageCache(); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	n := &lazyNode{name: name, dir: filepath.Join(r.work, name)}
	args := []string{"up", "--data-dir", n.dir, "--listen", addr, "--cgroup-parent", lazyCgroup, "--no-net",
		"--net-tag", lazyNetTag, "--disk-pool", strconv.Itoa(pool), "--blob-store", r.spec, "--fetch", "prefetch"}
	if r.cfg.FillRate > 0 {
		args = append(args, "--fetch-fill-rate", strconv.FormatInt(r.cfg.FillRate, 10))
	}
	pr := &benchProc{name: name, logPath: filepath.Join(r.work, name+".log"), done: make(chan struct{})}
	logf, err := os.Create(pr.logPath)
	if err != nil {
		return nil, err
	}
	pr.cmd = exec.Command(r.cfg.Corral, args...)
	pr.cmd.Env = r.nodeEnv
	pr.cmd.Stdout, pr.cmd.Stderr = logf, logf
	pr.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := pr.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	logf.Close()
	go func() { pr.waitErr = pr.cmd.Wait(); close(pr.done) }()
	n.proc = pr
	r.node = n
	url := "http://" + addr
	if err := waitHealthy(ctx, pr, url, time.Minute); err != nil {
		return nil, err
	}
	token, err := os.ReadFile(filepath.Join(n.dir, "admin.token"))
	if err != nil {
		return nil, fmt.Errorf("corral up wrote no admin token: %w", err)
	}
	n.c = corral.New(url, strings.TrimSpace(string(token)), corral.WithHTTPClient(benchHTTP(64)))
	if envs {
		if err := r.saveEnvs(ctx, n); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// waitPool waits (up to two minutes) until n keeps want formatted disks ready.
func (r *lazyRun) waitPool(ctx context.Context, n *lazyNode, want int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		slots, _ := filepath.Glob(filepath.Join(n.dir, "sandboxes", ".pool", "*", "disk", "work"))
		if len(slots) >= want {
			return nil
		}
		if n.proc.exited() {
			return fmt.Errorf("%s exited: %v\n%s", n.name, n.proc.waitErr, n.proc.tail(20))
		}
		if time.Now().After(deadline) {
			r.log.Warn("disk pool not full after 2 minutes; measuring anyway", "node", n.name, "ready", len(slots), "want", want)
			return nil
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// roundOut is one round's samples.
type roundOut struct {
	lat, create, task []time.Duration
	prewarm           time.Duration // added to lat and create (see LazyConfig.Prewarm)
	bytes             LazyBytes
}

// round starts count sandboxes of task pct's environment in mode at once on n, each running the
// task, and measures them and what they cost the node; then deletes them.
func (r *lazyRun) round(ctx context.Context, n *lazyNode, pct int, mode string, count int, cold bool) (out roundOut, err error) {
	if err := r.waitPool(ctx, n, count); err != nil {
		return out, err
	}
	if err := dropPageCache(); err != nil {
		return out, err
	}
	before := r.sample(ctx, n)
	var pre time.Duration
	if cold && r.cfg.Prewarm {
		t0 := time.Now()
		for _, name := range []string{lazyBaseName, lazyTKName} {
			if _, err := n.c.LayerStats(ctx, name, lazyVersion, ""); err != nil {
				return out, fmt.Errorf("prewarm the chunk table of %s: %w", name, err)
			}
		}
		pre = time.Since(t0)
		out.prewarm = pre
	}
	req := corral.CreateRequest{Environment: lazyEnvName(pct), Fetch: mode, TTL: "1h", Labels: map[string]string{"bench": "lazy"},
		Limits: corral.Limits{CPUs: r.cfg.CPUs, MemoryBytes: r.cfg.MemoryMiB << 20}}
	cmd := lazyTaskCommand(pct)
	ids := make([]string, count)
	out.lat, out.create, out.task = make([]time.Duration, count), make([]time.Duration, count), make([]time.Duration, count)
	defer func() {
		// Delete what was made, also on error; a failed delete is the teardown's.
		parallel(context.WithoutCancel(ctx), count, count, func(ctx context.Context, i int) error {
			if ids[i] != "" {
				if _, derr := n.c.DeleteSandbox(ctx, ids[i]); derr != nil {
					r.log.Warn("delete sandbox", "sandbox", ids[i], "err", derr)
				}
			}
			return nil
		})
	}()
	_, err = parallel(ctx, count, count, func(ctx context.Context, i int) error {
		t0 := time.Now()
		sb, err := n.c.CreateSandbox(ctx, req)
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		ids[i] = sb.ID
		t1 := time.Now()
		stdout, stderr, exit, err := n.c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{cmd}, Shell: true, Timeout: lazyTaskTimeout})
		t2 := time.Now()
		if err != nil {
			return fmt.Errorf("run the task in %s: %w", sb.ID, err)
		}
		if exit == nil || exit.Code != 0 || !strings.Contains(string(stdout), "ready") {
			return fmt.Errorf("the task in %s failed: exit %+v, stdout %q, stderr %q", sb.ID, exit, trimOut(stdout), trimOut(stderr))
		}
		out.lat[i], out.create[i], out.task[i] = pre+t2.Sub(t0), pre+t1.Sub(t0), t2.Sub(t1)
		return nil
	})
	if err != nil {
		return out, err
	}
	after := r.sample(ctx, n)
	out.bytes = after.minus(before)
	out.bytes.CacheDu = duBytes(filepath.Join(n.dir, "layers", "lazy", "cache"))
	return out, nil
}

func trimOut(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 400 {
		s = s[len(s)-400:]
	}
	return s
}

// nodeSample is a node's counters at one moment.
type nodeSample struct {
	up, lazyd int64
	lazydPid  int
	st        LazyBytes // fetch statistics and proxy counters
}

// sample reads n's counters. The layers' fetch statistics are read only once lazyd runs, so
// that sampling a cold node does not start it (nor fetch a chunk table).
func (r *lazyRun) sample(ctx context.Context, n *lazyNode) nodeSample {
	s := nodeSample{up: writeBytes(int64(n.proc.cmd.Process.Pid))}
	s.lazydPid = findLazyd(filepath.Join(n.dir, "layers", "lazy"))
	if s.lazydPid != 0 {
		s.lazyd = writeBytes(int64(s.lazydPid))
		for _, name := range []string{lazyBaseName, lazyTKName} {
			st, err := n.c.LayerStats(ctx, name, lazyVersion, "")
			if err != nil || st.Fetch == nil {
				if err != nil {
					r.log.Warn("layer stats", "node", n.name, "layer", name, "err", err)
				}
				continue
			}
			f := st.Fetch
			s.st.Fetched += f.BytesFetched
			s.st.Fetches += f.Fetches
			s.st.CacheHits += f.Hits
			s.st.CacheMisses += f.Misses
			s.st.PrefetchBytes += f.Prefetch.Bytes
			s.st.PrefetchChunks += f.Prefetch.Chunks
			s.st.PrefetchUsed += f.Prefetch.Used
			s.st.latBounds = f.FetchLatency.BoundsMs
			s.st.latCounts = addCounts(s.st.latCounts, f.FetchLatency.Counts, 1)
		}
	}
	s.st.BlobRequests, s.st.BlobBytes = r.proxy.requests.Load(), r.proxy.bytesIn.Load()
	return s
}

// minus returns what happened between b and a. A lazyd that was not running at b (or was
// another process) counts from zero.
func (a nodeSample) minus(b nodeSample) LazyBytes {
	if b.lazydPid != a.lazydPid {
		b.lazyd, b.st.Fetched, b.st.Fetches, b.st.CacheHits, b.st.CacheMisses = 0, 0, 0, 0, 0
		b.st.PrefetchBytes, b.st.PrefetchChunks, b.st.PrefetchUsed = 0, 0, 0
		b.st.latCounts = nil
	}
	d := LazyBytes{
		LazydWritten: a.lazyd - b.lazyd, Fetched: a.st.Fetched - b.st.Fetched, Fetches: a.st.Fetches - b.st.Fetches,
		CacheHits: a.st.CacheHits - b.st.CacheHits, CacheMisses: a.st.CacheMisses - b.st.CacheMisses,
		PrefetchBytes: a.st.PrefetchBytes - b.st.PrefetchBytes, PrefetchChunks: a.st.PrefetchChunks - b.st.PrefetchChunks,
		PrefetchUsed: a.st.PrefetchUsed - b.st.PrefetchUsed,
		BlobRequests: a.st.BlobRequests - b.st.BlobRequests, BlobBytes: a.st.BlobBytes - b.st.BlobBytes,
	}
	d.NodeWritten = a.up - b.up + d.LazydWritten
	d.latBounds, d.latCounts = a.st.latBounds, addCounts(slices.Clone(a.st.latCounts), b.st.latCounts, -1)
	d.FetchP50Ms, d.FetchP99Ms = histQuantile(d.latBounds, d.latCounts, 0.5), histQuantile(d.latBounds, d.latCounts, 0.99)
	return d
}

// addCounts adds sign times b to a, element by element, growing a as needed.
func addCounts(a, b []int64, sign int64) []int64 {
	for len(a) < len(b) {
		a = append(a, 0)
	}
	for i, v := range b {
		a[i] += sign * v
	}
	return a
}

// histQuantile returns the upper bound of the bucket holding quantile q of counts (bounds has
// one bound per bucket but the last; -1 for that one), or 0 when empty. It is lazyd's own rule.
func histQuantile(bounds []float64, counts []int64, q float64) float64 {
	var total int64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	want, run := max(int64(float64(total)*q+0.5), 1), int64(0)
	for i, c := range counts {
		run += c
		if run >= want {
			if i < len(bounds) {
				return bounds[i]
			}
			return -1
		}
	}
	return -1
}

// findLazyd returns the pid of the `corral lazyd` serving dir, or 0.
func findLazyd(dir string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		if isLazydOf(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), dir) {
			return pid
		}
	}
	return 0
}

// isLazydOf reports whether args is the command line of a `corral lazyd --dir dir`.
func isLazydOf(args []string, dir string) bool {
	if len(args) < 2 || filepath.Base(args[0]) != "corral" || args[1] != "lazyd" {
		return false
	}
	for i, a := range args {
		if a == "--dir="+dir || (a == "--dir" && i+1 < len(args) && args[i+1] == dir) {
			return true
		}
	}
	return false
}

// duBytes is the disk space the files below dir take.
func duBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(path, &st) == nil {
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

// dropPageCache writes dirty pages out and drops the page cache, dentries and inodes.
func dropPageCache() error {
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		return fmt.Errorf("drop the page cache: %w", err)
	}
	return nil
}

// stopNode deletes n's sandboxes, stops its corral up, waits for its lazyd to exit by itself
// (killing it after 30 s), removes what is left and its data dir, and returns what could not be
// removed.
func (r *lazyRun) stopNode(ctx context.Context, n *lazyNode) []string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var left []string
	if n.c != nil && !n.proc.exited() {
		if list, err := n.c.ListSandboxes(ctx, corral.ListOptions{}); err == nil {
			var live []string
			for _, sb := range list {
				if sb.State != corral.StateStopped && sb.State != corral.StateFailed {
					live = append(live, sb.ID)
				}
			}
			parallel(ctx, len(live), 8, func(ctx context.Context, i int) error {
				if _, err := n.c.DeleteSandbox(ctx, live[i]); err != nil {
					r.log.Warn("delete sandbox", "sandbox", live[i], "err", err)
				}
				return nil
			})
		}
	}
	lazyDir := filepath.Join(n.dir, "layers", "lazy")
	n.proc.stop(20 * time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for pid := findLazyd(lazyDir); pid != 0; pid = findLazyd(lazyDir) {
		if time.Now().After(deadline) {
			left = append(left, fmt.Sprintf("lazyd %d of %s still ran 30 s after corral up stopped (killed)", pid, n.name))
			unix.Kill(pid, unix.SIGKILL)
			time.Sleep(200 * time.Millisecond)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if errs := n.proc.logErrors(); errs > 0 {
		r.log.Warn("errors in a node's log", "node", n.name, "errors", errs, "tail", n.proc.tail(5))
	}
	if b, err := os.ReadFile(filepath.Join(lazyDir, "lazyd.log")); err == nil {
		if errs := strings.Count(string(b), "level=ERROR"); errs > 0 {
			r.log.Warn("errors in a lazyd's log", "node", n.name, "errors", errs)
		}
		os.WriteFile(filepath.Join(r.work, n.name+"-lazyd.log"), b, 0o600)
	}
	dirs := []string{n.dir}
	scrub(r.log, dirs, []string{lazyCgroup}, []string{lazyNetTag})
	os.RemoveAll(n.dir)
	left = append(left, leftovers(dirs, []string{lazyCgroup}, []string{lazyNetTag})...)
	if r.node == n {
		r.node = nil
	}
	return left
}

// close stops the node still running, the proxy and the blob store, unmounts the tmpfs and
// removes the work dir (unless failed: then its logs stay); it returns what is left on the host.
func (r *lazyRun) close(failed bool) []string {
	var left []string
	if r.node != nil {
		left = append(left, r.stopNode(context.Background(), r.node)...)
	}
	if r.proxy != nil {
		r.proxy.close()
	}
	if r.s3 != nil {
		r.s3.Stop()
	}
	if r.tmpfs != "" {
		if err := unix.Unmount(r.tmpfs, 0); err != nil {
			r.log.Warn("unmount the blob store's tmpfs", "err", err)
		}
	}
	scrub(r.log, []string{r.work}, []string{lazyCgroup}, []string{lazyNetTag})
	for _, l := range leftovers([]string{r.work}, []string{lazyCgroup}, []string{lazyNetTag}) {
		if !strings.HasPrefix(l, "directory ") && !slices.Contains(left, l) {
			left = append(left, l)
		}
	}
	if failed || len(left) > 0 {
		// The logs say what went wrong; the image and the node data dirs are gone already.
		os.RemoveAll(filepath.Join(r.work, "image"))
		os.RemoveAll(filepath.Join(r.work, "s3"))
		r.log.Warn("keeping the work dir for its logs", "dir", r.work)
		return left
	}
	if err := os.RemoveAll(r.work); err != nil {
		left = append(left, fmt.Sprintf("work dir %s: %v", r.work, err))
	}
	return left
}

// importLayerDir publishes dir as name:version of kind through c, public: the benchmarks'
// cold nodes adopt it from the shared blob store, which only public versions reach.
func importLayerDir(ctx context.Context, c *corral.Client, dir, name, version, kind string) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	tar := exec.CommandContext(ctx, "tar", "-C", dir, "-cf", "-", ".")
	tar.Stdout = pw
	if err := tar.Start(); err != nil {
		pr.Close()
		pw.Close()
		return err
	}
	pw.Close()
	_, err = c.ImportLayerWith(ctx, name, version, kind, corral.ImportOptions{Public: true}, pr)
	pr.Close()
	if werr := tar.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("tar %s: %w", dir, werr)
	}
	if err != nil {
		return fmt.Errorf("import %s:%s from %s: %w", name, version, dir, err)
	}
	return nil
}

// The synthetic image.

// imgFile is one file of the image: its path below the layer's root, its size, the unit
// (package or large file) it belongs to.
type imgFile struct {
	rel  string
	size int64
	unit int
}

// imagePlan is the image's files in layout order, grouped into units a task reads whole.
type imagePlan struct {
	files      []imgFile
	units      [][]int // file indices per unit
	unitBytes  []int64
	total      int64
	small      int64
	smallFiles int
}

// Shape of the image: like a toolkit, many small files in package directories (~28% of the
// bytes) and a few large ones.
const (
	smallShare  = 28 // percent of the bytes in small files
	smallMin    = 1 << 10
	smallMax    = 64 << 10
	largeMin    = 8 << 20
	largeMax    = 64 << 20
	pkgFilesMin = 16
	pkgFilesMax = 64
)

// planImage lays out an image of total bytes from seed.
func planImage(seed uint64, total int64) imagePlan {
	rng := mrand.New(mrand.NewPCG(seed, 0x6c617a79))
	var p imagePlan
	budget := total * smallShare / 100
	for pkg := 0; p.small < budget; pkg++ {
		unit := len(p.units)
		p.units = append(p.units, nil)
		p.unitBytes = append(p.unitBytes, 0)
		nfiles := pkgFilesMin + rng.IntN(pkgFilesMax-pkgFilesMin+1)
		mods := 2 + rng.IntN(3)
		for f := 0; f < nfiles && p.small < budget; f++ {
			size := min(smallMin+rng.Int64N(smallMax-smallMin+1), budget-p.small)
			size = max(size, 1)
			rel := fmt.Sprintf("%s/lib/pkg%04d/mod%d/f%03d.bin", lazyRoot, pkg, f%mods, f)
			p.units[unit] = append(p.units[unit], len(p.files))
			p.unitBytes[unit] += size
			p.files = append(p.files, imgFile{rel: rel, size: size, unit: unit})
			p.small += size
			p.smallFiles++
		}
	}
	rest := total - p.small
	for i := 0; rest > 0; i++ {
		size := largeMin + rng.Int64N(largeMax-largeMin+1)
		size &^= 4095
		if size > rest || rest-size < largeMin/8 {
			size = rest // the last file takes what is left
		}
		unit := len(p.units)
		p.units = append(p.units, []int{len(p.files)})
		p.unitBytes = append(p.unitBytes, size)
		p.files = append(p.files, imgFile{rel: fmt.Sprintf("%s/share/blob%03d.bin", lazyRoot, i), size: size, unit: unit})
		rest -= size
	}
	p.total = total
	return p
}

// selectTasks chooses each task's files: whole units in a random order (from seed), nested
// (each list starts with the previous one), up to each percentage of the image's bytes within a
// tolerance. 100% is every file.
func selectTasks(p imagePlan, seed uint64, pcts []int) map[int][]int {
	rng := mrand.New(mrand.NewPCG(seed, 0x7461736b))
	order := rng.Perm(len(p.units))
	chosen := make([]bool, len(p.units))
	var list []int
	var cum int64
	out := map[int][]int{}
	for _, pct := range pcts {
		target := p.total * int64(pct) / 100
		tol := max(p.total/100, target/10)
		for _, u := range order {
			if cum >= target {
				break
			}
			if chosen[u] || (pct < 100 && cum+p.unitBytes[u] > target+tol) {
				continue
			}
			chosen[u] = true
			cum += p.unitBytes[u]
			list = append(list, p.units[u]...)
		}
		out[pct] = slices.Clone(list)
	}
	return out
}

// writeImage writes p's files with random content from seed below dir, and the tasks' lists
// (absolute paths in the sandbox, one a line) as opt/lzb/task/list-PCT.
func writeImage(dir string, p imagePlan, lists map[int][]int, seed uint64) error {
	var key [32]byte
	for i := range 4 {
		v := seed*0x9e3779b97f4a7c15 + uint64(i)
		for j := range 8 {
			key[i*8+j] = byte(v >> (8 * j))
		}
	}
	rng := mrand.NewChaCha8(key)
	buf := make([]byte, 8<<20)
	made := map[string]bool{}
	for _, f := range p.files {
		path := filepath.Join(dir, f.rel)
		if d := filepath.Dir(path); !made[d] {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
			made[d] = true
		}
		fh, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		for left := f.size; left > 0; {
			b := buf[:min(left, int64(len(buf)))]
			rng.Read(b)
			if _, err := fh.Write(b); err != nil {
				fh.Close()
				return err
			}
			left -= int64(len(b))
		}
		if err := fh.Close(); err != nil {
			return err
		}
	}
	taskDir := filepath.Join(dir, lazyRoot, "task")
	if err := os.MkdirAll(taskDir, 0o755); err != nil {
		return err
	}
	for pct, idx := range lists {
		var b strings.Builder
		for _, i := range idx {
			b.WriteString("/" + p.files[i].rel + "\n")
		}
		if err := os.WriteFile(filepath.Join(taskDir, fmt.Sprintf("list-%d", pct)), []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// The blob store: versitygw and the delaying proxy.

// listKeys returns the keys under prefix in the run's bucket.
func (r *lazyRun) listKeys(ctx context.Context, prefix string) ([]string, error) {
	c, err := r.s3.Client()
	if err != nil {
		return nil, err
	}
	var keys []string
	for o := range c.ListObjects(ctx, lazyBucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("list %s in the blob store: %w", prefix, o.Err)
		}
		keys = append(keys, o.Key)
	}
	return keys, nil
}

// delayProxy is a reverse proxy on loopback that adds a delay to every request and can cap the
// bandwidth of the answers. It forwards the Host header as the client sent it: S3's SigV4
// signs it.
type delayProxy struct {
	addr  string
	srv   *http.Server
	delay time.Duration
	limit *rateLimiter // nil: no cap

	requests atomic.Int64 // requests received
	bytesIn  atomic.Int64 // bytes of the answers' bodies sent to clients
	bytesOut atomic.Int64 // bytes of the requests' bodies sent to the backend
}

// startDelayProxy serves on a free 127.0.0.1 port, forwarding to backend (host:port) after
// delay, its answers capped at bytesPerSec in all (0: no cap).
func startDelayProxy(backend string, delay time.Duration, bytesPerSec float64) (*delayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &delayProxy{addr: ln.Addr().String(), delay: delay}
	if bytesPerSec > 0 {
		p.limit = &rateLimiter{bps: bytesPerSec}
	}
	tr := &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute, DisableCompression: true}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", backend
			pr.Out.Host = pr.In.Host
		},
		Transport: tr,
		ModifyResponse: func(resp *http.Response) error {
			resp.Body = &countingBody{rc: resp.Body, n: &p.bytesIn, limit: p.limit}
			return nil
		},
		// A failed forward answers 502, which the node logs; the proxy's own line adds nothing.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	p.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p.requests.Add(1)
		if p.delay > 0 {
			t := time.NewTimer(p.delay)
			select {
			case <-t.C:
			case <-req.Context().Done():
				t.Stop()
				return
			}
		}
		if req.Body != nil && req.Body != http.NoBody {
			req.Body = &countingBody{rc: req.Body, n: &p.bytesOut}
		}
		rp.ServeHTTP(w, req)
	})}
	go p.srv.Serve(ln)
	return p, nil
}

func (p *delayProxy) close() { p.srv.Close() }

// countingBody counts the bytes read through it and paces them by limit.
type countingBody struct {
	rc    io.ReadCloser
	n     *atomic.Int64
	limit *rateLimiter
}

func (c *countingBody) Read(b []byte) (int, error) {
	if c.limit != nil && len(b) > 256<<10 {
		b = b[:256<<10] // pace in small steps
	}
	n, err := c.rc.Read(b)
	c.n.Add(int64(n))
	if c.limit != nil && n > 0 {
		c.limit.wait(n)
	}
	return n, err
}

func (c *countingBody) Close() error { return c.rc.Close() }

// rateLimiter paces bytes to bps over all its users: each wait reserves the next slot.
type rateLimiter struct {
	bps  float64
	mu   sync.Mutex
	next time.Time // protected by mu
}

func (l *rateLimiter) wait(n int) {
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	l.next = l.next.Add(time.Duration(float64(n) / l.bps * float64(time.Second)))
	d := l.next.Sub(now)
	l.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
}

// WriteSummary writes the run's figures as tables: first output, completion, bytes, goals.
func (res *LazyResult) WriteSummary(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	pr := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }
	lat := func(c LazyCell) string {
		s := fmt.Sprintf("%.0f / %.0f", c.Latency.P50, c.Latency.P99)
		if c.Mode != "eager" && c.RatioP50 > 0 {
			s += fmt.Sprintf(" (%.2fx / %.2fx)", c.RatioP50, c.RatioP99)
		}
		return s
	}
	byMode := func(kind, node string, n, pct int) map[string]LazyCell {
		m := map[string]LazyCell{}
		for _, c := range res.Cells {
			if c.Kind == kind && c.Node == node && c.Concurrency == n && c.Percent == pct {
				m[c.Mode] = c
			}
		}
		return m
	}
	first := 0
	if len(res.Image.Tasks) > 0 {
		first = res.Image.Tasks[0].Percent
	}
	pr("FIRST OUTPUT (%d%% task) ms p50 / p99 (vs eager)\tN\tEAGER\tLAZY\tPREFETCH\n", first)
	for _, node := range []string{"cold", "warm"} {
		for _, n := range res.Concurrency {
			m := byMode(cellFirstOutput, node, n, first)
			if len(m) == 0 {
				continue
			}
			pr("%s node\t%d\t%s\t%s\t%s\n", node, n, lat(m["eager"]), lat(m["lazy"]), lat(m["prefetch"]))
		}
	}
	pr("\nCOMPLETION, cold node, N=1, ms p50 / p99 (vs eager)\tREAD\tEAGER\tLAZY\tPREFETCH\n")
	for _, t := range res.Image.Tasks {
		m := byMode(cellCompletion, "cold", 1, t.Percent)
		if len(m) == 0 {
			continue
		}
		pr("%d%% task (%.1f%% of bytes, %d files)\t%.0f MiB\t%s\t%s\t%s\n", t.Percent, 100*t.Share, t.Files, mib(t.Bytes), lat(m["eager"]), lat(m["lazy"]), lat(m["prefetch"]))
	}
	pr("\nBYTES PER ROUND, MiB (vs eager)\tNODE\tMODE\tDISK WRITTEN\tLAZYD WRITTEN\tCACHE (du)\tFETCHED\tBLOB REQUESTS\tFETCH p50/p99 ms\n")
	for _, c := range res.Cells {
		if c.Kind == cellCompletion && c.SameAs != "" {
			continue
		}
		label := fmt.Sprintf("first output, N=%d", c.Concurrency)
		if c.Kind == cellCompletion {
			label = fmt.Sprintf("completion, %d%% task", c.Percent)
		}
		disk, fetched := fmt.Sprintf("%.1f", mib(c.Bytes.NodeWritten)), fmt.Sprintf("%.1f", mib(c.Bytes.Fetched))
		if c.Mode != "eager" && c.DiskRatio > 0 {
			disk += fmt.Sprintf(" (%.2fx)", c.DiskRatio)
		}
		if c.Mode != "eager" && c.FetchedRatio > 0 {
			fetched += fmt.Sprintf(" (%.2fx)", c.FetchedRatio)
		}
		pr("%s\t%s\t%s\t%s\t%.1f\t%.1f\t%s\t%d\t%g / %g\n", label, c.Node, c.Mode, disk, mib(c.Bytes.LazydWritten), mib(c.Bytes.CacheDu), fetched, c.Bytes.BlobRequests, c.Bytes.FetchP50Ms, c.Bytes.FetchP99Ms)
	}
	pr("\nGOAL\tN / READ\tWANT\tp50\tp99\tRESULT\n")
	for _, g := range res.Goals {
		verdict := "MISS"
		if g.Pass {
			verdict = "pass"
		}
		if g.Pass != g.PassP99 {
			verdict += " (p99: " + map[bool]string{true: "pass", false: "miss"}[g.PassP99] + ")"
		}
		where := fmt.Sprintf("N=%d", g.Concurrency)
		if g.Percent == 100 {
			where = "100%"
		}
		p99 := "-"
		if g.P99 != 0 {
			p99 = fmt.Sprintf("%.2f", g.P99)
		}
		pr("%s\t%s\t%s\t%.2f\t%s\t%s\n", g.Goal, where, g.Want, g.P50, p99, verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nimage %.0f MiB (%d files, %d small = %.0f MiB; data blob %d chunks), blob store +%g ms per request; %d CPUs, %.1f GiB; set-up: write %.0f s, import %.0f s, record %.0f s; wall %.0f s; leftovers: %d\n",
		mib(res.Image.Bytes), res.Image.Files, res.Image.SmallFiles, mib(res.Image.SmallBytes), res.Image.Chunks, res.DelayMs, res.CPUs, res.MemoryGiB,
		res.GenerateSeconds, res.ImportSeconds, res.RecordSeconds, res.WallSeconds, len(res.Leftovers))
	return err
}
