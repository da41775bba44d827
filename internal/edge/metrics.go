package edge

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/lazy"
)

// WriteMetrics writes the edge's metrics in the Prometheus text exposition format: live
// sandboxes by state, and for each networked sandbox its blocked egress attempts by reason, its
// data-plane actions and the blocked attempts per 1000 actions; then the resolver's and the
// proxy's totals. Sandbox counters restart with corral.
func (e *Edge) WriteMetrics(w io.Writer) error {
	var b strings.Builder
	live := e.liveSandboxes()
	slices.SortFunc(live, func(a, c *sandbox) int { return strings.Compare(a.id, c.id) })
	paused := 0
	for _, sb := range live {
		if sb.paused.Load() {
			paused++
		}
	}
	node := e.cfg.Node
	fmt.Fprintf(&b, "# HELP corral_sandboxes Live sandboxes on this node by state.\n# TYPE corral_sandboxes gauge\n")
	fmt.Fprintf(&b, "corral_sandboxes{node=%q,state=\"running\"} %d\ncorral_sandboxes{node=%q,state=\"paused\"} %d\n",
		node, len(live)-paused, node, paused)
	e.writeWarmMetrics(&b)
	fmt.Fprintf(&b, "# HELP corral_sandbox_actions_total Data-plane calls (exec, commands, files) per sandbox.\n# TYPE corral_sandbox_actions_total counter\n")
	for _, sb := range live {
		fmt.Fprintf(&b, "corral_sandbox_actions_total{sandbox=%q} %d\n", sb.id, sb.actions.Load())
	}
	fmt.Fprintf(&b, "# HELP corral_egress_blocked_total Blocked egress attempts per sandbox and reason.\n# TYPE corral_egress_blocked_total counter\n")
	var per1000 []string
	for _, sb := range live {
		if sb.net == nil {
			continue
		}
		rec := e.withNetStatsOf(sb)
		reasons := make([]string, 0, len(rec.Blocked))
		for r := range rec.Blocked {
			reasons = append(reasons, r)
		}
		slices.Sort(reasons)
		for _, r := range reasons {
			fmt.Fprintf(&b, "corral_egress_blocked_total{sandbox=%q,reason=%q} %d\n", sb.id, r, rec.Blocked[r])
		}
		per1000 = append(per1000, fmt.Sprintf("corral_egress_blocked_per_1000_actions{sandbox=%q} %g\n", sb.id, rec.BlockedPer1000Actions))
	}
	fmt.Fprintf(&b, "# HELP corral_egress_blocked_per_1000_actions Blocked egress attempts per 1000 data-plane actions.\n# TYPE corral_egress_blocked_per_1000_actions gauge\n")
	b.WriteString(strings.Join(per1000, ""))
	if nc := e.cfg.Net; nc != nil {
		st := nc.Resolver.Stats()
		fmt.Fprintf(&b, "# HELP corral_dns_queries_total Queries the sandboxes' resolver handled, by outcome.\n# TYPE corral_dns_queries_total counter\n")
		for _, o := range []struct {
			k string
			v uint64
		}{{"allowed", st.Allowed}, {"refused_name", st.RefusedName}, {"refused_type", st.RefusedType},
			{"refused_tunnel", st.RefusedTunnel}, {"refused_rate", st.RefusedRate}, {"unknown_source", st.UnknownSource},
			{"malformed", st.Malformed}, {"upstream_error", st.UpstreamErrors}} {
			fmt.Fprintf(&b, "corral_dns_queries_total{outcome=%q} %d\n", o.k, o.v)
		}
		if nc.Proxy != nil {
			ps := nc.Proxy.Stats()
			fmt.Fprintf(&b, "# HELP corral_egress_proxy_connections_total Connections the Host/SNI proxy handled, by outcome.\n# TYPE corral_egress_proxy_connections_total counter\n")
			fmt.Fprintf(&b, "corral_egress_proxy_connections_total{outcome=\"allowed\"} %d\n", ps.Allowed)
			reasons := make([]string, 0, len(ps.Refused))
			for r := range ps.Refused {
				reasons = append(reasons, r)
			}
			slices.Sort(reasons)
			for _, r := range reasons {
				fmt.Fprintf(&b, "corral_egress_proxy_connections_total{outcome=%q} %d\n", r, ps.Refused[r])
			}
			fmt.Fprintf(&b, "# HELP corral_egress_proxy_bytes_total Bytes the proxy spliced.\n# TYPE corral_egress_proxy_bytes_total counter\n")
			fmt.Fprintf(&b, "corral_egress_proxy_bytes_total{direction=\"up\"} %d\ncorral_egress_proxy_bytes_total{direction=\"down\"} %d\n", ps.BytesUp, ps.BytesDown)
		}
	}
	e.writeFetchMetrics(&b)
	e.writeSampleMetrics(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeFetchMetrics adds the node's chunk cache and per-layer fetch counters (from lazyd, when
// it serves this node).
func (e *Edge) writeFetchMetrics(b *strings.Builder) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cache, layers, ok := e.layers.FetchMetrics(ctx)
	if !ok {
		return
	}
	node := e.cfg.Node
	for _, g := range []struct {
		name, kind, help string
		v                int64
	}{
		{"corral_chunk_cache_bytes", "gauge", "Bytes of layer data in the node's chunk cache.", cache.Bytes},
		{"corral_chunk_cache_limit_bytes", "gauge", "The chunk cache's bound (--cache-size).", cache.Limit},
		{"corral_chunk_cache_pinned_bytes", "gauge", "Cached bytes of mounted layers and eager sandboxes (never evicted).", cache.PinnedBytes},
		{"corral_chunk_cache_evicted_bytes_total", "counter", "Bytes evicted from the chunk cache.", cache.EvictedBytes},
		{"corral_chunk_cache_corrupt_total", "counter", "Cached chunks found corrupt (deleted and refetched).", cache.Corrupt},
		{"corral_chunk_cache_bypassed_total", "counter", "Fetched chunks served without being cached (the cache was full of pinned data).", cache.Bypassed},
	} {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n%s{node=%q} %d\n", g.name, g.help, g.name, g.kind, g.name, node, g.v)
	}
	for _, m := range []struct {
		name, help string
		v          func(st *lazy.Stats) int64
	}{
		{"corral_layer_fetched_bytes_total", "Bytes of layer data read from the blob store, per layer (metadata image digest).", func(st *lazy.Stats) int64 { return st.BytesFetched }},
		{"corral_layer_fetch_errors_total", "Failed ranged reads of the blob store (retried), per layer.", func(st *lazy.Stats) int64 { return st.FetchErrors }},
		{"corral_layer_read_errors_total", "Reads that failed with EIO in a sandbox, per layer.", func(st *lazy.Stats) int64 { return st.ReadErrors }},
		{"corral_layer_cache_hits_total", "Chunk reads served from the node's cache, per layer.", func(st *lazy.Stats) int64 { return st.Hits }},
		{"corral_layer_cache_misses_total", "Chunk reads that had to fetch, per layer.", func(st *lazy.Stats) int64 { return st.Misses }},
	} {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s counter\n", m.name, m.help, m.name)
		for i := range layers {
			fmt.Fprintf(b, "%s{node=%q,layer=%q} %d\n", m.name, node, layers[i].Layer, m.v(&layers[i]))
		}
	}
}
