package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
)

// fakeNode is an in-memory Backend for the job runner's tests: layers in a map, sandboxes as
// IDs, commands that "fail" when their text says so. The real backend (the edge) is exercised
// by internal/e2e/build_test.go.
type fakeNode struct {
	mu        sync.Mutex
	layers    map[string]Layer // by NAME:VERSION
	live      map[string]bool  // sandboxes not yet deleted
	made, ran int
	envs      map[string]fakeEnv
	full      int // the next creates refused node_full
}

// fakeEnv is a saved environment: its base layer and project.
type fakeEnv struct{ Base, Project string }

func newFakeNode() *fakeNode {
	return &fakeNode{
		layers: map[string]Layer{"base:1": {Name: "base", Version: "1", Digest: "sha256:base",
			ImageConfig: &ImageConfig{Env: []string{"PATH=/bin"}}}},
		live: map[string]bool{}, envs: map[string]fakeEnv{},
	}
}

func (f *fakeNode) BuildFrom(ctx context.Context, at, ref string, dry bool) (Layer, int, *ImageConfig, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.layers[ref]
	if !ok {
		return l, 0, nil, errdefs.Invalid("from", "layer %s is not published", ref)
	}
	return l, 1, l.ImageConfig, nil
}

func (f *fakeNode) BuildLayer(ctx context.Context, at, key string) (Layer, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.layers[LayerName+":"+key]
	return l, ok, nil
}

func (f *fakeNode) BuildCheckNetwork(p *netpolicy.Policy) error { return nil }

func (f *fakeNode) BuildCheckTarget(name string) error {
	if strings.ContainsAny(name, " /:") {
		return errdefs.Invalid("name", "%q is not a name", name)
	}
	return nil
}

func (f *fakeNode) BuildSandbox(ctx context.Context, req Sandbox) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.full > 0 {
		f.full--
		return "", fmt.Errorf("create: %w (memory)", errdefs.ErrNodeFull)
	}
	if _, ok := f.layers[req.Base]; !ok {
		return "", fmt.Errorf("create on %s: not published", req.Base)
	}
	f.made++
	id := fmt.Sprintf("sb%d", f.made)
	f.live[id] = true
	return id, nil
}

func (f *fakeNode) BuildDelete(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, id)
	return nil
}

func (f *fakeNode) BuildExec(ctx context.Context, id string, req Command, out func([]byte)) (*Exit, error) {
	f.mu.Lock()
	f.ran++
	f.mu.Unlock()
	script := strings.Join(req.Argv, " ")
	out([]byte("running: " + script + "\n"))
	if strings.Contains(script, "block") {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if strings.Contains(script, "fail") {
		return &Exit{Code: 3}, nil
	}
	return &Exit{}, nil
}

func (f *fakeNode) BuildTarIn(ctx context.Context, id, dir, user string, r io.Reader) error {
	_, err := io.Copy(io.Discard, r)
	return err
}

func (f *fakeNode) BuildCommit(ctx context.Context, id string, l Layer) (Layer, error) {
	l.Digest = "sha256:" + l.Version
	return f.BuildPublish(ctx, l)
}

func (f *fakeNode) BuildPublish(ctx context.Context, l Layer) (Layer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range l.Below {
		if _, ok := f.layers[b]; !ok {
			return l, fmt.Errorf("below %s: not published", b)
		}
	}
	if got, ok := f.layers[l.Name+":"+l.Version]; ok {
		return got, nil
	}
	f.layers[l.Name+":"+l.Version] = l
	return l, nil
}

func (f *fakeNode) BuildSaveEnvironment(ctx context.Context, name, base, project string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.envs[name] = fakeEnv{Base: base, Project: project}
	return nil
}

func (f *fakeNode) EnvironmentOwner(ctx context.Context, at, name string) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	env, ok := f.envs[name]
	return env.Project, ok, nil // the tests name projects as Check is given them
}

func (f *fakeNode) ValidateImageConfig(c *ImageConfig) error { return nil }

// runJob checks, starts and waits for a build, following its log as the API does.
func runJob(t *testing.T, jobs *Jobs, dockerfile string) (Build, []Event) {
	t.Helper()
	r, err := jobs.Check(context.Background(), Spec{Name: "env", Dockerfile: dockerfile}, "/", nil)
	if err != nil {
		t.Fatal(err)
	}
	job := jobs.Start(r, "/")
	var evs []Event
	next := 0
	deadline := time.After(10 * time.Second)
	for {
		got, n, done, changed := job.Events(next)
		evs, next = append(evs, got...), n
		if done {
			return job.Snapshot(), evs
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatal("the build did not end")
		}
	}
}

func TestJobs(t *testing.T) {
	f := newFakeNode()
	jobs := NewJobs(context.Background(), f, "local", slog.New(slog.DiscardHandler))
	df := "FROM base:1\nENV A=1\nRUN one\nRUN two\nCMD [\"x\"]\n"
	b, evs := runJob(t, jobs, df)
	if b.State != Succeeded || !strings.HasPrefix(b.Layer, "env:b-") {
		t.Fatalf("build = %+v", b)
	}
	var lines []string
	for _, ev := range evs {
		if ev.Type == "step" {
			lines = append(lines, ev.Text)
		}
	}
	want := []string{"Step 1/5: FROM base:1", "Step 2/5: ENV A=1", "Step 3/5: RUN one", "Step 4/5: RUN two", `Step 5/5: CMD ["x"]`}
	if strings.Join(lines, "|") != strings.Join(want, "|") {
		t.Errorf("progress lines %q, want %q", lines, want)
	}
	if last := evs[len(evs)-1]; last.Type != "end" || last.Build.State != Succeeded {
		t.Errorf("last event %+v", last)
	}
	final := f.layers[b.Layer]
	if len(final.Below) != 2 || final.Below[0] != "base:1" || final.ImageConfig == nil || final.ImageConfig.Cmd[0] != "x" {
		t.Errorf("final layer %+v", final)
	}
	if f.envs["env"].Base != b.Layer {
		t.Errorf("environment %+v", f.envs["env"])
	}

	// The last step changed: one command runs, the first is cached.
	ran := f.ran
	b, evs = runJob(t, jobs, strings.Replace(df, "RUN two", "RUN three", 1))
	if b.State != Succeeded || f.ran != ran+1 || b.Steps[2].State != "cached" || b.Steps[3].State != "done" {
		t.Errorf("rebuild ran %d commands, steps %+v", f.ran-ran, b.Steps)
	}
	cached := 0
	for _, ev := range evs {
		if ev.Cached {
			cached++
			if !strings.HasSuffix(ev.Text, " CACHED") {
				t.Errorf("cached step line %q", ev.Text)
			}
		}
	}
	if cached != 1 {
		t.Errorf("%d cached progress lines, want 1", cached)
	}

	// A failing step names itself, leaves no environment and no sandbox.
	delete(f.envs, "env")
	b, _ = runJob(t, jobs, "FROM base:1\nRUN one\nRUN fail now\nRUN never\n")
	if b.State != Failed || !strings.Contains(b.Error, "step 3 (RUN fail now): the command failed: exit code 3") {
		t.Errorf("failed build = %s: %s", b.State, b.Error)
	}
	if _, ok := f.envs["env"]; ok {
		t.Error("a failed build saved its environment")
	}
	if len(f.live) != 0 {
		t.Errorf("sandboxes left: %v", f.live)
	}
	if b.Steps[3].State != "pending" {
		t.Errorf("the step after the failure: %+v", b.Steps[3])
	}

	// Checks refuse before anything is made.
	made := f.made
	for _, bad := range []string{"FROM nosuch:1\n", "FROM base:1\nHEALTHCHECK NONE\n", "FROM base:1\nCOPY x /y\n"} {
		if _, err := jobs.Check(context.Background(), Spec{Name: "env", Dockerfile: bad}, "/", nil); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
	if _, err := jobs.Check(context.Background(), Spec{Name: "env", Dockerfile: "FROM base:1\n", Runtime: "qemu"}, "/", nil); err == nil {
		t.Error("runtime qemu was accepted")
	}
	if f.made != made {
		t.Error("a refused build made a sandbox")
	}
	if len(jobs.List()) != 3 {
		t.Errorf("%d jobs listed, want 3", len(jobs.List()))
	}
}

// TestJobWaitsForRoom: a step whose sandbox the node refuses for room waits for it, saying so
// once in the build's log, and the build fails naming the wait when no room comes.
func TestJobWaitsForRoom(t *testing.T) {
	f := newFakeNode()
	jobs := NewJobs(context.Background(), f, "local", slog.New(slog.DiscardHandler))
	jobs.roomWait, jobs.roomRetry = time.Minute, 5*time.Millisecond
	f.full = 3
	b, evs := runJob(t, jobs, "FROM base:1\nRUN one\n")
	if b.State != Succeeded || f.full != 0 {
		t.Fatalf("build = %s (%s), %d refusals left", b.State, b.Error, f.full)
	}
	said := 0
	for _, ev := range evs {
		if ev.Type == "log" && strings.Contains(string(ev.Data), "the node is full; waiting up to 1m0s") {
			said++
		}
	}
	if said != 1 {
		t.Errorf("the wait was said %d times in the log, want once", said)
	}
	jobs.roomWait = 30 * time.Millisecond
	f.full = 1 << 20
	b, _ = runJob(t, jobs, "FROM base:1\nRUN two\n")
	if b.State != Failed || !strings.Contains(b.Error, "no room on the node for 30ms") || !strings.Contains(b.Error, "node full") {
		t.Errorf("build without room = %s: %s", b.State, b.Error)
	}
}

// TestJobFollowers reads one build's log from several goroutines while it runs.
func TestJobFollowers(t *testing.T) {
	f := newFakeNode()
	jobs := NewJobs(context.Background(), f, "local", slog.New(slog.DiscardHandler))
	var steps strings.Builder
	steps.WriteString("FROM base:1\n")
	for i := range 20 {
		fmt.Fprintf(&steps, "RUN step %d\n", i)
	}
	r, err := jobs.Check(context.Background(), Spec{Name: "env", Dockerfile: steps.String()}, "/", nil)
	if err != nil {
		t.Fatal(err)
	}
	job := jobs.Start(r, "/")
	var wg sync.WaitGroup
	counts := make([]int, 4)
	for i := range counts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := 0
			for {
				got, n, done, changed := job.Events(next)
				counts[i] += len(got)
				next = n
				if done {
					return
				}
				<-changed
			}
		}()
	}
	wg.Wait()
	jobs.Wait()
	for i, c := range counts {
		if c != counts[0] || c < 21 {
			t.Errorf("follower %d read %d events (first: %d)", i, c, counts[0])
		}
	}
}

// TestJobLogBudget: output beyond the budget drops the oldest output, keeps every event (so
// followers' positions hold) and every step line.
func TestJobLogBudget(t *testing.T) {
	job := &Job{changed: make(chan struct{})}
	job.emit(Event{Type: "step", Text: "Step 1/1: RUN x"})
	chunk := make([]byte, 1<<20)
	for range 20 {
		job.emit(Event{Type: "log", Data: chunk})
	}
	evs, n, _, _ := job.Events(0)
	if n != 21 || len(evs) != 21 || evs[0].Text != "Step 1/1: RUN x" {
		t.Fatalf("%d events, first %+v", n, evs[0])
	}
	held := 0
	for _, ev := range evs {
		held += len(ev.Data)
	}
	if held > maxLogBytes || held < maxLogBytes-(1<<20) || len(evs[20].Data) != 1<<20 || len(evs[1].Data) != 0 {
		t.Errorf("held %d bytes; newest %d, oldest %d", held, len(evs[20].Data), len(evs[1].Data))
	}
}

func TestJobCancel(t *testing.T) {
	f := newFakeNode()
	jobs := NewJobs(context.Background(), f, "local", slog.New(slog.DiscardHandler))
	r, err := jobs.Check(context.Background(), Spec{Name: "env", Dockerfile: "FROM base:1\nRUN block\n"}, "/", nil)
	if err != nil {
		t.Fatal(err)
	}
	job := jobs.Start(r, "/")
	for job.Snapshot().Steps[1].State != "running" {
		_, _, _, changed := job.Events(0)
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatal("the step did not start")
		}
	}
	job.Cancel()
	jobs.Wait()
	b := job.Snapshot()
	if b.State != Failed || !strings.Contains(b.Error, "cancelled") || !strings.Contains(b.Error, "step 2 (RUN block)") {
		t.Errorf("cancelled build = %s: %s", b.State, b.Error)
	}
	if len(f.live) != 0 || len(f.envs) != 0 {
		t.Errorf("left behind: sandboxes %v, environments %v", f.live, f.envs)
	}
}

// TestCheckEnvironmentOfAnotherProject: a build may not take over an environment name another
// project owns, the root included (whose canonical path is "", as "no owner" once was).
func TestCheckEnvironmentOfAnotherProject(t *testing.T) {
	node := newFakeNode()
	node.envs["taken"] = fakeEnv{Base: "base:1", Project: ""} // the root
	node.envs["team-env"] = fakeEnv{Base: "base:1", Project: "team"}
	jobs := NewJobs(context.Background(), node, "local", slog.New(slog.DiscardHandler))
	for _, name := range []string{"taken", "team-env"} {
		_, err := jobs.Check(context.Background(), Spec{Name: name, Dockerfile: "FROM base:1\n"}, "other", nil)
		if !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("%s: got %v, want a conflict", name, err)
		}
	}
	if _, err := jobs.Check(context.Background(), Spec{Name: "team-env", Dockerfile: "FROM base:1\n"}, "team", nil); err != nil {
		t.Errorf("the owner's rebuild: %v", err)
	}
}

func TestBuildIDNode(t *testing.T) {
	jobs := NewJobs(context.Background(), nil, "edge-2", slog.New(slog.DiscardHandler))
	id := buildIDPrefix + jobs.node + "-" + randHex(8)
	for in, want := range map[string]string{
		id:                           "edge-2",
		"bld-local-0123456789abcdef": "local",
		"bld-local-0123456789abcdeg": "",
		"bld--0123456789abcdef":      "",
		"bld-local-0123456789abcde":  "",
		"b0123456789abcdef":          "",
		"sb-local-aaaaaaaaaaaaaaaa":  "",
		"bld-a-b-c-0123456789abcdef": "a-b-c",
	} {
		if got := NodeOf(in); got != want {
			t.Errorf("NodeOf(%q) = %q, want %q", in, got, want)
		}
	}
}
