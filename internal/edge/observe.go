package edge

import (
	"context"
	"fmt"
	"github.com/corral-dev/corral/internal/httpjson"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/store"
	"golang.org/x/sys/unix"
)

// Observation (issue 28): per-sandbox resource samples kept in memory, lifecycle events on the
// bus, and each sandbox's usage row for the report.
//
// Samples. Every SampleInterval the sampler reads each live sandbox's cgroups (CPU time, memory
// and its peak, tasks), its writable disk's use and its veth's byte counters, and appends one
// sample to the sandbox's ring (at most MetricsRing samples: the newest are kept). Nothing is
// written to the store per sample. A ring outlives its sandbox by MetricsKeep. The same pass
// notices new blocked egress attempts and publishes them as one egress_blocked event per
// sandbox per pass (a burst, with its count).
//
// Concurrency: the sampler is one goroutine (started by Start, ended by Close); ringsMu guards
// the ring map; each ring has its own mu, so a reader copies one ring without stopping the
// sampler's pass over the others.

// sample is one MetricSample, compactly.
type sample struct {
	at                            int64 // unix nanoseconds
	cpu                           float32
	pids                          int32
	mem, peak, disk, netRx, netTx int64
}

// ring keeps a sandbox's newest samples.
type ring struct {
	mu     sync.Mutex
	buf    []sample // grows to its capacity, then wraps; protected by mu
	next   int      // protected by mu
	ended  time.Time
	cpu    uint64 // the last read of CPU time; protected by mu
	cpuAt  int64  // when it was read; protected by mu
	endSet bool   // protected by mu
}

func (r *ring) add(s sample, capacity int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) < capacity {
		r.buf = append(r.buf, s)
		return
	}
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
}

// since returns the samples after t (unix nanoseconds), oldest first.
func (r *ring) since(t int64) []model.MetricSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []model.MetricSample{}
	for i := range r.buf {
		s := r.buf[(r.next+i)%len(r.buf)]
		if s.at <= t {
			continue
		}
		out = append(out, model.MetricSample{
			At: time.Unix(0, s.at).UTC(), CPUPercent: float64(s.cpu), MemoryBytes: s.mem, MemoryPeakBytes: s.peak,
			DiskBytes: s.disk, NetRxBytes: s.netRx, NetTxBytes: s.netTx, Pids: int64(s.pids),
		})
	}
	return out
}

// last returns the newest sample (ok false when there is none).
func (r *ring) last() (sample, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) == 0 {
		return sample{}, false
	}
	return r.buf[(r.next+len(r.buf)-1)%len(r.buf)], true
}

// sampler takes a sample of every live sandbox every SampleInterval until Close.
func (e *Edge) sampler() {
	defer close(e.samplerDone)
	if e.cfg.SampleInterval < 0 {
		return
	}
	t := time.NewTicker(e.cfg.SampleInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			start := time.Now()
			n := e.sampleAll()
			e.sampleNanos.Add(uint64(time.Since(start)))
			e.samplePasses.Add(1)
			e.sampledSandboxes.Add(uint64(n))
			e.expireRings()
		}
	}
}

// sampleAll takes one sample of every live sandbox and returns how many it sampled.
func (e *Edge) sampleAll() int {
	ur, ok := e.rt.(runtime.UsageReader)
	if !ok {
		return 0
	}
	n := 0
	for _, sb := range e.liveSandboxes() {
		if e.sampleOne(ur, sb) {
			n++
		}
		e.noticeBlocked(sb)
	}
	return n
}

func (e *Edge) ringOf(id string) *ring {
	e.ringsMu.Lock()
	defer e.ringsMu.Unlock()
	r := e.rings[id]
	if r == nil {
		r = &ring{}
		e.rings[id] = r
	}
	return r
}

func (e *Edge) sampleOne(ur runtime.UsageReader, sb *sandbox) bool {
	u, err := ur.Usage(sb.id)
	if err != nil {
		return false // gone, or a paused VM (no QEMU): no sample
	}
	now := time.Now().UnixNano()
	s := sample{at: now, mem: u.MemoryBytes, peak: u.MemoryPeakBytes, disk: u.DiskBytes, pids: int32(u.Pids)}
	if s.peak < s.mem {
		s.peak = s.mem
	}
	if sb.net != nil {
		// The host side's counters: what it receives the sandbox sent.
		dir := filepath.Join("/sys/class/net", sb.net.slot.HostIf, "statistics")
		s.netTx = readInt(filepath.Join(dir, "rx_bytes"))
		s.netRx = readInt(filepath.Join(dir, "tx_bytes"))
	}
	r := e.ringOf(sb.id)
	r.mu.Lock()
	if r.cpuAt > 0 && now > r.cpuAt && u.CPUNanos >= r.cpu {
		s.cpu = float32(float64(u.CPUNanos-r.cpu) * 100 / float64(now-r.cpuAt))
	}
	r.cpu, r.cpuAt = u.CPUNanos, now
	r.mu.Unlock()
	r.add(s, e.cfg.MetricsRing)
	return true
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// ringEnded starts a ring's retention once its sandbox ended.
func (e *Edge) ringEnded(id string) {
	e.ringsMu.Lock()
	r := e.rings[id]
	e.ringsMu.Unlock()
	if r == nil {
		return
	}
	r.mu.Lock()
	r.ended, r.endSet = time.Now(), true
	r.mu.Unlock()
}

// expireRings forgets the rings of sandboxes that ended more than MetricsKeep ago.
func (e *Edge) expireRings() {
	cutoff := time.Now().Add(-e.cfg.MetricsKeep)
	e.ringsMu.Lock()
	defer e.ringsMu.Unlock()
	for id, r := range e.rings {
		r.mu.Lock()
		old := r.endSet && r.ended.Before(cutoff)
		r.mu.Unlock()
		if old {
			delete(e.rings, id)
		}
	}
}

// Metrics returns a sandbox's samples after since (all when zero): the live sandbox's, or an
// ended one's within MetricsKeep of its end. A sandbox with none yet has an empty list.
func (e *Edge) Metrics(ctx context.Context, id string, since time.Time) (model.Metrics, error) {
	out := model.Metrics{Samples: []model.MetricSample{}, IntervalSeconds: e.cfg.SampleInterval.Seconds()}
	if err := checkID(id); err != nil {
		return out, err
	}
	e.ringsMu.Lock()
	r := e.rings[id]
	e.ringsMu.Unlock()
	if r == nil {
		if _, err := e.record(ctx, id); err != nil {
			return out, err
		}
		return out, nil
	}
	t := int64(0)
	if !since.IsZero() {
		t = since.UnixNano()
	}
	out.Samples = r.since(t)
	return out, nil
}

// writeSampleMetrics adds the node's aggregates of the latest samples to the Prometheus
// output, and each sandbox's own series with PerSandboxMetrics.
func (e *Edge) writeSampleMetrics(b io.Writer) {
	live := e.liveSandboxes()
	slices.SortFunc(live, func(a, c *sandbox) int { return strings.Compare(a.id, c.id) })
	type row struct {
		id string
		s  sample
	}
	var rows []row
	var sum sample
	for _, sb := range live {
		e.ringsMu.Lock()
		r := e.rings[sb.id]
		e.ringsMu.Unlock()
		if r == nil {
			continue
		}
		s, ok := r.last()
		if !ok {
			continue
		}
		rows = append(rows, row{sb.id, s})
		sum.cpu += s.cpu
		sum.mem += s.mem
		sum.disk += s.disk
		sum.netRx += s.netRx
		sum.netTx += s.netTx
		sum.pids += s.pids
	}
	node := e.cfg.Node
	gauges := []struct {
		name, help string
		v          func(s sample) float64
	}{
		{"corral_sandbox_cpu_percent", "CPU use of sandboxes at the last sample, percent of one CPU.", func(s sample) float64 { return float64(s.cpu) }},
		{"corral_sandbox_memory_bytes", "Memory charged to sandboxes at the last sample.", func(s sample) float64 { return float64(s.mem) }},
		{"corral_sandbox_disk_bytes", "Bytes in use on sandboxes' writable layers at the last sample.", func(s sample) float64 { return float64(s.disk) }},
		{"corral_sandbox_net_rx_bytes", "Bytes sandboxes received over their network (totals at the last sample).", func(s sample) float64 { return float64(s.netRx) }},
		{"corral_sandbox_net_tx_bytes", "Bytes sandboxes sent over their network (totals at the last sample).", func(s sample) float64 { return float64(s.netTx) }},
		{"corral_sandbox_pids", "Tasks in sandboxes at the last sample.", func(s sample) float64 { return float64(s.pids) }},
	}
	for _, g := range gauges {
		nodeName := strings.Replace(g.name, "corral_sandbox_", "corral_node_sandboxes_", 1)
		fmt.Fprintf(b, "# HELP %s %s (sum over the node)\n# TYPE %s gauge\n%s{node=%q} %g\n", nodeName, g.help, nodeName, nodeName, node, g.v(sum))
		if !e.cfg.PerSandboxMetrics {
			continue
		}
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s gauge\n", g.name, g.help, g.name)
		for _, r := range rows {
			fmt.Fprintf(b, "%s{sandbox=%q} %g\n", g.name, r.id, g.v(r.s))
		}
	}
	fmt.Fprintf(b, "# HELP corral_metrics_sample_seconds_total Time the sampler spent reading sandboxes.\n# TYPE corral_metrics_sample_seconds_total counter\ncorral_metrics_sample_seconds_total{node=%q} %g\n",
		node, float64(e.sampleNanos.Load())/1e9)
	fmt.Fprintf(b, "# HELP corral_metrics_samples_total Samples taken.\n# TYPE corral_metrics_samples_total counter\ncorral_metrics_samples_total{node=%q} %d\n",
		node, e.sampledSandboxes.Load())
	if cpu, ok := processCPU(); ok {
		fmt.Fprintf(b, "# HELP process_cpu_seconds_total User and system CPU time of this process.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %g\n", cpu)
	}
	st := e.bus.Stats()
	fmt.Fprintf(b, "# HELP corral_events_total Events published.\n# TYPE corral_events_total counter\ncorral_events_total{node=%q} %d\n", node, st.Published)
	fmt.Fprintf(b, "# HELP corral_event_followers Event stream followers now.\n# TYPE corral_event_followers gauge\ncorral_event_followers{node=%q} %d\n", node, st.Followers)
	fmt.Fprintf(b, "# HELP corral_event_followers_dropped_total Followers dropped for not reading.\n# TYPE corral_event_followers_dropped_total counter\ncorral_event_followers_dropped_total{node=%q} %d\n", node, st.DroppedFollowers)
	fmt.Fprintf(b, "# HELP corral_events_unrecorded_total Events left out of the store (queue full or write failed).\n# TYPE corral_events_unrecorded_total counter\ncorral_events_unrecorded_total{node=%q} %d\n", node, st.StoreDropped+st.StoreFailed)
}

// emit publishes an event about rec's sandbox.
func (e *Edge) emit(typ string, rec *store.Sandbox, reason string) {
	if rec.Tier == TierFncall {
		return // pool containers come and go with their pools, not with anyone's tasks
	}
	e.bus.Publish(events.Event{Type: typ, Sandbox: rec.ID, Project: rec.Project, Tier: rec.Tier, Reason: reason})
}

// emitEnd publishes how a sandbox ended: deleted, ttl_expired, idle_expired, or failed (with
// an oom event first when the kernel killed it for memory).
func (e *Edge) emitEnd(rec *store.Sandbox, state, reason string) {
	typ := events.Failed
	switch {
	case state == model.StateStopped && reason == model.ReasonDeleted:
		typ = events.Deleted
	case state == model.StateStopped && reason == model.ReasonTTLExpired:
		typ = events.TTLExpired
	case state == model.StateStopped && reason == model.ReasonIdleExpired:
		typ = events.IdleExpired
	case state == model.StateStopped:
		typ = events.Deleted
	case reason == model.ReasonOOMKilled:
		e.emit(events.OOM, rec, reason)
	}
	e.emit(typ, rec, reason)
}

// noticeBlocked publishes the blocked egress attempts of sb since the last look as one
// egress_blocked event (a burst), and keeps the total for its usage row.
func (e *Edge) noticeBlocked(sb *sandbox) {
	if sb.net == nil {
		return
	}
	st := e.withNetStatsOf(sb)
	prev := sb.blockedSeen.Swap(st.BlockedTotal)
	if st.BlockedTotal <= prev {
		return
	}
	reason := ""
	sb.net.mu.Lock()
	if n := len(sb.net.recent); n > 0 {
		reason = sb.net.recent[n-1].Reason
	}
	sb.net.mu.Unlock()
	e.bus.Publish(events.Event{Type: events.EgressBlocked, Sandbox: sb.id, Project: sb.project,
		Tier: sb.tier, Reason: reason, Count: int64(st.BlockedTotal - prev)})
}

// maxTokens bounds one request's X-Corral-Tokens.
const maxTokens = 1 << 40

// observeCall counts a data-plane call for the report: the tokens its client reports
// (X-Corral-Tokens) and, for the first exec, the time since create.
func (e *Edge) observeCall(sb *sandbox, method, path string, tokens string) error {
	if tokens != "" {
		n, err := strconv.ParseInt(tokens, 10, 64)
		if err != nil || n < 0 || n > maxTokens {
			return errdefs.Invalid(model.TokensHeader, "%q is not a token count (an integer from 0 to %d)", tokens, int64(maxTokens))
		}
		sb.tokens.Add(n)
	}
	if method == "POST" && (strings.HasSuffix(path, "/exec") || strings.HasSuffix(path, "/commands")) && sb.firstExec.CompareAndSwap(false, true) {
		// Off the exec's path: the first exec is what create→first exec measures, and its
		// answer must not wait for a store write (one goroutine per sandbox, once).
		at := time.Now()
		if e.cfg.Activity != nil {
			e.queueActivity(store.Activity{ID: sb.id, FirstExecAt: at})
			return nil
		}
		go func() {
			if err := e.store.UsageFirstExec(context.Background(), sb.id, at); err != nil {
				e.log.Warn("record first exec", "sandbox", sb.id, "err", err)
			}
		}()
	}
	return nil
}

// usageCreated records a new sandbox's usage row (fncall pool containers have none). With an
// activity recorder (a cluster's servers) it asks off the create's path: the servers make the
// row from the record, and any later entry of the sandbox's makes it if this one is lost.
func (e *Edge) usageCreated(ctx context.Context, rec *store.Sandbox) {
	if rec.Tier == TierFncall {
		return
	}
	if e.cfg.Activity != nil {
		e.queueActivity(store.Activity{ID: rec.ID, Created: true})
		return
	}
	p, _ := iam.ParsePath("project", rec.Project)
	if err := e.store.AddUsage(context.WithoutCancel(ctx), store.Usage{ID: rec.ID, ProjectPath: p, Node: rec.Node, Tier: rec.Tier,
		Environment: rec.Environment, CreatedAt: rec.CreatedAt}); err != nil {
		e.log.Warn("record usage", "sandbox", rec.ID, "err", err)
	}
}

// flushUsage writes a live sandbox's counters to its usage row when they changed (always with
// final, at its end).
func (e *Edge) flushUsage(ctx context.Context, sb *sandbox, final bool) {
	if sb.fncall != "" {
		return
	}
	c, sum := sb.usageCounts()
	if sb.usageFlushed.Swap(sum) == sum && !final {
		return
	}
	if e.cfg.Activity != nil {
		e.queueActivity(store.Activity{ID: sb.id, Counters: &c}) // off the caller's path (a delete)
		return
	}
	if err := e.store.UsageCounters(context.WithoutCancel(ctx), sb.id, c.Actions, c.Blocked, c.Tokens); err != nil {
		e.log.Warn("record usage", "sandbox", sb.id, "err", err)
	}
}

// usageCounts returns sb's usage counters and a sum that changes whenever one of them does.
func (sb *sandbox) usageCounts() (store.UsageCounts, int64) {
	c := store.UsageCounts{Actions: int64(sb.actions.Load()), Blocked: int64(sb.blockedSeen.Load()), Tokens: sb.tokens.Load()}
	return c, c.Actions + c.Blocked<<20 + c.Tokens<<40
}

// Events returns the node's event bus.
func (e *Edge) Events() *events.Bus { return e.bus }

// SharedStore reports whether other edges write the store too (cluster mode): events of the
// whole cluster are then in the store, not on this node's bus.
func (e *Edge) SharedStore() bool { return e.cfg.SharedStore }

// ParseSince reads a since parameter: an RFC 3339 time, or a duration back from now ("10m").
// Empty is the zero time.
func ParseSince(field, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	if n, ok := strings.CutSuffix(v, "d"); ok {
		if days, err := strconv.Atoi(n); err == nil && days >= 0 && days <= 3660 {
			return now.Add(-time.Duration(days) * 24 * time.Hour), nil
		}
	}
	return time.Time{}, errdefs.Invalid(field, "%q is neither an RFC 3339 time nor a duration back from now (30s, 10m, 7d)", v)
}

// metrics serves GET /v1/sandboxes/{id}/metrics?since=. Reading samples is not activity: it
// neither resumes a paused sandbox nor resets its idle clock.
func (h *dataPlane) metrics(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "since" {
			h.fail(w, r, errdefs.Invalid(k, "unknown query parameter"))
			return
		}
	}
	since, err := ParseSince("since", q.Get("since"), time.Now())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	m, err := h.e.Metrics(r.Context(), r.PathValue("id"), since)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, m)
}

// processCPU is this process's user and system CPU time in seconds (getrusage).
func processCPU() (float64, bool) {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9, true
}
