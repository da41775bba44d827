package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// iamChain is the depth of the deepest measured project; the other is at depth 1, and is the
// chain's top, so the deep project's checks include the shallow one's.
const iamChain = 10

// IAMConfig sizes an identity benchmark run. Zero fields take the defaults of the issue that asked
// for it: 10,000 projects, 100,000 grants over 5,000 principals, 2,000 samples per depth, 8
// creators for 5 s.
type IAMConfig struct {
	// Dir is where the run's temporary store directory is made (default: the system's temp dir).
	Dir string
	// Keep leaves the store behind (its path is in the result) instead of removing it.
	Keep bool

	Projects   int // projects, the root not counted; at least iamChain+1
	Principals int // principals besides root
	Grants     int // grants besides root's
	Sandboxes  int // live sandbox records spread over the projects (as many stopped ones are added)
	// History is how many stopped records of the last 24 hours the deep project gets for the
	// last sensitivity measures (admission against a project's own history); negative skips them.
	History int

	N           int           // paired latency samples per depth
	Concurrency int           // creators in the throughput test
	Duration    time.Duration // measured time of each throughput test
}

func (c IAMConfig) withDefaults() IAMConfig {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Projects, 10_000)
	def(&c.Principals, 5_000)
	def(&c.Grants, 100_000)
	def(&c.Sandboxes, 3_000)
	def(&c.History, 10_000)
	def(&c.N, 2_000)
	def(&c.Concurrency, 8)
	if c.Duration == 0 {
		c.Duration = 5 * time.Second
	}
	return c
}

// Validate checks a configuration after defaults.
func (c IAMConfig) Validate() error {
	switch {
	case c.Projects <= iamChain:
		return errdefs.Invalid("projects", "at least %d projects are needed (a chain of depth %d and one more)", iamChain+1, iamChain)
	case c.Principals < 1 || c.Grants < c.Principals:
		return errdefs.Invalid("grants", "need at least one principal and one grant per principal (%d principals, %d grants)", c.Principals, c.Grants)
	case (c.Grants+c.Principals-1)/c.Principals >= c.Projects:
		return errdefs.Invalid("grants", "%d grants over %d principals would give a principal more than one grant per project (%d projects)", c.Grants, c.Principals, c.Projects)
	case c.Sandboxes < 0 || c.N < 1 || c.Concurrency < 1 || c.Duration <= 0:
		return errdefs.Invalid("n", "samples, concurrency and duration must be positive, sandboxes not negative")
	}
	return nil
}

// IAMResult is what one identity benchmark run measured. Latencies are in milliseconds; every
// "added" figure is against the baseline measured in the same run.
type IAMResult struct {
	Date      string `json:"date"`
	Host      string `json:"host"`
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go_version"`
	Store     string `json:"store,omitempty"` // the kept store's path (Keep)

	Projects         int     `json:"projects"`
	Principals       int     `json:"principals"`
	Grants           int     `json:"grants"`
	Tokens           int     `json:"tokens"`
	LiveSandboxes    int     `json:"live_sandboxes"`
	StoppedSandboxes int     `json:"stopped_sandboxes"`
	StoreMiB         float64 `json:"store_mib"` // database and WAL after populating
	// Populate is the wall time of each population step through the store's public API, one
	// transaction per call, in seconds.
	Populate      map[string]float64 `json:"populate_s"`
	PopulateTotal float64            `json:"populate_total_s"`

	Depths     []IAMDepth    `json:"depths"`
	Throughput IAMThroughput `json:"throughput"`
	// Sensitivity is admission under changes to the store made after the measures above.
	Sensitivity []IAMVariant `json:"sensitivity"`
	Notes       []string     `json:"notes"`
}

// IAMDepth is the per-create latency at one project depth. Each sample i of every series comes
// from the same iteration (the baseline and the identity path run back to back, in alternating
// order), so the paired differences compare like with like.
type IAMDepth struct {
	Depth   int    `json:"depth"`
	Project string `json:"project"`
	// Limited counts the projects whose quotas admission checks: the project and its ancestors.
	Limited int `json:"limited_levels"`

	// Baseline is store.PutSandbox of a new creating record: what create wrote before identity.
	Baseline Stats `json:"baseline_put_sandbox"`
	// Auth is what the API server does per request: token lookup, the principal's grants, the
	// SandboxCreate decision.
	Auth Stats `json:"auth"`
	// Resolve is the edge's two lookups of the project by path (projectPath, then admit).
	Resolve Stats `json:"resolve_project"`
	// Admit is store.AdmitSandbox: quota checks of every limited level and the insert, one tx.
	Admit Stats `json:"admit_sandbox"`
	// Audit is the audit entry the server writes for sandbox.create.
	Audit Stats `json:"audit_entry"`

	// With is Auth + Admit per iteration; Added is With − Baseline per iteration (paired), and
	// AddedP50Diff is p50(With) − p50(Baseline).
	With         Stats   `json:"auth_plus_admit"`
	Added        Stats   `json:"added_auth_admit_paired"`
	AddedP50Diff float64 `json:"added_auth_admit_p50_diff_ms"`
	RatioP50     float64 `json:"auth_admit_vs_baseline_p50"`
	// Full adds Resolve and Audit: every store call identity added to a create.
	Full         Stats   `json:"full"`
	FullAdded    Stats   `json:"added_full_paired"`
	FullP50Diff  float64 `json:"added_full_p50_diff_ms"`
	FullRatioP50 float64 `json:"full_vs_baseline_p50"`
}

// IAMThroughput is creations per second into one project from Concurrency goroutines.
type IAMThroughput struct {
	Project     string  `json:"project"`
	Concurrency int     `json:"concurrency"`
	Seconds     float64 `json:"seconds_each"`
	// ChecksOff is store.PutSandbox; ChecksOn is store.AdmitSandbox (quotas on every level, big
	// enough never to refuse); Full adds the request's authorisation, project lookups and audit.
	ChecksOff   float64 `json:"checks_off_per_s"`
	ChecksOn    float64 `json:"checks_on_per_s"`
	Full        float64 `json:"full_per_s"`
	Ratio       float64 `json:"checks_on_vs_off"`
	FullRatio   float64 `json:"full_vs_off"`
	OnLatency   Stats   `json:"checks_on_latency"`
	OffLatency  Stats   `json:"checks_off_latency"`
	FullLatency Stats   `json:"full_latency"`
}

// IAMVariant is admission under one change to the store, measured after the main measures with
// min(N, 200) paired samples (min(N, 50) once the history makes them slow). The changes
// accumulate in the order the variants are listed.
type IAMVariant struct {
	Name     string  `json:"name"`
	Project  string  `json:"project"`
	Depth    int     `json:"depth"`
	Setup    float64 `json:"setup_s,omitempty"` // time to make the change
	Baseline Stats   `json:"baseline_put_sandbox"`
	Admit    Stats   `json:"admit_sandbox"`
}

// iamBench is one run's store and the names it populated it with.
type iamBench struct {
	st     *store.Store
	log    *slog.Logger
	ids    map[string]string // canonical path → project ID
	paths  []string
	chain  []string          // the chain, depth 1 first
	tokens map[string]string // measured project path → the caller's token secret scoped to it
}

// IAM measures what identity adds to a sandbox creation, on a real SQLite store in a temporary
// directory: no server, no root. It populates the store, then measures, per create, the request's
// authorisation and the quota admission against the plain insert create did before identity, at
// depth 1 and depth 10, and creations per second into one project with quota checks on and off.
func IAM(ctx context.Context, cfg IAMConfig, log *slog.Logger) (*IAMResult, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(cfg.Dir, "corral-iam-bench-")
	if err != nil {
		return nil, fmt.Errorf("make the store directory: %w", err)
	}
	dbPath := filepath.Join(dir, "corral.db")
	st, err := store.Open(ctx, dbPath)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer func() {
		st.Close()
		if !cfg.Keep {
			os.RemoveAll(dir)
		}
	}()
	host, _ := os.Hostname()
	res := &IAMResult{
		Date: time.Now().UTC().Format(time.RFC3339), Host: host, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(),
		Populate: map[string]float64{},
	}
	if cfg.Keep {
		res.Store = dbPath
	}
	b := &iamBench{st: st, log: log, ids: map[string]string{"": store.RootProjectID}, tokens: map[string]string{}}
	if err := b.populate(ctx, cfg, res); err != nil {
		return nil, err
	}
	for _, f := range []string{dbPath, dbPath + "-wal"} {
		if fi, err := os.Stat(f); err == nil {
			res.StoreMiB += float64(fi.Size()) / (1 << 20)
		}
	}

	if err := b.latency(ctx, cfg, res); err != nil {
		return nil, err
	}
	if err := b.throughput(ctx, cfg, res); err != nil {
		return nil, err
	}
	if err := b.sensitivity(ctx, cfg, res); err != nil {
		return nil, err
	}
	res.Notes = []string{
		"baseline: store.PutSandbox of a new creating record, what create wrote before identity (the pre-identity API cached a token's check for 10 s, so a busy client's create made no other store call)",
		"auth: the API server's per-request steps replicated with the same store calls (TokenByHash, revocation and expiry checks, PrincipalGrants, the caller's SandboxCreate decision)",
		"added_*_paired: percentiles of (identity path − baseline) over paired iterations; *_p50_diff_ms: p50(identity path) − p50(baseline)",
		"quotas limit sandboxes, cpus, memory, disk, creates per minute and the container tier on every level from the root to the measured project",
		"measured sandboxes are deleted after each latency iteration and after each 250 ms throughput window (outside the timed part), so every measure sees the populated store: the stopped records a real installation keeps for 24 h are measured separately (sensitivity)",
	}
	return res, nil
}

// populate fills the store through its public API, one transaction per call, timing each step.
func (b *iamBench) populate(ctx context.Context, cfg IAMConfig, res *IAMResult) error {
	rng := rand.New(rand.NewPCG(1, 2))
	step := func(name string, fn func() error) error {
		start := time.Now()
		if err := fn(); err != nil {
			return fmt.Errorf("populate %s: %w", name, err)
		}
		d := time.Since(start).Seconds()
		res.Populate[name] = d
		res.PopulateTotal += d
		b.log.Info("populated", "step", name, "seconds", fmt.Sprintf("%.2f", d))
		return nil
	}

	// The tree: the chain t0/d2/.../d10 (its top is the depth-1 project measured), then top-level
	// projects t1..t(T-1), then their children round-robin until the count is reached, so each
	// top-level project holds about sqrt(Projects) children.
	for d := 1; d <= iamChain; d++ {
		p := "t0"
		for i := 2; i <= d; i++ {
			p += fmt.Sprintf("/d%d", i)
		}
		b.chain = append(b.chain, p)
	}
	b.paths = append(b.paths, b.chain...)
	top := 1
	for top*top < cfg.Projects {
		top++
	}
	for i := 1; i < top && len(b.paths) < cfg.Projects; i++ {
		b.paths = append(b.paths, fmt.Sprintf("t%d", i))
	}
	for j := 0; len(b.paths) < cfg.Projects; j++ {
		for i := 0; i < top && len(b.paths) < cfg.Projects; i++ {
			b.paths = append(b.paths, fmt.Sprintf("t%d/p%d", i, j))
		}
	}
	err := step("projects", func() error {
		for _, p := range b.paths {
			rec, err := b.st.CreateProject(ctx, p, store.RootPrincipal)
			if err != nil {
				return err
			}
			b.ids[p] = rec.ID
		}
		return nil
	})
	if err != nil {
		return err
	}
	res.Projects = len(b.paths)

	// Principals: the first is the measured caller. Each gets about Grants/Principals grants on
	// distinct projects (a window of project indexes from an offset); the caller's window starts
	// at 1, so its measured grant on t0 is separate.
	kinds := []string{model.KindUser, model.KindService, model.KindAgent}
	name := func(i int) string { return fmt.Sprintf("bench-%05d", i) }
	err = step("principals", func() error {
		for i := range cfg.Principals {
			p := model.Principal{Name: name(i), Kind: kinds[i%len(kinds)]}
			if err := b.st.CreatePrincipal(ctx, p, b.paths[rng.IntN(len(b.paths))], store.RootPrincipal); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	res.Principals = cfg.Principals
	caller := name(0)
	err = step("grants", func() error {
		if err := b.st.AddGrant(ctx, b.chain[0], caller, model.RoleUser, store.RootPrincipal); err != nil {
			return err
		}
		offsets := make([]int, cfg.Principals)
		for i := range offsets {
			offsets[i] = 1 + rng.IntN(len(b.paths)-1)
		}
		offsets[0] = 1
		for k := range cfg.Grants - 1 {
			pr := k % cfg.Principals
			proj := b.paths[(offsets[pr]+k/cfg.Principals)%len(b.paths)]
			if err := b.st.AddGrant(ctx, proj, name(pr), iam.Roles[rng.IntN(len(iam.Roles))], store.RootPrincipal); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	res.Grants = cfg.Grants

	// Tokens: one per principal (so the token table has a realistic size), and the caller's two
	// measured ones, scoped to the projects they create in.
	userPerms, _ := iam.RolePerms(model.RoleUser)
	mint := func(principal, path string) (string, error) {
		secret, id := iam.NewToken()
		err := b.st.MintToken(ctx, store.MintRequest{Token: store.TokenRecord{
			ID: id, Hash: hashToken(secret), Principal: principal, ProjectID: b.ids[path], Perms: userPerms, Role: model.RoleUser,
		}, CreatedBy: store.RootPrincipal})
		return secret, err
	}
	err = step("tokens", func() error {
		for i := range cfg.Principals {
			if _, err := mint(name(i), b.paths[rng.IntN(len(b.paths))]); err != nil {
				return err
			}
		}
		for _, p := range []string{b.chain[0], b.chain[iamChain-1]} {
			secret, err := mint(caller, p)
			if err != nil {
				return err
			}
			b.tokens[p] = secret
		}
		return nil
	})
	if err != nil {
		return err
	}
	res.Tokens = cfg.Principals + 2

	// Quotas on the root and every level of the chain, each level half its parent's, all far
	// above what the run uses: admission checks every level and never refuses.
	err = step("quotas", func() error {
		limit := int64(1) << 50
		for _, p := range append([]string{""}, b.chain...) {
			cpus := float64(limit)
			q := model.Quota{Sandboxes: &limit, CPUs: &cpus, MemoryBytes: &limit, DiskBytes: &limit, CreatesPerMinute: &limit,
				Tiers: map[string]int64{"container": limit}}
			if _, err := b.st.SetQuota(ctx, p, q); err != nil {
				return err
			}
			limit /= 2
		}
		return nil
	})
	if err != nil {
		return err
	}

	// Sandboxes created an hour or more ago, live and stopped, on random projects.
	err = step("sandboxes", func() error {
		old := time.Now().Add(-time.Hour)
		for i := range 2 * cfg.Sandboxes {
			p := b.paths[rng.IntN(len(b.paths))]
			rec := b.record(p, old.Add(-time.Duration(rng.IntN(3600))*time.Second))
			if i%2 == 1 {
				rec.State, rec.EndedAt = model.StateStopped, old
			} else {
				rec.State = model.StateRunning
			}
			if err := b.st.PutSandbox(ctx, rec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	res.LiveSandboxes, res.StoppedSandboxes = cfg.Sandboxes, cfg.Sandboxes
	return nil
}

// record returns a new sandbox record in project path, shaped like the edge's.
func (b *iamBench) record(path string, now time.Time) *store.Sandbox {
	id := iam.NewID("sb-bench-")
	return &store.Sandbox{
		Sandbox: model.Sandbox{
			ID: id, Node: "bench", Tier: "container", Runtime: "runc", State: model.StateCreating,
			Base:     "base:bench",
			Limits:   model.Limits{CPUs: 1, MemoryBytes: 512 << 20, Pids: 1024, DiskBytes: 1 << 30},
			Hostname: id, CreatedAt: now, ExpiresAt: now.Add(time.Hour), LastActivityAt: now,
			Project: iam.Display(path),
		},
		Lower:     []string{"sha256:" + strings.Repeat("ab", 32)},
		ProjectID: b.ids[path],
	}
}

// forget removes measured records, so that measures do not pile up state that the next one
// would see: every measure runs against the populated store.
func (b *iamBench) forget(ctx context.Context, recs ...*store.Sandbox) error {
	for _, r := range recs {
		if err := b.st.DeleteSandbox(ctx, r.ID); err != nil {
			return err
		}
	}
	return nil
}

// hashToken is apiserver.HashToken (the form in which a token is stored), repeated here so the
// benchmark does not pull in the API server.
func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// authorise repeats, with the same store calls, what the API server does before it creates a
// sandbox: apiserver.(*Server).caller (parse the bearer header, look the token up by hash, check
// revocation and expiry, load the principal's grants where the token reaches) and then
// caller.require(iam.SandboxCreate, project). The server's caller type is unexported, so the
// steps are replicated rather than called; keep them in step with internal/apiserver/auth.go.
func (b *iamBench) authorise(ctx context.Context, header, project string) (*store.TokenRecord, error) {
	secret, err := iam.ParseBearer(header)
	if err != nil {
		return nil, err
	}
	t, err := b.st.TokenByHash(ctx, hashToken(secret))
	if err != nil {
		return nil, err
	}
	if !t.RevokedAt.IsZero() || (!t.ExpiresAt.IsZero() && !time.Now().Before(t.ExpiresAt)) {
		return nil, fmt.Errorf("token %s is revoked or expired: %w", t.ID, errdefs.ErrUnauthorized)
	}
	grants, err := b.st.PrincipalGrants(ctx, t.Principal, t.ProjectPath)
	if err != nil {
		return nil, err
	}
	held := make(map[string]iam.Perm, len(grants))
	for _, g := range grants {
		p, _ := iam.RolePerms(g.Role)
		held[g.ProjectPath] |= p
	}
	var have iam.Perm
	if iam.Within(project, t.ProjectPath) {
		for _, a := range iam.Ancestors(project) {
			have |= held[a]
		}
		have &= t.Perms
	}
	if !have.Has(iam.SandboxCreate) {
		return nil, &iam.DeniedError{Perm: iam.SandboxCreate &^ have, Project: project}
	}
	return t, nil
}

// identityTimes is one create through the identity path, by phase.
type identityTimes struct{ auth, resolve, admit, audit time.Duration }

// createWithIdentity runs every store call identity added to a create, timing each phase: the
// request's authorisation, the edge's project lookups (it resolves the path twice, in
// projectPath and in admit), admission, and the audit entry.
func (b *iamBench) createWithIdentity(ctx context.Context, path string, rec *store.Sandbox) (identityTimes, error) {
	var t identityTimes
	start := time.Now()
	tok, err := b.authorise(ctx, "Bearer "+b.tokens[path], path)
	if err != nil {
		return t, err
	}
	t.auth = time.Since(start)

	start = time.Now()
	for range 2 {
		if _, err := b.st.GetProject(ctx, path); err != nil {
			return t, err
		}
	}
	t.resolve = time.Since(start)

	start = time.Now()
	if err := b.st.AdmitSandbox(ctx, rec, nil); err != nil {
		return t, err
	}
	t.admit = time.Since(start)

	start = time.Now()
	err = b.st.AddAudit(ctx, model.AuditEntry{At: time.Now().UTC(), Principal: tok.Principal, Token: tok.ID, Project: path,
		Action: "sandbox.create", Target: rec.ID, Result: "ok"}, tok.ProjectPath)
	t.audit = time.Since(start)
	return t, err
}

// latency measures cfg.N paired iterations at depth 1 and depth 10, interleaved so both depths
// see the same store, after a short warm-up.
func (b *iamBench) latency(ctx context.Context, cfg IAMConfig, res *IAMResult) error {
	depths := []int{1, iamChain}
	type series struct{ base, auth, resolve, admit, audit, with, added, full, fullAdded []time.Duration }
	ss := make([]series, len(depths))
	warm := min(cfg.N, 50)
	b.log.Info("measuring per-create latency", "samples", cfg.N, "warmup", warm, "depths", depths)
	for i := range warm + cfg.N {
		for k, d := range depths {
			if err := ctx.Err(); err != nil {
				return err
			}
			path := b.chain[d-1]
			base, with := b.record(path, time.Now().UTC()), b.record(path, time.Now().UTC())
			var tb time.Duration
			var ti identityTimes
			// Alternate the order so neither path always runs on a just-warmed connection.
			runBase := func() error {
				start := time.Now()
				err := b.st.PutSandbox(ctx, base)
				tb = time.Since(start)
				return err
			}
			runWith := func() (err error) {
				ti, err = b.createWithIdentity(ctx, path, with)
				return err
			}
			var err error
			if (i+k)%2 == 0 {
				if err = runBase(); err == nil {
					err = runWith()
				}
			} else if err = runWith(); err == nil {
				err = runBase()
			}
			if err != nil {
				return fmt.Errorf("create at depth %d: %w", d, err)
			}
			if err := b.forget(ctx, base, with); err != nil {
				return err
			}
			if i < warm {
				continue
			}
			s := &ss[k]
			w := ti.auth + ti.admit
			f := w + ti.resolve + ti.audit
			s.base = append(s.base, tb)
			s.auth = append(s.auth, ti.auth)
			s.resolve = append(s.resolve, ti.resolve)
			s.admit = append(s.admit, ti.admit)
			s.audit = append(s.audit, ti.audit)
			s.with = append(s.with, w)
			s.added = append(s.added, w-tb)
			s.full = append(s.full, f)
			s.fullAdded = append(s.fullAdded, f-tb)
		}
	}
	for k, d := range depths {
		s := ss[k]
		r := IAMDepth{
			Depth: d, Project: b.chain[d-1], Limited: d + 1,
			Baseline: summarise(s.base), Auth: summarise(s.auth), Resolve: summarise(s.resolve),
			Admit: summarise(s.admit), Audit: summarise(s.audit),
			With: summarise(s.with), Added: summarise(s.added), Full: summarise(s.full), FullAdded: summarise(s.fullAdded),
		}
		r.AddedP50Diff = r.With.P50 - r.Baseline.P50
		r.FullP50Diff = r.Full.P50 - r.Baseline.P50
		if r.Baseline.P50 > 0 {
			r.RatioP50 = r.With.P50 / r.Baseline.P50
			r.FullRatioP50 = r.Full.P50 / r.Baseline.P50
		}
		res.Depths = append(res.Depths, r)
	}
	return nil
}

// throughput measures creations per second into the deepest project (every level limited) three
// ways: checks off (PutSandbox), checks on (AdmitSandbox), and the full identity path.
func (b *iamBench) throughput(ctx context.Context, cfg IAMConfig, res *IAMResult) error {
	path := b.chain[iamChain-1]
	t := &res.Throughput
	t.Project, t.Concurrency, t.Seconds = path, cfg.Concurrency, cfg.Duration.Seconds()
	modes := []struct {
		name string
		rate *float64
		lat  *Stats
		op   func(ctx context.Context, rec *store.Sandbox) error
	}{
		{"checks off", &t.ChecksOff, &t.OffLatency, b.st.PutSandbox},
		{"checks on", &t.ChecksOn, &t.OnLatency, func(ctx context.Context, rec *store.Sandbox) error { return b.st.AdmitSandbox(ctx, rec, nil) }},
		{"full", &t.Full, &t.FullLatency, func(ctx context.Context, rec *store.Sandbox) error {
			_, err := b.createWithIdentity(ctx, path, rec)
			return err
		}},
	}
	for _, m := range modes {
		b.log.Info("measuring creations per second", "mode", m.name, "concurrency", cfg.Concurrency, "duration", cfg.Duration)
		rate, lat, err := b.rate(ctx, path, cfg, m.op)
		if err != nil {
			return fmt.Errorf("throughput %s: %w", m.name, err)
		}
		*m.rate, *m.lat = rate, summarise(lat)
	}
	if t.ChecksOff > 0 {
		t.Ratio, t.FullRatio = t.ChecksOn/t.ChecksOff, t.Full/t.ChecksOff
	}
	return nil
}

// rate runs op from cfg.Concurrency goroutines in 250 ms windows until cfg.Duration of measured
// time has passed; between windows (not timed) it deletes the window's sandboxes. It
// returns creations per second and each creation's latency. The goroutines of a window end with
// the window or with ctx.
func (b *iamBench) rate(ctx context.Context, path string, cfg IAMConfig, op func(context.Context, *store.Sandbox) error) (float64, []time.Duration, error) {
	const window = 250 * time.Millisecond
	var measured time.Duration
	var total int
	var lat []time.Duration
	for measured < cfg.Duration {
		recs := make([][]*store.Sandbox, cfg.Concurrency)
		lats := make([][]time.Duration, cfg.Concurrency)
		errs := make([]error, cfg.Concurrency)
		var wg sync.WaitGroup
		start := time.Now()
		end := start.Add(min(window, cfg.Duration-measured))
		for g := range cfg.Concurrency {
			wg.Go(func() {
				for time.Now().Before(end) && ctx.Err() == nil {
					rec := b.record(path, time.Now().UTC())
					t0 := time.Now()
					if err := op(ctx, rec); err != nil {
						errs[g] = err
						return
					}
					lats[g] = append(lats[g], time.Since(t0))
					recs[g] = append(recs[g], rec)
				}
			})
		}
		wg.Wait()
		measured += time.Since(start)
		if err := errors.Join(append(errs, ctx.Err())...); err != nil {
			return 0, nil, err
		}
		for g := range recs {
			total += len(recs[g])
			lat = append(lat, lats[g]...)
			if err := b.forget(ctx, recs[g]...); err != nil {
				return 0, nil, err
			}
		}
	}
	return float64(total) / measured.Seconds(), lat, nil
}

// sensitivity measures admission as the store changes: as configured, without the root's quota,
// then with cfg.History stopped records of the last 24 hours in the deep project, then without
// the creates-per-minute limits.
func (b *iamBench) sensitivity(ctx context.Context, cfg IAMConfig, res *IAMResult) error {
	shallow, deep := b.chain[0], b.chain[iamChain-1]
	n := min(cfg.N, 200)
	measure := func(name, path string, n int, setup time.Duration) error {
		b.log.Info("measuring admission", "variant", name, "project", path, "samples", n)
		base, adm, err := b.admitPairs(ctx, path, n)
		if err != nil {
			return fmt.Errorf("admission %s: %w", name, err)
		}
		res.Sensitivity = append(res.Sensitivity, IAMVariant{Name: name, Project: path, Depth: strings.Count(path, "/") + 1, Setup: setup.Seconds(), Baseline: base, Admit: adm})
		return nil
	}
	if err := measure("as configured", deep, n, 0); err != nil {
		return err
	}
	start := time.Now()
	if _, err := b.st.SetQuota(ctx, "", model.Quota{}); err != nil {
		return err
	}
	setup := time.Since(start)
	if err := measure("no root quota", shallow, n, setup); err != nil {
		return err
	}
	if err := measure("no root quota", deep, n, 0); err != nil {
		return err
	}
	if cfg.History <= 0 {
		return nil
	}
	start = time.Now()
	rng := rand.New(rand.NewPCG(3, 4))
	for range cfg.History {
		at := time.Now().Add(-time.Duration(rng.Int64N(int64(24 * time.Hour))))
		rec := b.record(deep, at)
		rec.State, rec.Reason, rec.EndedAt = model.StateStopped, model.ReasonDeleted, at.Add(time.Minute)
		if err := b.st.PutSandbox(ctx, rec); err != nil {
			return fmt.Errorf("populate history: %w", err)
		}
	}
	name := fmt.Sprintf("no root quota, +%d stopped records (24 h) in the project", cfg.History)
	if err := measure(name, deep, min(cfg.N, 50), time.Since(start)); err != nil {
		return err
	}
	// Drop creates_per_minute from every level, deepest first (a parent's limit must stay above
	// what its children hold).
	start = time.Now()
	for i := iamChain - 1; i >= 0; i-- {
		q, err := b.st.GetQuota(ctx, b.chain[i])
		if err != nil {
			return err
		}
		lim := q.Limit
		lim.CreatesPerMinute = nil
		if _, err := b.st.SetQuota(ctx, b.chain[i], lim); err != nil {
			return err
		}
	}
	return measure(name+", no creates_per_minute", deep, n, time.Since(start))
}

// admitPairs measures n paired iterations of PutSandbox (the baseline) and AdmitSandbox into
// path, deleting both records after each.
func (b *iamBench) admitPairs(ctx context.Context, path string, n int) (base, admit Stats, err error) {
	var bs, as []time.Duration
	for range n {
		if err := ctx.Err(); err != nil {
			return base, admit, err
		}
		r1, r2 := b.record(path, time.Now().UTC()), b.record(path, time.Now().UTC())
		t0 := time.Now()
		if err := b.st.PutSandbox(ctx, r1); err != nil {
			return base, admit, err
		}
		t1 := time.Now()
		if err := b.st.AdmitSandbox(ctx, r2, nil); err != nil {
			return base, admit, err
		}
		bs, as = append(bs, t1.Sub(t0)), append(as, time.Since(t1))
		if err := b.forget(ctx, r1, r2); err != nil {
			return base, admit, err
		}
	}
	return summarise(bs), summarise(as), nil
}
