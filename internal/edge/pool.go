package edge

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/cleanup"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/trace"
)

// Warm pools (issue 24). An environment with Warm N keeps up to N started sandboxes of its shape
// ready on each node: its tier (containers, or microvms booted ahead), its layers, its runtime,
// the tier's default limits, and a network slot (denying everything) when its default policy is
// networked. A create that
// names the environment and matches that shape claims one instead of starting a sandbox: the
// claim records it (quota, idempotency) under the ID it was started with, which no API user has
// seen, and sets what belongs to the request: project, labels, TTLs, environment variables for
// later commands, and the egress policy, applied to its slot at the claim. Anything else (other
// limits, a container's hostname, volumes, another fetch mode, network none against a networked
// pool) falls back to a fresh create.
//
// A microvm's limits (memory, vCPUs, disk) are fixed when it boots, so they are part of the
// match as a container's are. Its hostname is not: a pooled VM's agent is started claimable
// (corral-agent serve --claimable), its PID 1 keeping CAP_SYS_ADMIN, outside every command's
// bounding set, until the claim sets the sandbox's hostname through it (agentrpc SetHostname)
// and it drops the capability for good; every claim does this, with the request's hostname or
// the sandbox's ID, so a claimed VM holds nothing a fresh one does not.
//
// A pooled sandbox has no store record: it is not listed, not in the report, and charges no
// quota until claimed; it counts against the node's capacity (admitOnNode adds pooledUsage). At
// a restart its runtime state, network slot and layer mounts belong to no record, so reconcile
// removes them like any orphan; the pools then fill again.
//
// Goroutines: warmLoop (started by Start, ends with Close) syncs the pools with the store's
// environments every warmSync and on every change made through this edge; each pool has its
// own goroutine (run), ended by its context, which fills and shrinks it. One fill runs at a
// time on the node (warmFill), each followed by a pause half as long as it took and preceded by
// a quiet moment after the node's creates (warmQuietWait), and none while the node is near
// capacity or draining.
//
// Lock order: warmMu before warmPool.mu. The pool's mu never is held across a runtime call.

const (
	// warmSync is how often the pools follow the store (another edge of a cluster may change
	// an environment).
	warmSync = 5 * time.Second
	// warmCheck is how often a pool checks that its sandboxes still run (one that died, an
	// agent OOM-killed, is replaced instead of handed to a create).
	warmCheck = 30 * time.Second
	// warmQuiet is how long after the node's last create (a claim or a fresh one) a pool's fill
	// waits: the commands a client sends right after its create then do not share the CPUs
	// with a fill (one started at the claim made the claim's first exec 7.5 ms instead of 4 on
	// this 2-CPU host). warmQuietMax bounds the wait under a steady stream of creates, and a
	// pool holding fewer than target/4 (rounded down) fills at once (its claims would find it
	// empty).
	warmQuiet    = 30 * time.Millisecond
	warmQuietMax = 250 * time.Millisecond
	// warmIdle: a pool younger than this aims at its full size; one without a claim for this
	// long aims at 0. Between, it aims at the most claims seen in one minute of the last
	// warmIdle, at least 1.
	warmIdle = 10 * time.Minute
)

// warmKey names a pool: the environment, the runtime (RuntimeQEMU: the microvm tier), and
// whether its sandboxes are networked.
type warmKey struct {
	env       string
	runtime   string
	networked bool
}

// tier is the tier of the pool's sandboxes.
func (k warmKey) tier() string {
	if k.runtime == RuntimeQEMU {
		return TierMicroVM
	}
	return TierContainer
}

// warmSandbox is a started sandbox waiting in a pool.
type warmSandbox struct {
	rec      *store.Sandbox // never stored; ID, Lower, Limits, Fetch, NetSlot, Cwd, User
	socket   string
	net      *sandboxNet
	services bool // its layers started services (with the pool's environment variables)
	// accel is a microvm's Accelerator, recorded at its claim; boot how it started ("boot" or
	// "template"), for the log (a claimed one reports Boot "warm").
	accel, boot string
}

// warmPool is one environment's pool on this node.
type warmPool struct {
	key    warmKey
	cancel context.CancelFunc
	done   chan struct{}
	kick   chan struct{}

	hits, claims atomic.Int64

	mu sync.Mutex
	// env is the environment as last read from the store. Protected by mu.
	env model.Environment
	// ready are the sandboxes waiting, oldest first; stale are those taken out of ready because
	// the environment now resolves to other layers (a tag moved), for run to delete. Protected
	// by mu.
	ready, stale []*warmSandbox
	// filling are the records of sandboxes being started for the pool (layers mounted, not
	// ready yet): layer GC must see their blobs in use. Protected by mu.
	filling []*store.Sandbox
	// since is when the pool was made or its size last changed; lastClaim the last claim.
	// Protected by mu.
	since, lastClaim time.Time
	// perMinute counts claims in each of the last minutes (index: unix minute % len).
	// Protected by mu.
	perMinute [10]struct {
		minute int64
		n      int
	}
}

// target is the size the pool aims at now. Preconditions: p.mu is held.
func (p *warmPool) targetLocked(now time.Time) int {
	n := p.env.Warm
	if now.Sub(p.since) < warmIdle {
		return n
	}
	if now.Sub(p.lastClaim) > warmIdle {
		return 0
	}
	peak, cur := 1, now.Unix()/60
	for _, b := range p.perMinute {
		if cur-b.minute < int64(len(p.perMinute)) && b.n > peak {
			peak = b.n
		}
	}
	return min(peak, n)
}

// claimedLocked counts a claim. Preconditions: p.mu is held.
func (p *warmPool) claimedLocked(now time.Time) {
	p.claims.Add(1)
	p.lastClaim = now
	m := now.Unix() / 60
	b := &p.perMinute[m%int64(len(p.perMinute))]
	if b.minute != m {
		b.minute, b.n = m, 0
	}
	b.n++
}

func (p *warmPool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// warmState is the edge's pools; it lives in Edge.warm.
type warmState struct {
	mu    sync.Mutex
	pools map[warmKey]*warmPool // protected by mu
	// fill admits one pool fill at a time on the node.
	fill chan struct{}
	// sync asks warmLoop to follow the store now.
	sync chan struct{}
	// used sums the pooled sandboxes' limits, for the node's capacity.
	used struct {
		sync.Mutex
		r store.Resources
	}
}

// usesDigest reports whether a pooled sandbox (being started, ready, or stale and not yet
// deleted) has the layer blob digest in its rootfs: layer GC must not remove it.
func (w *warmState) usesDigest(digest string) bool {
	w.mu.Lock()
	pools := make([]*warmPool, 0, len(w.pools))
	for _, p := range w.pools {
		pools = append(pools, p)
	}
	w.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		found := slices.ContainsFunc(slices.Concat(p.ready, p.stale), func(ws *warmSandbox) bool { return slices.Contains(ws.rec.Lower, digest) }) ||
			slices.ContainsFunc(p.filling, func(r *store.Sandbox) bool { return slices.Contains(r.Lower, digest) })
		p.mu.Unlock()
		if found {
			return true
		}
	}
	return false
}

func newWarmState() *warmState {
	return &warmState{pools: map[warmKey]*warmPool{}, fill: make(chan struct{}, 1), sync: make(chan struct{}, 1)}
}

// warmKeyOf is the pool an environment keeps on this node, and ok false when it keeps none here.
func (e *Edge) warmKeyOf(env model.Environment) (warmKey, bool) {
	k := warmKey{env: env.Name, runtime: env.Runtime}
	switch {
	case env.Tier == TierMicroVM:
		k.runtime = RuntimeQEMU
	case k.runtime == "":
		k.runtime = RuntimeRunc
	}
	if k.runtime != RuntimeRunc {
		if err := e.rt.Available(k.runtime); err != nil {
			return k, false
		}
	}
	if env.Network != nil {
		c, err := e.compileNetwork(env.Network)
		if err != nil {
			return k, false
		}
		k.networked = c.Mode != model.NetworkNone
	}
	return k, env.Warm > 0
}

// warmChanged asks warmLoop to follow the store now (an environment changed through this edge).
func (e *Edge) warmChanged() {
	select {
	case e.warm.sync <- struct{}{}:
	default:
	}
}

// warmLoop keeps the pools those of the store's environments until the edge closes, then
// drains them.
func (e *Edge) warmLoop() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.removeStaleResolvConfs()
	t := time.NewTicker(warmSync)
	defer t.Stop()
	for {
		if err := e.syncWarm(ctx); err != nil {
			e.log.Warn("sync warm pools", "err", err)
		}
		select {
		case <-e.stop:
			e.stopWarm()
			close(e.warmDone)
			return
		case <-t.C:
		case <-e.warm.sync:
		}
	}
}

// syncWarm starts the pools the store's environments ask for, updates their sizes, and drains
// the others.
func (e *Edge) syncWarm(ctx context.Context) error {
	want := map[warmKey]model.Environment{}
	if !e.draining.Load() {
		envs, err := e.settings.WarmEnvironments(ctx)
		if err != nil {
			return err
		}
		for _, env := range envs {
			if k, ok := e.warmKeyOf(env); ok {
				want[k] = env
			}
		}
	}
	w := e.warm
	w.mu.Lock()
	var gone []*warmPool
	for k, p := range w.pools {
		if _, ok := want[k]; !ok {
			gone = append(gone, p)
			delete(w.pools, k)
		}
	}
	for k, env := range want {
		p := w.pools[k]
		if p == nil {
			pctx, cancel := context.WithCancel(ctx)
			p = &warmPool{key: k, cancel: cancel, done: make(chan struct{}), kick: make(chan struct{}, 1), env: env, since: time.Now()}
			w.pools[k] = p
			e.log.Info("warm pool started", "environment", k.env, "runtime", k.runtime, "networked", k.networked, "size", env.Warm)
			go e.runWarm(pctx, p)
			continue
		}
		p.mu.Lock()
		if p.env.Warm != env.Warm {
			p.since = time.Now()
		}
		p.env = env
		p.mu.Unlock()
		p.poke()
	}
	w.mu.Unlock()
	endWarm(gone)
	return nil
}

// stopWarm ends every pool and waits until each has deleted its sandboxes.
func (e *Edge) stopWarm() {
	var pools []*warmPool
	e.warm.mu.Lock()
	for k, p := range e.warm.pools {
		pools = append(pools, p)
		delete(e.warm.pools, k)
	}
	e.warm.mu.Unlock()
	endWarm(pools)
}

// endWarm ends pools and waits until each has deleted its sandboxes.
func endWarm(pools []*warmPool) {
	for _, p := range pools {
		p.cancel()
	}
	for _, p := range pools {
		<-p.done
	}
}

// runWarm is a pool's goroutine: it fills the pool up to its target, one sandbox at a time,
// and deletes what is over it, until ctx ends; then it deletes every sandbox left.
func (e *Edge) runWarm(ctx context.Context, p *warmPool) {
	defer close(p.done)
	defer e.drainWarm(p)
	log := e.log.With("environment", p.key.env, "runtime", p.key.runtime)
	backoff := time.Duration(0)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	lastCheck := time.Now()
	waiting := "" // why the pool last could not grow, as logged
	for {
		if time.Since(lastCheck) >= warmCheck {
			lastCheck = time.Now()
			e.checkWarm(ctx, p)
		}
		for ctx.Err() == nil {
			p.mu.Lock()
			target, have := p.targetLocked(time.Now()), len(p.ready)
			var surplus *warmSandbox
			switch {
			case len(p.stale) > 0:
				surplus, p.stale = p.stale[0], p.stale[1:]
			case have > target:
				surplus, p.ready = p.ready[0], p.ready[1:]
			}
			p.mu.Unlock()
			if surplus != nil {
				e.deleteWarm(surplus)
				continue
			}
			if have >= target {
				break
			}
			if why := e.warmNoRoom(p.key.tier()); why != "" {
				if why != waiting { // said once, not every second
					log.Info("warm pool waits for room", "why", why, "ready", have, "target", target)
					waiting = why
				}
				break
			}
			waiting = ""
			took, err := e.fillWarm(ctx, p)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				backoff = min(max(2*backoff, time.Second), 30*time.Second)
				log.Warn("fill warm pool", "err", err, "retry_in", backoff)
				if !sleepCtx(ctx, backoff) {
					break
				}
				continue
			}
			backoff = 0
			// Paced: the node's CPUs go to running sandboxes at least a third of the time.
			if !sleepCtx(ctx, took/2) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-t.C:
		}
	}
}

// warmQuietWait waits before a fill of a pool holding have of its target sandboxes while
// warmQuietLeft says so, for at most warmQuietMax. It reports whether ctx is still live.
func (e *Edge) warmQuietWait(ctx context.Context, have, target int) bool {
	deadline := time.Now().Add(warmQuietMax)
	for {
		now := time.Now()
		wait := min(warmQuietLeft(now, time.Unix(0, e.createdAt.Load()), e.creating.Load() > 0, have, target), deadline.Sub(now))
		if wait <= 0 {
			return ctx.Err() == nil
		}
		if !sleepCtx(ctx, wait) {
			return false
		}
	}
}

// warmQuietLeft is how long a fill should still wait at now, the node's last create having
// ended at last and one being in flight or not: until warmQuiet after the last, at least
// warmQuiet while one is in flight, and not at all for a pool holding fewer than target/4
// (rounded down: a pool of 1-3 always waits, its claims being few).
func warmQuietLeft(now, last time.Time, inFlight bool, have, target int) time.Duration {
	if have < target/4 {
		return 0
	}
	if inFlight {
		return warmQuiet
	}
	return warmQuiet - now.Sub(last)
}

// checkWarm deletes the pool's sandboxes that no longer run.
func (e *Edge) checkWarm(ctx context.Context, p *warmPool) {
	p.mu.Lock()
	ready := slices.Clone(p.ready)
	p.mu.Unlock()
	for _, w := range ready {
		st, err := e.rt.Status(ctx, w.rec.ID)
		if ctx.Err() != nil {
			return
		}
		if err == nil && st.State == runtime.StateRunning {
			continue
		}
		p.mu.Lock()
		i := slices.Index(p.ready, w)
		if i >= 0 {
			p.ready = slices.Delete(p.ready, i, i+1)
		}
		p.mu.Unlock()
		if i >= 0 {
			e.log.Warn("a warm pool's sandbox stopped running; replacing it", "environment", p.key.env, "sandbox", w.rec.ID, "state", st.State, "err", err)
			e.deleteWarm(w)
		}
	}
}

// sleepCtx waits d or until ctx ends (false then).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// warmNoRoom says why pools do not grow now, or "" when they may: the node is draining, or near
// its capacity (90% of any bound, counting one more sandbox of tier's default limits).
func (e *Edge) warmNoRoom(tier string) string {
	if e.draining.Load() {
		return "the node is draining"
	}
	// The host itself: a pool never takes the last 5% of its memory.
	if total, avail := hostMemory(); total > 0 && avail < total/20 {
		return "the host has less than 5% of its memory available"
	}
	c := e.cfg.Capacity
	if c == nil {
		return ""
	}
	used := e.withPooled(e.nodeUsage())
	// A pool's sandboxes have their tier's default limits (its create names none).
	b, _ := e.policy.Bounds(tier)
	def := b.Default
	for _, r := range []struct {
		name       string
		u, add, of float64
	}{
		{"sandboxes", float64(used.Sandboxes), 1, float64(c.Sandboxes)},
		{"cpus", used.CPUs, def.CPUs, c.CPUs},
		{"memory", float64(used.MemoryBytes), float64(def.MemoryBytes), float64(c.MemoryBytes)},
		{"disk", float64(used.DiskBytes), float64(def.DiskBytes), float64(c.DiskBytes)},
	} {
		if r.of > 0 && r.u+r.add > 0.9*r.of {
			return "one more sandbox would take the node's " + r.name + " past 90% of its capacity"
		}
	}
	return ""
}

// hostMemory returns MemTotal and MemAvailable of /proc/meminfo in bytes (0s when unread).
func hostMemory() (total, avail int64) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "MemTotal":
			total = n << 10
		case "MemAvailable":
			avail = n << 10
		}
	}
	return total, avail
}

// withPooled adds the pooled sandboxes to a node's usage.
func (e *Edge) withPooled(u store.Resources) store.Resources {
	e.warm.used.Lock()
	defer e.warm.used.Unlock()
	r := e.warm.used.r
	u.Sandboxes += r.Sandboxes
	u.CPUs += r.CPUs
	u.MemoryBytes += r.MemoryBytes
	u.DiskBytes += r.DiskBytes
	return u
}

func (e *Edge) countPooled(l model.Limits, sign int) {
	e.warm.used.Lock()
	defer e.warm.used.Unlock()
	r := &e.warm.used.r
	r.Sandboxes += sign
	r.CPUs += float64(sign) * l.CPUs
	r.MemoryBytes += int64(sign) * l.MemoryBytes
	r.DiskBytes += int64(sign) * l.DiskBytes
}

// fillWarm starts one sandbox for p, waiting its turn among the node's fills, and returns how
// long the start took.
func (e *Edge) fillWarm(ctx context.Context, p *warmPool) (time.Duration, error) {
	select {
	case e.warm.fill <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-e.warm.fill }()
	// With the token, so that a fill queued behind another pool's waits for quiet too.
	p.mu.Lock()
	have, target := len(p.ready), p.targetLocked(time.Now())
	p.mu.Unlock()
	if !e.warmQuietWait(ctx, have, target) {
		return 0, ctx.Err()
	}
	start := time.Now()
	p.mu.Lock()
	env := p.env
	p.mu.Unlock()
	req := model.CreateRequest{Environment: env.Name, Project: env.Project, Tier: p.key.tier(), Runtime: p.key.runtime,
		Network: &model.NetworkPolicy{Mode: model.NetworkNone}}
	if p.key.networked {
		// Networked, denying everything until a claim applies the create's policy.
		req.Network = &model.NetworkPolicy{Mode: model.NetworkAllowlist}
	}
	e.layersMu.RLock()
	adm, err := e.admit(ctx, req, false)
	if err != nil {
		e.layersMu.RUnlock()
		return 0, err
	}
	rec := adm.rec
	lower, err := e.prepareLayers(ctx, rec, adm.fill)
	if err == nil {
		// Seen by layer GC from here on: the read lock goes before the sandbox is ready.
		p.mu.Lock()
		p.filling = append(p.filling, rec)
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			p.filling = slices.DeleteFunc(p.filling, func(r *store.Sandbox) bool { return r == rec })
			p.mu.Unlock()
		}()
	}
	e.layersMu.RUnlock()
	if err != nil {
		return 0, fmt.Errorf("mount layers: %w", err)
	}
	// What the pool's sandbox holds is given back if it never gets to the pool.
	var undo cleanup.Stack
	defer undo.Unwind()
	undo.Push(func() { e.releaseLayers(rec, nil) })
	var nw *sandboxNet
	var resolv string
	if adm.net.Mode != model.NetworkNone {
		if nw, resolv, err = e.attachNetwork(ctx, rec, adm.net); err != nil {
			return 0, err
		}
		undo.Push(func() { e.detachNetwork(rec.ID, nw) })
	}
	spec, err := e.launchSpec(ctx, adm, lower, nw, resolv, false, e.log.With("sandbox", rec.ID, "environment", p.key.env))
	if err != nil {
		return 0, err
	}
	if rec.Tier == TierMicroVM {
		// The claim sets the hostname through the agent (see the package comment).
		spec.AgentArgs = append(spec.AgentArgs, agentrpc.ClaimableFlag)
	}
	rsb, err := e.rt.Create(ctx, spec)
	if err != nil {
		return 0, err
	}
	// From here on the sandbox is the pool's: deleteWarm gives back all it holds.
	undo.Release()
	w := &warmSandbox{rec: rec, socket: rsb.AgentSocket, net: nw, services: len(adm.services) > 0, accel: rsb.Accelerator}
	if rec.Tier == TierMicroVM {
		w.boot = "boot"
		if rsb.Template != "" {
			w.boot = "template"
		}
	}
	e.countPooled(rec.Limits, 1)
	if w.services {
		e.startServices(ctx, newSandbox(rec, rsb.AgentSocket), rec, adm.services, true)
	}
	p.mu.Lock()
	stale := ctx.Err() != nil
	if !stale {
		p.ready = append(p.ready, w)
	}
	p.mu.Unlock()
	if stale {
		e.deleteWarm(w)
		return 0, ctx.Err()
	}
	took := time.Since(start)
	e.log.Debug("warm sandbox ready", "environment", p.key.env, "sandbox", rec.ID, "tier", rec.Tier, "boot", w.boot, "took", took)
	return took, nil
}

// deleteWarm deletes a pooled sandbox and everything it held.
func (e *Edge) deleteWarm(w *warmSandbox) {
	ctx := context.Background()
	if err := e.rt.Delete(ctx, w.rec.ID); err != nil {
		e.log.Error("delete a warm pool's sandbox", "sandbox", w.rec.ID, "err", err)
	}
	e.detachNetwork(w.rec.ID, w.net)
	e.releaseLayers(w.rec, nil)
	e.countPooled(w.rec.Limits, -1)
}

// drainWarm deletes every sandbox of a pool that has ended.
func (e *Edge) drainWarm(p *warmPool) {
	p.mu.Lock()
	ready := append(p.ready, p.stale...)
	p.ready, p.stale = nil, nil
	p.mu.Unlock()
	for _, w := range ready {
		e.deleteWarm(w)
	}
	if len(ready) > 0 {
		e.log.Info("warm pool drained", "environment", p.key.env, "runtime", p.key.runtime, "sandboxes", len(ready))
	}
}

// removeStaleResolvConfs removes the resolv.conf files of sandboxes that no longer exist (the
// pooled sandboxes of an earlier run, which reconcile removed as orphans). Called after
// reconcile.
func (e *Edge) removeStaleResolvConfs() {
	if e.cfg.Net == nil {
		return
	}
	names, _ := filepath.Glob(filepath.Join(e.cfg.Net.Dir, "*.resolv.conf"))
	for _, n := range names {
		id := strings.TrimSuffix(filepath.Base(n), ".resolv.conf")
		if e.lookup(id) == nil && ValidID(id) {
			os.Remove(n)
		}
	}
}

// claimWarm serves a create from a warm pool when the request matches the pool's shape: ok
// false means there is no match (or nothing ready) and the create goes on as usual. adm is the
// admitted request; the caller holds e.layersMu for reading.
//
// A claimed sandbox already holds its layers, network slot and runtime sandbox; once the store
// admits the request's record, each of them gets its undo on a cleanup stack (as launch's
// steps do), so a failure after the claim ends the record failed and leaves nothing.
func (e *Edge) claimWarm(ctx context.Context, req model.CreateRequest, adm *admission, key *store.Idempotency) (_ *store.Sandbox, ok bool, err error) {
	rec := adm.rec
	p, w := e.takeWarm(req, adm)
	if w == nil {
		if p != nil {
			p.poke()
		}
		return nil, false, nil
	}
	defer p.poke()
	ctx, span := trace.Start(ctx, trace.Claim, trace.Sandbox(w.rec.ID), trace.Project(rec.Project), trace.Tier(rec.Tier))
	defer span.End(&err)
	put := func() {
		p.mu.Lock()
		p.ready = append(p.ready, w)
		p.mu.Unlock()
	}
	// The sandbox becomes the request's: the ID (and default hostname) it was started with,
	// which nobody has seen, its network slot, and everything else from the request.
	rec.ID = w.rec.ID
	if req.Hostname == "" {
		rec.Hostname = w.rec.ID
	}
	rec.NetSlot, rec.NetworkAddress = w.rec.NetSlot, w.rec.NetworkAddress
	if e.draining.Load() {
		put()
		return nil, false, nil
	}
	if err := e.admitRecord(ctx, rec, key); err != nil {
		// Refused (quota, a replayed idempotency key): no sandbox was made, so no claim either.
		p.claims.Add(-1)
		put()
		if _, quota := errors.AsType[*iam.QuotaError](err); quota {
			e.bus.Publish(events.Event{Type: events.QuotaRefused, Project: rec.Project, Tier: rec.Tier, Reason: err.Error()})
		}
		return nil, true, err
	}
	e.countPooled(w.rec.Limits, -1)
	log := e.log.With("sandbox", rec.ID, "project", rec.Project)
	e.emit(events.Created, rec, "")
	e.usageCreated(ctx, rec)
	var undo cleanup.Stack
	var cause error // the failure, for the record's reason
	undo.Push(func() { e.finish(context.WithoutCancel(ctx), rec, model.StateFailed, "error: "+cause.Error()) })
	undo.Push(func() { e.releaseLayers(rec, nil) })
	undo.Push(func() {
		e.detachNetwork(rec.ID, w.net)
		rec.NetSlot = nil
	})
	undo.Push(func() {
		if err := e.rt.Delete(context.WithoutCancel(ctx), rec.ID); err != nil {
			log.Error("delete a claimed warm sandbox", "err", err)
		}
	})
	fail := func(err error) (*store.Sandbox, bool, error) {
		log.Error("claim a warm sandbox", "err", err)
		cause = err
		undo.Unwind()
		return nil, true, fmt.Errorf("create sandbox %s: %w", rec.ID, err)
	}
	if w.net != nil {
		if err := e.cfg.Net.Manager.Apply(w.net.slot, e.slotPolicy(adm.net), false); err != nil {
			return fail(err)
		}
		w.net.policy.Store(adm.net)
	}
	sb := newSandbox(rec, w.socket)
	sb.net = w.net
	if rec.Tier == TierMicroVM {
		// The request's hostname, or its ID, which it booted with; either way the agent's PID 1
		// drops the capability it kept for this (see the package comment).
		if err := sb.agent.SetHostname(ctx, rec.Hostname); err != nil {
			return fail(fmt.Errorf("set the hostname: %w", err))
		}
		rec.Accelerator, rec.Boot = w.accel, "warm"
	}
	// The agent started with the image's environment; the request's is added to each command's
	// (the request's win, as at a fresh create).
	sb.env = slices.Clip(req.Env)
	sb.touch()
	rec.State = model.StateRunning
	e.mu.Lock()
	e.live[rec.ID] = sb
	e.mu.Unlock()
	undo.Push(func() { e.dropLive(rec.ID) })
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		return fail(err)
	}
	undo.Release()
	p.hits.Add(1)
	log.Info("sandbox created", "tier", rec.Tier, "base", rec.Base, "warm", true)
	e.emit(events.Started, rec, "")
	return rec, true, nil
}

// takeWarm takes a ready sandbox that matches the admitted request out of its warm pool,
// counting the claim: w nil means none (p, the request's pool if there is one, then wants a
// poke to refill). Ready sandboxes made before a tag of the environment moved go to the stale
// list on the way.
func (e *Edge) takeWarm(req model.CreateRequest, adm *admission) (p *warmPool, w *warmSandbox) {
	rec := adm.rec
	if (rec.Tier != TierContainer && rec.Tier != TierMicroVM) || req.Environment == "" {
		return nil, nil
	}
	k := warmKey{env: req.Environment, runtime: rec.Runtime, networked: adm.net.Mode != model.NetworkNone}
	e.warm.mu.Lock()
	p = e.warm.pools[k]
	if p == nil {
		// A pool of the environment with another shape still counts the claim as a miss.
		for pk, q := range e.warm.pools {
			if pk.env == req.Environment {
				q.mu.Lock()
				q.claimedLocked(time.Now())
				q.mu.Unlock()
				break
			}
		}
	}
	e.warm.mu.Unlock()
	if p == nil {
		return nil, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.claimedLocked(time.Now())
	// A container's hostname is its UTS namespace's, set by the runtime; a microvm's is set at
	// the claim.
	if (req.Hostname != "" && rec.Tier == TierContainer) || len(req.Volumes) > 0 {
		return p, nil
	}
	for i := 0; i < len(p.ready) && w == nil; i++ {
		c := p.ready[i]
		switch {
		case !slices.Equal(c.rec.Lower, rec.Lower):
			// Made before a tag of the environment moved: never claimable again.
			p.stale = append(p.stale, c)
			p.ready = slices.Delete(p.ready, i, i+1)
			i--
		case c.rec.Limits == rec.Limits && c.rec.Fetch == rec.Fetch && !(c.services && len(req.Env) > 0):
			w = c
			p.ready = slices.Delete(p.ready, i, i+1)
		}
	}
	return p, w
}

// WarmFigures returns this node's warm pools' figures by environment (its pools of every
// runtime summed): what the API shows under corral up, and a cluster's edge reports with its
// heartbeats.
func (e *Edge) WarmFigures() map[string]store.WarmFigures {
	e.warm.mu.Lock()
	defer e.warm.mu.Unlock()
	now := time.Now()
	out := make(map[string]store.WarmFigures, len(e.warm.pools))
	for k, p := range e.warm.pools {
		p.mu.Lock()
		f := store.WarmFigures{Ready: len(p.ready), Target: p.targetLocked(now)}
		p.mu.Unlock()
		f.Hits, f.Claims = p.hits.Load(), p.claims.Load()
		sum := out[k.env]
		sum.Add(f)
		out[k.env] = sum
	}
	return out
}

// writeWarmMetrics writes the pools' gauges and counters in the Prometheus text format.
func (e *Edge) writeWarmMetrics(b *strings.Builder) {
	type row struct {
		k             warmKey
		ready, target int
		hits, claims  int64
	}
	var rows []row
	e.warm.mu.Lock()
	now := time.Now()
	for k, p := range e.warm.pools {
		p.mu.Lock()
		rows = append(rows, row{k: k, ready: len(p.ready), target: p.targetLocked(now), hits: p.hits.Load(), claims: p.claims.Load()})
		p.mu.Unlock()
	}
	e.warm.mu.Unlock()
	slices.SortFunc(rows, func(a, c row) int {
		return strings.Compare(a.k.env+"/"+a.k.runtime, c.k.env+"/"+c.k.runtime)
	})
	fmt.Fprintf(b, "# HELP corral_warm_ready Started sandboxes ready in a warm pool of this node.\n# TYPE corral_warm_ready gauge\n")
	for _, r := range rows {
		fmt.Fprintf(b, "corral_warm_ready{environment=%q,runtime=%q,networked=\"%t\"} %d\n", r.k.env, r.k.runtime, r.k.networked, r.ready)
	}
	fmt.Fprintf(b, "# HELP corral_warm_target The size a warm pool of this node aims at now.\n# TYPE corral_warm_target gauge\n")
	for _, r := range rows {
		fmt.Fprintf(b, "corral_warm_target{environment=%q,runtime=%q,networked=\"%t\"} %d\n", r.k.env, r.k.runtime, r.k.networked, r.target)
	}
	fmt.Fprintf(b, "# HELP corral_warm_claims_total Creates naming an environment with a warm pool here, and those served from it (hit).\n# TYPE corral_warm_claims_total counter\n")
	for _, r := range rows {
		fmt.Fprintf(b, "corral_warm_claims_total{environment=%q,runtime=%q,networked=\"%t\",hit=\"true\"} %d\n", r.k.env, r.k.runtime, r.k.networked, r.hits)
		fmt.Fprintf(b, "corral_warm_claims_total{environment=%q,runtime=%q,networked=\"%t\",hit=\"false\"} %d\n", r.k.env, r.k.runtime, r.k.networked, r.claims-r.hits)
	}
}

// SetEnvironmentWarm changes an environment's pool size (PATCH /v1/environments/{name}).
func (e *Edge) SetEnvironmentWarm(ctx context.Context, name string, warm int) (model.Environment, error) {
	if err := catalog.CheckWarm(warm); err != nil {
		return model.Environment{}, err
	}
	env, err := e.store.SetEnvironmentWarm(ctx, name, warm)
	if err != nil {
		return env, err
	}
	e.settingsWritten(ctx)
	return env, nil
}

// DeleteEnvironment removes a saved environment and drains its pools (sandboxes made from it
// are not affected).
func (e *Edge) DeleteEnvironment(ctx context.Context, name string) error {
	if err := e.store.DeleteEnvironment(ctx, name); err != nil {
		return err
	}
	e.settingsWritten(ctx)
	return nil
}
