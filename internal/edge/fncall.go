package edge

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// The fncall tier. An fncall environment (corral.FncallEnv) names layers, limits and a pool of
// warm containers; a call (POST /v1/fncall/{name}) takes a ready container, runs one command
// isolated inside it and gives the container back. Isolation is the agent's (--calls): each
// call runs in fresh mount, PID, IPC and UTS namespaces on a private overlay whose writable layer
// is a tmpfs made for the call (agentrpc CallPrep), with its own /tmp; the command's processes
// die with the call's PID namespace, and CallEnd unmounts the tmpfs and checks that nothing is
// left. A container whose cleanup is not clean is destroyed and replaced, never reused.
//
// Pools: PoolMin containers are kept ready; under load the pool grows to PoolMax; calls that find
// no container wait in a FIFO queue of QueueDepth for at most QueueWait, then get 429 with
// Retry-After. Idle containers beyond PoolMin are removed after poolShrinkAfter. Pool containers
// are ordinary sandboxes of tier fncall (listed, labelled corral.fncall=NAME) that the data plane
// refuses; a restart of corral destroys them and builds the pools afresh.

// TierFncall is the tier of the containers of fncall pools.
const TierFncall = catalog.TierFncall

const (
	fncallLabel       = "corral.fncall"
	defaultCallCwd    = "/call"
	maxCallFiles      = 1024
	maxCallOutputs    = 64
	maxOutputFile     = 16 << 20
	defaultCallOutput = 1 << 20
	maxCallOutput     = 16 << 20
	poolShrinkAfter   = time.Minute
	maxPoolSize       = 256
	maxPythonBytes    = 16 << 20
)

// fncallPool is the pool of one fncall environment.
type fncallPool struct {
	e                  *Edge
	env                model.FncallEnv
	projectID          string // the environment's project; its path is read fresh (projects move)
	timeout, queueWait time.Duration
	log                *slog.Logger

	mu                        sync.Mutex
	idle                      []*sandbox
	busy, starting            int
	waiters                   []chan *sandbox // FIFO; each gets one container, already counted busy
	calls, rejected, replaced int64
	lastUse                   time.Time
	lastErr                   string
	closed                    bool
	// failures counts container starts that failed in a row; no start is tried before retryAt.
	failures int
	retryAt  time.Time
	// warm holds each container's warm interpreter (warm.go); nil while one is being started.
	warm map[string]*warmCall
}

// retryAfter is an ErrExhausted error that tells the client when to try again (429 Retry-After).
type retryAfter struct {
	err   error
	after time.Duration
}

func (r *retryAfter) Error() string { return r.err.Error() }
func (r *retryAfter) Unwrap() error { return r.err }

// RetryAfter returns how long a client should wait before retrying a call refused by err, or 0.
func RetryAfter(err error) time.Duration {
	var ra *retryAfter
	if errors.As(err, &ra) {
		return ra.after
	}
	return 0
}

// CreateFncallEnv validates and saves an fncall environment and starts its pool.
func (e *Edge) CreateFncallEnv(ctx context.Context, env model.FncallEnv) (model.FncallEnv, error) {
	p, err := e.newPool(ctx, env)
	if err != nil {
		return model.FncallEnv{}, err
	}
	p.env.CreatedAt = time.Now().UTC()
	e.fncallMu.Lock()
	defer e.fncallMu.Unlock()
	if _, ok := e.pools[p.env.Name]; ok {
		return model.FncallEnv{}, errdefs.Conflict("fncall environment %s exists; delete it first or use another name", p.env.Name)
	}
	if err := e.store.PutFncallEnv(ctx, p.env); err != nil {
		return model.FncallEnv{}, err
	}
	e.settingsWritten(ctx) // a sync of the pools must find it
	e.pools[p.env.Name] = p
	p.maintain()
	e.log.Info("fncall environment created", "fncall", p.env.Name, "base", p.env.Base, "pool_min", p.env.PoolMin, "pool_max", p.env.PoolMax)
	return p.view(), nil
}

// newPool validates env, fills its defaults and returns its (not yet started) pool.
func (e *Edge) newPool(ctx context.Context, env model.FncallEnv) (*fncallPool, error) {
	timeout, queueWait, err := CheckFncallEnv(&env, e.policy.MaxTTL())
	if err != nil {
		return nil, err
	}
	p := &fncallPool{e: e, log: e.log.With("fncall", env.Name), warm: map[string]*warmCall{}, timeout: timeout, queueWait: queueWait}
	// The containers' composition and limits pass the same admission as a sandbox's, which
	// resolves the project too (the servers, on a cluster's edge).
	adm, err := e.admit(ctx, p.containerRequest(env, env.Project), true)
	if err != nil {
		return nil, err
	}
	p.projectID, env.Project, env.Limits = adm.rec.ProjectID, adm.rec.Project, adm.rec.Limits
	if err := CheckFncallFiles(env); err != nil {
		return nil, err
	}
	env.Pool = nil
	p.env = env
	return p, nil
}

// CheckFncallEnv validates an fncall environment's own fields and fills their defaults: its
// name, its pool's sizes, its queue, its files, its warm interpreter, and its call timeout
// (within maxTTL) and queue wait, which it returns. What it names in the catalogue and its
// containers' limits are admission's to check (CheckFncallFiles once the limits are resolved).
func CheckFncallEnv(env *model.FncallEnv, maxTTL time.Duration) (timeout, queueWait time.Duration, err error) {
	if err := catalog.ValidateName("name", "fncall environment", env.Name); err != nil {
		return 0, 0, err
	}
	if env.PoolMax == 0 {
		env.PoolMax = max(4, env.PoolMin)
	}
	if env.PoolMin == 0 && env.PoolMax > 0 {
		env.PoolMin = 1
	}
	switch {
	case env.PoolMax < 1 || env.PoolMax > maxPoolSize:
		return 0, 0, errdefs.Invalid("pool_max", "must be 1-%d, got %d", maxPoolSize, env.PoolMax)
	case env.PoolMin < 0 || env.PoolMin > env.PoolMax:
		return 0, 0, errdefs.Invalid("pool_min", "must be 1-%d (pool_max; 0 means 1), got %d", env.PoolMax, env.PoolMin)
	case env.QueueDepth < 0 || env.QueueDepth > 100_000:
		return 0, 0, errdefs.Invalid("queue_depth", "must be 0-100000, got %d", env.QueueDepth)
	case env.FilesBytes < 0 || env.FilesBytes > 16<<30:
		return 0, 0, errdefs.Invalid("files_bytes", "must be at most 16 GiB, got %d", env.FilesBytes)
	}
	if env.QueueDepth == 0 {
		env.QueueDepth = 64
	}
	if env.FilesBytes == 0 {
		env.FilesBytes = 64 << 20
	}
	if env.Warm != nil {
		if err := checkWarm(env.Warm); err != nil {
			return 0, 0, err
		}
	}
	if env.Timeout == "" {
		env.Timeout = "30s"
	}
	if timeout, err = time.ParseDuration(env.Timeout); err != nil || timeout <= 0 || timeout > maxTTL {
		return 0, 0, errdefs.Invalid("timeout", "%q must be a positive duration of at most %s", env.Timeout, maxTTL)
	}
	if env.QueueWait == "" {
		env.QueueWait = "10s"
	}
	if queueWait, err = time.ParseDuration(env.QueueWait); err != nil || queueWait < 0 || queueWait > 10*time.Minute {
		return 0, 0, errdefs.Invalid("queue_wait", "%q must be a duration of at most 10m", env.QueueWait)
	}
	return timeout, queueWait, nil
}

// CheckFncallFiles checks that a call's files fit the containers' memory (env's resolved
// limits): they live in memory.
func CheckFncallFiles(env model.FncallEnv) error {
	if env.FilesBytes > env.Limits.MemoryBytes {
		return errdefs.Invalid("files_bytes", "%d is more than the containers' memory limit %d (a call's files live in memory)", env.FilesBytes, env.Limits.MemoryBytes)
	}
	return nil
}

// ContainerRequest is the create request of an fncall environment's pool container, in its
// project (a path), with the given TTL: what admission resolves.
func ContainerRequest(env model.FncallEnv, project string, ttl time.Duration) model.CreateRequest {
	return model.CreateRequest{
		Base: env.Base, Workspace: env.Workspace, Toolkits: env.Toolkits, Limits: env.Limits, Network: env.Network,
		TTL: ttl.String(), Labels: map[string]string{fncallLabel: env.Name}, Project: project,
	}
}

// containerRequest is the create request of one pool container, in project (a path).
func (p *fncallPool) containerRequest(env model.FncallEnv, project string) model.CreateRequest {
	return ContainerRequest(env, project, p.e.policy.MaxTTL())
}

// project returns the current path of the environment's project: the one it was created in,
// followed through moves (never another project that took its old path).
func (p *fncallPool) project(ctx context.Context) (string, error) {
	path, err := p.e.settings.ProjectPath(ctx, p.projectID)
	if err != nil {
		return "", fmt.Errorf("the fncall environment's project: %w", err)
	}
	return path, nil
}

// startPools builds the pools of the saved fncall environments and destroys the pool containers
// a previous corral left (a call may have been cut short in them).
func (e *Edge) startPools(ctx context.Context) error {
	var old []*sandbox
	for _, sb := range e.liveSandboxes() {
		if sb.fncall != "" {
			old = append(old, sb)
		}
	}
	go func() {
		for _, sb := range old {
			e.destroyPoolContainer(sb, "corral restarted")
		}
	}()
	return e.syncPools(ctx)
}

// FncallEnvs returns the fncall environments with their pools' state.
func (e *Edge) FncallEnvs() []model.FncallEnv {
	e.fncallMu.Lock()
	defer e.fncallMu.Unlock()
	out := make([]model.FncallEnv, 0, len(e.pools))
	for _, p := range e.pools {
		out = append(out, p.view())
	}
	slices.SortFunc(out, func(a, b model.FncallEnv) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// FncallEnv returns one fncall environment with its pool's state.
func (e *Edge) FncallEnv(name string) (model.FncallEnv, error) {
	p, err := e.pool(name)
	if err != nil {
		return model.FncallEnv{}, err
	}
	return p.view(), nil
}

func (e *Edge) pool(name string) (*fncallPool, error) {
	e.fncallMu.Lock()
	defer e.fncallMu.Unlock()
	p, ok := e.pools[name]
	if !ok {
		return nil, errdefs.NotFound("fncall environment %s", name)
	}
	return p, nil
}

// DeleteFncallEnv removes an fncall environment and destroys its containers; calls running in
// them are killed, calls waiting for one fail.
func (e *Edge) DeleteFncallEnv(ctx context.Context, name string) error {
	e.fncallMu.Lock()
	p, ok := e.pools[name]
	// A saved environment whose pool could not start (see startPools) is deleted all the same.
	if err := e.store.DeleteFncallEnv(ctx, name); err != nil {
		e.fncallMu.Unlock()
		return err
	}
	e.settingsWritten(ctx)
	delete(e.pools, name)
	e.fncallMu.Unlock()
	if ok {
		p.close("fncall environment deleted", true)
	}
	e.log.Info("fncall environment deleted", "fncall", name)
	return nil
}

// close ends a pool that left the edge's pools: waiting calls fail, idle containers are
// destroyed, and busy ones too when kill is set (their calls end with them) or else as their
// calls end.
func (p *fncallPool) close(why string, kill bool) {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	for _, w := range p.waiters {
		close(w)
	}
	p.waiters = nil
	p.mu.Unlock()
	for _, sb := range idle {
		p.e.destroyPoolContainer(sb, why)
	}
	if !kill {
		return
	}
	for _, sb := range p.e.liveSandboxes() {
		if sb.fncall == p.env.Name {
			p.e.destroyPoolContainer(sb, why)
		}
	}
}

// SetDraining tells the edge whether its node is draining (the cluster's heartbeats carry the
// node's state). A draining edge admits no new sandbox and winds its fncall pools down (calls
// running finish); when it is no longer draining the pools come back.
func (e *Edge) SetDraining(draining bool) {
	if e.draining.Swap(draining) == draining {
		return
	}
	e.log.Info("node drain changed", "draining", draining)
	if err := e.syncPools(context.Background()); err != nil {
		e.log.Warn("sync fncall pools", "err", err)
	}
}

// syncPools makes the edge's pools those of the fncall environments in the store, so that an
// environment created or deleted through another edge of a cluster reaches this one (within a
// flush interval); a draining edge keeps no pools.
func (e *Edge) syncPools(ctx context.Context) error {
	saved := map[string]model.FncallEnv{}
	if !e.draining.Load() {
		envs, err := e.settings.ListFncallEnvs(ctx)
		if err != nil {
			return fmt.Errorf("read the fncall environments: %w", err)
		}
		for _, rec := range envs {
			saved[rec.Name] = rec.FncallEnv
		}
	}
	e.fncallMu.Lock()
	var gone []*fncallPool
	for name, p := range e.pools {
		if env, ok := saved[name]; !ok || !env.CreatedAt.Equal(p.env.CreatedAt) {
			gone = append(gone, p)
			delete(e.pools, name)
		}
	}
	var added []*fncallPool
	for name, env := range saved {
		if _, ok := e.pools[name]; ok {
			continue
		}
		p, err := e.newPool(ctx, env)
		if err != nil {
			e.log.Error("fncall environment not valid here; its pool is not started", "fncall", name, "err", err)
			continue
		}
		p.env.CreatedAt = env.CreatedAt
		e.pools[name] = p
		added = append(added, p)
	}
	e.fncallMu.Unlock()
	for _, p := range gone {
		why := "fncall environment deleted"
		if e.draining.Load() {
			why = "node draining"
		}
		p.close(why, false)
		e.log.Info("fncall pool removed", "fncall", p.env.Name, "why", why)
	}
	for _, p := range added {
		e.log.Info("fncall pool started", "fncall", p.env.Name)
		p.maintain()
	}
	return nil
}

func (e *Edge) destroyPoolContainer(sb *sandbox, why string) {
	rec, err := e.record(context.Background(), sb.id)
	if err == nil {
		err = e.stopSandbox(context.Background(), rec, model.StateStopped, model.ReasonDeleted)
	}
	if err != nil {
		e.log.Error("destroy fncall container", "sandbox", sb.id, "fncall", sb.fncall, "why", why, "err", err)
	}
}

// view is the environment with its pool's state.
func (p *fncallPool) view() model.FncallEnv {
	project, err := p.project(context.Background())
	p.mu.Lock()
	defer p.mu.Unlock()
	env := p.env
	if err == nil {
		env.Project = project
	}
	env.Pool = &model.FncallPool{Ready: len(p.idle), Busy: p.busy, Starting: p.starting, Queued: len(p.waiters),
		Calls: p.calls, Rejected: p.rejected, Replaced: p.replaced, LastError: p.lastErr}
	return env
}

// maintain starts containers until the pool has PoolMin (and one per waiting call, up to
// PoolMax), and removes one idle container beyond PoolMin once the pool has been idle for
// poolShrinkAfter. The reaper calls it every tick.
func (p *fncallPool) maintain() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	have := len(p.idle) + p.busy + p.starting
	want := max(p.env.PoolMin, min(p.env.PoolMax, p.busy+len(p.waiters)))
	n := want - have
	if n > 0 && time.Now().Before(p.retryAt) {
		n = 0 // starts are failing: wait for the backoff
	}
	p.starting += max(n, 0)
	var shrink *sandbox
	if n < 0 && len(p.idle) > 0 && len(p.idle)+p.busy > p.env.PoolMin && time.Since(p.lastUse) > poolShrinkAfter {
		shrink = p.idle[0]
		p.idle = p.idle[1:]
	}
	p.mu.Unlock()
	for range max(n, 0) {
		go p.grow()
	}
	if shrink != nil {
		p.log.Info("fncall pool shrinks", "sandbox", shrink.id)
		go p.e.destroyPoolContainer(shrink, "idle")
	}
}

// grow creates one container; the caller counted it in p.starting.
func (p *fncallPool) grow() {
	start := time.Now()
	project, err := p.project(context.Background())
	var rec *store.Sandbox
	if err == nil {
		rec, err = p.e.create(context.Background(), p.containerRequest(p.env, project), true, nil)
	}
	var sb *sandbox
	if err == nil {
		if sb = p.e.lookup(rec.ID); sb == nil {
			err = fmt.Errorf("container %s ended right after it started", rec.ID)
		}
	}
	p.mu.Lock()
	p.starting--
	if err != nil {
		p.lastErr = err.Error()
		p.failures++
		backoff := min(time.Second<<min(p.failures-1, 6), time.Minute)
		p.retryAt = time.Now().Add(backoff)
		p.mu.Unlock()
		p.log.Error("start fncall container", "err", err, "failures_in_a_row", p.failures, "next_try_in", backoff)
		return
	}
	p.lastErr, p.failures, p.retryAt = "", 0, time.Time{}
	closed := p.closed
	p.mu.Unlock()
	if closed {
		p.e.destroyPoolContainer(sb, "fncall environment deleted")
		return
	}
	p.prewarm(sb)
	p.log.Debug("fncall container ready", "sandbox", sb.id, "took", time.Since(start).Round(time.Millisecond))
	p.give(sb)
}

// give hands a ready container to the first waiting call, or makes it idle.
func (p *fncallPool) give(sb *sandbox) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.e.lookup(sb.id) != sb {
		return // it ended meanwhile; the next maintenance replaces it
	}
	p.lastUse = time.Now()
	if len(p.waiters) > 0 {
		w := p.waiters[0]
		p.waiters = p.waiters[1:]
		p.busy++
		w <- sb
		return
	}
	p.idle = append(p.idle, sb)
}

// claim takes a ready container for a call, waiting in the queue when there is none. The
// container counts as busy until release.
func (p *fncallPool) claim(ctx context.Context) (*sandbox, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errdefs.NotFound("fncall environment %s", p.env.Name)
	}
	for len(p.idle) > 0 {
		sb := p.idle[len(p.idle)-1] // the most recently used: its caches are warm
		p.idle = p.idle[:len(p.idle)-1]
		if p.e.lookup(sb.id) != sb {
			continue
		}
		if time.Until(time.Unix(0, sb.expiresAt.Load())) < p.timeout+time.Minute {
			// Its TTL would end during the call: retire it (maintenance replaces it).
			go p.e.destroyPoolContainer(sb, "TTL ends soon")
			continue
		}
		p.busy++
		p.mu.Unlock()
		return sb, nil
	}
	if len(p.waiters) >= p.env.QueueDepth {
		p.rejected++
		p.mu.Unlock()
		return nil, p.exhausted("its queue of %d calls is full", p.env.QueueDepth)
	}
	if p.busy+p.starting == 0 && p.failures > 0 {
		// No container runs and none can be started: say why now rather than after QueueWait.
		msg := p.lastErr
		p.mu.Unlock()
		return nil, errdefs.Unavailable("fncall environment %s has no container: starting one failed: %s", p.env.Name, msg)
	}
	w := make(chan *sandbox, 1)
	p.waiters = append(p.waiters, w)
	p.mu.Unlock()
	p.maintain() // grows the pool for this waiter when it is below PoolMax
	timer := time.NewTimer(p.queueWait)
	defer timer.Stop()
	select {
	case sb, ok := <-w:
		if !ok {
			return nil, errdefs.NotFound("fncall environment %s was deleted", p.env.Name)
		}
		return sb, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	p.mu.Lock()
	for i, x := range p.waiters {
		if x == w {
			p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
	select {
	case sb, ok := <-w: // handed over while we gave up: pass it on
		if ok {
			p.release(sb, true)
		}
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.rejected++
	p.mu.Unlock()
	return nil, p.exhausted("no container was free within %s", p.queueWait)
}

func (p *fncallPool) exhausted(format string, args ...any) error {
	return &retryAfter{
		err:   fmt.Errorf("fncall environment %s is busy: %s: %w", p.env.Name, fmt.Sprintf(format, args...), errdefs.ErrExhausted),
		after: max(time.Second, p.queueWait/2),
	}
}

// release gives a container back after a call: to the pool when its cleanup was clean, else it
// is destroyed and replaced.
func (p *fncallPool) release(sb *sandbox, clean bool) {
	p.mu.Lock()
	p.busy--
	closed := p.closed
	if !clean {
		p.replaced++
	}
	p.mu.Unlock()
	switch {
	case closed:
		go p.e.destroyPoolContainer(sb, "fncall environment deleted")
	case !clean:
		go p.e.destroyPoolContainer(sb, "a call's cleanup failed")
		p.maintain()
	default:
		p.give(sb)
		go p.prewarm(sb)
	}
}

// callSpec is a validated call.
type callSpec struct {
	req agentrpc.ExecRequest
	// python is the code of a Python call (pyArgv then runs it), with pyArgs its sys.argv[1:].
	python  string
	pyArgs  []string
	files   []callFile
	refs    []callFile // data holds the artifact reference
	outputs []callOutput
	keep    []callOutput
	limit   int64
	// project is the ID of the environment's project: where artifacts are kept and looked up.
	project string
	keepTTL time.Duration
}

// callOutput is a file to return: as the request named it, and where it is.
type callOutput struct{ name, path string }

type callFile struct {
	path string
	data []byte
}

// checkCall validates a call against its environment.
func (p *fncallPool) checkCall(req model.CallRequest) (*callSpec, error) {
	c := &callSpec{limit: defaultCallOutput, project: p.projectID, keepTTL: model.ArtifactTTL}
	switch {
	case req.Python != "" && req.Script != "":
		return nil, errdefs.Invalid("python", "give python or script, not both")
	case len(req.Python) > maxPythonBytes:
		return nil, errdefs.Invalid("python", "%d bytes of code, more than %d", len(req.Python), maxPythonBytes)
	case req.Python != "":
		c.python, c.pyArgs = req.Python, req.Argv
		c.req.Argv = pyArgv(p.env)
	case len(req.Argv) > 0 && req.Script != "":
		return nil, errdefs.Invalid("script", "give argv or script, not both")
	case req.Script != "":
		c.req.Argv, c.req.Shell = []string{req.Script}, true
	case len(req.Argv) == 0 || req.Argv[0] == "":
		return nil, errdefs.Invalid("argv", "a command is required (argv or script)")
	default:
		c.req.Argv = req.Argv
	}
	total := 0
	for i, a := range c.req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, errdefs.Invalid(fmt.Sprintf("argv[%d]", i), "contains a NUL byte")
		}
		total += len(a)
	}
	if total > maxArgvBytes {
		return nil, errdefs.Invalid("argv", "%d bytes in all, more than %d", total, maxArgvBytes)
	}
	if err := catalog.ValidateEnv("env", req.Env); err != nil {
		return nil, err
	}
	c.req.Env, c.req.Stdin = req.Env, req.Stdin
	cwd := req.Cwd
	if cwd == "" {
		cwd = defaultCallCwd
	}
	var err error
	if c.req.Cwd, err = callPath("cwd", "/", cwd, true); err != nil {
		return nil, err
	}
	c.req.Timeout = p.timeout
	if req.Timeout != "" {
		d, err := time.ParseDuration(req.Timeout)
		if err != nil || d <= 0 || d > p.timeout {
			return nil, errdefs.Invalid("timeout", "%q must be a positive duration of at most %s (the environment's timeout)", req.Timeout, p.timeout)
		}
		c.req.Timeout = d
	}
	if req.OutputLimit < 0 || req.OutputLimit > maxCallOutput {
		return nil, errdefs.Invalid("output_limit", "must be at most %d, got %d", maxCallOutput, req.OutputLimit)
	} else if req.OutputLimit > 0 {
		c.limit = req.OutputLimit
	}
	c.req.OutputLimit = 2 * c.limit
	if len(req.Files) > maxCallFiles {
		return nil, errdefs.Invalid("files", "at most %d files, got %d", maxCallFiles, len(req.Files))
	}
	var bytes int64
	for name, data := range req.Files {
		p, err := callPath("files", c.req.Cwd, name, false)
		if err != nil {
			return nil, err
		}
		bytes += int64(len(data))
		c.files = append(c.files, callFile{path: p, data: data})
	}
	if bytes > p.env.FilesBytes {
		return nil, errdefs.Invalid("files", "%d bytes in all, more than the environment's files_bytes %d", bytes, p.env.FilesBytes)
	}
	if len(req.FileRefs) > maxCallFiles {
		return nil, errdefs.Invalid("file_refs", "at most %d files, got %d", maxCallFiles, len(req.FileRefs))
	}
	for name, ref := range req.FileRefs {
		p, err := callPath("file_refs", c.req.Cwd, name, false)
		if err != nil {
			return nil, err
		}
		c.refs = append(c.refs, callFile{path: p, data: []byte(ref)})
	}
	if len(req.Keep) > maxCallOutputs {
		return nil, errdefs.Invalid("keep", "at most %d files, got %d", maxCallOutputs, len(req.Keep))
	}
	for _, k := range req.Keep {
		p, err := callPath("keep", c.req.Cwd, k, false)
		if err != nil {
			return nil, err
		}
		c.keep = append(c.keep, callOutput{name: k, path: p})
	}
	if req.KeepTTL != "" {
		d, err := time.ParseDuration(req.KeepTTL)
		if err != nil || d < time.Second || d > model.MaxArtifactTTL {
			return nil, errdefs.Invalid("keep_ttl", "%q must be a duration from 1s to %s", req.KeepTTL, model.MaxArtifactTTL)
		}
		if len(c.keep) == 0 {
			return nil, errdefs.Invalid("keep_ttl", "is the lifetime of kept files, and the call keeps none")
		}
		c.keepTTL = d
	}
	if (len(c.refs) > 0 || len(c.keep) > 0) && p.e.artifacts == nil {
		return nil, errdefs.Invalid("keep", "this node keeps no artifacts (no artifact directory configured)")
	}
	if len(req.Outputs) > maxCallOutputs {
		return nil, errdefs.Invalid("outputs", "at most %d files, got %d", maxCallOutputs, len(req.Outputs))
	}
	for _, o := range req.Outputs {
		p, err := callPath("outputs", c.req.Cwd, o, false)
		if err != nil {
			return nil, err
		}
		c.outputs = append(c.outputs, callOutput{name: o, path: p})
	}
	return c, nil
}

// callPath cleans a path of a call (relative ones are under cwd) and refuses the places that are
// the kernel's or the container's in every call (/proc, /sys, /dev) or belong to the agent.
func callPath(field, cwd, p string, dir bool) (string, error) {
	if p == "" || strings.IndexByte(p, 0) >= 0 || len(p) > 4096 {
		return "", errdefs.Invalid(field, "%q is not a usable path", p)
	}
	if !strings.HasPrefix(p, "/") {
		p = path.Join(cwd, p)
	}
	p = path.Clean(p)
	if p == "/" && !dir {
		return "", errdefs.Invalid(field, "%q is the root directory", p)
	}
	for _, fresh := range []string{"/proc", "/sys", "/dev", "/.corral-calls"} {
		if p == fresh || strings.HasPrefix(p, fresh+"/") {
			return "", errdefs.Invalid(field, "%q is under %s, which a call cannot write: use %s", p, fresh, defaultCallCwd)
		}
	}
	return p, nil
}

// Call runs one call in the fncall environment name. With onOutput set, the command's output is
// passed to it as it comes (stdout and stderr events) instead of being collected in the result.
func (e *Edge) Call(ctx context.Context, name string, req model.CallRequest, onOutput func(model.Event) error) (*model.CallResult, error) {
	p, err := e.pool(name)
	if err != nil {
		return nil, err
	}
	spec, err := p.checkCall(req)
	if err != nil {
		return nil, err
	}
	// An unknown artifact fails the call before it takes a container.
	for _, f := range spec.refs {
		a, _, err := e.artifacts.open(spec.project, string(f.data))
		if err != nil {
			return nil, err
		}
		a.Close()
	}
	queued := time.Now()
	sb, err := p.claim(ctx)
	if err != nil {
		return nil, err
	}
	res := &model.CallResult{Container: sb.id, QueuedMs: ms(time.Since(queued))}
	sb.touch()
	clean := false
	defer func() { p.release(sb, clean) }()
	// Preparing, cleaning up and reading outputs run to their end even if the client goes (the
	// container must be cleaned), but not forever: a container whose agent does not answer in
	// time is unclean and replaced.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), spec.req.Timeout+time.Minute)
	defer cancel()
	var warm *warmCall
	if spec.python != "" && spec.limit <= defaultCallOutput {
		warm = p.takeWarm(sb)
	}
	// A call with nothing to stage before its command and nothing to read after it is one
	// request to the agent: prepared, run and ended on one connection (CallSpec.Prepare, End).
	// Others prepare first, stage their files, run, read their outputs, then end.
	oneTrip := warm == nil && len(spec.files)+len(spec.refs)+len(spec.outputs)+len(spec.keep) == 0
	var id, dir string
	var call *agentrpc.CallSpec
	switch {
	case warm != nil:
		id, dir = warm.id, warm.dir
		call = &agentrpc.CallSpec{Dir: dir}
	case oneTrip:
		id = newCallID()
		call = &agentrpc.CallSpec{Prepare: &agentrpc.CallPrepare{ID: id, Size: p.env.FilesBytes}, End: true}
	default:
		id = newCallID()
		if dir, err = sb.agent.CallPrep(cctx, id, p.env.FilesBytes); err != nil {
			p.log.Error("prepare a call", "sandbox", sb.id, "call", id, "err", err)
			return nil, fmt.Errorf("call in %s: prepare: %w", sb.id, err)
		}
		call = &agentrpc.CallSpec{Dir: dir}
	}
	log := p.log.With("sandbox", sb.id, "call", id)
	// ended is what the agent found when it ended the call itself (CallSpec.End), once read.
	var ended *agentrpc.CallEnd
	end := func() {
		ce, err := agentrpc.CallEnd{}, error(nil)
		if ended != nil {
			ce = *ended
		} else {
			// Also when the agent was to end the call but its answer did not come: if it did
			// end it, this is ErrNotFound, and the container, whose state is then unknown, is
			// replaced.
			ce, err = sb.agent.CallEnd(cctx, id)
		}
		switch {
		case err != nil:
			log.Error("clean up after a call; the container is replaced", "err", err)
		case !ce.Clean:
			log.Warn("a call left something behind; the container is replaced", "problems", ce.Problems)
		default:
			clean = true
		}
	}
	defer end()
	upper := dir + "/upper"
	events, err := e.startCall(ctx, cctx, p, sb, spec, warm, call, res)
	if events != nil && events.ended != nil {
		ended = events.ended
	}
	if err != nil {
		return nil, err
	}
	defer events.close()
	start := time.Now()
	var stdout, stderr capped
	stdout.limit, stderr.limit = spec.limit, spec.limit
	for {
		ev, err := events.next()
		if err != nil {
			return nil, fmt.Errorf("call in %s: output stream: %w", sb.id, err)
		}
		if ev.Type == agentrpc.EventExit {
			res.Exit = exitOf(ev.Exit)
			if ev.Exit != nil {
				res.CPUMs, res.MaxRSSBytes = ms(ev.Exit.CPUTime), ev.Exit.MaxRSS
			}
			if events.timedOut != nil && events.timedOut.Load() {
				res.Exit.TimedOut = true
			}
			if events.callEnd != nil {
				if ce, err := events.callEnd(); err == nil {
					ended = &ce
				} else {
					log.Debug("the agent's end of the call did not come; ending it apart", "err", err)
				}
			}
			break
		}
		if onOutput != nil && (ev.Type == agentrpc.EventStdout || ev.Type == agentrpc.EventStderr) {
			if onOutput(model.Event{Type: ev.Type, Offset: ev.Offset, Data: ev.Data}) != nil {
				onOutput = nil // the client went: collect the rest (the stream ends when ctx does)
			}
			continue
		}
		switch ev.Type {
		case agentrpc.EventStdout:
			stdout.Write(ev.Data)
		case agentrpc.EventStderr:
			stderr.Write(ev.Data)
		}
	}
	res.WallMs = ms(time.Since(start))
	res.Stdout, res.StdoutTruncated = stdout.b.Bytes(), stdout.truncated
	res.Stderr, res.StderrTruncated = stderr.b.Bytes(), stderr.truncated
	for _, o := range spec.outputs {
		data, err := readCallOutput(cctx, sb.agent, upper, o.path)
		if err != nil {
			if res.OutputErrors == nil {
				res.OutputErrors = map[string]string{}
			}
			res.OutputErrors[o.name] = err.Error()
			continue
		}
		if res.Outputs == nil {
			res.Outputs = map[string][]byte{}
		}
		res.Outputs[o.name] = data
	}
	if err := e.keepArtifacts(cctx, spec, sb, upper, res); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.calls++
	p.mu.Unlock()
	log.Debug("call done", "argv0", spec.req.Argv[0], "exit", res.Exit.Code, "wall_ms", res.WallMs, "queued_ms", res.QueuedMs)
	return res, nil
}

// callEvents is where a call's output comes from.
type callEvents struct {
	next     func() (agentrpc.Event, error)
	close    func()
	timedOut *atomic.Bool // set when the edge enforced the timeout (warm interpreters)
	// callEnd, for a call the agent ends itself (CallSpec.End), reads what it found, after the
	// exit event.
	callEnd func() (agentrpc.CallEnd, error)
	// ended is what the agent found when it ended a call whose command did not start.
	ended *agentrpc.CallEnd
}

// startCall stages the call's input and starts its command, as the call of call: a warm
// interpreter fed through its stdin, or a command started now (Python code then goes to a fresh
// interpreter's stdin). A call the agent prepares (call.Prepare) has nothing to stage but its
// working directory, which the agent makes.
func (e *Edge) startCall(ctx, cctx context.Context, p *fncallPool, sb *sandbox, spec *callSpec, warm *warmCall, call *agentrpc.CallSpec, res *model.CallResult) (*callEvents, error) {
	upper := call.Dir + "/upper"
	if spec.python != "" {
		payload, err := e.pyPayload(spec, spec.python, spec.pyArgs)
		if err != nil {
			return nil, err
		}
		if warm != nil {
			next, closeFn, timedOut, err := p.runWarm(cctx, sb, warm, payload, spec.req.Timeout)
			if err != nil {
				return nil, fmt.Errorf("call in %s: warm interpreter: %w", sb.id, err)
			}
			res.Warm = true
			return &callEvents{next: next, close: closeFn, timedOut: timedOut}, nil
		}
		// The boot program creates the working directory and goes there itself.
		spec.req.Stdin, spec.req.Cwd = payload, "/"
	} else if call.Prepare != nil {
		call.Prepare.Dirs = []string{spec.req.Cwd}
	} else {
		if _, err := sb.agent.Mkdir(cctx, upper+spec.req.Cwd, agentrpc.WriteOptions{Parents: true}); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			return nil, fmt.Errorf("call in %s: working directory: %w", sb.id, err)
		}
		for _, f := range spec.files {
			if _, err := sb.agent.WriteFile(cctx, upper+f.path, bytes.NewReader(f.data), agentrpc.WriteOptions{Parents: true}); err != nil {
				return nil, fmt.Errorf("call input file %s: %w", f.path, err)
			}
		}
		for _, f := range spec.refs {
			if err := e.stageArtifact(cctx, sb, spec.project, upper+f.path, string(f.data)); err != nil {
				return nil, fmt.Errorf("call input file %s: %w", f.path, err)
			}
		}
	}
	spec.req.Call = call
	sess, err := sb.agent.Exec(ctx, spec.req)
	if err != nil {
		return nil, err
	}
	events := &callEvents{next: sess.Next, close: func() { sess.Close() }}
	if call.End {
		events.callEnd = sess.CallEnd
	}
	if err := startError(sess.Info()); err != nil {
		if call.End {
			// The agent sends the exit and ends the call all the same: take what it found.
			for ev, nerr := sess.Next(); nerr == nil; ev, nerr = sess.Next() {
				if ev.Type == agentrpc.EventExit {
					if ce, cerr := sess.CallEnd(); cerr == nil {
						events.ended = &ce
					}
					break
				}
			}
		}
		sess.Close()
		return events, err
	}
	return events, nil
}

// stageArtifact writes the artifact ref of project into a call's writable layer at dst, with its
// mode.
func (e *Edge) stageArtifact(ctx context.Context, sb *sandbox, project, dst, ref string) error {
	f, mode, err := e.artifacts.open(project, ref)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = sb.agent.WriteFile(ctx, dst, f, agentrpc.WriteOptions{Parents: true, Mode: mode.Perm()})
	return err
}

// keepArtifacts keeps the files the call asked to keep as artifacts of its project and records
// their references in res; a file the call did not leave is an output error. A file that would
// take the project past its artifact quota fails the whole call with the quota error, and the
// call keeps nothing (what it kept already is removed).
func (e *Edge) keepArtifacts(ctx context.Context, spec *callSpec, sb *sandbox, upper string, res *model.CallResult) error {
	if len(spec.keep) == 0 {
		return nil
	}
	limits, err := e.settings.ArtifactLimits(ctx, spec.project)
	if err != nil {
		return fmt.Errorf("keep files of call in %s: %w", sb.id, err)
	}
	var created []string
	for _, k := range spec.keep {
		ref, isNew, err := e.keepArtifact(ctx, sb, spec, limits, upper, k.path)
		if _, quota := errors.AsType[*iam.QuotaError](err); quota {
			for _, ref := range created {
				e.artifacts.remove(spec.project, ref)
			}
			return fmt.Errorf("keep %s: %w", k.name, err)
		}
		if err != nil {
			if res.OutputErrors == nil {
				res.OutputErrors = map[string]string{}
			}
			res.OutputErrors[k.name] = err.Error()
			continue
		}
		if isNew {
			created = append(created, ref)
		}
		if res.Artifacts == nil {
			res.Artifacts = map[string]string{}
		}
		res.Artifacts[k.name] = ref
	}
	return nil
}

// keepArtifact keeps a file the call left as an artifact and returns its reference.
func (e *Edge) keepArtifact(ctx context.Context, sb *sandbox, spec *callSpec, limits []store.ArtifactLimit, upper, p string) (string, bool, error) {
	rc, info, err := openCallFile(ctx, sb.agent, upper, p)
	if err != nil {
		return "", false, err
	}
	defer rc.Close()
	return e.artifacts.put(spec.project, rc, info.Mode, spec.keepTTL, limits)
}

// openCallFile opens a file as the call left it: from the call's writable layer if it wrote
// it, else from the container's layers.
func openCallFile(ctx context.Context, ag *agentrpc.Client, upper, p string) (io.ReadCloser, agentrpc.FileInfo, error) {
	rc, info, err := ag.ReadFile(ctx, upper+p)
	if errors.Is(err, errdefs.ErrNotFound) {
		rc, info, err = ag.ReadFile(ctx, p)
	}
	return rc, info, err
}

// readCallOutput reads a file the call left (openCallFile), at most maxOutputFile bytes.
func readCallOutput(ctx context.Context, ag *agentrpc.Client, upper, p string) ([]byte, error) {
	rc, info, err := openCallFile(ctx, ag, upper, p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if info.Size > maxOutputFile {
		return nil, fmt.Errorf("%d bytes, more than the %d an output file may have", info.Size, maxOutputFile)
	}
	return io.ReadAll(io.LimitReader(rc, maxOutputFile))
}

// capped keeps the first limit bytes written to it.
type capped struct {
	b         bytes.Buffer
	limit     int64
	truncated bool
}

func (c *capped) Write(p []byte) {
	room := c.limit - int64(c.b.Len())
	if int64(len(p)) > room {
		p, c.truncated = p[:max(room, 0)], true
	}
	c.b.Write(p)
}

func exitOf(x *agentrpc.Exit) model.Exit {
	if x == nil {
		return model.Exit{Code: -1, Error: "no exit status"}
	}
	return model.Exit{Code: x.Code, Signal: x.Signal, TimedOut: x.TimedOut, OOMKilled: x.OOMKilled, Error: x.Error}
}

func newCallID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// maintainPools runs every pool's maintenance (the reaper calls it every tick).
func (e *Edge) maintainPools() {
	e.fncallMu.Lock()
	pools := make([]*fncallPool, 0, len(e.pools))
	for _, p := range e.pools {
		pools = append(pools, p)
	}
	e.fncallMu.Unlock()
	for _, p := range pools {
		p.maintain()
	}
}

// poolGone is called when a pool container ended outside a call (TTL, death, a user's delete): it
// leaves the pool, which replaces it at its next maintenance.
func (e *Edge) poolGone(rec *store.Sandbox) {
	p, err := e.pool(rec.Labels[fncallLabel])
	if err != nil {
		return
	}
	p.mu.Lock()
	for i, sb := range p.idle {
		if sb.id == rec.ID {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			break
		}
	}
	delete(p.warm, rec.ID)
	p.mu.Unlock()
}
