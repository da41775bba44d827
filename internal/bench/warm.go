package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// WarmConfig sets the sizes of a warm pool benchmark run.
type WarmConfig struct {
	Base        string // layer NAME:VERSION of the environment
	Env         string // the environment the run saves (and deletes at the end)
	TTIRounds   int    // warm create→first exec samples (and as many runc run samples)
	Burst       int    // the pool's size and the creates of the burst
	Concurrency int    // concurrent creators in the burst
	// Sustained creates (0: skipped) at Concurrency with the pool refilling, each deleted right
	// after it was made (so that the host holds no more than Concurrency of them), against
	// `runc run --detach` + `runc delete -f` of as many at the same concurrency.
	Sustained int
}

// WarmResult is what one warm pool run measured.
type WarmResult struct {
	Date        string `json:"date"`
	Host        string `json:"host"`
	RuncVersion string `json:"runc_version"`
	Base        string `json:"base"`

	// TTI is POST /v1/sandboxes naming a warm environment to the first `true` exec's result,
	// each sample taken with the pool full (refilled between samples); the baseline is `runc
	// run true` of the same rootfs.
	TTI         Stats   `json:"warm_tti_create_to_first_exec"`
	TTIBaseline Stats   `json:"tti_baseline_runc_run_true"`
	TTIRatioP50 float64 `json:"warm_tti_ratio_p50"`
	TTIRatioP99 float64 `json:"warm_tti_ratio_p99"`

	// Burst creates from a full pool of Burst sandboxes at Concurrency, against `runc run
	// --detach` of as many containers at the same concurrency.
	Burst                  int     `json:"burst_creates"`
	Concurrency            int     `json:"burst_concurrency"`
	BurstPerSec            float64 `json:"burst_creates_per_s"`
	BurstCreate            Stats   `json:"burst_create_latency"`
	BurstBaselinePerSec    float64 `json:"burst_baseline_runc_run_detach_per_s"`
	BurstRatio             float64 `json:"burst_ratio"`
	BurstHits, BurstClaims int64   `json:"-"`
	BurstHitRate           float64 `json:"burst_hit_rate"`

	Sustained               int     `json:"sustained_creates,omitempty"`
	SustainedPerSec         float64 `json:"sustained_create_delete_per_s,omitempty"`
	SustainedCreate         Stats   `json:"sustained_create_latency"`
	SustainedHitRate        float64 `json:"sustained_hit_rate"`
	SustainedBaselinePerSec float64 `json:"sustained_baseline_runc_run_detach_delete_per_s,omitempty"`
	SustainedRatio          float64 `json:"sustained_ratio,omitempty"`

	// PoolFill is how long the pool took to fill to Burst from empty; PoolHostMiBPerSbx the
	// drop in MemAvailable per pooled sandbox (page cache dropped before both reads: noisy on a
	// shared host); PoolAgentPSSMiB and PoolCgroupMiB the pooled sandboxes' agent PSS and memory
	// cgroup usage, each (the sandboxes of the data dir that the API does not list).
	PoolFillSeconds   float64 `json:"pool_fill_seconds"`
	PoolHostMiBPerSbx float64 `json:"pool_host_mib_per_sandbox"`
	PoolAgentPSSMiB   float64 `json:"pool_agent_pss_mib_per_sandbox"`
	PoolCgroupMiB     float64 `json:"pool_cgroup_mib_per_sandbox"`
	PoolMeasured      int     `json:"pool_sandboxes_measured"`
}

// Warm runs the warm pool benchmark: it saves cfg.Env on cfg.Base with a pool of cfg.Burst,
// measures, and deletes the environment (draining the pool).
func Warm(ctx context.Context, c *corral.Client, cfg WarmConfig, log *slog.Logger) (*WarmResult, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	res := &WarmResult{Date: time.Now().UTC().Format(time.RFC3339), Host: host, RuncVersion: info.RuntimeVersion, Base: cfg.Base,
		Burst: cfg.Burst, Concurrency: cfg.Concurrency}
	b, _, done, err := baselineOn(ctx, c, info, cfg.Base)
	if err != nil {
		return nil, err
	}
	defer done()

	dropCaches()
	availBefore := memAvailable()
	fillStart := time.Now()
	if _, err := c.SaveEnvironment(ctx, corral.Environment{Name: cfg.Env, Base: cfg.Base, Warm: cfg.Burst}); err != nil {
		return nil, err
	}
	defer c.DeleteEnvironment(context.WithoutCancel(ctx), cfg.Env)
	log.Info("filling the pool", "environment", cfg.Env, "size", cfg.Burst)
	if err := waitReady(ctx, c, cfg.Env, cfg.Burst, 10*time.Minute); err != nil {
		return nil, err
	}
	res.PoolFillSeconds = time.Since(fillStart).Seconds()
	dropCaches()
	res.PoolHostMiBPerSbx = float64(availBefore-memAvailable()) / float64(cfg.Burst) / (1 << 20)
	if err := poolMemory(ctx, c, info, res); err != nil {
		return nil, err
	}

	// Warm up both paths once.
	if _, err := warmTTIOnce(ctx, c, cfg.Env); err != nil {
		return nil, err
	}
	if _, err := b.run(ctx, "warm"); err != nil {
		return nil, err
	}
	log.Info("measuring warm time to interactive", "rounds", cfg.TTIRounds)
	var tti, base []time.Duration
	for i := range cfg.TTIRounds {
		if err := waitReady(ctx, c, cfg.Env, cfg.Burst, 5*time.Minute); err != nil {
			return nil, err
		}
		d, err := warmTTIOnce(ctx, c, cfg.Env)
		if err != nil {
			return nil, err
		}
		tti = append(tti, d)
		// The claim's refill (a sandbox's create, then the node's own pools') must not run in
		// the baseline's sample.
		if err := waitReady(ctx, c, cfg.Env, cfg.Burst, 5*time.Minute); err != nil {
			return nil, err
		}
		time.Sleep(250 * time.Millisecond)
		d, err = b.run(ctx, fmt.Sprintf("warm-run-%d", i))
		if err != nil {
			return nil, err
		}
		base = append(base, d)
	}
	res.TTI, res.TTIBaseline = summarise(tti), summarise(base)
	res.TTIRatioP50 = res.TTI.P50 / res.TTIBaseline.P50
	res.TTIRatioP99 = res.TTI.P99 / res.TTIBaseline.P99

	log.Info("measuring a burst from a full pool", "creates", cfg.Burst, "concurrency", cfg.Concurrency)
	if err := waitReady(ctx, c, cfg.Env, cfg.Burst, 10*time.Minute); err != nil {
		return nil, err
	}
	before, err := c.Environment(ctx, cfg.Env)
	if err != nil {
		return nil, err
	}
	work := make(chan struct{}, cfg.Burst)
	for range cfg.Burst {
		work <- struct{}{}
	}
	close(work)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var created []string
	var lat []time.Duration
	var firstErr error
	start := time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				t0 := time.Now()
				sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Environment: cfg.Env})
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					firstErr = err
				} else {
					created = append(created, sb.ID)
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	after, _ := c.Environment(ctx, cfg.Env)
	deleteAll(ctx, c, created)
	if firstErr != nil {
		return nil, firstErr
	}
	res.BurstPerSec = float64(len(created)) / elapsed.Seconds()
	res.BurstCreate = summarise(lat)
	if after != nil {
		res.BurstHits, res.BurstClaims = after.WarmHits-before.WarmHits, after.WarmClaims-before.WarmClaims
		if res.BurstClaims > 0 {
			res.BurstHitRate = float64(res.BurstHits) / float64(res.BurstClaims)
		}
	}
	if cfg.Sustained > 0 {
		log.Info("measuring sustained creates with the pool refilling", "creates", cfg.Sustained, "concurrency", cfg.Concurrency)
		if err := waitReady(ctx, c, cfg.Env, cfg.Burst, 10*time.Minute); err != nil {
			return nil, err
		}
		before, err := c.Environment(ctx, cfg.Env)
		if err != nil {
			return nil, err
		}
		n, lat, elapsed, err := churn(ctx, cfg.Sustained, cfg.Concurrency, func() (time.Duration, func(), error) {
			t0 := time.Now()
			sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Environment: cfg.Env})
			if err != nil {
				return 0, nil, err
			}
			return time.Since(t0), func() { c.DeleteSandbox(ctx, sb.ID) }, nil
		})
		if err != nil {
			return nil, err
		}
		after, _ := c.Environment(ctx, cfg.Env)
		res.Sustained, res.SustainedPerSec, res.SustainedCreate = n, float64(n)/elapsed.Seconds(), summarise(lat)
		if after != nil && after.WarmClaims > before.WarmClaims {
			res.SustainedHitRate = float64(after.WarmHits-before.WarmHits) / float64(after.WarmClaims-before.WarmClaims)
		}
	}
	// The baselines run with the pool drained, so that its refills do not compete with them.
	if _, err := c.UpdateEnvironment(ctx, cfg.Env, corral.EnvironmentPatch{Warm: new(int)}); err != nil {
		return nil, err
	}
	if err := waitReady(ctx, c, cfg.Env, 0, 5*time.Minute); err != nil {
		return nil, err
	}
	if res.BurstBaselinePerSec, err = b.throughput(ctx, cfg.Burst, cfg.Concurrency); err != nil {
		return nil, err
	}
	res.BurstRatio = res.BurstPerSec / res.BurstBaselinePerSec
	if cfg.Sustained > 0 {
		if err := b.setArgs("/bin/sleep", "3600"); err != nil {
			return nil, err
		}
		defer b.setArgs("/bin/true")
		var seq sync.Mutex
		i := 0
		n, _, elapsed, err := churn(ctx, cfg.Sustained, cfg.Concurrency, func() (time.Duration, func(), error) {
			seq.Lock()
			id := fmt.Sprintf("bench-sus-%d-%d", os.Getpid(), i)
			i++
			seq.Unlock()
			t0 := time.Now()
			if err := exec.CommandContext(ctx, b.runc, "--root", b.root, "run", "--detach", "--bundle", b.dir, id).Run(); err != nil {
				return 0, nil, fmt.Errorf("runc run --detach %s: %w", id, err)
			}
			return time.Since(t0), func() { exec.Command(b.runc, "--root", b.root, "delete", "-f", id).Run() }, nil
		})
		if err != nil {
			return nil, err
		}
		res.SustainedBaselinePerSec = float64(n) / elapsed.Seconds()
		res.SustainedRatio = res.SustainedPerSec / res.SustainedBaselinePerSec
	}
	return res, nil
}

// churn runs n create-then-delete steps at the given concurrency and returns how many
// succeeded, the creates' latencies and the wall time.
func churn(ctx context.Context, n, concurrency int, step func() (time.Duration, func(), error)) (int, []time.Duration, time.Duration, error) {
	work := make(chan struct{}, n)
	for range n {
		work <- struct{}{}
	}
	close(work)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	start := time.Now()
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				if ctx.Err() != nil {
					return
				}
				d, del, err := step()
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					lat = append(lat, d)
				}
				mu.Unlock()
				if del != nil {
					del()
				}
			}
		}()
	}
	wg.Wait()
	return len(lat), lat, time.Since(start), firstErr
}

// poolMemory measures the pooled sandboxes: those with state under the data dir that the API
// does not list.
func poolMemory(ctx context.Context, c *corral.Client, info *corral.Info, res *WarmResult) error {
	listed := map[string]bool{}
	list, err := c.ListSandboxes(ctx, corral.ListOptions{State: corral.StateRunning})
	if err != nil {
		return err
	}
	for _, sb := range list {
		listed[sb.ID] = true
	}
	ents, _ := os.ReadDir(filepath.Join(info.DataDir, "sandboxes"))
	var pss, cg float64
	n := 0
	for _, e := range ents {
		id := e.Name()
		if !strings.HasPrefix(id, "sb-") || listed[id] {
			continue
		}
		n++
		pss += float64(pssOf(readInt(filepath.Join(info.DataDir, "sandboxes", id, "init.pid"))))
		if p := cgroupMemFile(id); p != "" {
			cg += float64(readInt(p))
		}
	}
	if n > 0 {
		res.PoolMeasured = n
		res.PoolAgentPSSMiB = pss / float64(n) / (1 << 20)
		res.PoolCgroupMiB = cg / float64(n) / (1 << 20)
	}
	return nil
}

// warmTTIOnce times a create naming env to its first exec's result.
func warmTTIOnce(ctx context.Context, c *corral.Client, env string) (time.Duration, error) {
	start := time.Now()
	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Environment: env})
	if err != nil {
		return 0, err
	}
	_, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}})
	d := time.Since(start)
	c.DeleteSandbox(ctx, sb.ID)
	if err != nil || exit == nil || exit.Code != 0 {
		return 0, fmt.Errorf("first exec: %v %+v", err, exit)
	}
	return d, nil
}

// waitReady polls env until exactly n of its sandboxes are ready on the node.
func waitReady(ctx context.Context, c *corral.Client, env string, n int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		e, err := c.Environment(ctx, env)
		if err != nil {
			return err
		}
		if e.WarmReady == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("environment %s: %d sandboxes ready after %s, want %d", env, e.WarmReady, within, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
