package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/placement"
)

// PlacementConfig sizes a placement benchmark run: simulated edges, no server, no sandboxes.
// Zero fields take the defaults of the issue that asked for it.
type PlacementConfig struct {
	Nodes       []int   // cluster sizes, each run separately (default 1,000 and 10,000)
	Fill        float64 // stop when the mean node load reaches this (default 0.5)
	ReportEvery int     // edges report their usage every this many placements (default 100)
	Seed        uint64  // seeds the request sizes and the placers (default 1)
	MaxTries    int     // placement attempts per sandbox when edges refuse (default 3)
}

func (c PlacementConfig) withDefaults() PlacementConfig {
	if len(c.Nodes) == 0 {
		c.Nodes = []int{1000, 10_000}
	}
	if c.Fill == 0 {
		c.Fill = 0.5
	}
	if c.ReportEvery == 0 {
		c.ReportEvery = 100
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.MaxTries == 0 {
		c.MaxTries = 3
	}
	return c
}

// Validate checks a configuration after defaults.
func (c PlacementConfig) Validate() error {
	for _, n := range c.Nodes {
		if n < 1 {
			return errdefs.Invalid("nodes", "cluster sizes must be positive, got %d", n)
		}
	}
	switch {
	case !(c.Fill > 0 && c.Fill <= 0.95):
		return errdefs.Invalid("fill", "must be in (0, 0.95], got %v", c.Fill)
	case c.ReportEvery < 1:
		return errdefs.Invalid("report_every", "must be positive, got %d", c.ReportEvery)
	case c.MaxTries < 1:
		return errdefs.Invalid("max_tries", "must be positive, got %d", c.MaxTries)
	}
	return nil
}

// PlacementResult is what one placement benchmark run measured.
type PlacementResult struct {
	Date      string `json:"date"`
	Host      string `json:"host"`
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go_version"`

	Fill        float64              `json:"fill"`
	ReportEvery int                  `json:"report_every"`
	Seed        uint64               `json:"seed"`
	MaxTries    int                  `json:"max_tries"`
	Node        PlacementNode        `json:"node"`
	Overcommit  placement.Overcommit `json:"overcommit"`
	Sizes       []PlacementSize      `json:"sizes"`
	Runs        []PlacementRun       `json:"runs"`
	Notes       []string             `json:"notes"`
}

// PlacementNode is the capacity of every simulated node.
type PlacementNode struct {
	CPUs      float64 `json:"cpus"`
	MemoryGiB float64 `json:"memory_gib"`
	DiskGiB   float64 `json:"disk_gib"`
	Sandboxes int     `json:"sandboxes"`
}

// PlacementSize is one sandbox size in the request mix.
type PlacementSize struct {
	Name      string  `json:"name"`
	Share     float64 `json:"share"`
	CPUs      float64 `json:"cpus"`
	MemoryGiB float64 `json:"memory_gib"`
	DiskGiB   float64 `json:"disk_gib"`
}

// PlacementRun is one cluster size, K and variant, filled from empty.
type PlacementRun struct {
	Nodes int    `json:"nodes"`
	K     string `json:"k"` // "1" (random), "2", "all" (least loaded of all)
	// Variant is "one replica"; "two replicas" (two Placers alternate, each seeing only its own
	// in-flight placements and the shared reports); or "no in-flight" (placements forgotten at
	// once, so only the lagging reports count).
	Variant    string `json:"variant"`
	Placements int    `json:"placements"` // sandboxes placed
	// Failures counts sandboxes no node took: nothing fit, or MaxTries edges refused.
	Failures int `json:"failures"`
	// Refusals counts edge admission refusals (each retried on another node).
	Refusals int `json:"refusals"`
	// Latency is one PlaceWithRetry per sandbox: Place, the simulated edge's admission check
	// (tens of nanoseconds) and Done, retries included.
	Latency   MicroStats `json:"latency"`
	MeanLoad  float64    `json:"mean_load"`
	MaxLoad   float64    `json:"max_load"`
	Imbalance float64    `json:"imbalance"` // MaxLoad / MeanLoad
	Seconds   float64    `json:"seconds"`   // wall time of the run, reports and bookkeeping included
}

// MicroStats summarises samples in microseconds.
type MicroStats struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_us"`
	P99  float64 `json:"p99_us"`
	Mean float64 `json:"mean_us"`
	Max  float64 `json:"max_us"`
}

func microStats(d []time.Duration) MicroStats {
	if len(d) == 0 {
		return MicroStats{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	us := func(x time.Duration) float64 { return float64(x.Nanoseconds()) / 1000 }
	q := func(p float64) float64 { return us(s[max(0, min(int(p*float64(len(s))+0.5)-1, len(s)-1))]) }
	var sum time.Duration
	for _, x := range s {
		sum += x
	}
	return MicroStats{N: len(s), P50: q(0.50), P99: q(0.99), Mean: us(sum / time.Duration(len(s))), Max: us(s[len(s)-1])}
}

const gib = 1 << 30

// The simulated cluster: equal nodes and a mix of three realistic sizes. Memory dominates the
// load (3.4 GiB per sandbox on average against 256 GiB), then CPU (2 against 64 × 4).
var (
	simCapacity = placement.Resources{CPUs: 64, MemoryBytes: 256 * gib, DiskBytes: 2048 * gib, Sandboxes: 200}
	simSizes    = []struct {
		PlacementSize
		req placement.Request
	}{
		{PlacementSize{"small", 0.6, 1, 1, 5}, placement.Request{CPUs: 1, MemoryBytes: 1 * gib, DiskBytes: 5 * gib}},
		{PlacementSize{"medium", 0.3, 2, 4, 10}, placement.Request{CPUs: 2, MemoryBytes: 4 * gib, DiskBytes: 10 * gib}},
		{PlacementSize{"large", 0.1, 8, 16, 40}, placement.Request{CPUs: 8, MemoryBytes: 16 * gib, DiskBytes: 40 * gib}},
	}
)

// Placement measures the placement engine on simulated edges: for each cluster size, it fills an
// empty cluster to cfg.Fill with sandboxes of random sizes (the same sequence for every run of a
// size) for K = 1, 2 and all, then K = 2 with two replicas, and K = 2 and all with no in-flight
// accounting.
// Edges report every cfg.ReportEvery placements and refuse what does not fit.
func Placement(ctx context.Context, cfg PlacementConfig, log *slog.Logger) (*PlacementResult, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	res := &PlacementResult{
		Date: time.Now().UTC().Format(time.RFC3339), Host: host, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(),
		Fill: cfg.Fill, ReportEvery: cfg.ReportEvery, Seed: cfg.Seed, MaxTries: cfg.MaxTries,
		Node: PlacementNode{CPUs: simCapacity.CPUs, MemoryGiB: float64(simCapacity.MemoryBytes) / gib,
			DiskGiB: float64(simCapacity.DiskBytes) / gib, Sandboxes: simCapacity.Sandboxes},
		Notes: []string{
			"Simulated edges, one goroutine: no server, no sandboxes, no network. Latency is placement CPU time only.",
			"Load of a node = max over CPU, memory, disk and sandbox count of used / (capacity × overcommit); imbalance = max load / mean load when the mean reaches fill.",
			"Edges report all at once every report_every placements; until then each replica counts its own placements in flight. A simulated millisecond passes per placement.",
			"two replicas: two Placers alternate, each counting only its own in-flight placements; no in-flight: placements are forgotten at once, so only the lagging reports count.",
		},
	}
	p, err := placement.New(placement.Config{})
	if err != nil {
		return nil, err
	}
	res.Overcommit = p.Config().Overcommit
	for _, s := range simSizes {
		res.Sizes = append(res.Sizes, s.PlacementSize)
	}
	type variant struct {
		k        int
		name     string
		replicas int
		ttl      time.Duration
	}
	variants := []variant{
		{placement.KRandom, "one replica", 1, 0},
		{placement.DefaultK, "one replica", 1, 0},
		{placement.KAll, "one replica", 1, 0},
		{placement.DefaultK, "two replicas", 2, 0},
		{placement.DefaultK, "no in-flight", 1, time.Nanosecond},
		{placement.KAll, "no in-flight", 1, time.Nanosecond}, // the classic herd
	}
	// A discarded warm-up, so the first measured run does not pay for the process's heap growth.
	if _, err := simulatePlacement(ctx, cfg, 100, placement.DefaultK, 1, 0); err != nil {
		return nil, err
	}
	for _, n := range cfg.Nodes {
		for _, v := range variants {
			run, err := simulatePlacement(ctx, cfg, n, v.k, v.replicas, v.ttl)
			if err != nil {
				return nil, err
			}
			run.Variant = v.name
			log.Info("placement run", "nodes", n, "k", run.K, "variant", v.name, "placements", run.Placements,
				"p50_us", run.Latency.P50, "p99_us", run.Latency.P99, "imbalance", run.Imbalance, "failures", run.Failures,
				"refusals", run.Refusals, "seconds", run.Seconds)
			res.Runs = append(res.Runs, run)
		}
	}
	return res, nil
}

// simulatePlacement fills one empty cluster of n nodes. ttl, when not zero, replaces the
// Placers' InflightTTL (1 ns forgets each placement by the next one).
func simulatePlacement(ctx context.Context, cfg PlacementConfig, n, k, replicas int, ttl time.Duration) (PlacementRun, error) {
	start := time.Now()
	// The simulated clock: a millisecond per placement, reports a microsecond after the last.
	clock := time.Unix(1_700_000_000, 0)
	now := func() time.Time { return clock }

	placers := make([]*placement.Placer, replicas)
	for i := range placers {
		p, err := placement.New(placement.Config{K: k, InflightTTL: ttl, Now: now,
			Rand: rand.NewPCG(cfg.Seed, uint64(1000*i+k+10))})
		if err != nil {
			return PlacementRun{}, err
		}
		placers[i] = p
	}
	nodes := make([]placement.Node, n)
	index := make(map[string]int, n)
	for i := range nodes {
		nodes[i] = placement.Node{
			Name: "node-" + strconv.Itoa(i), State: placement.StateReady, Tiers: []string{"container"},
			Runtimes: []string{"runc"}, Capacity: simCapacity, ReportedAt: clock,
		}
		index[nodes[i].Name] = i
	}
	truth := make([]placement.Resources, n) // what each edge has admitted
	loads := make([]float64, n)
	sum := 0.0 // of loads
	load := placers[0].Load

	var req placement.Request
	edge := func(_ context.Context, name string) error {
		i := index[name]
		next := truth[i]
		next.CPUs += req.CPUs
		next.MemoryBytes += req.MemoryBytes
		next.DiskBytes += req.DiskBytes
		next.Sandboxes++
		l := load(next, simCapacity)
		if l > 1+1e-9 {
			return fmt.Errorf("node %s: %w", name, placement.ErrRefused)
		}
		truth[i], sum, loads[i] = next, sum-loads[i]+l, l
		return nil
	}

	run := PlacementRun{Nodes: n, K: strconv.Itoa(k)}
	if k < 0 {
		run.K = "all"
	}
	sizes := rand.New(rand.NewPCG(cfg.Seed, uint64(n)))
	lat := make([]time.Duration, 0, int(float64(n)*cfg.Fill*60))
	failedInARow := 0
	for i := 0; sum/float64(n) < cfg.Fill; i++ {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return run, err
			}
		}
		x := sizes.Float64()
		s := 0
		for s < len(simSizes)-1 && x >= simSizes[s].Share {
			x -= simSizes[s].Share
			s++
		}
		req = simSizes[s].req
		req.Tier, req.Runtime = "container", "runc"
		clock = clock.Add(time.Millisecond)

		p := placers[i%replicas]
		t0 := time.Now()
		_, err := p.PlaceWithRetry(ctx, req, nodes, func(ctx context.Context, name string) error {
			err := edge(ctx, name)
			if err != nil {
				run.Refusals++
			}
			return err
		}, cfg.MaxTries)
		lat = append(lat, time.Since(t0))
		switch {
		case err == nil:
			run.Placements++
			failedInARow = 0
		case errors.As(err, new(*placement.NoFitError)) || errors.Is(err, placement.ErrRefused):
			run.Failures++
			if failedInARow++; failedInARow >= 1000 {
				return run, fmt.Errorf("placement: %d failures in a row at mean load %.3f; the fill %.2f cannot be reached", failedInARow, sum/float64(n), cfg.Fill)
			}
		default:
			return run, fmt.Errorf("placement %d: %w", i, err)
		}
		if (i+1)%cfg.ReportEvery == 0 {
			clock = clock.Add(time.Microsecond)
			for j := range nodes {
				nodes[j].Used, nodes[j].ReportedAt = truth[j], clock
			}
		}
	}
	run.Latency = microStats(lat)
	run.MeanLoad = sum / float64(n)
	run.MaxLoad = slices.Max(loads)
	run.Imbalance = run.MaxLoad / run.MeanLoad
	run.Seconds = time.Since(start).Seconds()
	return run, nil
}
