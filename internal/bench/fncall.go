package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// FncallConfig sizes an fncall benchmark run.
type FncallConfig struct {
	Base        string // the base layer NAME:VERSION
	Calls       int    // latency samples of each kind
	Throughput  int    // calls in the throughput test
	Concurrency int    // concurrent callers in the throughput test
	PoolMax     int    // the environment's pool size (min = max, all warm)
	// PyToolkit, when set, is a toolkit NAME:VERSION with python3 (scripts/host-python-toolkit.sh):
	// Python calls that import heavy modules are then measured with and without warm interpreters.
	PyToolkit string
	PyCalls   int
	// CPUCgroups are cgroup directories (v2, or v1's cpuacct hierarchy) holding everything of the Corral
	// under test (corral up and its sandboxes' parent): their CPU time over the throughput test
	// is reported per call, which the host's other load changes far less than calls/s.
	CPUCgroups []string
}

// FncallResult compares a call of `true` with the other ways to run `true`, measured in one run.
type FncallResult struct {
	Date string `json:"date"`
	// Call is client to result of a call of `true`; Exec is `true` through the API in an existing
	// sandbox; RuncExec is `runc exec` of /bin/true into an existing container of the same
	// rootfs; Fresh is create sandbox → exec true → delete.
	Call         Stats   `json:"call_true"`
	Exec         Stats   `json:"api_exec_true"`
	RuncExec     Stats   `json:"runc_exec_true"`
	Fresh        Stats   `json:"fresh_sandbox_true"`
	RatioVsRunc  float64 `json:"call_vs_runc_exec_p50"`
	RatioVsFresh float64 `json:"call_vs_fresh_sandbox_p50"`
	// CallsPerSec is calls of `true` per second with Concurrency callers over a pool of PoolMax.
	CallsPerSec float64 `json:"calls_per_s"`
	Concurrency int     `json:"concurrency"`
	PoolMax     int     `json:"pool_max"`
	Rejected    int64   `json:"rejected_429"`
	// CPUMsPerCall is the CPU time of CPUCgroups over the throughput test, per call (with
	// CPUCgroups set); CPUBoundCallsPerSec is the calls/s that CPU time allows on this host's
	// CPUs, were nothing else running.
	CPUMsPerCall        float64 `json:"cpu_ms_per_call,omitempty"`
	CPUBoundCallsPerSec float64 `json:"cpu_bound_calls_per_s,omitempty"`
	// PyWarm and PyCold time a Python call importing PyImports, with a warm interpreter (imports
	// done before the call) and without.
	PyImports  []string `json:"py_imports,omitempty"`
	PyWarm     *Stats   `json:"py_call_warm,omitempty"`
	PyCold     *Stats   `json:"py_call_cold,omitempty"`
	PyWarmRate float64  `json:"py_warm_served_fraction,omitempty"`
	PyRatio    float64  `json:"py_warm_vs_cold_p50,omitempty"`
}

// Fncall creates an fncall environment on cfg.Base with a warm pool and measures calls.
func Fncall(ctx context.Context, c *corral.Client, cfg FncallConfig, log *slog.Logger) (*FncallResult, error) {
	res := &FncallResult{Date: time.Now().UTC().Format(time.RFC3339), Concurrency: cfg.Concurrency, PoolMax: cfg.PoolMax}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, err
	}
	env := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	if _, err := c.CreateFncallEnv(ctx, corral.FncallEnv{Name: env, Base: cfg.Base, PoolMin: cfg.PoolMax, PoolMax: cfg.PoolMax,
		QueueDepth: 4 * cfg.Concurrency}); err != nil {
		return nil, err
	}
	defer c.DeleteFncallEnv(context.WithoutCancel(ctx), env)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		e, err := c.FncallEnv(ctx, env)
		if err != nil {
			return nil, err
		}
		if e.Pool.Ready >= cfg.PoolMax {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the pool did not fill in 2 minutes: %+v", e.Pool)
		}
		time.Sleep(100 * time.Millisecond)
	}
	call := corral.CallRequest{Argv: []string{"true"}}
	once := func() (time.Duration, error) {
		start := time.Now()
		r, err := c.Call(ctx, env, call)
		if err == nil && r.Exit.Code != 0 {
			err = fmt.Errorf("call of true exited %+v", r.Exit)
		}
		return time.Since(start), err
	}
	for range 5 { // warm up
		if _, err := once(); err != nil {
			return nil, err
		}
	}
	// The sandbox that holds the base layer for the runc baseline also serves the API execs.
	b, sbID, done, err := baselineOn(ctx, c, info, cfg.Base)
	if err != nil {
		return nil, err
	}
	defer done()

	log.Info("measuring call, API exec, runc exec and fresh-sandbox latency", "samples", cfg.Calls)
	var calls, execs, fresh []time.Duration
	for i := range cfg.Calls {
		d, err := once()
		if err != nil {
			return nil, err
		}
		calls = append(calls, d)
		start := time.Now()
		if _, _, _, err := c.Run(ctx, sbID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
			return nil, err
		}
		execs = append(execs, time.Since(start))
		if i < cfg.Calls/5 { // a fresh sandbox costs ~100x more: fewer samples
			d, err := ttiOnce(ctx, c, cfg.Base)
			if err != nil {
				return nil, err
			}
			fresh = append(fresh, d)
		}
	}
	runcExecs, err := b.execs(ctx, cfg.Calls)
	if err != nil {
		return nil, err
	}
	res.Call, res.Exec, res.RuncExec, res.Fresh = summarise(calls), summarise(execs), summarise(runcExecs), summarise(fresh)
	res.RatioVsRunc = res.Call.P50 / res.RuncExec.P50
	res.RatioVsFresh = res.Call.P50 / res.Fresh.P50

	log.Info("measuring call throughput", "calls", cfg.Throughput, "concurrency", cfg.Concurrency)
	var next, failed atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	cpu0, err := cgroupsCPU(cfg.CPUCgroups)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(cfg.Throughput) {
				if _, err := once(); err != nil {
					failed.Add(1)
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	res.CallsPerSec = float64(cfg.Throughput) / time.Since(start).Seconds()
	if len(cfg.CPUCgroups) > 0 {
		cpu1, err := cgroupsCPU(cfg.CPUCgroups)
		if err != nil {
			return nil, err
		}
		res.CPUMsPerCall = float64((cpu1 - cpu0).Microseconds()) / 1000 / float64(cfg.Throughput)
		res.CPUBoundCallsPerSec = 1000 * float64(runtime.NumCPU()) / res.CPUMsPerCall
	}
	if e, err := c.FncallEnv(ctx, env); err == nil {
		res.Rejected = e.Pool.Rejected
	}
	if firstErr != nil {
		return nil, fmt.Errorf("%d of %d calls failed, the first: %w", failed.Load(), cfg.Throughput, firstErr)
	}
	if cfg.PyToolkit != "" {
		if err := pythonCalls(ctx, c, cfg, res, log); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// cgroupsCPU is the CPU time used so far by the processes of the cgroup directories dirs:
// cgroup v2's cpu.stat usage_usec, or cgroup v1's cpuacct.usage (a cpuacct hierarchy's).
func cgroupsCPU(dirs []string) (time.Duration, error) {
	var total time.Duration
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, "cpuacct.usage")); err == nil {
			ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("CPU time of cgroup %s: %w", d, err)
			}
			total += time.Duration(ns)
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "cpu.stat"))
		if err != nil {
			return 0, fmt.Errorf("CPU time of cgroup %s: %w", d, err)
		}
		found := false
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("CPU time of cgroup %s: %q: %w", d, line, err)
				}
				total, found = total+time.Duration(us)*time.Microsecond, true
			}
		}
		if !found {
			return 0, fmt.Errorf("CPU time of cgroup %s: no usage_usec in its cpu.stat", d)
		}
	}
	return total, nil
}

// pythonCalls measures a Python call that imports heavy modules, in an environment with warm
// interpreters and in one without, alternating.
func pythonCalls(ctx context.Context, c *corral.Client, cfg FncallConfig, res *FncallResult, log *slog.Logger) error {
	res.PyImports = []string{"json", "email.parser", "http.client", "sqlite3", "decimal", "asyncio"}
	suffix := fmt.Sprint(time.Now().UnixNano())
	warm, cold := "bench-pywarm-"+suffix, "bench-pycold-"+suffix
	for _, env := range []corral.FncallEnv{
		{Name: warm, Base: cfg.Base, Toolkits: []string{cfg.PyToolkit}, PoolMin: 1, PoolMax: 1, Warm: &corral.WarmPython{Imports: res.PyImports}},
		{Name: cold, Base: cfg.Base, Toolkits: []string{cfg.PyToolkit}, PoolMin: 1, PoolMax: 1},
	} {
		if _, err := c.CreateFncallEnv(ctx, env); err != nil {
			return err
		}
		defer c.DeleteFncallEnv(context.WithoutCancel(ctx), env.Name)
	}
	code := "import " + strings.Join(res.PyImports, ", ") + "\nprint(json.dumps({'ok': True}))\n"
	log.Info("measuring Python calls with and without a warm interpreter", "calls", cfg.PyCalls, "imports", res.PyImports)
	var w, k []time.Duration
	served := 0
	for i := range cfg.PyCalls + 2 {
		for _, env := range []string{warm, cold} {
			start := time.Now()
			r, err := c.Call(ctx, env, corral.CallRequest{Python: code})
			if err != nil {
				return err
			}
			if r.Exit.Code != 0 {
				return fmt.Errorf("python call in %s: %+v: %s", env, r.Exit, r.Stderr)
			}
			d := time.Since(start)
			if i < 2 {
				continue // warm-up; the first call may come before an interpreter is ready
			}
			if env == warm {
				w = append(w, d)
				if r.Warm {
					served++
				}
			} else {
				k = append(k, d)
			}
		}
		time.Sleep(50 * time.Millisecond) // time for the next interpreter to start, as between real calls
	}
	ws, ks := summarise(w), summarise(k)
	res.PyWarm, res.PyCold = &ws, &ks
	res.PyWarmRate = float64(served) / float64(len(w))
	res.PyRatio = ws.P50 / ks.P50
	return nil
}
