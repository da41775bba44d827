// Package placement chooses the edge node a new sandbox goes to in cluster mode. It filters the
// nodes that can take the sandbox (state, tier, runtime, labels, the project's node groups, free
// capacity after overcommit), samples K of them at random and takes the least loaded (the
// "power of K choices"), and counts this server replica's own recent placements against their
// nodes until the nodes' reports catch up, so a burst of creations does not herd onto the node
// that looked emptiest in the last report. The edge has the final word: it may refuse, and
// PlaceWithRetry then tries another node.
//
// The package is pure: no I/O, no goroutines; the caller passes the current node list (from the
// watcher) to every call. A Placer is safe for concurrent use. Its one lock, Placer.mu, guards
// the random source and the in-flight placements; the static filter of a full scan runs outside
// it, on the caller's node list, which Place only reads.
package placement

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// State is a node's place in its lifecycle, as the watcher sees it.
type State string

// Node states. Only a ready node takes new sandboxes; any other value (an unknown state
// included) keeps a node out.
const (
	StateReady    State = "ready"    // healthy and taking new sandboxes
	StateCordoned State = "cordoned" // healthy, kept out of placement by an operator
	StateDraining State = "draining" // its sandboxes are moving off or ending
	StateLost     State = "lost"     // no report within the grace period
)

// Resources is an amount of each resource placement accounts for.
type Resources struct {
	CPUs        float64 // CPUs (fractions allowed)
	MemoryBytes int64   // memory in bytes
	DiskBytes   int64   // writable disk in bytes
	Sandboxes   int     // sandboxes
}

func (r *Resources) add(o Resources) {
	r.CPUs += o.CPUs
	r.MemoryBytes += o.MemoryBytes
	r.DiskBytes += o.DiskBytes
	r.Sandboxes += o.Sandboxes
}

func (r *Resources) sub(o Resources) {
	r.CPUs -= o.CPUs
	r.MemoryBytes -= o.MemoryBytes
	r.DiskBytes -= o.DiskBytes
	r.Sandboxes -= o.Sandboxes
}

// Node is one edge as the last report described it.
type Node struct {
	Name     string
	State    State
	Tiers    []string          // sandbox tiers the edge runs ("container", "microvm")
	Runtimes []string          // runtimes the edge runs ("runc", "gvisor")
	Labels   map[string]string // matched by Request.Require, Pin and Avoid
	// Capacity is what the edge offers before overcommit. A zero amount means none: a node
	// that reports 0 sandboxes takes none, and one that reports 0 CPUs takes only sandboxes
	// that ask for no CPU.
	Capacity Resources
	// Used is what the edge's live sandboxes were granted when it reported.
	Used Resources
	// ReportedAt is when this server received the report, by this server's clock (not the
	// edge's): a confirmed placement stops being counted in flight once a report received after
	// its confirmation arrives, because that report includes it.
	ReportedAt time.Time
}

// Selector is a set of labels a node must all carry, with these values, to match. An empty
// selector matches every node.
type Selector map[string]string

// Request is one sandbox to place.
type Request struct {
	Tier        string // required tier; empty accepts any
	Runtime     string // required runtime; empty accepts any
	CPUs        float64
	MemoryBytes int64
	DiskBytes   int64
	// Require lists labels the node must carry (gpu=h100).
	Require Selector
	// Pin and Avoid are the project's node groups: when Pin is not empty a node must match at
	// least one of its selectors, and it must match none of Avoid's. They bound the blast radius
	// of one tenant (pinned to its own pool) or keep a project off a pool.
	Pin   []Selector
	Avoid []Selector
	// Exclude names nodes already tried for this sandbox.
	Exclude []string
	// Prefer names nodes to choose first when one of them fits (those caching the sandbox's
	// volumes): the least loaded fitting one of them wins; when none fits, placement is as if
	// Prefer were empty.
	Prefer []string
}

// Overcommit is how far each resource may be granted beyond a node's capacity: 4 lets a node
// with 64 CPUs grant 256. Sandbox counts are never overcommitted.
type Overcommit struct {
	CPU    float64 // default 4
	Memory float64 // default 1
	Disk   float64 // default 1
}

// Special values of Config.K.
const (
	DefaultK = 2  // K when Config.K is 0
	KRandom  = 1  // one node at random among those that fit
	KAll     = -1 // the least loaded of all nodes that fit
)

// Config sets a Placer's policy. Zero fields take the defaults.
type Config struct {
	// K is how many fitting nodes are sampled, uniformly without replacement; the least loaded
	// of them wins. 0 means DefaultK, 1 a random fitting node, and a negative K (or one at least
	// the number of fitting nodes) the least loaded of all.
	K int
	// Overcommit multiplies each node's capacity for the fit check and the load score.
	Overcommit Overcommit
	// InflightTTL is how long this Placer counts one of its placements against a node at most:
	// a report received after the placement was confirmed ends it sooner. Default 10 s; it
	// should exceed the creation RPC's timeout plus the report interval.
	InflightTTL time.Duration
	// Rand is the random source for sampling and ties (default: seeded at random). Tests pass a
	// seeded one.
	Rand rand.Source
	// Now is the clock in-flight expiry runs on (default time.Now).
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.K == 0 {
		c.K = DefaultK
	}
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Overcommit.CPU, 4)
	def(&c.Overcommit.Memory, 1)
	def(&c.Overcommit.Disk, 1)
	if c.InflightTTL == 0 {
		c.InflightTTL = 10 * time.Second
	}
	if c.Rand == nil {
		c.Rand = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate checks a configuration after defaults.
func (c Config) Validate() error {
	for _, o := range []struct {
		name string
		v    float64
	}{{"overcommit.cpu", c.Overcommit.CPU}, {"overcommit.memory", c.Overcommit.Memory}, {"overcommit.disk", c.Overcommit.Disk}} {
		if !(o.v > 0) || math.IsInf(o.v, 0) {
			return errdefs.Invalid(o.name, "must be a positive number, got %v", o.v)
		}
	}
	if c.InflightTTL < 0 {
		return errdefs.Invalid("inflight_ttl", "must not be negative, got %s", c.InflightTTL)
	}
	return nil
}

// ID names one placement to Done.
type ID uint64

// Decision is where a sandbox goes.
type Decision struct {
	Node string
	ID   ID
	// Score is the chosen node's load score with this sandbox and the in-flight placements on it
	// counted: the largest share of any resource, after overcommit (1 is full).
	Score float64
	// Candidates is how many nodes passed the filters on reported usage; 0 when a sample of K
	// fitting nodes was found without a full scan.
	Candidates int
}

// ErrRefused marks an edge's refusal at admission (its 409). The create call a PlaceWithRetry
// caller passes returns an error wrapping it, and placement tries another node. It is an
// errdefs.ErrExhausted.
var ErrRefused = fmt.Errorf("refused by the node's admission check: %w", errdefs.ErrExhausted)

// Placer chooses nodes and remembers its own recent placements. Make one with New; one per
// server process.
type Placer struct {
	cfg     Config
	scratch sync.Pool // *[]int32: candidate indices of a full scan

	mu      sync.Mutex
	rng     *rand.Rand           // protected by mu
	nextID  ID                   // protected by mu
	entries map[ID]*entry        // placements counted in flight, by ID; protected by mu
	byNode  map[string]*nodeLoad // the same, summed per node; protected by mu
	queue   []*entry             // the same in placement order, for TTL expiry (removed ones stay until popped); protected by mu
	head    int                  // queue[head:] are live or removed-but-not-popped; protected by mu
}

// entry is one placement counted in flight.
type entry struct {
	id        ID
	node      string
	res       Resources
	placed    time.Time
	confirmed time.Time // zero until Done(id, true)
	removed   bool
}

// nodeLoad is what one node carries in flight.
type nodeLoad struct {
	sum     Resources
	entries []*entry
}

// New returns a Placer with cfg's policy.
func New(cfg Config) (*Placer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Placer{
		cfg:     cfg,
		scratch: sync.Pool{New: func() any { return new([]int32) }},
		rng:     rand.New(cfg.Rand),
		entries: map[ID]*entry{},
		byNode:  map[string]*nodeLoad{},
	}, nil
}

// Config returns the Placer's configuration, defaults filled in.
func (p *Placer) Config() Config { return p.cfg }

// Load is a node's load score for usage used: the largest share of any resource (CPUs, memory,
// disk, sandboxes) granted, against capacity after overcommit. 1 is full; an overfull node
// scores above 1 (+Inf where it uses a resource it has none of).
func (p *Placer) Load(used, capacity Resources) float64 {
	return load(&used, &capacity, &p.cfg.Overcommit)
}

// Inflight returns how many placements this Placer still counts in flight.
func (p *Placer) Inflight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(p.cfg.Now())
	return len(p.entries)
}

// Done tells the Placer how placement id ended. admitted false (the edge refused, or the create
// surely never reached it) stops counting it at once. admitted true (the edge admitted it, or
// the outcome is unknown) keeps counting it until a report received after this call, which
// includes it, or InflightTTL after placement. Unknown or expired ids are ignored.
func (p *Placer) Done(id ID, admitted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entries[id]
	if e == nil {
		return
	}
	if !admitted {
		p.removeLocked(e)
		return
	}
	if e.confirmed.IsZero() {
		e.confirmed = p.cfg.Now()
	}
}

// Place chooses a node for req among nodes and counts the placement in flight until Done, a
// newer report or InflightTTL ends it. The error, when nothing fits, is a *NoFitError saying how
// many nodes each filter removed. Place reads nodes and never keeps or changes them.
func (p *Placer) Place(req Request, nodes []Node) (Decision, error) {
	if len(req.Prefer) > 0 {
		only := req
		only.Prefer, only.Exclude = nil, slices.Clip(req.Exclude)
		for i := range nodes {
			if !slices.Contains(req.Prefer, nodes[i].Name) {
				only.Exclude = append(only.Exclude, nodes[i].Name)
			}
		}
		if len(only.Exclude) < len(nodes) {
			if d, err := p.placeAll(only, nodes); err == nil {
				return d, nil
			}
		}
		req.Prefer = nil
	}
	return p.place(req, nodes)
}

// placeAll places req on the least loaded fitting node of all (K ignored): the preferred
// nodes are few, and each is worth its score.
func (p *Placer) placeAll(req Request, nodes []Node) (Decision, error) {
	q, err := compile(&req)
	if err != nil {
		return Decision{}, err
	}
	q.all = true
	return p.placeQuery(&q, nodes)
}

func (p *Placer) place(req Request, nodes []Node) (Decision, error) {
	q, err := compile(&req)
	if err != nil {
		return Decision{}, err
	}
	return p.placeQuery(&q, nodes)
}

func (p *Placer) placeQuery(q *query, nodes []Node) (Decision, error) {
	if !q.all {
		if d, ok := p.placeSampled(q, nodes); ok {
			return d, nil
		}
	}

	// Full scan: the static filters and reported usage first, without the lock.
	buf := p.scratch.Get().(*[]int32)
	defer p.scratch.Put(buf)
	cands := (*buf)[:0]
	var c counts
	for i := range nodes {
		n := &nodes[i]
		if r := q.static(n); r != fitOK {
			c.add(r, n.State)
			continue
		}
		if _, r := score(&n.Used, &Resources{}, &q.demand, &n.Capacity, &p.cfg.Overcommit); r != fitOK {
			c.add(r, n.State)
			continue
		}
		cands = append(cands, int32(i))
	}
	*buf = cands

	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.cfg.Now()
	p.expireLocked(now)
	k := p.cfg.K
	if q.all {
		k = KAll
	}
	best, bestScore, ties, found := -1, 0.0, 0, 0
	for i := 0; i < len(cands) && (k < 0 || found < k); i++ {
		if k > 0 && k < len(cands) {
			// Partial Fisher-Yates: cands[i] becomes a uniform draw from those not drawn yet.
			j := i + p.rng.IntN(len(cands)-i)
			cands[i], cands[j] = cands[j], cands[i]
		}
		n := &nodes[cands[i]]
		s, r := p.scoreLocked(q, n)
		if r != fitOK {
			c.add(r, n.State)
			continue
		}
		found++
		best, bestScore, ties = p.better(int(cands[i]), s, best, bestScore, ties)
	}
	if best < 0 {
		return Decision{}, c.err(q, len(nodes))
	}
	return p.recordLocked(q, &nodes[best], bestScore, now, len(cands)), nil
}

// Sampling before filtering: with K small and most nodes fitting, K fitting nodes turn up in a
// few draws and Place costs O(K), not O(nodes). It gives up after sampledDraws(K) draws and Place
// falls back to the full scan. Draws are uniform without replacement, so the first K fitting
// nodes are a uniform sample of the fitting ones either way.
const (
	maxSampledK   = 7
	maxDraws      = 8*maxSampledK + 8
	minNodesRatio = 2 // nodes per draw below which the full scan is cheaper than duplicate draws
)

func sampledDraws(k int) int { return 8*k + 8 }

func (p *Placer) placeSampled(q *query, nodes []Node) (Decision, bool) {
	k := p.cfg.K
	if k < 1 || k > maxSampledK || len(nodes) < minNodesRatio*sampledDraws(k) {
		return Decision{}, false
	}
	var drawn [maxDraws]int32
	nd := 0
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.cfg.Now()
	p.expireLocked(now)
	best, bestScore, ties, found := -1, 0.0, 0, 0
draws:
	for range sampledDraws(k) {
		i := int32(p.rng.IntN(len(nodes)))
		for _, d := range drawn[:nd] {
			if d == i {
				continue draws
			}
		}
		drawn[nd] = i
		nd++
		n := &nodes[i]
		if q.static(n) != fitOK {
			continue
		}
		s, r := p.scoreLocked(q, n)
		if r != fitOK {
			continue
		}
		best, bestScore, ties = p.better(int(i), s, best, bestScore, ties)
		if found++; found == k {
			return p.recordLocked(q, &nodes[best], bestScore, now, 0), true
		}
	}
	return Decision{}, false
}

// better keeps the lower score, choosing uniformly among equal ones (reservoir sampling: the
// n-th tie replaces the incumbent with probability 1/n). Preconditions: p.mu held.
func (p *Placer) better(i int, s float64, best int, bestScore float64, ties int) (int, float64, int) {
	switch {
	case best < 0 || s < bestScore:
		return i, s, 1
	case s == bestScore:
		ties++
		if p.rng.IntN(ties) == 0 {
			return i, s, ties
		}
		return best, bestScore, ties
	}
	return best, bestScore, ties
}

// scoreLocked scores n for q with this Placer's in-flight placements on n counted, first dropping
// those n's report already includes. Preconditions: p.mu held.
func (p *Placer) scoreLocked(q *query, n *Node) (float64, reason) {
	var in Resources
	if len(p.byNode) > 0 {
		if nl := p.byNode[n.Name]; nl != nil {
			for i := 0; i < len(nl.entries); {
				e := nl.entries[i]
				if !e.confirmed.IsZero() && n.ReportedAt.After(e.confirmed) {
					p.removeLocked(e) // swaps the last entry into i
					continue
				}
				i++
			}
			if len(nl.entries) > 0 {
				in = nl.sum
			}
		}
	}
	return score(&n.Used, &in, &q.demand, &n.Capacity, &p.cfg.Overcommit)
}

func (p *Placer) recordLocked(q *query, n *Node, s float64, now time.Time, cands int) Decision {
	p.nextID++
	e := &entry{id: p.nextID, node: n.Name, res: q.demand, placed: now}
	p.entries[e.id] = e
	nl := p.byNode[n.Name]
	if nl == nil {
		nl = &nodeLoad{}
		p.byNode[n.Name] = nl
	}
	nl.sum.add(e.res)
	nl.entries = append(nl.entries, e)
	if p.head > 1024 && p.head > len(p.queue)/2 {
		n := copy(p.queue, p.queue[p.head:])
		clear(p.queue[n:])
		p.queue, p.head = p.queue[:n], 0
	}
	p.queue = append(p.queue, e)
	return Decision{Node: n.Name, ID: e.id, Score: s, Candidates: cands}
}

// removeLocked stops counting e. Preconditions: p.mu held; e not removed.
func (p *Placer) removeLocked(e *entry) {
	e.removed = true
	delete(p.entries, e.id)
	nl := p.byNode[e.node]
	if i := slices.Index(nl.entries, e); i >= 0 {
		last := len(nl.entries) - 1
		nl.entries[i] = nl.entries[last]
		nl.entries[last] = nil
		nl.entries = nl.entries[:last]
	}
	nl.sum.sub(e.res)
	if len(nl.entries) == 0 {
		delete(p.byNode, e.node) // also clears rounding left in the CPU sum
	}
}

// expireLocked drops placements older than InflightTTL. Preconditions: p.mu held.
func (p *Placer) expireLocked(now time.Time) {
	for p.head < len(p.queue) {
		e := p.queue[p.head]
		if !e.removed && now.Sub(e.placed) < p.cfg.InflightTTL {
			return
		}
		if !e.removed {
			p.removeLocked(e)
		}
		p.queue[p.head] = nil
		p.head++
	}
	p.queue, p.head = p.queue[:0], 0
}

// PlaceWithRetry places req and calls try with the chosen node. When try's error wraps
// ErrRefused, the node is excluded and placement tries again, maxTries times in all (at least
// once). It returns the node that admitted the sandbox; a try error that is not a refusal is
// returned as is, without another try (the create may have happened). Every placement is
// reported to Done.
func (p *Placer) PlaceWithRetry(ctx context.Context, req Request, nodes []Node, try func(ctx context.Context, node string) error, maxTries int) (string, error) {
	maxTries = max(maxTries, 1)
	req.Exclude = slices.Clip(req.Exclude) // appends below must not write into the caller's array
	var refused []string
	var last error
	for range maxTries {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		d, err := p.Place(req, nodes)
		if err != nil {
			if last != nil {
				return "", fmt.Errorf("place sandbox after %d refusals (%s): %w; last refusal: %w", len(refused), strings.Join(refused, ", "), err, last)
			}
			return "", err
		}
		err = try(ctx, d.Node)
		if err == nil {
			p.Done(d.ID, true)
			return d.Node, nil
		}
		if !errors.Is(err, ErrRefused) {
			p.Done(d.ID, true) // the outcome is unknown: count it until the node reports
			return "", err
		}
		p.Done(d.ID, false)
		refused = append(refused, d.Node)
		req.Exclude = append(req.Exclude, d.Node)
		last = err
	}
	return "", fmt.Errorf("place sandbox: %d nodes refused it (%s): %w", len(refused), strings.Join(refused, ", "), last)
}

// query is a Request compiled for the per-node checks.
type query struct {
	req     *Request
	demand  Resources
	require []label
	pin     [][]label
	avoid   [][]label
	exclude []string
	exSet   map[string]bool // instead of exclude when it is long
	all     bool            // the least loaded of all fitting nodes, whatever K is
}

type label struct{ k, v string }

func compile(req *Request) (query, error) {
	switch {
	case !(req.CPUs >= 0) || math.IsInf(req.CPUs, 0):
		return query{}, errdefs.Invalid("cpus", "must be a non-negative number, got %v", req.CPUs)
	case req.MemoryBytes < 0:
		return query{}, errdefs.Invalid("memory_bytes", "must not be negative, got %d", req.MemoryBytes)
	case req.DiskBytes < 0:
		return query{}, errdefs.Invalid("disk_bytes", "must not be negative, got %d", req.DiskBytes)
	}
	q := query{
		req:     req,
		demand:  Resources{CPUs: req.CPUs, MemoryBytes: req.MemoryBytes, DiskBytes: req.DiskBytes, Sandboxes: 1},
		require: labels(req.Require),
	}
	for _, s := range req.Pin {
		q.pin = append(q.pin, labels(s))
	}
	for _, s := range req.Avoid {
		q.avoid = append(q.avoid, labels(s))
	}
	if len(req.Exclude) > 8 {
		q.exSet = make(map[string]bool, len(req.Exclude))
		for _, n := range req.Exclude {
			q.exSet[n] = true
		}
	} else {
		q.exclude = req.Exclude
	}
	return q, nil
}

func labels(s Selector) []label {
	if len(s) == 0 {
		return nil
	}
	l := make([]label, 0, len(s))
	for k, v := range s {
		l = append(l, label{k, v})
	}
	return l
}

func matches(l []label, node map[string]string) bool {
	for _, kv := range l {
		if v, ok := node[kv.k]; !ok || v != kv.v {
			return false
		}
	}
	return true
}

// reason is the filter that removed a node, in the order the filters run.
type reason uint8

const (
	fitOK reason = iota
	reasonNotReady
	reasonTried
	reasonTier
	reasonRuntime
	reasonLabels
	reasonPin
	reasonAvoid
	reasonCPU
	reasonMemory
	reasonDisk
	reasonSandboxes
	numReasons
)

// Filter names a filter in NoFitError.Removed.
type Filter string

// The filters, in the order they run; a node is counted under the first that removes it.
const (
	FilterNotReady  Filter = "not_ready" // State is not ready
	FilterTried     Filter = "tried"     // in Request.Exclude
	FilterTier      Filter = "tier"      // lacks Request.Tier
	FilterRuntime   Filter = "runtime"   // lacks Request.Runtime
	FilterLabels    Filter = "labels"    // lacks a label of Request.Require
	FilterPin       Filter = "pin"       // matches none of Request.Pin
	FilterAvoid     Filter = "avoid"     // matches one of Request.Avoid
	FilterCPU       Filter = "cpu"       // not enough CPU left
	FilterMemory    Filter = "memory"    // not enough memory left
	FilterDisk      Filter = "disk"      // not enough disk left
	FilterSandboxes Filter = "sandboxes" // at its sandbox limit
)

var filters = [numReasons]Filter{"", FilterNotReady, FilterTried, FilterTier, FilterRuntime, FilterLabels,
	FilterPin, FilterAvoid, FilterCPU, FilterMemory, FilterDisk, FilterSandboxes}

// static runs every filter but capacity.
func (q *query) static(n *Node) reason {
	if n.State != StateReady {
		return reasonNotReady
	}
	if q.exSet != nil {
		if q.exSet[n.Name] {
			return reasonTried
		}
	} else if slices.Contains(q.exclude, n.Name) {
		return reasonTried
	}
	if q.req.Tier != "" && !slices.Contains(n.Tiers, q.req.Tier) {
		return reasonTier
	}
	if q.req.Runtime != "" && !slices.Contains(n.Runtimes, q.req.Runtime) {
		return reasonRuntime
	}
	if !matches(q.require, n.Labels) {
		return reasonLabels
	}
	if len(q.pin) > 0 && !slices.ContainsFunc(q.pin, func(l []label) bool { return matches(l, n.Labels) }) {
		return reasonPin
	}
	if slices.ContainsFunc(q.avoid, func(l []label) bool { return matches(l, n.Labels) }) {
		return reasonAvoid
	}
	return fitOK
}

// fitSlack absorbs rounding in sums of fractional CPUs.
const fitSlack = 1e-9

func share(d, c float64) float64 {
	if c <= 0 {
		if d <= 0 {
			return 0
		}
		return math.Inf(1)
	}
	return d / c
}

// load is the load score without the fit check: max over resources of used/(capacity×overcommit).
func load(used, capacity *Resources, oc *Overcommit) float64 {
	return max(share(used.CPUs, capacity.CPUs*oc.CPU),
		share(float64(used.MemoryBytes), float64(capacity.MemoryBytes)*oc.Memory),
		share(float64(used.DiskBytes), float64(capacity.DiskBytes)*oc.Disk),
		share(float64(used.Sandboxes), float64(capacity.Sandboxes)))
}

// score returns the load score with demand placed, max over resources of (used+inflight+demand)/
// (capacity×overcommit), or the first resource that would go over 1.
func score(used, inflight, demand, capacity *Resources, oc *Overcommit) (float64, reason) {
	c := share(used.CPUs+inflight.CPUs+demand.CPUs, capacity.CPUs*oc.CPU)
	if c > 1+fitSlack {
		return 0, reasonCPU
	}
	m := share(float64(used.MemoryBytes+inflight.MemoryBytes+demand.MemoryBytes), float64(capacity.MemoryBytes)*oc.Memory)
	if m > 1+fitSlack {
		return 0, reasonMemory
	}
	d := share(float64(used.DiskBytes+inflight.DiskBytes+demand.DiskBytes), float64(capacity.DiskBytes)*oc.Disk)
	if d > 1+fitSlack {
		return 0, reasonDisk
	}
	s := share(float64(used.Sandboxes+inflight.Sandboxes+demand.Sandboxes), float64(capacity.Sandboxes))
	if s > 1+fitSlack {
		return 0, reasonSandboxes
	}
	return max(c, m, d, s), fitOK
}

// counts tallies the nodes each filter removed.
type counts struct {
	by       [numReasons]int
	notReady map[State]int
}

func (c *counts) add(r reason, s State) {
	c.by[r]++
	if r == reasonNotReady {
		if c.notReady == nil {
			c.notReady = map[State]int{}
		}
		c.notReady[s]++
	}
}

func (c *counts) err(q *query, nodes int) *NoFitError {
	e := &NoFitError{Nodes: nodes, Removed: map[Filter]int{}, NotReady: c.notReady, req: *q.req}
	for r := reasonNotReady; r < numReasons; r++ {
		if c.by[r] > 0 {
			e.Removed[filters[r]] = c.by[r]
		}
	}
	return e
}

// NoFitError says why no node could take a sandbox: how many nodes each filter removed. It is an
// errdefs.ErrExhausted when a capacity filter removed any node (the cluster, or the part of it
// the request may use, is full), and an errdefs.ErrUnavailable otherwise.
type NoFitError struct {
	Nodes    int            // nodes considered
	Removed  map[Filter]int // nodes removed by each filter (each counted under the first)
	NotReady map[State]int  // the not-ready nodes by state
	req      Request
}

// Unwrap returns the error's kind.
func (e *NoFitError) Unwrap() error {
	for _, f := range []Filter{FilterCPU, FilterMemory, FilterDisk, FilterSandboxes} {
		if e.Removed[f] > 0 {
			return errdefs.ErrExhausted
		}
	}
	return errdefs.ErrUnavailable
}

// Error reads like "no node can take this sandbox (2 CPUs, 4 GiB memory): 3 nodes: 1 not ready
// (1 cordoned), 2 lack tier microvm". Sizes of zero are left out.
func (e *NoFitError) Error() string {
	var b strings.Builder
	b.WriteString("no node can take this sandbox")
	var size []string
	if e.req.CPUs > 0 {
		size = append(size, fmtCPUs(e.req.CPUs))
	}
	if e.req.MemoryBytes > 0 {
		size = append(size, fmtBytes(e.req.MemoryBytes)+" memory")
	}
	if e.req.DiskBytes > 0 {
		size = append(size, fmtBytes(e.req.DiskBytes)+" disk")
	}
	if len(size) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(size, ", "))
	}
	if e.Nodes == 0 {
		b.WriteString(": the cluster has no nodes")
		return b.String()
	}
	fmt.Fprintf(&b, ": %d %s", e.Nodes, plural(e.Nodes, "node", "nodes"))
	sep := ": "
	part := func(f Filter, format string, args ...any) {
		if e.Removed[f] == 0 {
			return
		}
		b.WriteString(sep)
		sep = ", "
		fmt.Fprintf(&b, "%d ", e.Removed[f])
		fmt.Fprintf(&b, format, args...)
	}
	one := func(f Filter, singular, many string) string { return plural(e.Removed[f], singular, many) }
	var states []string
	for _, s := range slices.Sorted(maps.Keys(e.NotReady)) {
		name := string(s)
		if name == "" {
			name = "no state"
		}
		states = append(states, fmt.Sprintf("%d %s", e.NotReady[s], name))
	}
	part(FilterNotReady, "not ready (%s)", strings.Join(states, ", "))
	part(FilterTried, "already tried")
	part(FilterTier, "%s tier %s", one(FilterTier, "lacks", "lack"), e.req.Tier)
	part(FilterRuntime, "%s runtime %s", one(FilterRuntime, "lacks", "lack"), e.req.Runtime)
	part(FilterLabels, "%s labels %s", one(FilterLabels, "lacks", "lack"), fmtSelector(e.req.Require))
	pins := make([]string, len(e.req.Pin))
	for i, s := range e.req.Pin {
		pins[i] = fmtSelector(s)
	}
	part(FilterPin, "outside the project's node groups (%s)", strings.Join(pins, " or "))
	avoids := make([]string, len(e.req.Avoid))
	for i, s := range e.req.Avoid {
		avoids[i] = fmtSelector(s)
	}
	part(FilterAvoid, "in node groups the project avoids (%s)", strings.Join(avoids, " or "))
	part(FilterCPU, "%s room for %s", one(FilterCPU, "lacks", "lack"), fmtCPUs(e.req.CPUs))
	part(FilterMemory, "%s room for %s memory", one(FilterMemory, "lacks", "lack"), fmtBytes(e.req.MemoryBytes))
	part(FilterDisk, "%s room for %s disk", one(FilterDisk, "lacks", "lack"), fmtBytes(e.req.DiskBytes))
	part(FilterSandboxes, "%s at %s sandbox limit", one(FilterSandboxes, "is", "are"), one(FilterSandboxes, "its", "their"))
	capacity := 0
	for _, f := range []Filter{FilterCPU, FilterMemory, FilterDisk, FilterSandboxes} {
		capacity += e.Removed[f]
	}
	if capacity == e.Nodes {
		b.WriteString("; retry later or ask for less")
	}
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func fmtSelector(s Selector) string {
	if len(s) == 0 {
		return "{}"
	}
	parts := make([]string, 0, len(s))
	for k, v := range s {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

func fmtCPUs(c float64) string {
	if c == 1 {
		return "1 CPU"
	}
	return fmt.Sprintf("%g CPUs", c)
}

func fmtBytes(b int64) string {
	const mib, gib = 1 << 20, 1 << 30
	switch {
	case b >= gib:
		return fmt.Sprintf("%g GiB", math.Round(float64(b)/gib*10)/10)
	case b >= mib:
		return fmt.Sprintf("%g MiB", math.Round(float64(b)/mib*10)/10)
	}
	return fmt.Sprintf("%d B", b)
}
