package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/mountinfo"
	"github.com/corral-dev/corral/internal/store/pgtest"
	corral "github.com/corral-dev/corral/sdk/go"
)

// ClusterConfig sizes a `corral bench cluster` run. Zero fields take the defaults.
type ClusterConfig struct {
	// Corral is the corral binary to start (servers, edges, `corral up`); Rootfs the base
	// layer's directory (scripts/busybox-rootfs.sh makes one). Both are required.
	Corral, Rootfs string
	Creates        int // sandboxes created in each setup (default 60)
	Concurrency    int // concurrent creators, and deleters (default 8)
	// CPUs is each sandbox's CPU limit (default 0.25: 60 fit the 3 edges' default admission of 4
	// CPU limits per CPU on 2 CPUs, and at concurrency 8 on 2 CPUs a create gets no more anyway).
	CPUs      float64
	MemoryMiB int64 // memory limit of each sandbox (default 64)
	// DiskPool is how many formatted disks are kept ready in all: `corral up` keeps this many,
	// each of the 3 edges a third of it (at least 1), so both start a run with the same stock
	// (default 6).
	DiskPool int
	// Rounds splits the creates of each setup into rounds, the setups taking turns (default 4).
	Rounds int
	// SkipSQLite leaves out the `corral up` on its default SQLite store (the baseline's too).
	SkipSQLite bool
	// Baseline, when set, is another corral binary whose `corral up` on SQLite is measured as one
	// more setup, "up-sqlite-baseline", and, unless OnlyUp, whose cluster is measured as
	// "cluster-baseline" (before/after comparisons in one run).
	Baseline string
	// OnlyUp leaves out the cluster and the `corral up` on PostgreSQL (no PostgreSQL is started).
	OnlyUp bool
}

func (c ClusterConfig) withDefaults() ClusterConfig {
	if c.Creates == 0 {
		c.Creates = 60
	}
	if c.Concurrency == 0 {
		c.Concurrency = 8
	}
	if c.CPUs == 0 {
		c.CPUs = 0.25
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 64
	}
	if c.DiskPool == 0 {
		c.DiskPool = 6
	}
	if c.Rounds == 0 {
		c.Rounds = 4
	}
	return c
}

// Validate checks a configuration after defaults.
func (c ClusterConfig) Validate() error {
	switch {
	case c.Corral == "":
		return errdefs.Invalid("corral", "the corral binary to start is required")
	case c.Rootfs == "":
		return errdefs.Invalid("rootfs", "the base layer's directory is required (scripts/busybox-rootfs.sh makes one)")
	case c.Creates < 1:
		return errdefs.Invalid("creates", "must be positive, got %d", c.Creates)
	case c.Concurrency < 1:
		return errdefs.Invalid("concurrency", "must be positive, got %d", c.Concurrency)
	case c.CPUs <= 0:
		return errdefs.Invalid("cpus", "must be positive, got %v", c.CPUs)
	case c.MemoryMiB < 8:
		return errdefs.Invalid("memory_mib", "must be at least 8, got %d", c.MemoryMiB)
	case c.DiskPool < 0:
		return errdefs.Invalid("disk_pool", "must not be negative, got %d", c.DiskPool)
	case c.Rounds < 1 || c.Rounds > c.Creates:
		return errdefs.Invalid("rounds", "must be between 1 and the creates (%d), got %d", c.Creates, c.Rounds)
	}
	return nil
}

// The cluster under test: 2 server replicas and 3 edges.
const (
	clusterServers = 2
	clusterEdges   = 3
)

// ClusterResult is what one `corral bench cluster` run measured.
type ClusterResult struct {
	Date        string  `json:"date"`
	Host        string  `json:"host"`
	Kernel      string  `json:"kernel"`
	CPUs        int     `json:"cpus"`
	MemoryGiB   float64 `json:"memory_gib"`
	Creates     int     `json:"creates"`
	Concurrency int     `json:"concurrency"`
	SandboxCPUs float64 `json:"sandbox_cpus"`
	SandboxMiB  int64   `json:"sandbox_memory_mib"`
	DiskPool    int     `json:"disk_pool_total"`
	Rounds      int     `json:"rounds"`
	// LoadAvgStart and LoadAvgEnd are the machine's 1-minute load average before the first
	// measured create and after the last delete; they count the run's own work too (the
	// warm-ups, then the measures), so they say mostly whether something else was running.
	LoadAvgStart float64 `json:"loadavg_1m_start"`
	LoadAvgEnd   float64 `json:"loadavg_1m_end"`

	// Setups: "cluster", "up-postgres", "up-sqlite"; all run during the whole measure, taking
	// turns.
	Setups []ClusterSetup `json:"setups"`
	// Ratios compare the cluster with each `corral up`.
	Ratios []ClusterRatio `json:"ratios"`
	// Leftovers lists what was still on the host after the cleanup (empty when clean).
	Leftovers []string `json:"leftovers"`
	Notes     []string `json:"notes"`
}

// ClusterSetup is one setup's measure.
type ClusterSetup struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Store       string `json:"store"`
	// StartSeconds is from starting its processes to all of them serving (the cluster: 3 ready
	// nodes), the base layer imported; WarmupSeconds the creates and deletes that mount the base
	// on every node.
	StartSeconds  float64 `json:"start_seconds"`
	WarmupSeconds float64 `json:"warmup_seconds"`

	CreatesPerSec float64 `json:"creates_per_s"`
	Create        Stats   `json:"create_latency"`
	DeletesPerSec float64 `json:"deletes_per_s"`
	Delete        Stats   `json:"delete_latency"`
	// Read and Exec are one request at a time on each created sandbox, through the setup's API
	// (a replica, for a cluster): GET /v1/sandboxes/{id}, and an exec of `true` to its result.
	Read Stats `json:"read_latency"`
	Exec Stats `json:"exec_latency"`
	// ByNode counts the measured sandboxes per node that ran them.
	ByNode map[string]int `json:"by_node"`
	// LogErrors counts level=ERROR lines per process of the setup.
	LogErrors map[string]int `json:"log_errors"`
}

// ClusterRatio is the cluster against one `corral up`.
type ClusterRatio struct {
	Versus     string  `json:"versus"`
	Throughput float64 `json:"creates_per_s_ratio"`
	P50        float64 `json:"create_p50_ratio"`
	P99        float64 `json:"create_p99_ratio"`
	DeleteP50  float64 `json:"delete_p50_ratio"`
	DeleteP99  float64 `json:"delete_p99_ratio"`
	ReadP50    float64 `json:"read_p50_ratio"`
	ExecP50    float64 `json:"exec_p50_ratio"`
	ExecP99    float64 `json:"exec_p99_ratio"`
}

// Cluster measures create throughput through a cluster of 2 `corral server` replicas and 3
// `corral edge` processes (sharing a PostgreSQL started for the run) against one `corral up` on
// the same machine, on the same PostgreSQL and on its default SQLite store. It starts everything
// it needs, as root, and removes all of it afterwards, on error and cancellation too; what the
// cleanup could not remove is listed in the result's Leftovers (the result is returned with an
// error then).
func Cluster(ctx context.Context, cfg ClusterConfig, log *slog.Logger) (res *ClusterResult, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("corral bench cluster runs servers, edges and corral up on this machine: run it as root")
	}
	if _, err := os.Stat(filepath.Join(cfg.Rootfs, "bin")); err != nil {
		return nil, fmt.Errorf("rootfs %s has no bin/: %w", cfg.Rootfs, err)
	}
	host, _ := os.Hostname()
	var uts unix.Utsname
	unix.Uname(&uts)
	res = &ClusterResult{
		Date: time.Now().UTC().Format(time.RFC3339), Host: host, Kernel: unix.ByteSliceToString(uts.Release[:]),
		CPUs: runtime.NumCPU(), MemoryGiB: float64(meminfoBytes("MemTotal")) / (1 << 30),
		Creates: cfg.Creates, Concurrency: cfg.Concurrency, SandboxCPUs: cfg.CPUs, SandboxMiB: cfg.MemoryMiB,
		DiskPool: cfg.DiskPool, Rounds: cfg.Rounds, Leftovers: []string{},
		Notes: []string{
			"Every process runs on this one machine: the 3 edges share its CPUs, so the cluster's figure is the cost of the extra hop (client → server → edge) and of PostgreSQL, not scale-out.",
			"Creates go round robin to the two replicas' URLs; each create's latency is from the request to the running sandbox's answer. Deletes are timed separately, at the same concurrency.",
			"All setups run side by side (idle when not measured) and take turns: each setup's creates are split into rounds, in the order A B C, then C B A, and so on. Before every round all disk pools are waited full, so no refill runs during a measure; a warm-up first mounted the base on every node. corral up keeps disk_pool_total disks ready, each edge a third of it.",
			"Servers and edges run with their default placement and admission (4 CPU limits per CPU, disk and memory not overcommitted); each edge reports this machine's CPUs, memory and filesystem as its own. A create an edge refuses as full is retried on another node, inside its measured latency.",
		},
	}
	work, err := os.MkdirTemp("", "crl-cb-") // short: sandbox paths below it hold unix sockets
	if err != nil {
		return nil, err
	}
	env := &clusterEnv{cfg: cfg, work: work, log: log}
	defer func() {
		res.Leftovers = env.close(context.WithoutCancel(ctx))
		if len(res.Leftovers) > 0 {
			err = errors.Join(err, fmt.Errorf("left on the host after the cleanup: %s", strings.Join(res.Leftovers, "; ")))
		}
	}()
	type setup struct {
		name, desc, store string
		start             func(context.Context, *phase) error
	}
	var setups []setup
	if !cfg.OnlyUp {
		log.Info("starting PostgreSQL")
		if env.pg, err = pgtest.Start(); err != nil {
			return res, fmt.Errorf("start PostgreSQL: %w", err)
		}
		clusterDB, err := env.pg.CreateDB("bench_cluster")
		if err != nil {
			return res, err
		}
		upDB, err := env.pg.CreateDB("bench_up")
		if err != nil {
			return res, err
		}
		setups = append(setups, setup{"cluster", fmt.Sprintf("%d servers + %d edges, PostgreSQL", clusterServers, clusterEdges), "postgres",
			func(ctx context.Context, p *phase) error { return env.startCluster(ctx, p, clusterDB, "", 0) }},
			setup{"up-postgres", "one corral up, PostgreSQL", "postgres",
				func(ctx context.Context, p *phase) error { return env.startUp(ctx, p, "up", "cbu", 8, upDB) }})
	}
	if !cfg.SkipSQLite {
		setups = append(setups, setup{"up-sqlite", "one corral up, SQLite (its default)", "sqlite",
			func(ctx context.Context, p *phase) error { return env.startUp(ctx, p, "us", "cbs", 10, "") }})
	}
	if cfg.Baseline != "" && !cfg.OnlyUp {
		baseDB, err := env.pg.CreateDB("bench_cluster_baseline")
		if err != nil {
			return res, err
		}
		setups = append(setups, setup{"cluster-baseline", fmt.Sprintf("%d servers + %d edges, PostgreSQL, the baseline binary", clusterServers, clusterEdges), "postgres",
			func(ctx context.Context, p *phase) error {
				p.bin = cfg.Baseline
				return env.startCluster(ctx, p, baseDB, "b", 1)
			}})
	}
	if cfg.Baseline != "" && !cfg.SkipSQLite {
		setups = append(setups, setup{"up-sqlite-baseline", "one corral up, SQLite, the baseline binary", "sqlite",
			func(ctx context.Context, p *phase) error {
				p.bin = cfg.Baseline
				return env.startUp(ctx, p, "ub", "cbb", 12, "")
			}})
	}
	if len(setups) == 0 {
		return res, errdefs.Invalid("setups", "no setup left to measure")
	}
	// Every setup is started and warmed up first, then measured in rounds whose order reverses
	// each round (A B C, C B A, ...): a change in the machine's load during the run (this is a
	// shared VM) then weighs on every setup alike.
	phases := make([]*phase, len(setups))
	for i, s := range setups {
		p := &phase{name: s.name, out: ClusterSetup{Name: s.name, Description: s.desc, Store: s.store, ByNode: map[string]int{}}}
		phases[i] = p
		env.phases = append(env.phases, p)
		log.Info("starting", "setup", s.name)
		start := time.Now()
		if err := s.start(ctx, p); err != nil {
			return res, fmt.Errorf("start %s: %w", s.name, err)
		}
		p.out.StartSeconds = time.Since(start).Seconds()
		start = time.Now()
		if err := env.warmup(ctx, p); err != nil {
			return res, fmt.Errorf("%s: warm-up: %w", s.name, err)
		}
		p.out.WarmupSeconds = time.Since(start).Seconds()
	}
	res.LoadAvgStart = loadAvg1()
	for r := range cfg.Rounds {
		n := cfg.Creates / cfg.Rounds
		if r < cfg.Creates%cfg.Rounds {
			n++
		}
		order := slices.Clone(phases)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, p := range order {
			if err := env.waitPools(ctx, phases); err != nil {
				return res, err
			}
			if err := env.round(ctx, p, r, n); err != nil {
				return res, fmt.Errorf("%s: %w", p.name, err)
			}
		}
	}
	res.LoadAvgEnd = loadAvg1()
	for _, p := range phases {
		out := p.out
		out.Create, out.CreatesPerSec = summarise(p.creates), float64(len(p.creates))/p.createWall.Seconds()
		out.Delete, out.DeletesPerSec = summarise(p.deletes), float64(len(p.deletes))/p.deleteWall.Seconds()
		out.Read, out.Exec = summarise(p.reads), summarise(p.execs)
		out.LogErrors = map[string]int{}
		for _, pr := range p.procs {
			out.LogErrors[pr.name] = pr.logErrors()
		}
		res.Setups = append(res.Setups, out)
		log.Info("measured", "setup", p.name, "creates_per_s", fmt.Sprintf("%.2f", out.CreatesPerSec),
			"create_p50_ms", out.Create.P50, "create_p99_ms", out.Create.P99, "by_node", out.ByNode)
	}
	for _, s := range res.Setups[1:] {
		c := res.Setups[0]
		res.Ratios = append(res.Ratios, ClusterRatio{Versus: s.Name, Throughput: c.CreatesPerSec / s.CreatesPerSec,
			P50: c.Create.P50 / s.Create.P50, P99: c.Create.P99 / s.Create.P99,
			DeleteP50: c.Delete.P50 / s.Delete.P50, DeleteP99: c.Delete.P99 / s.Delete.P99,
			ReadP50: c.Read.P50 / s.Read.P50, ExecP50: c.Exec.P50 / s.Exec.P50, ExecP99: c.Exec.P99 / s.Exec.P99})
	}
	return res, nil
}

// clusterEnv is what one run started: its PostgreSQL, its work dir and the phase now running.
// It is used by one goroutine (the run's).
type clusterEnv struct {
	cfg    ClusterConfig
	work   string
	log    *slog.Logger
	pg     *pgtest.Cluster
	phases []*phase // started, in start order; torn down in reverse
}

// phase is one setup's processes, what they put on the host, and its measures so far.
type phase struct {
	name     string
	bin      string // the corral binary its processes run (default ClusterConfig.Corral)
	out      ClusterSetup
	procs    []*benchProc // in start order; stopped in reverse
	clients  []*corral.Client
	dataDirs []string // of the processes that run sandboxes, for their disk pools
	pool     int      // disk pool of each of them
	nodes    []string // the nodes sandboxes must land on in the warm-up
	cgroups  []string // cgroup parents, e.g. /corral-bench-e1
	tags     []string // net tags

	creates, deletes       []time.Duration // latencies, over the rounds so far
	reads, execs           []time.Duration
	createWall, deleteWall time.Duration // wall times, over the rounds so far
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// benchHTTP returns the clients' HTTP client of one setup: every setup gets the same kind, with
// enough idle connections per host for the run's concurrency.
func benchHTTP(concurrency int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2 * concurrency
	return &http.Client{Transport: tr}
}

// Its processes' names, net tags and cgroups start with prefix, and its edges' network pools are
// the set'th of the 10.252.0.0/16 range, so two clusters run side by side.
func (e *clusterEnv) startCluster(ctx context.Context, p *phase, dsn, prefix string, set int) error {
	blobs := filepath.Join(e.work, prefix+"blobs")
	var urls []string
	for i := range clusterServers {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%ss%d", prefix, i+1)
		dir := filepath.Join(e.work, name)
		args := []string{"server", "--store", dsn, "--data-dir", dir, "--listen", addr, "--blob-store", "dir:" + blobs}
		if e.hasFlag(p, "server", "--node-listen") { // a baseline from before the node channel has none
			nodeAddr, err := freeAddr()
			if err != nil {
				return err
			}
			args = append(args, "--node-listen", nodeAddr)
		}
		pr, err := e.start(p, name, args...)
		if err != nil {
			return err
		}
		url := "http://" + addr
		// One at a time: the first replica bootstraps the store and writes the tokens.
		if err := waitHealthy(ctx, pr, url, time.Minute); err != nil {
			return err
		}
		urls = append(urls, url)
	}
	sdir := filepath.Join(e.work, prefix+"s1")
	token, err := os.ReadFile(filepath.Join(sdir, "admin.token"))
	if err != nil {
		return fmt.Errorf("the first replica wrote no admin token: %w", err)
	}
	hc := benchHTTP(e.cfg.Concurrency)
	for _, u := range urls {
		p.clients = append(p.clients, corral.New(u, strings.TrimSpace(string(token)), corral.WithHTTPClient(hc)))
	}
	p.pool = max(1, e.cfg.DiskPool/clusterEdges)
	var edgeAddrs []string
	for i := range clusterEdges {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		name, tag, cg := fmt.Sprintf("%se%d", prefix, i+1), fmt.Sprintf("cb%s%d", prefix, i+1), fmt.Sprintf("/corral-bench-%se%d", prefix, i+1)
		dir := filepath.Join(e.work, name)
		edgeAddrs = append(edgeAddrs, addr)
		p.cgroups, p.tags, p.dataDirs, p.nodes = append(p.cgroups, cg), append(p.tags, tag), append(p.dataDirs, dir), append(p.nodes, name)
		if _, err := e.start(p, name, "edge", "--server", urls[i%len(urls)], "--join-token", filepath.Join(sdir, "join.token"),
			"--name", name, "--data-dir", dir, "--listen", addr, "--cgroup-parent", cg, "--net-tag", tag,
			"--net-pool", fmt.Sprintf("10.252.%d.0/23", 2*i+16*set), "--disk-pool", strconv.Itoa(p.pool)); err != nil {
			return err
		}
	}
	// Ready means registered in the store, which the servers read, and accepting connections:
	// independent of how the edges serve their own API (an edge registers before it listens).
	deadline := time.Now().Add(time.Minute)
	for {
		nodes, err := p.clients[0].Nodes(ctx)
		ready := 0
		for _, n := range nodes {
			if n.State == corral.NodeReady && slices.Contains(p.nodes, n.Name) {
				ready++
			}
		}
		if err == nil && ready == clusterEdges && allListening(edgeAddrs) {
			break
		}
		for _, pr := range p.procs {
			if pr.exited() {
				return fmt.Errorf("%s exited: %v\n%s", pr.name, pr.waitErr, pr.tail(20))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d edges ready after a minute (last error: %v)", ready, clusterEdges, err)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return importBase(ctx, p.clients[0], e.cfg.Rootfs)
}

// allListening reports whether every address accepts TCP connections.
func allListening(addrs []string) bool {
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, time.Second)
		if err != nil {
			return false
		}
		c.Close()
	}
	return true
}

// startUp starts one `corral up` named name (its data dir, cgroup parent /corral-bench-NAME),
// with net tag tag and net pool 10.252.NET.0/23, on store (its SQLite when empty).
func (e *clusterEnv) startUp(ctx context.Context, p *phase, name, tag string, netOctet int, store string) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	dir, cg := filepath.Join(e.work, name), "/corral-bench-"+name
	p.cgroups, p.tags, p.dataDirs, p.nodes, p.pool = []string{cg}, []string{tag}, []string{dir}, nil, e.cfg.DiskPool
	args := []string{"up", "--data-dir", dir, "--listen", addr, "--cgroup-parent", cg, "--net-tag", tag,
		"--net-pool", fmt.Sprintf("10.252.%d.0/23", netOctet), "--disk-pool", strconv.Itoa(p.pool)}
	if store != "" {
		args = append(args, "--store", store)
	}
	pr, err := e.start(p, name, args...)
	if err != nil {
		return err
	}
	url := "http://" + addr
	if err := waitHealthy(ctx, pr, url, time.Minute); err != nil {
		return err
	}
	token, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		return fmt.Errorf("corral up wrote no admin token: %w", err)
	}
	p.clients = []*corral.Client{corral.New(url, strings.TrimSpace(string(token)), corral.WithHTTPClient(benchHTTP(e.cfg.Concurrency)))}
	return importBase(ctx, p.clients[0], e.cfg.Rootfs)
}

// importBase publishes dir as base:cbench through c.
func importBase(ctx context.Context, c *corral.Client, dir string) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(layers.WriteTar(ctx, dir, pw)) }()
	_, err := c.ImportLayer(ctx, "base", "cbench", corral.KindBase, pr)
	pr.CloseWithError(errors.New("import ended"))
	if err != nil {
		return fmt.Errorf("import base layer %s: %w", dir, err)
	}
	return nil
}

// createRequest is what every measured create asks for.
func (e *clusterEnv) createRequest() corral.CreateRequest {
	return corral.CreateRequest{Base: "base:cbench", Labels: map[string]string{"bench": "cluster"},
		Limits: corral.Limits{CPUs: e.cfg.CPUs, MemoryBytes: e.cfg.MemoryMiB << 20}}
}

// round times n creates in setup p at the run's concurrency, then their deletes, and adds them to
// p's measures.
func (e *clusterEnv) round(ctx context.Context, p *phase, r, n int) error {
	e.log.Info("measuring creates", "setup", p.name, "round", r+1, "n", n, "concurrency", e.cfg.Concurrency)
	type created struct {
		id, node string
		d        time.Duration
	}
	req := e.createRequest()
	results := make([]created, n)
	elapsed, err := parallel(ctx, n, e.cfg.Concurrency, func(ctx context.Context, i int) error {
		t0 := time.Now()
		sb, err := p.clients[i%len(p.clients)].CreateSandbox(ctx, req)
		if err != nil {
			return fmt.Errorf("create %d: %w", i, err)
		}
		results[i] = created{sb.ID, sb.Node, time.Since(t0)}
		return nil
	})
	if err != nil {
		return err // the teardown deletes what was made
	}
	for _, c := range results {
		p.creates = append(p.creates, c.d)
		p.out.ByNode[c.node]++
	}
	p.createWall += elapsed

	// One request at a time through the setup's API: a sandbox's record, then an exec.
	for i, c := range results {
		cl := p.clients[i%len(p.clients)]
		t0 := time.Now()
		if _, err := cl.GetSandbox(ctx, c.id); err != nil {
			return fmt.Errorf("read %s: %w", c.id, err)
		}
		t1 := time.Now()
		if _, _, exit, err := cl.Run(ctx, c.id, corral.ExecRequest{Argv: []string{"true"}}); err != nil || exit.Code != 0 {
			return fmt.Errorf("exec true in %s: exit %+v, %v", c.id, exit, err)
		}
		p.reads, p.execs = append(p.reads, t1.Sub(t0)), append(p.execs, time.Since(t1))
	}

	del := make([]time.Duration, n)
	elapsed, err = parallel(ctx, n, e.cfg.Concurrency, func(ctx context.Context, i int) error {
		t0 := time.Now()
		if _, err := p.clients[i%len(p.clients)].DeleteSandbox(ctx, results[i].id); err != nil {
			return fmt.Errorf("delete %s: %w", results[i].id, err)
		}
		del[i] = time.Since(t0)
		return nil
	})
	if err != nil {
		return err
	}
	p.deletes = append(p.deletes, del...)
	p.deleteWall += elapsed
	return nil
}

// warmup creates sandboxes until every node of the setup has run one (which mounts the base
// there), and deletes them.
func (e *clusterEnv) warmup(ctx context.Context, p *phase) error {
	req := e.createRequest()
	seen := map[string]bool{}
	var ids []string
	defer func() {
		for i, id := range ids {
			p.clients[i%len(p.clients)].DeleteSandbox(context.WithoutCancel(ctx), id)
		}
	}()
	want := max(1, len(p.nodes))
	for i := 0; len(seen) < want; i++ {
		if i >= 8*want {
			return fmt.Errorf("after %d creates, sandboxes ran on %v only, not on every one of %v", i, slices.Sorted(maps.Keys(seen)), p.nodes)
		}
		sb, err := p.clients[i%len(p.clients)].CreateSandbox(ctx, req)
		if err != nil {
			return err
		}
		ids = append(ids, sb.ID)
		seen[sb.Node] = true
	}
	for i, id := range ids {
		if _, err := p.clients[i%len(p.clients)].DeleteSandbox(ctx, id); err != nil {
			return fmt.Errorf("delete %s: %w", id, err)
		}
	}
	ids = nil
	return nil
}

// waitPools waits until the disk pool of every sandbox host of every setup is full, so that no
// refill runs during the next measure (it would take CPU from whichever setup is measured). It
// gives up, saying so, after 30 seconds.
func (e *clusterEnv) waitPools(ctx context.Context, phases []*phase) error {
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range phases {
		for _, dir := range p.dataDirs {
			for {
				// The pool's ready slots are directories of <data dir>/sandboxes/.pool with their
				// disk mounted and set up (disk/work made last); a slot being made has none yet.
				slots, _ := filepath.Glob(filepath.Join(dir, "sandboxes", ".pool", "*", "disk", "work"))
				if len(slots) >= p.pool {
					break
				}
				if time.Now().After(deadline) {
					e.log.Warn("disk pool not full after 30 s; measuring anyway", "data_dir", dir, "ready", len(slots), "want", p.pool)
					return nil
				}
				if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// parallel runs fn(0..n-1) on concurrency goroutines and returns the wall time; the first error
// stops the work not yet started.
func parallel(ctx context.Context, n, concurrency int, fn func(ctx context.Context, i int) error) (time.Duration, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan int, n)
	for i := range n {
		work <- i
	}
	close(work)
	var wg sync.WaitGroup
	start := time.Now()
	for range min(concurrency, n) {
		wg.Go(func() {
			for i := range work {
				if ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := context.Cause(ctx); err != nil {
		return elapsed, err
	}
	return elapsed, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// healthClient probes /healthz only: it accepts any certificate, so that a process serving
// HTTPS with a certificate of its own cluster answers the probe too.
var healthClient = &http.Client{
	Timeout:   2 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
}

// waitHealthy polls url's /healthz (over http, then https) until it answers 200, pr exits or
// the timeout passes.
func waitHealthy(ctx context.Context, pr *benchProc, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	alt := strings.Replace(url, "http://", "https://", 1)
	for {
		for _, u := range []string{url, alt} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"/healthz", nil)
			if resp, err := healthClient.Do(req); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		if pr.exited() {
			return fmt.Errorf("%s exited: %v\n%s", pr.name, pr.waitErr, pr.tail(20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not healthy at %s after %s:\n%s", pr.name, url, timeout, pr.tail(20))
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// benchProc is one corral process of a setup, in a process group of its own (so that a Ctrl-C
// reaches only the benchmark, which then stops it in order).
type benchProc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited; waitErr is set then
	waitErr error
}

// hasFlag reports whether the binary of phase p has flag on command cmd (a baseline binary may
// predate it).
func (e *clusterEnv) hasFlag(p *phase, cmd, flag string) bool {
	bin := e.cfg.Corral
	if p.bin != "" {
		bin = p.bin
	}
	out, _ := exec.Command(bin, cmd, "--help").CombinedOutput()
	return strings.Contains(string(out), flag+" ")
}

func (e *clusterEnv) start(p *phase, name string, args ...string) (*benchProc, error) {
	pr := &benchProc{name: name, logPath: filepath.Join(e.work, name+".log"), done: make(chan struct{})}
	logf, err := os.Create(pr.logPath)
	if err != nil {
		return nil, err
	}
	bin := e.cfg.Corral
	if p.bin != "" {
		bin = p.bin
	}
	pr.cmd = exec.Command(bin, args...)
	pr.cmd.Stdout, pr.cmd.Stderr = logf, logf
	pr.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := pr.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	logf.Close() // the child holds its own copy
	go func() { pr.waitErr = pr.cmd.Wait(); close(pr.done) }()
	p.procs = append(p.procs, pr)
	return pr, nil
}

func (pr *benchProc) exited() bool {
	select {
	case <-pr.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and, if the process has not exited after grace, SIGKILL.
func (pr *benchProc) stop(grace time.Duration) {
	if pr.exited() {
		return
	}
	pr.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-pr.done:
	case <-time.After(grace):
		pr.cmd.Process.Kill()
		<-pr.done
	}
}

func (pr *benchProc) tail(n int) string {
	b, _ := os.ReadFile(pr.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (pr *benchProc) logErrors() int {
	b, _ := os.ReadFile(pr.logPath)
	return strings.Count(string(b), "level=ERROR")
}

// teardown deletes the phase's sandboxes through its API, stops its processes (sandbox hosts
// first), removes what they may have left, and returns what is still there.
func (e *clusterEnv) teardown(ctx context.Context, p *phase) []string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if len(p.clients) > 0 {
		if list, err := p.clients[0].ListSandboxes(ctx, corral.ListOptions{}); err != nil {
			e.log.Warn("list sandboxes to delete", "setup", p.name, "err", err)
		} else {
			var live []string
			for _, sb := range list {
				if sb.State != corral.StateStopped && sb.State != corral.StateFailed {
					live = append(live, sb.ID)
				}
			}
			if len(live) > 0 {
				e.log.Info("deleting sandboxes left", "setup", p.name, "n", len(live))
				parallel(ctx, len(live), 4, func(ctx context.Context, i int) error {
					if _, err := p.clients[i%len(p.clients)].DeleteSandbox(ctx, live[i]); err != nil {
						e.log.Warn("delete sandbox", "sandbox", live[i], "err", err)
					}
					return nil
				})
			}
		}
	}
	for _, pr := range slices.Backward(p.procs) {
		pr.stop(20 * time.Second)
	}
	for _, pr := range p.procs {
		if n := pr.logErrors(); n > 0 {
			e.log.Warn("errors in a process's log", "process", pr.name, "errors", n, "tail", pr.tail(5))
		}
	}
	dirs := slices.Clone(p.dataDirs)
	for _, pr := range p.procs {
		dirs = append(dirs, filepath.Join(e.work, pr.name))
	}
	scrub(e.log, dirs, p.cgroups, p.tags)
	for _, d := range dirs {
		os.RemoveAll(d)
	}
	return leftovers(dirs, p.cgroups, p.tags)
}

// close tears down the phase still running, stops PostgreSQL, removes the work dir and
// returns what is left on the host.
func (e *clusterEnv) close(ctx context.Context) []string {
	left := []string{}
	var cgroups, tags []string
	for _, p := range slices.Backward(e.phases) {
		for _, l := range e.teardown(ctx, p) {
			left = append(left, p.name+": "+l)
		}
		cgroups, tags = append(cgroups, p.cgroups...), append(tags, p.tags...)
	}
	e.phases = nil
	if e.pg != nil {
		e.pg.Stop()
	}
	scrub(e.log, []string{e.work}, cgroups, tags)
	if err := os.RemoveAll(e.work); err != nil {
		left = append(left, fmt.Sprintf("work dir %s: %v", e.work, err))
	}
	for _, l := range leftovers([]string{e.work}, cgroups, tags) {
		if !slices.ContainsFunc(left, func(s string) bool { return strings.HasSuffix(s, l) }) {
			left = append(left, l)
		}
	}
	return left
}

// under reports whether path is dir or below it.
func under(path string, dirs []string) bool {
	for _, d := range dirs {
		if path == d || strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

// mountsUnder returns the mount points of this mount namespace below dirs or named by prefixes,
// in mount order.
func mountsUnder(dirs, prefixes []string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := mountinfo.Unescape(fields[4])
		hasPrefix := slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(mp, p) })
		if under(mp, dirs) || hasPrefix {
			out = append(out, mp)
		}
	}
	return out
}

// loopsUnder returns the loop devices (/dev/loopN) whose backing file is below dirs.
func loopsUnder(dirs []string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if under(strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)"), dirs) {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return out
}

// procsUsing returns the pids (other than this one) whose command line names a path below dirs.
func procsUsing(dirs []string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(b) == 0 {
			continue
		}
		for _, arg := range strings.Split(string(b), "\x00") {
			if slices.ContainsFunc(dirs, func(d string) bool { return strings.Contains(arg+"/", d+"/") }) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// cgroupDirs returns the directories of cgroup parent cg (e.g. /corral-bench-e1) in every
// hierarchy, with everything below them, deepest first.
func cgroupDirs(cg string) []string {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	var out []string
	for _, r := range roots {
		top := filepath.Join(r, cg)
		if fi, err := os.Stat(top); err != nil || !fi.IsDir() {
			continue
		}
		filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				out = append(out, path)
			}
			return nil
		})
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return slices.Compact(out)
}

// What a Corral with net tag tag names on the host: its namespaces' bind mounts, its interfaces
// and its nftables tables.
func netnsPrefix(tag string) string { return "/run/netns/corral-" + tag + "-" }
func linkPrefix(tag string) string  { return "cr" + tag + "-" }
func nftTables(tag string) []string { return []string{"corral-" + tag, "corral-" + tag + "-nat"} }

// scrub removes what a setup's processes may have left when they did not stop cleanly:
// processes in its cgroups or naming its dirs, mounts and loop devices below its dirs, its
// network namespaces, interfaces and nftables tables, and its cgroups. On a clean stop there is
// nothing to do but remove the (empty) cgroups.
func scrub(log *slog.Logger, dirs, cgroups, tags []string) {
	var pids []int
	for _, cg := range cgroups {
		for _, d := range cgroupDirs(cg) {
			b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
		}
	}
	for _, pid := range procsUsing(dirs) {
		if !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	if len(pids) > 0 {
		log.Warn("killing processes left behind", "pids", pids)
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
	}
	var prefixes []string
	for _, t := range tags {
		prefixes = append(prefixes, netnsPrefix(t))
	}
	mounts := mountsUnder(dirs, prefixes)
	for _, mp := range slices.Backward(mounts) {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			log.Warn("unmount", "path", mp, "err", err)
		}
	}
	if len(mounts) > 0 {
		log.Warn("unmounted what was left", "mounts", len(mounts))
	}
	for _, dev := range loopsUnder(dirs) {
		if f, err := os.Open(dev); err == nil {
			if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil {
				log.Warn("detach loop device", "device", dev, "err", err)
			}
			f.Close()
		}
	}
	for _, t := range tags {
		ns, _ := filepath.Glob(netnsPrefix(t) + "*")
		for _, n := range ns {
			os.Remove(n)
		}
		if links, err := netlink.LinkList(); err == nil {
			for _, l := range links {
				if strings.HasPrefix(l.Attrs().Name, linkPrefix(t)) {
					netlink.LinkDel(l)
				}
			}
		}
	}
	if len(tags) > 0 {
		if conn, err := nftables.New(); err == nil {
			if tables, err := conn.ListTables(); err == nil {
				for _, tb := range tables {
					if slices.ContainsFunc(tags, func(t string) bool { return slices.Contains(nftTables(t), tb.Name) }) {
						conn.DelTable(tb)
					}
				}
				if err := conn.Flush(); err != nil {
					log.Warn("remove nftables tables", "err", err)
				}
			}
		}
	}
	// A cgroup whose last process just died goes away only once it is reaped.
	deadline := time.Now().Add(5 * time.Second)
	for _, cg := range cgroups {
		for _, d := range cgroupDirs(cg) {
			for os.Remove(d) != nil && time.Now().Before(deadline) {
				if _, err := os.Stat(d); err != nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}

// leftovers lists what of a setup is still on the host: mounts and loop devices below dirs,
// processes naming them, the dirs themselves, its cgroups, network namespaces, interfaces and
// nftables tables.
func leftovers(dirs, cgroups, tags []string) []string {
	var out []string
	var prefixes []string
	for _, t := range tags {
		prefixes = append(prefixes, netnsPrefix(t))
	}
	for _, m := range mountsUnder(dirs, prefixes) {
		out = append(out, "mount "+m)
	}
	for _, l := range loopsUnder(dirs) {
		out = append(out, "loop device "+l)
	}
	for _, pid := range procsUsing(dirs) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("process %d (%s)", pid, strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")))
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			out = append(out, "directory "+d)
		}
	}
	for _, cg := range cgroups {
		for _, d := range cgroupDirs(cg) {
			out = append(out, "cgroup "+d)
		}
	}
	for _, t := range tags {
		ns, _ := filepath.Glob(netnsPrefix(t) + "*")
		for _, n := range ns {
			out = append(out, "network namespace "+n)
		}
		if links, err := netlink.LinkList(); err == nil {
			for _, l := range links {
				if strings.HasPrefix(l.Attrs().Name, linkPrefix(t)) {
					out = append(out, "interface "+l.Attrs().Name)
				}
			}
		}
	}
	if len(tags) > 0 {
		if conn, err := nftables.New(); err == nil {
			if tables, err := conn.ListTables(); err == nil {
				for _, tb := range tables {
					if slices.ContainsFunc(tags, func(t string) bool { return slices.Contains(nftTables(t), tb.Name) }) {
						out = append(out, "nftables table "+tb.Name)
					}
				}
			}
		}
	}
	return out
}

// loadAvg1 returns the 1-minute load average, or 0.
func loadAvg1() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// meminfoBytes returns a "Field:  N kB" value of /proc/meminfo in bytes.
func meminfoBytes(field string) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
