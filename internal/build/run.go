package build

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
)

// Backend is what a build needs of the node that runs it (the edge). Every layer a build makes
// is of kind base, named LayerName, versioned by its cache key, and stacks (Below) on every
// layer under it, so making a sandbox with it as base gives the whole stack.
type Backend interface {
	// BuildFrom resolves FROM in project at: the layer to stack on, the stack's depth and the
	// base's configuration. With dry set it publishes nothing.
	BuildFrom(ctx context.Context, at, ref string, dry bool) (Layer, int, *ImageConfig, error)
	// BuildLayer finds the layer of a cache key.
	BuildLayer(ctx context.Context, at, key string) (Layer, bool, error)
	// BuildCheckTarget validates the environment's name.
	BuildCheckTarget(name string) error
	BuildCheckNetwork(p *netpolicy.Policy) error
	BuildSandbox(ctx context.Context, s Sandbox) (string, error)
	BuildDelete(ctx context.Context, id string) error
	// BuildExec runs cmd in sandbox id, passes its output (stdout and stderr) to out as it
	// comes, and returns how it ended.
	BuildExec(ctx context.Context, id string, cmd Command, out func(data []byte)) (*Exit, error)
	BuildTarIn(ctx context.Context, id, dir, user string, r io.Reader) error
	// BuildCommit publishes the sandbox's writable layer as l (Name, Version, Below, Project set).
	BuildCommit(ctx context.Context, id string, l Layer) (Layer, error)
	// BuildPublish publishes l, whose content is stored already; an existing version is returned.
	BuildPublish(ctx context.Context, l Layer) (Layer, error)
	// BuildSaveEnvironment saves environment name of project with base (NAME:VERSION) as its
	// base layer, replacing an environment of the same name and project.
	BuildSaveEnvironment(ctx context.Context, name, base, project string) error
	// EnvironmentOwner is the project (canonical; the root is "") owning environment name, and
	// whether there is one, as a build in project at asks.
	EnvironmentOwner(ctx context.Context, at, name string) (string, bool, error)
	ValidateImageConfig(c *ImageConfig) error
}

// LayerName is the name of the layers builds make (the edge's BuildLayerName).
const LayerName = "corral.build"

// MaxStack bounds the layers an environment stacks: a layer stacks on at most 64 others (the
// edge's rule for images imported in parts), which keeps the overlay's option string far below
// the page the kernel reads it from.
const MaxStack = 65

// maxLogBytes bounds the command output a job keeps (older output is dropped, steps kept).
const maxLogBytes = 8 << 20

// maxJobs is how many jobs Jobs remembers.
const maxJobs = 100

// Request is a checked build request: everything is validated and planned, nothing made.
type Request struct {
	Spec
	Project string // canonical
	Plan    *Plan
	Context *Context
	// Bind, when set, gives the build's context what it carries from the request that
	// started it (on a cluster's edge, the caller the servers sealed, which its steps'
	// sandboxes are admitted for).
	Bind func(context.Context) context.Context
}

// Jobs runs builds and keeps the last maxJobs of them, with their logs, in memory (a restart
// of corral forgets them; the layers and environments they made stay).
type Jobs struct {
	b    Backend
	node string // names the builds' IDs
	log  *slog.Logger
	ctx  context.Context // ends at shutdown; builds stop
	wg   sync.WaitGroup

	mu    sync.Mutex // protects jobs and order
	jobs  map[string]*Job
	order []string

	// roomWait bounds how long a step waits for room on the node for its sandbox (RoomWait),
	// trying again after roomRetry at first (2 s), doubling up to 15 s; tests shorten both.
	roomWait, roomRetry time.Duration
}

// RoomWait is how long a build step waits for room for its sandbox on a node that is full (a
// create refused node_full) before the build fails: other sandboxes end, pools shrink. The
// build was placed where a step's sandbox fitted, but its steps are made one at a time, each
// after the last, and the node admits others meanwhile.
const RoomWait = 10 * time.Minute

// NewJobs returns a job runner of node's builds (their IDs name it: NodeOf) whose builds end
// when ctx does.
func NewJobs(ctx context.Context, b Backend, node string, log *slog.Logger) *Jobs {
	return &Jobs{b: b, node: node, log: log, ctx: ctx, jobs: map[string]*Job{}, roomWait: RoomWait, roomRetry: 2 * time.Second}
}

// buildIDPrefix starts every build's ID: bld-NODE-HEX.
const buildIDPrefix = "bld-"

// NodeOf returns the node whose build id is (bld-NODE-16 hex digits), or "" when id is not a
// build's ID: a cluster's servers send every request about a build to the edge that runs it.
func NodeOf(id string) string {
	rest, ok := strings.CutPrefix(id, buildIDPrefix)
	i := strings.LastIndexByte(rest, '-')
	if !ok || i <= 0 || len(rest)-i-1 != 16 || strings.Trim(rest[i+1:], "0123456789abcdef") != "" {
		return ""
	}
	return rest[:i]
}

// Wait waits for running builds to end (after the context given to NewJobs ended).
func (j *Jobs) Wait() { j.wg.Wait() }

// Job is one build.
type Job struct {
	mu      sync.Mutex // protects the fields below
	build   Build
	events  []Event
	logged  int           // bytes of output held
	trimmed int           // events before this index have had their output dropped
	changed chan struct{} // closed and replaced whenever something is appended

	ctx    context.Context // the build's; ended by Cancel or the Jobs' context
	cancel context.CancelFunc
}

// ErrCancelled is the cause of a build ended by Cancel.
var ErrCancelled = errors.New("the build was cancelled")

// Cancel ends a running build: the step running stops, its sandbox is removed and no
// environment is saved. Cancelling an ended build does nothing.
func (job *Job) Cancel() { job.cancel() }

// Check validates and plans a build; every error is a 4xx (ErrInvalid, ErrConflict, ...) and
// nothing is made. bctx may be nil.
func (j *Jobs) Check(ctx context.Context, req Spec, project string, bctx *Context) (*Request, error) {
	if req.Name == "" {
		return nil, errdefs.Invalid("name", "the environment to build is required")
	}
	if req.Dockerfile == "" {
		return nil, errdefs.Invalid("dockerfile", "the Dockerfile's text is required")
	}
	switch req.Runtime {
	case "", "runc", "gvisor":
	default:
		return nil, errdefs.Invalid("runtime", "%q: builds run on runc or gvisor", req.Runtime)
	}
	if err := j.b.BuildCheckTarget(req.Name); err != nil {
		return nil, err
	}
	// Project exists (the answer says so) and the name is not another project's: environment
	// names are one namespace. A root-owned environment's owner is "" too, hence exists.
	if owner, exists, err := j.b.EnvironmentOwner(ctx, project, req.Name); err != nil {
		return nil, err
	} else if exists && owner != project {
		return nil, errdefs.Conflict("environment name %s belongs to another project; choose another name", req.Name)
	}
	if err := j.b.BuildCheckNetwork(req.Network); err != nil {
		return nil, err
	}
	df, err := Parse(req.Dockerfile)
	if err != nil {
		return nil, err
	}
	args, err := ValidateArgs(req.BuildArgs)
	if err != nil {
		return nil, err
	}
	from := req.From
	if from == "" {
		if from, err = FromRef(df, args); err != nil {
			return nil, err
		}
	}
	_, depth, baseCfg, err := j.b.BuildFrom(ctx, project, from, true)
	if err != nil {
		return nil, err
	}
	if bctx == nil {
		bctx = EmptyContext()
	}
	plan, err := MakePlan(df, args, baseCfg, bctx)
	if err != nil {
		return nil, err
	}
	plan.From = from
	if n := depth + plan.Layers(); n > MaxStack {
		return nil, errdefs.Invalid("dockerfile", "the environment would stack %d layers (%d from FROM, %d steps that write files); at most %d: join RUN steps with &&", n, depth, plan.Layers(), MaxStack)
	}
	cfg := plan.Config
	if err := j.b.ValidateImageConfig(&cfg); err != nil {
		return nil, err
	}
	return &Request{Spec: req, Project: project, Plan: plan, Context: bctx}, nil
}

// Start runs a checked build in the background and returns its job. The job owns r.Context
// and closes it when it ends.
func (j *Jobs) Start(r *Request, projectDisplay string) *Job {
	id := buildIDPrefix + j.node + "-" + randHex(8)
	job := &Job{changed: make(chan struct{})}
	job.ctx, job.cancel = context.WithCancel(j.ctx)
	if r.Bind != nil {
		job.ctx = r.Bind(job.ctx)
	}
	job.build = Build{ID: id, Name: r.Name, Project: projectDisplay, State: Running, From: r.Plan.From,
		Warnings: r.Plan.Warnings, CreatedAt: time.Now().UTC()}
	for _, s := range r.Plan.Steps {
		job.build.Steps = append(job.build.Steps, StepStatus{N: s.N, Text: s.Text, Kind: s.Kind, State: "pending"})
	}
	j.mu.Lock()
	j.jobs[id] = job
	j.order = append(j.order, id)
	for len(j.order) > maxJobs {
		old := j.jobs[j.order[0]]
		if old != nil && old.Snapshot().State == Running {
			break // never forget a running build
		}
		delete(j.jobs, j.order[0])
		j.order = j.order[1:]
	}
	j.mu.Unlock()
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		defer r.Context.Close()
		defer job.cancel()
		j.run(job, r)
	}()
	return job
}

// Get returns a job by ID.
func (j *Jobs) Get(id string) (*Job, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	job, ok := j.jobs[id]
	return job, ok
}

// List returns the jobs, oldest first.
func (j *Jobs) List() []*Job {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]*Job, 0, len(j.order))
	for _, id := range j.order {
		out = append(out, j.jobs[id])
	}
	return out
}

// Snapshot returns the job's state now.
func (job *Job) Snapshot() Build {
	job.mu.Lock()
	defer job.mu.Unlock()
	b := job.build
	b.Steps = append([]StepStatus(nil), b.Steps...)
	return b
}

// Events returns the events from index from on (an index into all events ever appended), the
// next index, whether the job has ended, and a channel closed on the next change.
func (job *Job) Events(from int) ([]Event, int, bool, <-chan struct{}) {
	job.mu.Lock()
	defer job.mu.Unlock()
	if from > len(job.events) {
		from = len(job.events)
	}
	out := append([]Event(nil), job.events[from:]...)
	done := len(job.events) > 0 && job.events[len(job.events)-1].Type == "end"
	return out, len(job.events), done, job.changed
}

func (job *Job) emit(ev Event) {
	job.mu.Lock()
	defer job.mu.Unlock()
	// Over the budget, the oldest output goes (its event stays, empty, so that followers'
	// positions stay valid); step lines and the end are kept.
	for job.logged+len(ev.Data) > maxLogBytes && job.trimmed < len(job.events) {
		old := &job.events[job.trimmed]
		job.trimmed++
		if old.Type == "log" && len(old.Data) > 0 {
			job.logged -= len(old.Data)
			old.Data = nil
		}
	}
	if len(ev.Data) > maxLogBytes {
		ev.Data = ev.Data[len(ev.Data)-maxLogBytes:]
	}
	job.events = append(job.events, ev)
	job.logged += len(ev.Data)
	close(job.changed)
	job.changed = make(chan struct{})
}

func (job *Job) setStep(i int, f func(*StepStatus)) {
	job.mu.Lock()
	f(&job.build.Steps[i])
	job.mu.Unlock()
}

// run executes the build's steps. A failed build leaves no environment and no sandbox; the
// layers of the steps that succeeded stay as the cache of the next build (each is an ordinary
// layer, `corral layer rm` takes it, `corral layer gc` the content of one never published).
func (j *Jobs) run(job *Job, r *Request) {
	ctx := job.ctx
	log := j.log.With("build", job.build.ID, "environment", r.Name)
	start := time.Now()
	layer, err := j.steps(ctx, job, r)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", ErrCancelled, err)
	}
	now := time.Now().UTC()
	job.mu.Lock()
	job.build.FinishedAt = &now
	if err != nil {
		job.build.State, job.build.Error = Failed, err.Error()
	} else {
		job.build.State, job.build.Layer = Succeeded, layer
	}
	b := job.build
	b.Steps = append([]StepStatus(nil), b.Steps...)
	job.mu.Unlock()
	job.emit(Event{Type: "end", Build: &b})
	log.Info("build ended", "state", b.State, "err", err, "took", time.Since(start).Round(time.Millisecond))
}

func (j *Jobs) steps(ctx context.Context, job *Job, r *Request) (string, error) {
	top, _, _, err := j.b.BuildFrom(ctx, r.Project, r.Plan.From, false)
	if err != nil {
		return "", fmt.Errorf("step 1 (FROM %s): %w", r.Plan.From, err)
	}
	key := Key("", "from\x00"+r.Project+"\x00"+top.Name+":"+top.Version+"\x00"+top.Digest)
	n := len(r.Plan.Steps)
	for i, st := range r.Plan.Steps {
		t0 := time.Now()
		if st.Kind == StepConfig {
			job.emit(Event{Type: "step", Step: st.N, Text: fmt.Sprintf("Step %d/%d: %s", st.N, n, st.Text)})
			job.setStep(i, func(s *StepStatus) { s.State = "done" })
			continue
		}
		inputs := st.Inputs
		if st.Kind == StepRun && r.Network != nil {
			// What a command could reach is one of its inputs.
			nb, _ := json.Marshal(r.Network)
			inputs += "\x00network=" + string(nb)
		}
		key = Key(key, inputs)
		if l, ok, err := j.b.BuildLayer(ctx, r.Project, key); err != nil {
			return "", fmt.Errorf("step %d (%s): %w", st.N, st.Text, err)
		} else if ok && !r.NoCache {
			job.emit(Event{Type: "step", Step: st.N, Cached: true, Text: fmt.Sprintf("Step %d/%d: %s CACHED", st.N, n, st.Text)})
			job.setStep(i, func(s *StepStatus) { s.State, s.Layer = "cached", l.Name+":"+l.Version })
			top = l
			continue
		}
		job.emit(Event{Type: "step", Step: st.N, Text: fmt.Sprintf("Step %d/%d: %s", st.N, n, st.Text)})
		job.setStep(i, func(s *StepStatus) { s.State = "running" })
		l, err := j.runStep(ctx, job, r, st, top, key)
		if err != nil {
			job.setStep(i, func(s *StepStatus) { s.State, s.Seconds = "failed", time.Since(t0).Seconds() })
			return "", fmt.Errorf("step %d (%s): %w", st.N, st.Text, err)
		}
		job.setStep(i, func(s *StepStatus) {
			s.State, s.Layer, s.Seconds = "done", l.Name+":"+l.Version, time.Since(t0).Seconds()
		})
		top = l
	}
	// The environment's base: the top layer's content and stack, with the configuration.
	cfg := r.Plan.Config
	cb, _ := json.Marshal(cfg)
	final := Layer{
		Name: r.Name, Version: "b-" + Key(key, string(cb))[:16],
		// The same content as top, stacked on what top stacks on.
		Digest: top.Digest, Size: top.Size, Files: top.Files, Below: append([]string(nil), top.Below...),
		ImageConfig: &cfg, Project: r.Project, CreatedAt: time.Now().UTC(),
	}
	got, err := j.b.BuildPublish(ctx, final)
	if err != nil {
		return "", fmt.Errorf("publish the environment's layer %s:%s: %w", final.Name, final.Version, err)
	}
	ref := got.Name + ":" + got.Version
	if err := j.b.BuildSaveEnvironment(ctx, r.Name, ref, r.Project); err != nil {
		return "", fmt.Errorf("save environment %s: %w", r.Name, err)
	}
	return ref, nil
}

// stepSandbox creates the sandbox of step st, waiting up to roomWait while the node is full
// (said once in the build's log).
func (j *Jobs) stepSandbox(ctx context.Context, job *Job, st Step, sb Sandbox) (string, error) {
	deadline := time.Now().Add(j.roomWait)
	wait := j.roomRetry
	for said := false; ; said = true {
		id, err := j.b.BuildSandbox(ctx, sb)
		if err == nil || !errors.Is(err, errdefs.ErrNodeFull) || time.Now().Add(wait).After(deadline) {
			if err != nil && said {
				err = fmt.Errorf("no room on the node for %s: %w", j.roomWait, err)
			}
			return id, err
		}
		if !said {
			job.emit(Event{Type: "log", Step: st.N, Data: fmt.Appendf(nil, "corral: the node is full; waiting up to %s for room for this step's sandbox (%v)\n", j.roomWait, err)})
			j.log.Info("build step waits for room on the node", "build", job.build.ID, "step", st.N, "err", err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 15*time.Second)
	}
}

// runStep makes the layer of one RUN or COPY step in a sandbox of its own, removed after.
func (j *Jobs) runStep(ctx context.Context, job *Job, r *Request, st Step, top Layer, key string) (Layer, error) {
	net := r.Network
	if st.Kind == StepCopy {
		net = nil // copying needs no network
	}
	id, err := j.stepSandbox(ctx, job, st, Sandbox{
		Base: top.Name + ":" + top.Version, Project: r.Project, Runtime: r.Runtime, Network: net,
		TTL: "2h", Labels: map[string]string{"corral.build": job.build.ID},
	})
	if err != nil {
		return Layer{}, fmt.Errorf("create the step's sandbox: %w", err)
	}
	defer func() {
		if err := j.b.BuildDelete(ctx, id); err != nil {
			j.log.Warn("delete a build sandbox", "sandbox", id, "err", err)
		}
	}()
	switch st.Kind {
	case StepRun:
		if st.Cwd != "/" {
			// As Docker: the working directory exists for the command.
			if err := j.b.BuildTarIn(ctx, id, st.Cwd, "", emptyTar()); err != nil {
				return Layer{}, fmt.Errorf("make the working directory %s: %w", st.Cwd, err)
			}
		}
		exit, err := j.b.BuildExec(ctx, id, Command{Argv: st.Argv, Env: st.Env, Cwd: st.Cwd, User: st.User}, func(data []byte) {
			job.emit(Event{Type: "log", Step: st.N, Data: data})
		})
		if err != nil {
			return Layer{}, err
		}
		if exit.Code != 0 || exit.Signal != "" || exit.Error != "" {
			return Layer{}, fmt.Errorf("the command failed: %s", describeExit(exit))
		}
		if r.Runtime == "gvisor" {
			// gVisor keeps written data in its own page cache: flush it to the host's upper
			// directory before it is read.
			if _, err := j.b.BuildExec(ctx, id, Command{Argv: []string{"sync"}, User: "0"}, func([]byte) {}); err != nil {
				return Layer{}, fmt.Errorf("sync the step's writes: %w", err)
			}
		}
	case StepCopy:
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(WriteCopyTar(r.Context, st, tar.NewWriter(pw))) }()
		err := j.b.BuildTarIn(ctx, id, st.DestDir, st.Chown, pr)
		pr.CloseWithError(errors.New("copy ended"))
		if err != nil {
			return Layer{}, fmt.Errorf("copy into %s: %w", st.DestDir, err)
		}
	}
	below := append(append([]string(nil), top.Below...), top.Name+":"+top.Version)
	return j.b.BuildCommit(ctx, id, Layer{Name: LayerName, Version: key, Below: below, Project: r.Project})
}

func describeExit(x *Exit) string {
	var parts []string
	if x.Signal != "" {
		parts = append(parts, "killed by "+x.Signal)
	} else {
		parts = append(parts, fmt.Sprintf("exit code %d", x.Code))
	}
	if x.OOMKilled {
		parts = append(parts, "out of memory")
	}
	if x.Error != "" {
		parts = append(parts, x.Error)
	}
	return strings.Join(parts, ", ")
}

func emptyTar() io.Reader {
	return strings.NewReader(strings.Repeat("\x00", 1024))
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
