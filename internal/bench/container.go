// Package bench measures Corral against baselines taken in the same run: create-to-first-exec
// against `runc run` of the same composed rootfs, exec round trip against `runc exec`, creation
// throughput, and host memory per idle sandbox. `corral bench container` runs it against a running
// `corral up` on this machine (it reads the layer store and runc through the data dir that
// GET /v1/info names), so it must run as root on the same host.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
	"golang.org/x/sys/unix"
)

// Config sets the sizes of a container benchmark run.
type Config struct {
	Base        string // layer NAME:VERSION to create sandboxes from
	TTIRounds   int    // create→first exec samples (and as many runc run samples)
	ExecRounds  int    // exec round trips
	Throughput  int    // sandboxes created in the throughput test
	Concurrency int    // concurrent creators in the throughput test
	Idle        int    // idle sandboxes for the memory measure
	// Settle is the pause after each create→first exec sample and each runc run sample, so that
	// neither side's background work (Corral's delete cleanup and pool refills, the kernel's
	// teardown of runc's container) runs in the other's next sample. 0: back to back, as before
	// 2026-12-04.
	Settle time.Duration
	// ExecGap is a pause between a TTI sample's create and its first exec (a client that thinks
	// first); the TTI figures leave it out. 0: the exec follows at once.
	ExecGap time.Duration
	// Alone is the create→first exec samples taken first, with no other sandbox on the node
	// (each deleted, and aloneGap waited, before the next): a client running one sandbox at a
	// time, whose sandbox finds its layers only as the last one left them. The other samples run
	// beside a sandbox that holds the base layer for the runc baseline. 0 skips them.
	Alone int
}

// aloneGap is the pause between Alone samples: the last one's delete (its cleanup runs after
// the call returns) has then released its layers.
const aloneGap = 500 * time.Millisecond

// Stats summarises samples in milliseconds.
type Stats struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Min float64 `json:"min_ms"`
	Max float64 `json:"max_ms"`
}

func summarise(d []time.Duration) Stats {
	if len(d) == 0 {
		return Stats{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	q := func(p float64) float64 {
		i := int(p*float64(len(s))+0.5) - 1
		return ms(s[max(0, min(i, len(s)-1))])
	}
	return Stats{N: len(s), P50: q(0.50), P99: q(0.99), Min: ms(s[0]), Max: ms(s[len(s)-1])}
}

// Result is what one run measured.
type Result struct {
	Date        string `json:"date"`
	Host        string `json:"host"`
	RuncVersion string `json:"runc_version"`
	Base        string `json:"base"`

	TTI         Stats   `json:"tti_create_to_first_exec"`
	TTIBaseline Stats   `json:"tti_baseline_runc_run_true"`
	TTIRatioP50 float64 `json:"tti_ratio_p50"`
	TTISettleMs float64 `json:"tti_settle_ms"`
	// The TTI's parts: the create's answer, the first exec of `true`, and a second one right
	// after it (not part of the TTI).
	TTICreate     Stats `json:"tti_create"`
	TTIFirstExec  Stats `json:"tti_first_exec"`
	TTISecondExec Stats `json:"tti_second_exec"`
	// TTIAlone is create→first exec with no other sandbox on the node (Config.Alone), and its
	// ratio to the runc run baseline above (whose rootfs, a mounted layer, is warm in the page
	// cache as a local directory would be).
	TTIAlone          Stats   `json:"tti_alone_create_to_first_exec"`
	TTIAloneCreate    Stats   `json:"tti_alone_create"`
	TTIAloneFirstExec Stats   `json:"tti_alone_first_exec"`
	TTIAloneRatioP50  float64 `json:"tti_alone_ratio_p50,omitempty"`
	Exec              Stats   `json:"exec_true_round_trip"`
	ExecBaseline      Stats   `json:"exec_baseline_runc_exec_true"`
	ExecRatioP50      float64 `json:"exec_ratio_p50"`

	ThroughputPerSec         float64 `json:"create_throughput_per_s"`
	ThroughputBaselinePerSec float64 `json:"create_throughput_baseline_runc_run_detach_per_s"`
	ThroughputRatio          float64 `json:"create_throughput_ratio"`
	Concurrency              int     `json:"create_concurrency"`

	Idle                 int     `json:"idle_sandboxes"`
	IdleHostMiBPerSbx    float64 `json:"idle_host_mib_per_sandbox"`
	IdleAgentPSSMiB      float64 `json:"idle_agent_pss_mib"`
	IdleCgroupMiB        float64 `json:"idle_cgroup_usage_mib"`
	IdleEdgeMiBPerSbx    float64 `json:"idle_edge_rss_mib_per_sandbox"`
	IdleKernelMiBPerSbx  float64 `json:"idle_kernel_mib_per_sandbox"`
	IdleMemAvailableNote string  `json:"idle_note"`
}

// Container runs the container-tier benchmark.
func Container(ctx context.Context, c *corral.Client, cfg Config, log *slog.Logger) (*Result, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	res := &Result{Date: time.Now().UTC().Format(time.RFC3339), Host: host, RuncVersion: info.RuntimeVersion, Base: cfg.Base}
	if cfg.Alone > 0 {
		log.Info("measuring time to interactive with no other sandbox", "rounds", cfg.Alone)
		var tti, creates, firsts []time.Duration
		for i := range cfg.Alone + 1 { // the first one warms up
			p, err := ttiParts(ctx, c, cfg.Base, false, cfg.ExecGap)
			if err != nil {
				return nil, err
			}
			if i > 0 {
				tti, creates, firsts = append(tti, p.total), append(creates, p.create), append(firsts, p.first)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(max(cfg.Settle, aloneGap)):
			}
		}
		res.TTIAlone, res.TTIAloneCreate, res.TTIAloneFirstExec = summarise(tti), summarise(creates), summarise(firsts)
	}
	b, _, done, err := baselineOn(ctx, c, info, cfg.Base)
	if err != nil {
		return nil, err
	}
	defer done()

	// Warm up both paths once.
	if _, err := ttiOnce(ctx, c, cfg.Base); err != nil {
		return nil, err
	}
	if _, err := b.run(ctx, "warm"); err != nil {
		return nil, err
	}
	log.Info("measuring time to interactive", "rounds", cfg.TTIRounds)
	var tti, creates, firsts, seconds, base []time.Duration
	for i := range cfg.TTIRounds {
		p, err := ttiParts(ctx, c, cfg.Base, true, cfg.ExecGap)
		if err != nil {
			return nil, err
		}
		tti, creates, firsts, seconds = append(tti, p.total), append(creates, p.create), append(firsts, p.first), append(seconds, p.second)
		time.Sleep(cfg.Settle)
		d, err := b.run(ctx, fmt.Sprintf("run-%d", i))
		if err != nil {
			return nil, err
		}
		base = append(base, d)
		time.Sleep(cfg.Settle)
	}
	res.TTI, res.TTIBaseline = summarise(tti), summarise(base)
	res.TTICreate, res.TTIFirstExec, res.TTISecondExec = summarise(creates), summarise(firsts), summarise(seconds)
	res.TTIRatioP50 = res.TTI.P50 / res.TTIBaseline.P50
	if cfg.Alone > 0 {
		res.TTIAloneRatioP50 = res.TTIAlone.P50 / res.TTIBaseline.P50
	}
	res.TTISettleMs = float64(cfg.Settle.Microseconds()) / 1000

	log.Info("measuring exec round trip", "rounds", cfg.ExecRounds)
	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base})
	if err != nil {
		return nil, err
	}
	var ex []time.Duration
	for range cfg.ExecRounds {
		start := time.Now()
		if _, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil || exit == nil || exit.Code != 0 {
			return nil, fmt.Errorf("exec true: %v %+v", err, exit)
		}
		ex = append(ex, time.Since(start))
	}
	c.DeleteSandbox(ctx, sb.ID)
	bex, err := b.execs(ctx, min(cfg.ExecRounds, 100))
	if err != nil {
		return nil, err
	}
	res.Exec, res.ExecBaseline = summarise(ex), summarise(bex)
	res.ExecRatioP50 = res.Exec.P50 / res.ExecBaseline.P50

	log.Info("measuring creation throughput", "sandboxes", cfg.Throughput, "concurrency", cfg.Concurrency)
	res.Concurrency = cfg.Concurrency
	ids := make(chan string, cfg.Throughput)
	work := make(chan struct{}, cfg.Throughput)
	for range cfg.Throughput {
		work <- struct{}{}
	}
	close(work)
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	start := time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base})
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				ids <- sb.ID
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(ids)
	var created []string
	for id := range ids {
		created = append(created, id)
	}
	if firstErr != nil {
		deleteAll(ctx, c, created)
		return nil, firstErr
	}
	res.ThroughputPerSec = float64(len(created)) / elapsed.Seconds()
	deleteAll(ctx, c, created)
	if res.ThroughputBaselinePerSec, err = b.throughput(ctx, cfg.Throughput, cfg.Concurrency); err != nil {
		return nil, err
	}
	res.ThroughputRatio = res.ThroughputPerSec / res.ThroughputBaselinePerSec

	if cfg.Idle > 0 {
		if err := idleMemory(ctx, c, cfg, info, res, log); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func ttiOnce(ctx context.Context, c *corral.Client, base string) (time.Duration, error) {
	s, err := ttiParts(ctx, c, base, false, 0)
	return s.total, err
}

// ttiSample is one create→first exec: the whole, its create and its first exec, and (when
// asked) the second exec of `true` right after, which tells what the first one pays for being
// first.
type ttiSample struct{ total, create, first, second time.Duration }

// ttiParts creates a sandbox of base, runs `true` in it (twice with second) gap after the
// create's answer (the gap is in no figure), and deletes it.
func ttiParts(ctx context.Context, c *corral.Client, base string, second bool, gap time.Duration) (ttiSample, error) {
	var s ttiSample
	start := time.Now()
	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: base})
	if err != nil {
		return s, err
	}
	defer c.DeleteSandbox(ctx, sb.ID)
	s.create = time.Since(start)
	time.Sleep(gap)
	runTrue := func(what string) (time.Duration, error) {
		t := time.Now()
		_, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}})
		if err != nil || exit == nil || exit.Code != 0 {
			return 0, fmt.Errorf("%s exec: %v %+v", what, err, exit)
		}
		return time.Since(t), nil
	}
	if s.first, err = runTrue("first"); err != nil {
		return s, err
	}
	s.total = s.create + s.first
	if second {
		s.second, err = runTrue("second")
	}
	return s, err
}

func deleteAll(ctx context.Context, c *corral.Client, ids []string) {
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			c.DeleteSandbox(ctx, id)
			<-sem
		}()
	}
	wg.Wait()
}

// idleMemory creates cfg.Idle idle sandboxes and measures what they cost the host.
func idleMemory(ctx context.Context, c *corral.Client, cfg Config, info *corral.Info, res *Result, log *slog.Logger) error {
	edgePid := findCorralUp(info.DataDir)
	log.Info("measuring idle memory", "sandboxes", cfg.Idle, "corral_up_pid", edgePid)
	dropCaches()
	availBefore := memAvailable()
	edgeBefore := rssOf(edgePid)
	var ids []string
	defer func() { deleteAll(ctx, c, ids) }()
	for range cfg.Idle {
		sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base, Limits: corral.Limits{DiskBytes: 64 << 20}})
		if err != nil {
			return fmt.Errorf("idle sandbox %d: %w", len(ids), err)
		}
		ids = append(ids, sb.ID)
		// One exec each, so every agent has served a request (as a real idle sandbox has).
		if _, _, _, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
			return err
		}
	}
	time.Sleep(2 * time.Second) // let the pool refill and the GC settle
	dropCaches()
	availAfter := memAvailable()
	var pss, cg float64
	for _, id := range ids {
		pid := readInt(filepath.Join(info.DataDir, "sandboxes", id, "init.pid"))
		pss += float64(pssOf(pid))
		if p := cgroupMemFile(id); p != "" {
			cg += float64(readInt(p))
		}
	}
	n := float64(len(ids))
	const mib = 1 << 20
	res.Idle = len(ids)
	res.IdleHostMiBPerSbx = float64(availBefore-availAfter) / n / mib
	res.IdleAgentPSSMiB = pss / n / mib
	res.IdleCgroupMiB = cg / n / mib
	res.IdleEdgeMiBPerSbx = float64(rssOf(edgePid)-edgeBefore) / n / mib
	res.IdleKernelMiBPerSbx = res.IdleHostMiBPerSbx - res.IdleAgentPSSMiB - res.IdleEdgeMiBPerSbx
	res.IdleMemAvailableNote = "host = drop in MemAvailable (page cache dropped before both reads) / sandboxes; kernel = host - agent PSS - edge RSS growth (mounts, loop devices, cgroups, namespaces, page tables)"
	return nil
}

func cgroupMemFile(id string) string {
	m, _ := filepath.Glob("/sys/fs/cgroup/memory/*/" + id + "/memory.usage_in_bytes")
	if len(m) > 0 {
		return m[0]
	}
	m, _ = filepath.Glob("/sys/fs/cgroup/*/" + id + "/memory.current")
	if len(m) > 0 {
		return m[0]
	}
	return ""
}

func dropCaches() {
	unix.Sync()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200)
}

func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// smapsField returns a "Field:  N kB" value of /proc/pid/smaps_rollup in bytes.
func smapsField(pid int64, field string) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func pssOf(pid int64) int64 { return smapsField(pid, "Pss") }
func rssOf(pid int64) int64 { return smapsField(pid, "Rss") }

// findCorralUp returns the pid of the `corral up` serving dataDir, or 0.
func findCorralUp(dataDir string) int64 {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.ParseInt(e.Name(), 10, 64)
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == "corral" && args[1] == "up" && (slices.Contains(args, dataDir) || slices.Contains(args, "--data-dir="+dataDir) || (dataDir == "/var/lib/corral" && !slices.Contains(args, "--data-dir"))) {
			return pid
		}
	}
	return 0
}

// baseline runs the same rootfs with plain runc: `runc spec` defaults, an overlay of the layer.
type baseline struct {
	runc, dir, root string
}

func newBaseline(ctx context.Context, runc, layerDir string) (*baseline, error) {
	dir, err := os.MkdirTemp("", "corral-bench-")
	if err != nil {
		return nil, err
	}
	b := &baseline{runc: runc, dir: dir, root: filepath.Join(dir, "state")}
	for _, d := range []string{"rootfs", "upper", "work", "state"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", layerDir, filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := unix.Mount("overlay", filepath.Join(dir, "rootfs"), "overlay", 0, opts); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("baseline overlay: %w", err)
	}
	if out, err := exec.CommandContext(ctx, runc, "spec", "--bundle", dir).CombinedOutput(); err != nil {
		b.close()
		return nil, fmt.Errorf("runc spec: %v: %s", err, out)
	}
	if err := b.setArgs("/bin/true"); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *baseline) setArgs(args ...string) error {
	path := filepath.Join(b.dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"], proc["args"] = false, args
	raw, _ = json.Marshal(spec)
	return os.WriteFile(path, raw, 0o644)
}

// baselineOn prepares the runc baseline on the base layer as Corral's sandboxes see it: a
// sandbox of base (returned, for the caller's own use too) keeps the layer mounted, and the
// baseline's bundle stacks on that mount. done removes both.
func baselineOn(ctx context.Context, c *corral.Client, info *corral.Info, base string) (*baseline, string, func(), error) {
	name, version, _ := strings.Cut(base, ":")
	layer, err := c.Layer(ctx, name, version)
	if err != nil {
		return nil, "", nil, fmt.Errorf("base layer %s: %w", base, err)
	}
	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: base, Labels: map[string]string{"bench": "layer-holder"}})
	if err != nil {
		return nil, "", nil, fmt.Errorf("hold the base layer: %w", err)
	}
	release := func() { c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID) }
	dir := filepath.Join(info.DataDir, "layers", "mnt", strings.TrimPrefix(layer.Digest, "sha256:"))
	if _, err := os.Stat(filepath.Join(dir, "bin")); err != nil {
		release()
		return nil, "", nil, fmt.Errorf("the base layer's mount %s: %w (run the benchmark on the host that runs corral, as root)", dir, err)
	}
	b, err := newBaseline(ctx, info.RuntimePath, dir)
	if err != nil {
		release()
		return nil, "", nil, err
	}
	return b, sb.ID, func() { b.close(); release() }, nil
}

// run times `runc run` of /bin/true to its exit.
func (b *baseline) run(ctx context.Context, id string) (time.Duration, error) {
	start := time.Now()
	cmd := exec.CommandContext(ctx, b.runc, "--root", b.root, "run", "--bundle", b.dir, "bench-"+id)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("runc run: %v: %s", err, out)
	}
	d := time.Since(start)
	exec.Command(b.runc, "--root", b.root, "delete", "-f", "bench-"+id).Run()
	return d, nil
}

// execs times `runc exec` of /bin/true in a running container, n times.
func (b *baseline) execs(ctx context.Context, n int) ([]time.Duration, error) {
	if err := b.setArgs("/bin/sleep", "3600"); err != nil {
		return nil, err
	}
	defer b.setArgs("/bin/true")
	id := fmt.Sprintf("bench-exec-%d", os.Getpid())
	exec.Command(b.runc, "--root", b.root, "delete", "-f", id).Run()
	// Stdio stays nil (/dev/null): a pipe would be held open by the detached container.
	logPath := filepath.Join(b.dir, "runc.log")
	cmd := exec.CommandContext(ctx, b.runc, "--root", b.root, "--log", logPath, "run", "--detach", "--bundle", b.dir, id)
	if err := cmd.Run(); err != nil {
		msg, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("runc run --detach: %w: %s", err, msg)
	}
	defer exec.Command(b.runc, "--root", b.root, "delete", "-f", id).Run()
	var out []time.Duration
	for range n {
		start := time.Now()
		if o, err := exec.CommandContext(ctx, b.runc, "--root", b.root, "exec", id, "/bin/true").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("runc exec: %v: %s", err, o)
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// throughput starts n detached containers (sleep) of the baseline bundle with the given
// concurrency and returns containers per second; it removes them afterwards.
func (b *baseline) throughput(ctx context.Context, n, concurrency int) (float64, error) {
	if err := b.setArgs("/bin/sleep", "3600"); err != nil {
		return 0, err
	}
	defer b.setArgs("/bin/true")
	ids := make(chan string, n)
	for i := range n {
		ids <- fmt.Sprintf("bench-tp-%d-%d", os.Getpid(), i)
	}
	close(ids)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var started []string
	var firstErr error
	start := time.Now()
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				if err := exec.CommandContext(ctx, b.runc, "--root", b.root, "run", "--detach", "--bundle", b.dir, id).Run(); err != nil {
					mu.Lock()
					firstErr = fmt.Errorf("runc run --detach %s: %w", id, err)
					mu.Unlock()
					continue
				}
				mu.Lock()
				started = append(started, id)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	sem := make(chan struct{}, 4)
	for _, id := range started {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			exec.Command(b.runc, "--root", b.root, "delete", "-f", id).Run()
			<-sem
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(len(started)) / elapsed.Seconds(), nil
}

func (b *baseline) close() {
	unix.Unmount(filepath.Join(b.dir, "rootfs"), unix.MNT_DETACH)
	os.RemoveAll(b.dir)
}
