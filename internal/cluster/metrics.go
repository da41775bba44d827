package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

// GET /v1/metrics on a replica is the cluster's one scrape target: every node's Prometheus text
// (edges serve only the servers, so nothing else can scrape them), each series labelled with
// its node, beside the replica's own (nodes by state, whether each node answered, the webhook
// dispatcher, its goroutines). `?node=NAME` is that node's text alone, unlabelled.

const (
	// scrapeTimeout bounds the read of one node's metrics.
	scrapeTimeout = 5 * time.Second
	// scrapeParallel bounds the nodes read at once.
	scrapeParallel = 16
	// scrapeMax bounds one node's text.
	scrapeMax = 32 << 20
)

// nodeText is one source of the merged text: a node's metrics (node set) or the replica's own.
type nodeText struct {
	node string
	text string
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	if err := apiserver.Require(r, iam.Operator, ""); err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	if r.URL.Query().Get("node") != "" {
		s.toNamedNode(w, r)
		return
	}
	nodes := s.upNodes(r.Context())
	texts := make([]nodeText, len(nodes))
	errs := make([]error, len(nodes))
	took := make([]time.Duration, len(nodes))
	var wg sync.WaitGroup
	sem := make(chan struct{}, scrapeParallel)
	for i, n := range nodes {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			start := time.Now()
			texts[i] = nodeText{node: n.Name}
			texts[i].text, errs[i] = s.scrape(r, n)
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	var own strings.Builder
	s.writeOwnMetrics(r.Context(), &own, nodes, errs, took)
	for i, err := range errs {
		if err != nil {
			s.log.Warn("read a node's metrics", "node", nodes[i].Name, "err", err)
		}
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	mergeMetrics(w, append(texts, nodeText{text: own.String()}))
}

// scrape reads node n's metrics as r's caller.
func (s *Server) scrape(r *http.Request, n model.Node) (string, error) {
	ctx, cancel := context.WithTimeout(r.Context(), scrapeTimeout)
	defer cancel()
	resp, err := s.edgeRequest(ctx, r, n, http.MethodGet, "/v1/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, scrapeMax+1))
	switch {
	case err != nil:
		return "", errdefs.Unavailable("node %s: %v", n.Name, err)
	case resp.StatusCode != http.StatusOK:
		return "", fmt.Errorf("node %s answered %d: %.200s", n.Name, resp.StatusCode, b)
	case len(b) > scrapeMax:
		return "", fmt.Errorf("node %s: its metrics are over %d bytes", n.Name, scrapeMax)
	}
	return string(b), nil
}

// writeOwnMetrics writes the replica's own metrics: the nodes by state, whether each up node
// answered the scrape and how long it took, the webhook dispatcher's counters, goroutines.
func (s *Server) writeOwnMetrics(ctx context.Context, w io.Writer, up []model.Node, errs []error, took []time.Duration) {
	states := map[string]int{}
	for _, n := range s.refresh(ctx, false) { // the node list placement reads, at most 1 s old
		states[n.State]++
	}
	fmt.Fprintf(w, "# HELP corral_cluster_nodes Nodes of the cluster by state.\n# TYPE corral_cluster_nodes gauge\n")
	for _, st := range []string{model.NodeReady, model.NodeCordoned, model.NodeDraining, model.NodeLost} {
		fmt.Fprintf(w, "corral_cluster_nodes{state=%q} %d\n", st, states[st])
	}
	fmt.Fprintf(w, "# HELP corral_node_scrape_ok Whether the node answered this scrape (1) or not (0; the replica's log says why).\n# TYPE corral_node_scrape_ok gauge\n")
	for i, n := range up {
		ok := 1
		if errs[i] != nil {
			ok = 0
		}
		fmt.Fprintf(w, "corral_node_scrape_ok{node=%q} %d\n", n.Name, ok)
	}
	fmt.Fprintf(w, "# HELP corral_node_scrape_seconds How long the node took to answer this scrape.\n# TYPE corral_node_scrape_seconds gauge\n")
	for i, n := range up {
		fmt.Fprintf(w, "corral_node_scrape_seconds{node=%q} %.3f\n", n.Name, took[i].Seconds())
	}
	s.api.WriteWebhookMetrics(w)
	fmt.Fprintf(w, "# HELP go_goroutines Goroutines of this corral process.\n# TYPE go_goroutines gauge\ngo_goroutines %d\n", runtime.NumGoroutine())
}

// family is one metric family of the merged text: its HELP and TYPE lines (once) and its samples
// from every source.
type family struct {
	help, typ string
	samples   []string
}

// mergeMetrics writes the Prometheus texts as one: each family once, its HELP and TYPE first
// and all its samples together (the format wants a family's lines in one block), each sample of
// a node's text labelled node="NAME". Families keep the order they were first seen in.
func mergeMetrics(w io.Writer, texts []nodeText) {
	byName := map[string]*family{}
	var order []string
	get := func(name string) *family {
		f := byName[name]
		if f == nil {
			f = &family{}
			byName[name] = f
			order = append(order, name)
		}
		return f
	}
	for _, t := range texts {
		current := ""
		sc := bufio.NewScanner(strings.NewReader(t.text))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.TrimSpace(line) == "":
			case strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE "):
				fields := strings.SplitN(line, " ", 4)
				if len(fields) < 3 {
					continue
				}
				current = fields[2]
				f := get(current)
				if fields[1] == "HELP" && f.help == "" {
					f.help = line
				} else if fields[1] == "TYPE" && f.typ == "" {
					f.typ = line
				}
			case strings.HasPrefix(line, "#"): // another comment
			default:
				name := line[:max(strings.IndexAny(line, "{ "), 0)]
				if name == "" {
					continue
				}
				if current == "" || !strings.HasPrefix(name, current) {
					current = name // a sample of a family with no HELP or TYPE
				}
				f := get(current)
				f.samples = append(f.samples, withNode(line, name, t.node))
			}
		}
	}
	bw := bufio.NewWriter(w)
	for _, name := range order {
		f := byName[name]
		for _, l := range slices.DeleteFunc([]string{f.help, f.typ}, func(s string) bool { return s == "" }) {
			bw.WriteString(l)
			bw.WriteByte('\n')
		}
		for _, l := range f.samples {
			bw.WriteString(l)
			bw.WriteByte('\n')
		}
	}
	bw.Flush()
}

// withNode adds node="NODE" to the labels of sample line (whose metric is name); a line of the
// replica's own (node empty), or one that names its node already (most of an edge's do), is
// kept as it is.
func withNode(line, name, node string) string {
	rest := line[len(name):]
	if node == "" || strings.HasPrefix(rest, `{node="`) || (strings.HasPrefix(rest, "{") && strings.Contains(rest[:labelsEnd(rest)], `,node="`)) {
		return line
	}
	label := fmt.Sprintf("node=%q", node)
	if strings.HasPrefix(rest, "{}") {
		return name + "{" + label + "}" + rest[2:]
	}
	if strings.HasPrefix(rest, "{") {
		return name + "{" + label + "," + rest[1:]
	}
	return name + "{" + label + "}" + rest
}

// labelsEnd returns the index just past the label set that rest ({...} value) starts with,
// quoted values (with their escapes) skipped; len(rest) when it does not close.
func labelsEnd(rest string) int {
	quoted := false
	for i := 0; i < len(rest); i++ {
		switch c := rest[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case c == '}' && !quoted:
			return i + 1
		}
	}
	return len(rest)
}
