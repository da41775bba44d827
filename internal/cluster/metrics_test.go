package cluster

import (
	"strings"
	"testing"
)

// TestMergeMetrics: nodes' texts and the replica's own become one valid text: each family once,
// HELP and TYPE first, all its samples in one block, each node's samples labelled with it.
func TestMergeMetrics(t *testing.T) {
	edge := func(n string) string {
		return `# HELP corral_sandboxes Sandboxes by state.
# TYPE corral_sandboxes gauge
corral_sandboxes{state="running"} ` + n + `
corral_sandboxes{state="paused"} 0
corral_layer_bytes{layer="a,node=\"x\"",node="` + n + `"} 9
# HELP corral_dns_queries_total DNS queries.
# TYPE corral_dns_queries_total counter
corral_dns_queries_total 7
# HELP corral_fetch_seconds Fetch latency.
# TYPE corral_fetch_seconds histogram
corral_fetch_seconds_bucket{le="0.1"} 1
corral_fetch_seconds_bucket{le="+Inf"} 2
corral_fetch_seconds_sum 0.3
corral_fetch_seconds_count 2
untyped_thing{} 3
# HELP go_goroutines Goroutines of this corral process.
# TYPE go_goroutines gauge
go_goroutines 40
`
	}
	own := `# HELP corral_cluster_nodes Nodes of the cluster by state.
# TYPE corral_cluster_nodes gauge
corral_cluster_nodes{state="ready"} 2
# HELP go_goroutines Goroutines of this corral process.
# TYPE go_goroutines gauge
go_goroutines 12
`
	var b strings.Builder
	mergeMetrics(&b, []nodeText{{"edge1", edge("3")}, {"edge2", edge("5")}, {"", own}})
	if got := withNode(`corral_sandboxes{node="edge1",state="running"} 3`, "corral_sandboxes", "edge1"); got != `corral_sandboxes{node="edge1",state="running"} 3` {
		t.Errorf("a sample that names its node got %s", got)
	}
	if got := withNode(`x{a="}"} 1`, "x", "e"); got != `x{node="e",a="}"} 1` {
		t.Errorf("withNode = %s", got)
	}
	want := `# HELP corral_sandboxes Sandboxes by state.
# TYPE corral_sandboxes gauge
corral_sandboxes{node="edge1",state="running"} 3
corral_sandboxes{node="edge1",state="paused"} 0
corral_sandboxes{node="edge2",state="running"} 5
corral_sandboxes{node="edge2",state="paused"} 0
corral_layer_bytes{layer="a,node=\"x\"",node="3"} 9
corral_layer_bytes{layer="a,node=\"x\"",node="5"} 9
# HELP corral_dns_queries_total DNS queries.
# TYPE corral_dns_queries_total counter
corral_dns_queries_total{node="edge1"} 7
corral_dns_queries_total{node="edge2"} 7
# HELP corral_fetch_seconds Fetch latency.
# TYPE corral_fetch_seconds histogram
corral_fetch_seconds_bucket{node="edge1",le="0.1"} 1
corral_fetch_seconds_bucket{node="edge1",le="+Inf"} 2
corral_fetch_seconds_sum{node="edge1"} 0.3
corral_fetch_seconds_count{node="edge1"} 2
corral_fetch_seconds_bucket{node="edge2",le="0.1"} 1
corral_fetch_seconds_bucket{node="edge2",le="+Inf"} 2
corral_fetch_seconds_sum{node="edge2"} 0.3
corral_fetch_seconds_count{node="edge2"} 2
untyped_thing{node="edge1"} 3
untyped_thing{node="edge2"} 3
# HELP go_goroutines Goroutines of this corral process.
# TYPE go_goroutines gauge
go_goroutines{node="edge1"} 40
go_goroutines{node="edge2"} 40
go_goroutines 12
# HELP corral_cluster_nodes Nodes of the cluster by state.
# TYPE corral_cluster_nodes gauge
corral_cluster_nodes{state="ready"} 2
`
	if got := b.String(); got != want {
		t.Errorf("merged:\n%s\nwant:\n%s", got, want)
	}
}
