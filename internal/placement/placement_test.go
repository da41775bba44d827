package placement

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

// TestExportedDocs checks that every exported identifier has a doc comment: the API server's
// cluster mode is written against them.
func TestExportedDocs(t *testing.T) { doccheck.Exported(t, ".") }

const gib = 1 << 30

// node returns a ready container/runc node with 64 CPUs, 256 GiB, 2 TiB of disk and room for
// 200 sandboxes, nothing used.
func node(name string, opts ...func(*Node)) Node {
	n := Node{
		Name: name, State: StateReady, Tiers: []string{"container"}, Runtimes: []string{"runc", "gvisor"},
		Capacity: Resources{CPUs: 64, MemoryBytes: 256 * gib, DiskBytes: 2048 * gib, Sandboxes: 200},
	}
	for _, o := range opts {
		o(&n)
	}
	return n
}

func state(s State) func(*Node)                 { return func(n *Node) { n.State = s } }
func tiers(t ...string) func(*Node)             { return func(n *Node) { n.Tiers = t } }
func runtimes(r ...string) func(*Node)          { return func(n *Node) { n.Runtimes = r } }
func labelled(kv map[string]string) func(*Node) { return func(n *Node) { n.Labels = kv } }
func used(r Resources) func(*Node)              { return func(n *Node) { n.Used = r } }

func newPlacer(t testing.TB, cfg Config) *Placer {
	t.Helper()
	if cfg.Rand == nil {
		cfg.Rand = rand.NewPCG(1, 2)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// small is a 1 CPU, 1 GiB request for a container.
var small = Request{Tier: "container", Runtime: "runc", CPUs: 1, MemoryBytes: gib}

// TestFilters checks each filter: which nodes may be chosen, or how the refusal counts them.
func TestFilters(t *testing.T) {
	withReq := func(f func(*Request)) Request {
		r := small
		f(&r)
		return r
	}
	for _, tc := range []struct {
		name    string
		cfg     Config
		nodes   []Node
		req     Request
		want    []string       // nodes any of which may be chosen; empty when an error is wanted
		removed map[Filter]int // on error
		msg     string         // on error: the whole message
		kind    error          // on error
	}{
		{
			name:  "only ready nodes",
			nodes: []Node{node("a", state(StateCordoned)), node("b", state(StateLost)), node("c"), node("d", state(StateDraining))},
			req:   small, want: []string{"c"},
		},
		{
			name:    "no ready node",
			nodes:   []Node{node("a", state(StateCordoned)), node("b", state(StateLost)), node("c", state(StateDraining)), node("d", state(""))},
			req:     small,
			removed: map[Filter]int{FilterNotReady: 4},
			msg:     "no node can take this sandbox (1 CPU, 1 GiB memory): 4 nodes: 4 not ready (1 no state, 1 cordoned, 1 draining, 1 lost)",
			kind:    errdefs.ErrUnavailable,
		},
		{
			name:    "the issue's example",
			nodes:   []Node{node("a", state(StateCordoned)), node("b"), node("c")},
			req:     withReq(func(r *Request) { r.Tier = "microvm"; r.Runtime = "" }),
			removed: map[Filter]int{FilterNotReady: 1, FilterTier: 2},
			msg:     "no node can take this sandbox (1 CPU, 1 GiB memory): 3 nodes: 1 not ready (1 cordoned), 2 lack tier microvm",
			kind:    errdefs.ErrUnavailable,
		},
		{
			name:  "tier",
			nodes: []Node{node("a"), node("b", tiers("container", "microvm"))},
			req:   withReq(func(r *Request) { r.Tier = "microvm" }), want: []string{"b"},
		},
		{
			name:  "empty tier and runtime accept any",
			nodes: []Node{node("a", tiers("microvm"), runtimes("firecracker"))},
			req:   withReq(func(r *Request) { r.Tier, r.Runtime = "", "" }), want: []string{"a"},
		},
		{
			name:    "runtime",
			nodes:   []Node{node("a", runtimes("runc")), node("b", runtimes("runc"))},
			req:     withReq(func(r *Request) { r.Runtime = "gvisor" }),
			removed: map[Filter]int{FilterRuntime: 2},
			msg:     "no node can take this sandbox (1 CPU, 1 GiB memory): 2 nodes: 2 lack runtime gvisor",
			kind:    errdefs.ErrUnavailable,
		},
		{
			name: "required labels",
			nodes: []Node{node("a"), node("b", labelled(map[string]string{"gpu": "a100"})),
				node("c", labelled(map[string]string{"gpu": "h100", "zone": "x"}))},
			req: withReq(func(r *Request) { r.Require = Selector{"gpu": "h100"} }), want: []string{"c"},
		},
		{
			name:    "required labels missing",
			nodes:   []Node{node("a"), node("b", labelled(map[string]string{"gpu": "a100"}))},
			req:     withReq(func(r *Request) { r.Require = Selector{"gpu": "h100", "zone": "x"} }),
			removed: map[Filter]int{FilterLabels: 2},
			msg:     "no node can take this sandbox (1 CPU, 1 GiB memory): 2 nodes: 2 lack labels gpu=h100,zone=x",
			kind:    errdefs.ErrUnavailable,
		},
		{
			name: "pinned to either of two groups",
			nodes: []Node{node("a", labelled(map[string]string{"pool": "a"})), node("b", labelled(map[string]string{"pool": "b"})),
				node("c", labelled(map[string]string{"pool": "c"})), node("d")},
			req:  withReq(func(r *Request) { r.Pin = []Selector{{"pool": "a"}, {"pool": "b"}} }),
			want: []string{"a", "b"},
		},
		{
			name:    "pinned and the group is down",
			nodes:   []Node{node("a", labelled(map[string]string{"pool": "a"}), state(StateLost)), node("c", labelled(map[string]string{"pool": "c"})), node("d")},
			req:     withReq(func(r *Request) { r.Pin = []Selector{{"pool": "a"}, {"pool": "b"}} }),
			removed: map[Filter]int{FilterNotReady: 1, FilterPin: 2},
			msg:     "no node can take this sandbox (1 CPU, 1 GiB memory): 3 nodes: 1 not ready (1 lost), 2 outside the project's node groups (pool=a or pool=b)",
			kind:    errdefs.ErrUnavailable,
		},
		{
			name: "avoid",
			nodes: []Node{node("a", labelled(map[string]string{"pool": "shared"})), node("b", labelled(map[string]string{"pool": "canary"})),
				node("c", labelled(map[string]string{"pool": "c"}))},
			req:  withReq(func(r *Request) { r.Avoid = []Selector{{"pool": "shared"}, {"pool": "canary"}} }),
			want: []string{"c"},
		},
		{
			name:    "avoid everything",
			nodes:   []Node{node("a", labelled(map[string]string{"pool": "shared"}))},
			req:     withReq(func(r *Request) { r.Avoid = []Selector{{"pool": "shared"}} }),
			removed: map[Filter]int{FilterAvoid: 1},
			msg:     "no node can take this sandbox (1 CPU, 1 GiB memory): 1 node: 1 in node groups the project avoids (pool=shared)",
			kind:    errdefs.ErrUnavailable,
		},
		{
			name:  "exclude",
			nodes: []Node{node("a"), node("b"), node("c")},
			req:   withReq(func(r *Request) { r.Exclude = []string{"a", "c"} }), want: []string{"b"},
		},
		{
			name:  "exclude, long list",
			nodes: []Node{node("a"), node("b"), node("c")},
			req:   withReq(func(r *Request) { r.Exclude = []string{"a", "c", "x1", "x2", "x3", "x4", "x5", "x6", "x7"} }), want: []string{"b"},
		},
		{
			name: "capacity, CPU overcommitted 4x by default",
			nodes: []Node{
				node("a", used(Resources{CPUs: 255.5})),
				node("b", used(Resources{CPUs: 254})),
			},
			req: withReq(func(r *Request) { r.CPUs = 2 }), want: []string{"b"},
		},
		{
			name: "capacity, CPU not overcommitted",
			cfg:  Config{Overcommit: Overcommit{CPU: 1}},
			nodes: []Node{
				node("a", used(Resources{CPUs: 63})),
				node("b", used(Resources{CPUs: 62})),
			},
			req: withReq(func(r *Request) { r.CPUs = 2 }), want: []string{"b"},
		},
		{
			name: "capacity, each resource",
			nodes: []Node{
				node("cpu", used(Resources{CPUs: 255})),
				node("mem", used(Resources{MemoryBytes: 255 * gib})),
				node("disk", used(Resources{DiskBytes: 2040 * gib})),
				node("count", used(Resources{Sandboxes: 200})),
				node("count2", used(Resources{Sandboxes: 200})),
				node("zero", func(n *Node) { n.Capacity = Resources{} }),
			},
			req:     withReq(func(r *Request) { r.CPUs, r.MemoryBytes, r.DiskBytes = 2, 2*gib, 10*gib }),
			removed: map[Filter]int{FilterCPU: 2, FilterMemory: 1, FilterDisk: 1, FilterSandboxes: 2},
			msg: "no node can take this sandbox (2 CPUs, 2 GiB memory, 10 GiB disk): 6 nodes: 2 lack room for 2 CPUs, " +
				"1 lacks room for 2 GiB memory, 1 lacks room for 10 GiB disk, 2 are at their sandbox limit; retry later or ask for less",
			kind: errdefs.ErrExhausted,
		},
		{
			name:    "no nodes",
			req:     small,
			removed: map[Filter]int{},
			msg:     "no node can take this sandbox (1 CPU, 1 GiB memory): the cluster has no nodes",
			kind:    errdefs.ErrUnavailable,
		},
		{
			name: "first failing filter counts",
			nodes: []Node{
				node("a", state(StateCordoned), tiers("microvm")),
				node("b", tiers("microvm"), used(Resources{Sandboxes: 200})),
				node("c", used(Resources{Sandboxes: 200})),
			},
			req:     small,
			removed: map[Filter]int{FilterNotReady: 1, FilterTier: 1, FilterSandboxes: 1},
			msg:     "no node can take this sandbox (1 CPU, 1 GiB memory): 3 nodes: 1 not ready (1 cordoned), 1 lacks tier container, 1 is at its sandbox limit",
			kind:    errdefs.ErrExhausted,
		},
	} {
		for _, k := range []int{KRandom, DefaultK, KAll} {
			t.Run(fmt.Sprintf("%s/k=%d", tc.name, k), func(t *testing.T) {
				cfg := tc.cfg
				cfg.K = k
				p := newPlacer(t, cfg)
				for range 5 { // several draws: a wrong node would turn up
					d, err := p.Place(tc.req, tc.nodes)
					if len(tc.want) > 0 {
						if err != nil {
							t.Fatalf("Place: %v", err)
						}
						if !slices.Contains(tc.want, d.Node) {
							t.Fatalf("Place chose %s, want one of %v", d.Node, tc.want)
						}
						p.Done(d.ID, false)
						continue
					}
					var nf *NoFitError
					if !errors.As(err, &nf) {
						t.Fatalf("Place: got %v (%v), want a *NoFitError", d, err)
					}
					if got := nf.Removed; !equalCounts(got, tc.removed) {
						t.Errorf("removed: got %v, want %v", got, tc.removed)
					}
					if got := err.Error(); got != tc.msg {
						t.Errorf("message:\n got %q\nwant %q", got, tc.msg)
					}
					if !errors.Is(err, tc.kind) {
						t.Errorf("kind: got %q, want %v", errdefs.Code(err), tc.kind)
					}
				}
			})
		}
	}
}

func equalCounts(a, b map[Filter]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestInvalid checks that impossible requests and configurations are refused as invalid.
func TestInvalid(t *testing.T) {
	p := newPlacer(t, Config{})
	for _, r := range []Request{{CPUs: -1}, {MemoryBytes: -1}, {DiskBytes: -1}} {
		if _, err := p.Place(r, []Node{node("a")}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Place(%+v): got %v, want invalid", r, err)
		}
	}
	for _, cfg := range []Config{{Overcommit: Overcommit{CPU: -1}}, {Overcommit: Overcommit{Disk: -0.5}}, {InflightTTL: -time.Second}} {
		if _, err := New(cfg); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("New(%+v): got %v, want invalid", cfg, err)
		}
	}
	if got := newPlacer(t, Config{}).Config(); got.K != DefaultK || got.Overcommit != (Overcommit{4, 1, 1}) || got.InflightTTL != 10*time.Second {
		t.Errorf("defaults: got K %d, overcommit %+v, TTL %s", got.K, got.Overcommit, got.InflightTTL)
	}
}

// TestLoadScore checks the score: the largest share of any resource after overcommit, and that
// the least loaded node wins when all are compared.
func TestLoadScore(t *testing.T) {
	p := newPlacer(t, Config{K: KAll})
	c := node("x").Capacity
	for _, tc := range []struct {
		used Resources
		want float64
	}{
		{Resources{}, 0},
		{Resources{CPUs: 128}, 0.5}, // 64 CPUs × 4
		{Resources{CPUs: 128, MemoryBytes: 192 * gib}, 0.75}, // memory dominates
		{Resources{Sandboxes: 200}, 1},
		{Resources{Sandboxes: 300, CPUs: 1}, 1.5}, // overfull scores above 1
	} {
		if got := p.Load(tc.used, c); got != tc.want {
			t.Errorf("Load(%+v) = %v, want %v", tc.used, got, tc.want)
		}
	}
	nodes := []Node{
		node("a", used(Resources{MemoryBytes: 128 * gib})),
		node("b", used(Resources{CPUs: 100})),
		node("c", used(Resources{Sandboxes: 150})),
	}
	d, err := p.Place(small, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if want := 101.0 / 256; d.Node != "b" || d.Score != want {
		t.Errorf("Place: got %s at %v, want b at %v", d.Node, d.Score, want)
	}
}

// TestTiesRandom checks that equal nodes share placements: ties are broken at random, not by
// position.
func TestTiesRandom(t *testing.T) {
	for _, k := range []int{KRandom, DefaultK, KAll} {
		p := newPlacer(t, Config{K: k})
		nodes := []Node{node("a"), node("b"), node("c"), node("d")}
		got := map[string]int{}
		for range 4000 {
			d, err := p.Place(small, nodes)
			if err != nil {
				t.Fatal(err)
			}
			got[d.Node]++
			p.Done(d.ID, false)
		}
		for _, n := range nodes {
			if c := got[n.Name]; c < 850 || c > 1150 {
				t.Errorf("k=%d: %s chosen %d times of 4000, want about 1000 (%v)", k, n.Name, c, got)
			}
		}
	}
}

// TestSampledFallsBack checks the sampled path on a large cluster where few nodes fit: it must
// find them (by the full scan) and choose only among them, each about as often.
func TestSampledFallsBack(t *testing.T) {
	var nodes []Node
	for i := range 1000 {
		n := node(fmt.Sprintf("n%04d", i))
		if i%200 == 7 {
			n.Labels = map[string]string{"gpu": "h100"}
		}
		nodes = append(nodes, n)
	}
	req := small
	req.Require = Selector{"gpu": "h100"}
	for _, k := range []int{KRandom, DefaultK} {
		p := newPlacer(t, Config{K: k})
		got := map[string]int{}
		for range 1000 {
			d, err := p.Place(req, nodes)
			if err != nil {
				t.Fatal(err)
			}
			if d.Candidates != 5 && d.Candidates != 0 {
				t.Fatalf("k=%d: %d candidates, want 5 (full scan) or 0 (found by sampling)", k, d.Candidates)
			}
			got[d.Node]++
			p.Done(d.ID, false)
		}
		if len(got) != 5 {
			t.Fatalf("k=%d: chose %v, want the 5 gpu nodes", k, got)
		}
		for n, c := range got {
			if c < 120 || c > 280 {
				t.Errorf("k=%d: %s chosen %d times of 1000, want about 200", k, n, c)
			}
		}
	}
}

// TestInflightPreventsHerd places 100 sandboxes from one Placer onto nodes whose reports never
// change. Least loaded of all, without in-flight accounting, sends all 100 to the emptiest node
// (the classic herd, shown first); with it, the emptiest node fills to its neighbours' level and
// the rest spread evenly.
func TestInflightPreventsHerd(t *testing.T) {
	nodes := []Node{node("empty")}
	for i := range 19 {
		nodes = append(nodes, node(fmt.Sprintf("half%02d", i), used(Resources{CPUs: 32})))
	}
	req := Request{CPUs: 2, MemoryBytes: gib}
	cfg := Config{K: KAll, Overcommit: Overcommit{CPU: 1}}

	herd := newPlacer(t, cfg)
	for range 100 {
		d, err := herd.Place(req, nodes)
		if err != nil {
			t.Fatal(err)
		}
		if d.Node != "empty" {
			t.Fatalf("without in-flight accounting: placed on %s, want every one on the emptiest node", d.Node)
		}
		herd.Done(d.ID, false) // forgets it: only the report counts
	}

	for _, k := range []int{KAll, DefaultK} {
		cfg.K = k
		p := newPlacer(t, cfg)
		got := map[string]int{}
		for range 100 {
			d, err := p.Place(req, nodes)
			if err != nil {
				t.Fatal(err)
			}
			got[d.Node]++
		}
		// 16 placements bring "empty" to 32 CPUs, level with the rest; the other 84 spread
		// over 20 nodes, 4.2 each.
		if k == KAll {
			if got["empty"] < 16 || got["empty"] > 22 {
				t.Errorf("k=all: emptiest node got %d of 100, want 16 to 22 (%v)", got["empty"], got)
			}
			for _, n := range nodes[1:] {
				if got[n.Name] < 3 || got[n.Name] > 6 {
					t.Errorf("k=all: %s got %d, want 3 to 6 (%v)", n.Name, got[n.Name], got)
				}
			}
		}
		if most := slices.Max(slicesValues(got)); most > 22 {
			t.Errorf("k=%d: a node got %d of 100 (%v)", k, most, got)
		}
		if p.Inflight() != 100 {
			t.Errorf("k=%d: %d in flight, want 100", k, p.Inflight())
		}
	}
}

func slicesValues(m map[string]int) []int {
	var v []int
	for _, c := range m {
		v = append(v, c)
	}
	return v
}

// fakeClock is a settable clock for in-flight expiry.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// TestInflightLifetime follows in-flight placements on a node with room for two sandboxes:
// counted in the fit check, dropped by Done(false), kept after Done(true) until a later report,
// kept (unconfirmed) past a report, and dropped after the TTL.
func TestInflightLifetime(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_000_000, 0)}
	p := newPlacer(t, Config{Now: clock.Now, InflightTTL: 10 * time.Second})
	n := node("a", func(n *Node) { n.Capacity.Sandboxes = 2; n.ReportedAt = clock.Now() })
	nodes := []Node{n}
	place := func(step string, wantOK bool) ID {
		t.Helper()
		d, err := p.Place(small, nodes)
		if wantOK && err != nil {
			t.Fatalf("%s: Place: %v", step, err)
		}
		if !wantOK {
			var nf *NoFitError
			if !errors.As(err, &nf) || nf.Removed[FilterSandboxes] != 1 {
				t.Fatalf("%s: Place: got %v, %v; want the node at its sandbox limit", step, d, err)
			}
		}
		return d.ID
	}
	inflight := func(step string, want int) {
		t.Helper()
		if got := p.Inflight(); got != want {
			t.Fatalf("%s: %d in flight, want %d", step, got, want)
		}
	}

	a := place("first", true)
	b := place("second", true)
	place("third: two in flight fill the node", false)
	p.Done(a, false)
	inflight("refused", 1)
	c := place("after a refusal", true)

	clock.Add(time.Second)
	p.Done(b, true)
	p.Done(c, true)
	nodes[0].ReportedAt = clock.Now() // not after the confirmations: may not include them
	place("report as old as the confirmations", false)
	inflight("confirmed, not yet reported", 2)

	clock.Add(time.Second)
	nodes[0].ReportedAt = clock.Now()
	nodes[0].Used.Sandboxes = 1 // the edge reports b (c already ended)
	d := place("after a newer report", true)
	inflight("newer report", 1)

	nodes[0].ReportedAt = clock.Add(time.Second) // a report after d's placement, before its confirmation
	nodes[0].Used.Sandboxes = 0
	place("one more fits", true)
	place("unconfirmed placements outlive reports", false)
	inflight("unconfirmed", 2)

	clock.Add(10 * time.Second)
	inflight("after the TTL", 0)
	p.Done(d, true) // expired: ignored
	place("fits again", true)
}

// TestQueueCompacts checks that many placements expiring by TTL do not grow the queue without
// bound.
func TestQueueCompacts(t *testing.T) {
	clock := &fakeClock{now: time.Unix(0, 0)}
	p := newPlacer(t, Config{Now: clock.Now, InflightTTL: time.Second})
	var nodes []Node
	for i := range 100 {
		nodes = append(nodes, node(fmt.Sprint(i)))
	}
	for i := range 20_000 {
		clock.Add(time.Millisecond)
		d, err := p.Place(small, nodes)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			p.Done(d.ID, true)
		}
	}
	if got := p.Inflight(); got < 999 || got > 1000 {
		t.Errorf("%d in flight, want 1000 (one TTL's worth)", got)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) > 3000 || len(p.byNode) > 100 {
		t.Errorf("queue %d long, %d nodes tracked; want about 1000 and at most 100", len(p.queue), len(p.byNode))
	}
}

// TestPlaceWithRetry checks that refusing nodes are excluded in turn, that it stops after
// maxTries, and that other errors end it at once.
func TestPlaceWithRetry(t *testing.T) {
	// Least loaded first: a, then b, then c, ...
	nodes := []Node{
		node("a"), node("b", used(Resources{Sandboxes: 10})), node("c", used(Resources{Sandboxes: 20})),
		node("d", used(Resources{Sandboxes: 30})),
	}
	refuse := func(names ...string) (func(context.Context, string) error, *[]string) {
		var tried []string
		return func(_ context.Context, n string) error {
			tried = append(tried, n)
			if slices.Contains(names, n) {
				return fmt.Errorf("create on %s: conflict: %w", n, ErrRefused)
			}
			return nil
		}, &tried
	}
	ctx := context.Background()

	t.Run("refusals retried", func(t *testing.T) {
		p := newPlacer(t, Config{K: KAll})
		try, tried := refuse("a", "b")
		req := small
		req.Exclude = make([]string, 0, 8) // room to append into: must stay untouched
		got, err := p.PlaceWithRetry(ctx, req, nodes, try, 3)
		if err != nil || got != "c" {
			t.Fatalf("got %q, %v; want c", got, err)
		}
		if want := []string{"a", "b", "c"}; !slices.Equal(*tried, want) {
			t.Errorf("tried %v, want %v", *tried, want)
		}
		if len(req.Exclude[:cap(req.Exclude)][0]) != 0 {
			t.Errorf("the caller's Exclude array was written")
		}
		if p.Inflight() != 1 {
			t.Errorf("%d in flight, want 1 (the admitted one; refusals dropped)", p.Inflight())
		}
	})
	t.Run("stops after maxTries", func(t *testing.T) {
		p := newPlacer(t, Config{K: KAll})
		try, tried := refuse("a", "b", "c")
		_, err := p.PlaceWithRetry(ctx, small, nodes, try, 2)
		if !errors.Is(err, ErrRefused) || !errors.Is(err, errdefs.ErrExhausted) {
			t.Fatalf("got %v, want a refusal (exhausted)", err)
		}
		if want := []string{"a", "b"}; !slices.Equal(*tried, want) {
			t.Errorf("tried %v, want %v", *tried, want)
		}
		if want := "2 nodes refused it (a, b)"; !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
		if p.Inflight() != 0 {
			t.Errorf("%d in flight, want 0", p.Inflight())
		}
	})
	t.Run("every node refuses", func(t *testing.T) {
		p := newPlacer(t, Config{})
		try, tried := refuse("a", "b", "c", "d")
		_, err := p.PlaceWithRetry(ctx, small, nodes, try, 10)
		var nf *NoFitError
		if !errors.As(err, &nf) || nf.Removed[FilterTried] != 4 || !errors.Is(err, ErrRefused) {
			t.Fatalf("got %v, want no fit with 4 tried, wrapping the last refusal", err)
		}
		if len(*tried) != 4 {
			t.Errorf("tried %v, want each node once", *tried)
		}
	})
	t.Run("other errors end it", func(t *testing.T) {
		p := newPlacer(t, Config{K: KAll})
		boom := errors.New("connection reset")
		n := 0
		_, err := p.PlaceWithRetry(ctx, small, nodes, func(context.Context, string) error { n++; return boom }, 3)
		if !errors.Is(err, boom) || n != 1 {
			t.Fatalf("got %v after %d tries, want the error after 1", err, n)
		}
		if p.Inflight() != 1 {
			t.Errorf("%d in flight, want 1 (unknown outcome stays counted)", p.Inflight())
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		p := newPlacer(t, Config{})
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := p.PlaceWithRetry(cctx, small, nodes, func(context.Context, string) error { return nil }, 3); !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want canceled", err)
		}
	})
}

// simulate places sandboxes of three sizes from placers (in turn) on equal nodes until the
// cluster is fill full on average; edges report every reportEvery placements and refuse what
// does not fit. It returns max load / mean load.
func simulate(t testing.TB, placers []*Placer, clock *fakeClock, nodes int, fill float64, reportEvery int, seed uint64) float64 {
	t.Helper()
	ns := make([]Node, nodes)
	idx := map[string]int{}
	for i := range ns {
		ns[i] = node(fmt.Sprintf("n%05d", i), func(n *Node) { n.ReportedAt = clock.Now() })
		idx[ns[i].Name] = i
	}
	truth := make([]Resources, nodes)
	loads := make([]float64, nodes)
	sum := 0.0
	rng := rand.New(rand.NewPCG(seed, 0))
	sizes := []Request{
		{Tier: "container", CPUs: 1, MemoryBytes: 1 * gib, DiskBytes: 5 * gib},
		{Tier: "container", CPUs: 2, MemoryBytes: 4 * gib, DiskBytes: 10 * gib},
		{Tier: "container", CPUs: 8, MemoryBytes: 16 * gib, DiskBytes: 40 * gib},
	}
	p0 := placers[0]
	for i := 0; sum/float64(nodes) < fill; i++ {
		if i > 100*nodes {
			t.Fatalf("no progress after %d placements", i)
		}
		req := sizes[0]
		if x := rng.Float64(); x > 0.9 {
			req = sizes[2]
		} else if x > 0.6 {
			req = sizes[1]
		}
		clock.Add(time.Millisecond)
		d := Resources{CPUs: req.CPUs, MemoryBytes: req.MemoryBytes, DiskBytes: req.DiskBytes, Sandboxes: 1}
		_, err := placers[i%len(placers)].PlaceWithRetry(context.Background(), req, ns, func(_ context.Context, name string) error {
			j := idx[name]
			next := truth[j]
			next.add(d)
			l := p0.Load(next, ns[j].Capacity)
			if l > 1+fitSlack {
				return ErrRefused
			}
			truth[j], sum, loads[j] = next, sum-loads[j]+l, l
			return nil
		}, 3)
		if err != nil && !errors.Is(err, errdefs.ErrExhausted) {
			t.Fatalf("placement %d: %v", i, err)
		}
		if (i+1)%reportEvery == 0 {
			at := clock.Add(time.Microsecond)
			for j := range ns {
				ns[j].Used, ns[j].ReportedAt = truth[j], at
			}
		}
	}
	return slices.Max(loads) / (sum / float64(nodes))
}

// TestBalance checks on a seeded simulation that two choices balance far better than one, and
// that least loaded of all does at least as well as two.
func TestBalance(t *testing.T) {
	imb := map[int]float64{}
	for _, k := range []int{KRandom, DefaultK, KAll} {
		clock := &fakeClock{now: time.Unix(0, 0)}
		p := newPlacer(t, Config{K: k, Now: clock.Now, Rand: rand.NewPCG(7, uint64(k+10))})
		imb[k] = simulate(t, []*Placer{p}, clock, 1000, 0.5, 100, 42)
	}
	t.Logf("imbalance (max/mean load) at 1000 nodes, 50%% full: k=1 %.3f, k=2 %.3f, k=all %.3f", imb[KRandom], imb[DefaultK], imb[KAll])
	if imb[DefaultK] > 0.75*imb[KRandom] {
		t.Errorf("k=2 imbalance %.3f, want at most 0.75 × k=1's %.3f", imb[DefaultK], imb[KRandom])
	}
	if imb[KAll] > imb[DefaultK]+0.02 {
		t.Errorf("k=all imbalance %.3f, want no worse than k=2's %.3f", imb[KAll], imb[DefaultK])
	}
}

// TestConcurrent runs placements and Done from many goroutines (meant for -race).
func TestConcurrent(t *testing.T) {
	p := newPlacer(t, Config{})
	var nodes []Node
	for i := range 200 {
		nodes = append(nodes, node(fmt.Sprint(i)))
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				d, err := p.Place(small, nodes)
				if err != nil {
					t.Error(err)
					return
				}
				p.Done(d.ID, (i+g)%2 == 0)
			}
		})
	}
	wg.Wait()
	if got := p.Inflight(); got != 8*150 {
		t.Errorf("%d in flight, want %d", got, 8*150)
	}
}

// BenchmarkPlace measures one Place on 1,000 and 10,000 nodes, a quarter to half full, with
// about a thousand placements in flight (a 1 s TTL at one placement per simulated millisecond).
func BenchmarkPlace(b *testing.B) {
	for _, n := range []int{1000, 10_000} {
		nodes := make([]Node, n)
		rng := rand.New(rand.NewPCG(1, 1))
		for i := range nodes {
			u := 0.25 + rng.Float64()/4
			nodes[i] = node(fmt.Sprintf("node-%05d", i), used(Resources{CPUs: 256 * u, MemoryBytes: int64(256 * gib * u), Sandboxes: int(200 * u)}))
		}
		for _, k := range []int{KRandom, DefaultK, KAll} {
			name := fmt.Sprintf("nodes=%d/k=%d", n, k)
			if k == KAll {
				name = fmt.Sprintf("nodes=%d/k=all", n)
			}
			b.Run(name, func(b *testing.B) {
				clock := &fakeClock{now: time.Unix(0, 0)}
				p := newPlacer(b, Config{K: k, Now: clock.Now, InflightTTL: time.Second})
				b.ReportAllocs()
				for b.Loop() {
					clock.Add(time.Millisecond)
					d, err := p.Place(small, nodes)
					if err != nil {
						b.Fatal(err)
					}
					p.Done(d.ID, true)
				}
			})
		}
	}
}

// TestPrefer: a preferred node (one caching the sandbox's volumes) wins while it fits, even
// when busier than the others; the least loaded of several preferred ones wins; a preferred
// node that does not fit, or is excluded, leaves placement as without the hint.
func TestPrefer(t *testing.T) {
	p := newPlacer(t, Config{K: 2})
	var nodes []Node
	for i := range 40 {
		nodes = append(nodes, node(fmt.Sprintf("n%02d", i)))
	}
	nodes[7].Used = Resources{CPUs: 200}
	nodes[9].Used = Resources{CPUs: 100}
	req := small
	req.Prefer = []string{"n07", "n09", "gone"}
	for range 5 {
		d, err := p.Place(req, nodes)
		if err != nil || d.Node != "n09" {
			t.Fatalf("Place with Prefer = %+v, %v; want n09 (the less loaded preferred node)", d, err)
		}
	}
	nodes[9].Used = Resources{CPUs: 256} // full
	if d, err := p.Place(req, nodes); err != nil || d.Node != "n07" {
		t.Fatalf("Place with n09 full = %+v, %v; want n07", d, err)
	}
	nodes[7].Used = Resources{CPUs: 256}
	d, err := p.Place(req, nodes)
	if err != nil || d.Node == "n07" || d.Node == "n09" {
		t.Fatalf("Place with every preferred node full = %+v, %v; want another node", d, err)
	}
	req.Exclude = []string{"n07", "n09"}
	nodes[7].Used, nodes[9].Used = Resources{}, Resources{}
	if d, err := p.Place(req, nodes); err != nil || d.Node == "n07" || d.Node == "n09" {
		t.Fatalf("Place with the preferred nodes excluded = %+v, %v; want another node", d, err)
	}
	if len(req.Exclude) != 2 {
		t.Fatalf("Place changed the caller's Exclude: %v", req.Exclude)
	}
}
