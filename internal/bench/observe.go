package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// ObserveConfig sizes `corral bench observe`.
type ObserveConfig struct {
	Base string
	// Sandboxes are kept running (idle) while the sampler's cost is measured over Window.
	Sandboxes int
	Window    time.Duration
	// Events is how many pause/resume rounds produce events for the stream's latency.
	Events int
}

// ObserveResult is what `corral bench observe` measured: the sampler's cost with Sandboxes idle
// sandboxes (extrapolated to 1000), against the whole edge process's CPU in the same window;
// and the event stream's latency (published → read by a follower) against a GET of the
// sandbox's record, in the same run.
type ObserveResult struct {
	Date      string `json:"date"`
	Host      string `json:"host"`
	Sandboxes int    `json:"sandboxes"`
	// IntervalSeconds is the server's sampling interval.
	IntervalSeconds float64 `json:"interval_seconds"`
	WindowSeconds   float64 `json:"window_seconds"`
	Samples         float64 `json:"samples"`
	// SamplerSeconds is the time the sampler spent in the window; per sample and per pass.
	SamplerSeconds   float64 `json:"sampler_seconds"`
	MicrosPerSample  float64 `json:"sampler_us_per_sandbox_sample"`
	PassMillis       float64 `json:"sampler_ms_per_pass"`
	PassMillis1000   float64 `json:"sampler_ms_per_pass_at_1000_extrapolated"`
	CPUPercent1000   float64 `json:"sampler_cpu_percent_of_one_cpu_at_1000_extrapolated"`
	ProcessCPUSecond float64 `json:"edge_process_cpu_seconds"`
	// SamplerShare is the sampler's time over the whole process's CPU time in the window (the
	// baseline: everything else the edge does for the same idle sandboxes, the reaper first).
	SamplerShare float64 `json:"sampler_share_of_process_cpu"`
	// EventLatency is publish → received by a follower; GetBaseline a GET /v1/sandboxes/{id}.
	EventLatency  Stats   `json:"event_latency"`
	GetBaseline   Stats   `json:"baseline_get_sandbox"`
	LatencyP50    float64 `json:"event_latency_ratio_p50"`
	LatencyP99    float64 `json:"event_latency_ratio_p99"`
	EventsDropped int     `json:"events_missed"`
}

// promValue returns the sum of a Prometheus text's samples of metric (every label set).
func promValue(text, metric string) float64 {
	var sum float64
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, metric) || strings.HasPrefix(l, "#") {
			continue
		}
		rest := l[len(metric):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		f := strings.Fields(rest)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// Observe runs the observation benchmark against c (an operator's token).
func Observe(ctx context.Context, c *corral.Client, cfg ObserveConfig, log *slog.Logger) (*ObserveResult, error) {
	host, _ := os.Hostname()
	res := &ObserveResult{Date: time.Now().UTC().Format(time.RFC3339), Host: host, Sandboxes: cfg.Sandboxes}
	log.Info("creating idle sandboxes", "n", cfg.Sandboxes)
	ids := make([]string, cfg.Sandboxes)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base, TTL: "2h",
					Limits: corral.Limits{MemoryBytes: 64 << 20, DiskBytes: 64 << 20, CPUs: 0.1}})
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					ids[i] = sb.ID
				}
				mu.Unlock()
			}
		}()
	}
	for i := range cfg.Sandboxes {
		work <- i
	}
	close(work)
	wg.Wait()
	defer func() {
		log.Info("deleting the sandboxes")
		work := make(chan string)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for id := range work {
					c.DeleteSandbox(context.WithoutCancel(ctx), id)
				}
			}()
		}
		for _, id := range ids {
			if id != "" {
				work <- id
			}
		}
		close(work)
		wg.Wait()
	}()
	if firstErr != nil {
		return nil, fmt.Errorf("create sandboxes: %w", firstErr)
	}
	m, err := c.SandboxMetrics(ctx, ids[0], time.Time{})
	if err != nil {
		return nil, err
	}
	res.IntervalSeconds = m.IntervalSeconds
	// Let every sandbox be in a pass before the window opens.
	time.Sleep(time.Duration(2 * m.IntervalSeconds * float64(time.Second)))
	p0, err := c.PrometheusMetrics(ctx)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	log.Info("measuring the sampler", "window", cfg.Window)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(cfg.Window):
	}
	p1, err := c.PrometheusMetrics(ctx)
	if err != nil {
		return nil, err
	}
	res.WindowSeconds = time.Since(t0).Seconds()
	res.Samples = promValue(p1, "corral_metrics_samples_total") - promValue(p0, "corral_metrics_samples_total")
	res.SamplerSeconds = promValue(p1, "corral_metrics_sample_seconds_total") - promValue(p0, "corral_metrics_sample_seconds_total")
	res.ProcessCPUSecond = promValue(p1, "process_cpu_seconds_total") - promValue(p0, "process_cpu_seconds_total")
	if res.Samples > 0 {
		res.MicrosPerSample = res.SamplerSeconds / res.Samples * 1e6
		passes := res.Samples / float64(cfg.Sandboxes)
		res.PassMillis = res.SamplerSeconds / passes * 1000
		res.PassMillis1000 = res.PassMillis * 1000 / float64(cfg.Sandboxes)
		res.CPUPercent1000 = res.MicrosPerSample * 1000 / 1e6 / res.IntervalSeconds * 100
	}
	if res.ProcessCPUSecond > 0 {
		res.SamplerShare = res.SamplerSeconds / res.ProcessCPUSecond
	}

	log.Info("measuring the event stream", "rounds", cfg.Events)
	id := ids[0]
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Events(sctx, corral.EventQuery{Follow: true, Types: []string{corral.EventPaused, corral.EventResumed}})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	type got struct {
		ev corral.LifecycleEvent
		at time.Time
	}
	recv := make(chan got, 2*cfg.Events+16)
	go func() {
		for {
			ev, err := st.Next()
			if err != nil {
				close(recv)
				return
			}
			recv <- got{ev, time.Now()}
		}
	}()
	var lat, base []time.Duration
	for range cfg.Events {
		for _, op := range []func(context.Context, string) (*corral.Sandbox, error){c.PauseSandbox, c.ResumeSandbox} {
			if _, err := op(ctx, id); err != nil {
				return nil, err
			}
			select {
			case g, ok := <-recv:
				if !ok {
					return nil, fmt.Errorf("event stream ended")
				}
				lat = append(lat, g.at.Sub(g.ev.At))
			case <-time.After(10 * time.Second):
				res.EventsDropped++
			}
		}
		start := time.Now()
		if _, err := c.GetSandbox(ctx, id); err != nil {
			return nil, err
		}
		base = append(base, time.Since(start))
		start = time.Now()
		if _, err := c.GetSandbox(ctx, id); err != nil {
			return nil, err
		}
		base = append(base, time.Since(start))
	}
	res.EventLatency, res.GetBaseline = summarise(lat), summarise(base)
	if res.GetBaseline.P50 > 0 {
		res.LatencyP50 = res.EventLatency.P50 / res.GetBaseline.P50
		res.LatencyP99 = res.EventLatency.P99 / res.GetBaseline.P99
	}
	return res, nil
}
