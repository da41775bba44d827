package runc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/runtime"
)

// TestCreateLatency compares Create (and Create plus the first command through the agent)
// with plain `runc run` of the same composed rootfs running /bin/true, interleaved in one run.
// CORRAL_BENCH_N sets the number of rounds (default 30). Skipped with -short.
//
//	go test ./internal/runtime/runc -run TestCreateLatency -v -count=1
func TestCreateLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: a latency measurement")
	}
	e := newTestEnv(t, nil)
	ctx := context.Background()
	n := 30
	if v, err := strconv.Atoi(os.Getenv("CORRAL_BENCH_N")); err == nil && v > 0 {
		n = v
	}

	// The baseline: runc's own default spec (`runc spec`), args /bin/true, over an overlay of
	// the same layers.
	bdir := filepath.Join(e.top, "baseline")
	for _, d := range []string{"rootfs", "upper", "work"} {
		os.MkdirAll(filepath.Join(bdir, d), 0o755)
	}
	if err := mountOverlay(filepath.Join(bdir, "rootfs"), []string{fx.base, fx.top}, filepath.Join(bdir, "upper"), filepath.Join(bdir, "work"), nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(ctx, bdir) })
	if out, err := exec.Command(fx.runc, "spec", "--bundle", bdir).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v: %s", err, out)
	}
	var spec map[string]any
	b, _ := os.ReadFile(filepath.Join(bdir, "config.json"))
	json.Unmarshal(b, &spec)
	proc := spec["process"].(map[string]any)
	proc["terminal"], proc["args"] = false, []string{"/bin/true"}
	b, _ = json.Marshal(spec)
	os.WriteFile(filepath.Join(bdir, "config.json"), b, 0o644)
	baseRoot := filepath.Join(e.top, "baseline-state")

	waitPool := func() {
		waitFor(t, 30*time.Second, func() bool { return len(e.r.ready) == cap(e.r.ready) })
	}
	var runcRun, create, createStart, firstExec, del []time.Duration
	for i := range n {
		start := time.Now()
		cmd := exec.Command(fx.runc, "--root", baseRoot, "run", "--bundle", bdir, fmt.Sprintf("base-%d", i))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("runc run: %v: %s", err, out)
		}
		runcRun = append(runcRun, time.Since(start))

		for _, cs := range []bool{false, true} {
			waitPool()
			e.r.createStart = cs
			id := fmt.Sprintf("lat-%d-%v", i, cs)
			start = time.Now()
			sb, err := e.r.Create(ctx, runtime.Spec(e.spec(id)))
			if err != nil {
				t.Fatal(err)
			}
			if cs {
				createStart = append(createStart, time.Since(start))
			} else {
				create = append(create, time.Since(start))
				okSh(t, sb.AgentSocket, "true")
				firstExec = append(firstExec, time.Since(start))
			}
			start = time.Now()
			if err := e.r.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			del = append(del, time.Since(start))
		}
	}
	e.r.createStart = false
	p := func(d []time.Duration, q float64) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		i := int(float64(len(d))*q+0.999999) - 1
		return d[max(0, min(i, len(d)-1))].Round(100 * time.Microsecond)
	}
	ratio := float64(p(create, 0.5)) / float64(p(runcRun, 0.5))
	t.Logf("%s, %d rounds, pool of %d pre-mounted disks (full before each Create)", e.r.version, n, cap(e.r.ready))
	t.Logf("runc run /bin/true (baseline)       p50 %v  p99 %v", p(runcRun, 0.5), p(runcRun, 0.99))
	t.Logf("Create (runc run --detach)          p50 %v  p99 %v  (%.2fx baseline p50)", p(create, 0.5), p(create, 0.99), ratio)
	t.Logf("Create + first command via agent    p50 %v  p99 %v  (%.2fx)", p(firstExec, 0.5), p(firstExec, 0.99), float64(p(firstExec, 0.5))/float64(p(runcRun, 0.5)))
	t.Logf("Create (runc create + runc start)   p50 %v  p99 %v", p(createStart, 0.5), p(createStart, 0.99))
	t.Logf("Delete                              p50 %v  p99 %v", p(del, 0.5), p(del, 0.99))
}

// BenchmarkCreateDelete measures a Create and a Delete of a sandbox from the pool.
func BenchmarkCreateDelete(b *testing.B) {
	e := newTestEnv(b, nil)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprintf("bench-%d", i)
		if _, err := e.r.Create(ctx, runtime.Spec(e.spec(id))); err != nil {
			b.Fatal(err)
		}
		if err := e.r.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStatus is what the edge's reaper pays a running sandbox every second: its Status,
// with the pidfd of its init held ("pidfd") and with the pid file and the cgroup's process list
// read, as every Status did before liveInits ("files").
func BenchmarkStatus(b *testing.B) {
	e := newTestEnv(b, nil)
	ctx := context.Background()
	sb := e.create(e.spec("status"))
	for _, mode := range []string{"pidfd", "files"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				if mode == "files" {
					e.r.inits.drop(sb.ID)
				}
				if st, err := e.r.Status(ctx, sb.ID); err != nil || st.State != runtime.StateRunning {
					b.Fatalf("Status = %+v, %v", st, err)
				}
			}
		})
	}
}

// BenchmarkRender is the per-Create cost of the spec: the template with the seccomp profile
// spliced in as bytes.
func BenchmarkRender(b *testing.B) {
	tmpl, err := newTemplate(ptr(-1000), false, true)
	if err != nil {
		b.Fatal(err)
	}
	s := Spec{ID: "x", Hostname: "x", AgentArgs: []string{"serve"}, CPUs: 1, MemoryBytes: 1 << 30, Pids: 100, OpenFiles: 1024, ShmBytes: 1 << 20}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.render(&s, "/corral/x", nil, nil, nil, Budgets{}); err != nil {
			b.Fatal(err)
		}
	}
}
