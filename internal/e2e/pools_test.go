package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// warmEnv polls GET /v1/environments/{name} until cond holds of it.
func (p *corralProc) warmEnv(name, what string, cond func(e *corral.Environment) bool) *corral.Environment {
	p.t.Helper()
	var env *corral.Environment
	eventually(p.t, 2*time.Minute, what, func() bool {
		var err error
		env, err = p.Client.Environment(context.Background(), name)
		return err == nil && cond(env)
	})
	return env
}

// metrics returns GET /v1/metrics.
func (p *corralProc) metrics() string {
	p.t.Helper()
	req, _ := http.NewRequest("GET", p.URL+"/v1/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+p.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// sandboxDirs lists the per-sandbox state corral keeps under its data dir and cgroup parent.
func (p *corralProc) sandboxDirs() []string {
	var out []string
	for _, sub := range []string{"sandboxes", "runc"} {
		entries, _ := os.ReadDir(filepath.Join(p.DataDir, sub))
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "sb-") {
				out = append(out, filepath.Join(sub, e.Name()))
			}
		}
	}
	ctrls, _ := filepath.Glob("/sys/fs/cgroup/*" + p.Cgroup)
	for _, dir := range ctrls {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), "sb-") {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
	}
	return out
}

// TestWarmPools: an environment with warm N keeps N started sandboxes ready, charged to no
// quota and listed nowhere; a matching create claims one (the request's labels, env vars, TTL
// and egress policy applied at the claim), a mismatching one is created fresh; warm 0 drains
// the pool leaving nothing; a restart deletes the pooled sandboxes of the earlier run and fills
// the pool again.
func TestWarmPools(t *testing.T) {
	needRoot(t)
	startInternet(t)
	services := filepath.Join(t.TempDir(), "services.json")
	os.WriteFile(services, []byte(`{"services": {"grader": {"addresses": ["`+inetGrader+`:80/tcp"]},
		"github": {"addresses": ["`+inetGitHub+`:80/tcp"]}}}`), 0o644)
	p := withBase(t, "--services", services, "--dns-upstream", inetDNS)
	ctx := context.Background()
	reach := func(p *corralProc, id, addr string) bool {
		out, _, _ := p.run(id, "/bin/sh", "-c", `printf 'GET / HTTP/1.0\r\nHost: x\r\n\r\n' | timeout 4 nc -w 2 `+addr+` 80 | tail -n 1`)
		return strings.HasPrefix(strings.TrimSpace(out), "served by")
	}
	forRuntimes(t, func(t *testing.T, rt string) {
		if rt == "microvm" {
			t.Skip("microvm pools have their own test (TestWarmPoolMicroVM): a pool of 3 VMs is too heavy here")
		}
		sub := *p
		sub.t = t
		p := &sub
		name := "warm-" + rt
		const n = 3
		if _, stderr, code := p.cli("", "env", "create", name, "--base", "base:test", "--runtime", rt, "--net", "allowlist", "--warm", "3"); code != 0 {
			t.Fatalf("corral env create --warm: %s", stderr)
		}
		env := p.warmEnv(name, "the pool to fill", func(e *corral.Environment) bool { return e.WarmReady == n })
		if env.Warm != n || env.Runtime != rt || env.Network == nil || env.Network.Mode != corral.NetworkAllowlist {
			t.Errorf("environment = %+v", env)
		}
		// Pooled sandboxes are nobody's: not listed, no quota used.
		if list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{State: corral.StateRunning}); err != nil || len(list) != 0 {
			t.Errorf("sandboxes listed with only a pool: %d, %v", len(list), err)
		}
		if _, err := p.Client.CreateProject(ctx, "team-"+rt); err != nil {
			t.Fatal(err)
		}
		one := int64(1)
		if _, err := p.Client.SetQuota(ctx, "team-"+rt, corral.Quota{Sandboxes: &one}); err != nil {
			t.Fatal(err)
		}

		// A claim: the request's project, labels, env vars, TTL and egress policy.
		before := time.Now()
		sb, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Environment: name, Project: "team-" + rt,
			Labels: map[string]string{"task": "t1"}, Env: []string{"TASK=t1"}, TTL: "20m",
			Network: &corral.NetworkPolicy{Allow: []string{"grader"}}})
		if err != nil {
			t.Fatal(err)
		}
		env = p.warmEnv(name, "the claim counted", func(e *corral.Environment) bool { return e.WarmClaims >= 1 })
		if env.WarmHits != 1 || env.WarmClaims != 1 || env.WarmHitRate != 1 {
			t.Errorf("after a matching create: hits %d of %d claims (rate %g), want 1 of 1", env.WarmHits, env.WarmClaims, env.WarmHitRate)
		}
		if sb.Runtime != rt || sb.Project != "team-"+rt || sb.Labels["task"] != "t1" || sb.Hostname != sb.ID || sb.CreatedAt.Before(before.Add(-time.Second)) ||
			sb.ExpiresAt.Sub(sb.CreatedAt) != 20*time.Minute || sb.Environment != name || sb.Network == nil || len(sb.Network.Allow) != 1 {
			t.Errorf("claimed sandbox = %+v", sb)
		}
		if got := p.sh(sb.ID, `echo "$TASK $(hostname)"`); strings.TrimSpace(got) != "t1 "+sb.ID {
			t.Errorf("env var and hostname in the claimed sandbox: %q", got)
		}
		if !reach(p, sb.ID, inetGrader) {
			t.Errorf("the claim's allowed target %s is unreachable", inetGrader)
		}
		if reach(p, sb.ID, inetGitHub) {
			t.Errorf("the claim's policy does not allow %s, yet it is reachable", inetGitHub)
		}
		// Its events are those of a fresh sandbox, and the pool made none.
		eventually(t, 30*time.Second, "the claimed sandbox's created and started events", func() bool {
			seen, ok := eventCounts(p, before.Add(-time.Minute))
			return ok && seen[sb.ID+" "+corral.EventCreated] == 1 && seen[sb.ID+" "+corral.EventStarted] == 1
		})

		if m := p.metrics(); !strings.Contains(m, `corral_warm_claims_total{environment="`+name+`",runtime="`+rt+`",networked="true",hit="true"} 1`) {
			t.Errorf("metrics lack the pool's hit:\n%s", m)
		}
		// Quota: the pool charged none of it; the claim charged one, so a second create in the
		// project is refused and leaves the pool as it was.
		q, err := p.Client.Quota(ctx, "team-"+rt)
		if err != nil || q.Usage.Sandboxes != 1 {
			t.Errorf("project usage after one claim = %+v, %v", q, err)
		}
		if _, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Environment: name, Project: "team-" + rt}); err == nil {
			t.Errorf("a second create over the project's quota succeeded")
		}
		p.warmEnv(name, "the pool to refill", func(e *corral.Environment) bool { return e.WarmReady == n })

		// Mismatches: other limits, a hostname, network none: each created fresh.
		for i, req := range []corral.CreateRequest{
			{Environment: name, Limits: corral.Limits{MemoryBytes: 300 << 20}},
			{Environment: name, Hostname: "box"},
			{Environment: name, Network: &corral.NetworkPolicy{Mode: corral.NetworkNone}},
		} {
			got, err := p.Client.CreateSandbox(ctx, req)
			if err != nil {
				t.Fatalf("mismatching create %d: %v", i, err)
			}
			if req.Hostname != "" && got.Hostname != "box" {
				t.Errorf("fresh create's hostname = %q", got.Hostname)
			}
			if out := p.sh(got.ID, "echo ok"); strings.TrimSpace(out) != "ok" {
				t.Errorf("fresh sandbox: %q", out)
			}
		}
		env = p.warmEnv(name, "claims counted", func(e *corral.Environment) bool { return e.WarmClaims >= 4 })
		if env.WarmHits != 1 || env.WarmClaims != 4 {
			t.Errorf("after three mismatching creates: hits %d of %d claims, want 1 of 4", env.WarmHits, env.WarmClaims)
		}
		if list, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{State: corral.StateRunning}); len(list) != 4 {
			t.Errorf("sandboxes listed: %d, want 4 (the pool's are not)", len(list))
		}
		for _, s := range func() []corral.Sandbox {
			l, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{State: corral.StateRunning})
			return l
		}() {
			p.Client.DeleteSandbox(ctx, s.ID)
		}

		// warm 0 drains the pool: nothing of it is left.
		if _, stderr, code := p.cli("", "env", "set", name, "--warm", "0"); code != 0 {
			t.Fatalf("corral env set --warm 0: %s", stderr)
		}
		p.warmEnv(name, "the pool to drain", func(e *corral.Environment) bool { return e.WarmReady == 0 })
		eventually(t, time.Minute, "nothing of the pool left", func() bool { return len(p.sandboxDirs()) == 0 })
		if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), filepath.Join(p.DataDir, "sandboxes", "sb-")) {
			t.Errorf("sandbox mounts left after the drain")
		}
		if err := p.Client.DeleteEnvironment(ctx, name); err != nil {
			t.Fatal(err)
		}
	})

	// Bad input: a clear 4xx, nothing saved.
	for _, bad := range []corral.Environment{{Name: "bad", Base: "base:test", Warm: -1}, {Name: "bad", Base: "base:test", Warm: 257},
		{Name: "bad", Base: "base:test", Runtime: "kata"}, {Name: "bad", Base: "base:test", Network: &corral.NetworkPolicy{Mode: "wide"}}} {
		if _, err := p.Client.SaveEnvironment(ctx, bad); !corral.IsInvalid(err) {
			t.Errorf("SaveEnvironment(%+v): %v, want invalid", bad, err)
		}
	}
	if _, err := p.Client.Environment(ctx, "bad"); !corral.IsNotFound(err) {
		t.Errorf("a refused environment was saved: %v", err)
	}
	if _, err := p.Client.SaveEnvironment(ctx, corral.Environment{Name: "cold", Base: "base:test"}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []int{-1, 1000} {
		if _, err := p.Client.UpdateEnvironment(ctx, "cold", corral.EnvironmentPatch{Warm: &w}); !corral.IsInvalid(err) {
			t.Errorf("PATCH warm %d: %v, want invalid", w, err)
		}
	}
	if e, err := p.Client.Environment(ctx, "cold"); err != nil || e.Warm != 0 {
		t.Errorf("after refused PATCHes: %+v, %v", e, err)
	}
	if _, err := p.Client.UpdateEnvironment(ctx, "nope", corral.EnvironmentPatch{Warm: new(int)}); !corral.IsNotFound(err) {
		t.Errorf("PATCH of a missing environment: %v, want not found", err)
	}

	// Restart: the pool of the earlier run is deleted, not adopted, and filled again.
	if _, stderr, code := p.cli("", "env", "create", "warm-restart", "--base", "base:test", "--net", "allowlist", "--warm", "2"); code != 0 {
		t.Fatalf("corral env create: %s", stderr)
	}
	p.warmEnv("warm-restart", "the pool to fill", func(e *corral.Environment) bool { return e.WarmReady == 2 })
	old := p.sandboxDirs()
	p.Kill9()
	p.Restart()
	p.warmEnv("warm-restart", "the pool to fill after the restart", func(e *corral.Environment) bool { return e.WarmReady == 2 })
	now := strings.Join(p.sandboxDirs(), "\n")
	for _, d := range old {
		if strings.Contains(now, filepath.Base(d)) && strings.HasPrefix(filepath.Base(d), "sb-") {
			t.Errorf("a pooled sandbox of the earlier run survived the restart: %s", d)
		}
	}
	sb := p.create(corral.CreateRequest{Environment: "warm-restart", Network: &corral.NetworkPolicy{Allow: []string{"grader"}}})
	if !reach(p, sb.ID, inetGrader) {
		t.Errorf("a claim after the restart cannot reach its allowed target")
	}
	if err := p.Client.DeleteEnvironment(ctx, "warm-restart"); err != nil {
		t.Fatal(err)
	}
	p.Client.DeleteSandbox(ctx, sb.ID)
	p.Stop()
	assertNoLeftovers(t, p)
}

// TestWarmPoolTagMove: when a tag the environment names moves, the pooled sandboxes made with
// the old version are never claimed: the create gets the new version, as a fresh create would,
// and the pool refills with it.
func TestWarmPoolTagMove(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	mk := func(content string) string {
		dir := t.TempDir()
		os.MkdirAll(filepath.Join(dir, "opt/tk"), 0o755)
		os.WriteFile(filepath.Join(dir, "opt/tk/version"), []byte(content), 0o644)
		return dir
	}
	p.importDir("tk", "1", corral.KindToolkit, mk("one\n"))
	p.importDir("tk", "2", corral.KindToolkit, mk("two\n"))
	if _, err := p.Client.TagLayer(ctx, "tk", "latest", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.SaveEnvironment(ctx, corral.Environment{Name: "tagged", Base: "base:test", Toolkits: []string{"tk:latest"}, Warm: 2}); err != nil {
		t.Fatal(err)
	}
	p.warmEnv("tagged", "the pool to fill", func(e *corral.Environment) bool { return e.WarmReady == 2 })
	a := p.create(corral.CreateRequest{Environment: "tagged"})
	if got := strings.TrimSpace(p.sh(a.ID, "cat /opt/tk/version")); got != "one" || a.Toolkits[0] != "tk:1" {
		t.Errorf("claim before the tag moved: %q, toolkits %v", got, a.Toolkits)
	}
	if _, err := p.Client.TagLayer(ctx, "tk", "latest", "2"); err != nil {
		t.Fatal(err)
	}
	b := p.create(corral.CreateRequest{Environment: "tagged"})
	if got := strings.TrimSpace(p.sh(b.ID, "cat /opt/tk/version")); got != "two" || b.Toolkits[0] != "tk:2" {
		t.Errorf("create after the tag moved: %q, toolkits %v (a stale pooled sandbox was claimed)", got, b.Toolkits)
	}
	env := p.warmEnv("tagged", "the pool to refill with the new version", func(e *corral.Environment) bool { return e.WarmReady == 2 })
	c := p.create(corral.CreateRequest{Environment: "tagged"})
	if got := strings.TrimSpace(p.sh(c.ID, "cat /opt/tk/version")); got != "two" {
		t.Errorf("claim from the refilled pool: %q", got)
	}
	after, _ := p.Client.Environment(ctx, "tagged")
	if after == nil || after.WarmHits != env.WarmHits+1 {
		t.Errorf("the create after the refill was not a claim: %+v -> %+v", env, after)
	}
}

// TestWarmPoolMicroVM: an environment of the microvm tier with warm 1 keeps one booted VM ready,
// listed nowhere and charged to no quota; a matching create claims it (boot "warm") with the
// request's hostname, env vars, labels, TTL and egress policy, and its PID 1 no longer holds the
// capability the pool kept for setting the hostname; a create of another shape (other memory)
// boots a fresh VM; a restart removes the pooled VM of the earlier run; deleting the sandboxes
// and warm 0 leave no QEMU, tap, netns or cgroup.
func TestWarmPoolMicroVM(t *testing.T) {
	needMicroVM(t)
	needRoot(t)
	startInternet(t)
	services := filepath.Join(t.TempDir(), "services.json")
	os.WriteFile(services, []byte(`{"services": {"grader": {"addresses": ["`+inetGrader+`:80/tcp"]},
		"github": {"addresses": ["`+inetGitHub+`:80/tcp"]}}}`), 0o644)
	p := withBase(t, "--services", services, "--dns-upstream", inetDNS)
	ctx := context.Background()
	reach := func(id, addr string) bool {
		out, _, _ := p.run(id, "/bin/sh", "-c", `printf 'GET / HTTP/1.0\r\nHost: x\r\n\r\n' | timeout 4 nc -w 2 `+addr+` 80 | tail -n 1`)
		return strings.HasPrefix(strings.TrimSpace(out), "served by")
	}
	const name = "warm-vm"
	if _, stderr, code := p.cli("", "env", "create", name, "--base", "base:test", "--tier", "microvm", "--net", "allowlist", "--warm", "1"); code != 0 {
		t.Fatalf("corral env create --tier microvm --warm 1: %s", stderr)
	}
	env := p.warmEnv(name, "a booted VM in the pool", func(e *corral.Environment) bool { return e.WarmReady == 1 })
	if env.Tier != "microvm" || env.Warm != 1 || env.Runtime != "" {
		t.Errorf("environment = %+v", env)
	}
	if pids := instanceQEMUPids(p); len(pids) != 1 {
		t.Errorf("QEMU processes with a pool of 1: %v", pids)
	}
	if list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{State: corral.StateRunning}); err != nil || len(list) != 0 {
		t.Errorf("sandboxes listed with only a pool: %d, %v", len(list), err)
	}
	if _, err := p.Client.CreateProject(ctx, "team-vm"); err != nil {
		t.Fatal(err)
	}
	if q, err := p.Client.Quota(ctx, "team-vm"); err != nil || q.Usage.Sandboxes != 0 {
		t.Errorf("project usage with only a pool = %+v, %v", q, err)
	}

	// The claim: the request's project, hostname, labels, env vars, TTL and egress policy.
	before := time.Now()
	sb, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Environment: name, Project: "team-vm", Hostname: "agent-box",
		Labels: map[string]string{"task": "t1"}, Env: []string{"TASK=t1"}, TTL: "20m",
		Network: &corral.NetworkPolicy{Allow: []string{"grader"}}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Tier != "microvm" || sb.Runtime != "qemu" || sb.Boot != "warm" || sb.Project != "team-vm" || sb.Hostname != "agent-box" ||
		sb.Labels["task"] != "t1" || sb.ExpiresAt.Sub(sb.CreatedAt) != 20*time.Minute || sb.Environment != name ||
		sb.Network == nil || len(sb.Network.Allow) != 1 || sb.NetworkAddress == "" {
		t.Errorf("claimed sandbox = %+v", sb)
	}
	env = p.warmEnv(name, "the claim counted", func(e *corral.Environment) bool { return e.WarmClaims >= 1 })
	if env.WarmHits != 1 || env.WarmClaims != 1 || env.WarmHitRate != 1 {
		t.Errorf("after a matching create: hits %d of %d claims (rate %g), want 1 of 1", env.WarmHits, env.WarmClaims, env.WarmHitRate)
	}
	if q, err := p.Client.Quota(ctx, "team-vm"); err != nil || q.Usage.Sandboxes != 1 {
		t.Errorf("project usage after the claim = %+v, %v", q, err)
	}
	out := p.sh(sb.ID, `echo "$TASK $(hostname) $(cat /proc/sys/kernel/hostname)"; grep '^CapEff:' /proc/1/status`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] != "t1 agent-box agent-box" {
		t.Fatalf("env var and hostname in the claimed VM: %q", out)
	}
	// CAP_SYS_ADMIN (21) is gone from the guest's PID 1 once claimed.
	eff, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(lines[1], "CapEff:")), 16, 64)
	if err != nil || eff&(1<<21) != 0 {
		t.Errorf("the claimed VM's PID 1 still holds CAP_SYS_ADMIN: %q", lines[1])
	}
	if _, _, exit := p.run(sb.ID, "hostname", "other"); exit == nil || exit.Code == 0 {
		t.Errorf("a command in the claimed VM could set the hostname: %+v", exit)
	}
	if !reach(sb.ID, inetGrader) {
		t.Errorf("the claim's allowed target %s is unreachable", inetGrader)
	}
	if reach(sb.ID, inetGitHub) {
		t.Errorf("the claim's policy does not allow %s, yet it is reachable", inetGitHub)
	}
	if m := p.metrics(); !strings.Contains(m, `corral_warm_claims_total{environment="`+name+`",runtime="qemu",networked="true",hit="true"} 1`) {
		t.Errorf("metrics lack the pool's hit:\n%s", m)
	}
	// Its events are those of a fresh sandbox, and the pool made none.
	eventually(t, 30*time.Second, "the claimed VM's created and started events", func() bool {
		seen, ok := eventCounts(p, before.Add(-time.Minute))
		for k := range seen {
			if id, _, _ := strings.Cut(k, " "); id != sb.ID && id != "" {
				t.Errorf("an event of a sandbox other than the claimed one: %s", k)
			}
		}
		return ok && seen[sb.ID+" "+corral.EventCreated] == 1 && seen[sb.ID+" "+corral.EventStarted] == 1
	})
	if _, err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the claimed VM's QEMU gone", func() bool { return len(qemuPids(sb.ID)) == 0 })
	p.warmEnv(name, "the pool to refill", func(e *corral.Environment) bool { return e.WarmReady == 1 })

	// Another shape (limits fixed at boot): a fresh VM, and the pool keeps its own.
	fresh, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Environment: name, Limits: corral.Limits{MemoryBytes: 256 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Tier != "microvm" || fresh.Boot != "boot" || fresh.Hostname != fresh.ID || fresh.Limits.MemoryBytes != 256<<20 {
		t.Errorf("a mismatching create = %+v, want a booted microvm of 256 MiB", fresh)
	}
	if got := p.sh(fresh.ID, "hostname"); strings.TrimSpace(got) != fresh.ID {
		t.Errorf("the fresh VM's hostname = %q", got)
	}
	env = p.warmEnv(name, "the miss counted", func(e *corral.Environment) bool { return e.WarmClaims >= 2 })
	if env.WarmHits != 1 || env.WarmClaims != 2 || env.WarmReady != 1 {
		t.Errorf("after a mismatching create: hits %d of %d claims, %d ready; want 1 of 2, 1", env.WarmHits, env.WarmClaims, env.WarmReady)
	}
	if _, err := p.Client.DeleteSandbox(ctx, fresh.ID); err != nil {
		t.Fatal(err)
	}

	// A restart of corral (kill -9): the pool's VM, which outlives it, is removed as an orphan,
	// not adopted, and the pool boots a new one.
	old := instanceQEMUPids(p)
	if len(old) != 1 {
		t.Fatalf("QEMU processes before the restart: %v, want the pool's one", old)
	}
	p.Kill9()
	p.Restart()
	p.warmEnv(name, "the pool to refill after the restart", func(e *corral.Environment) bool { return e.WarmReady == 1 })
	eventually(t, time.Minute, "the earlier run's pooled VM gone", func() bool {
		now := instanceQEMUPids(p)
		return len(now) == 1 && now[0] != old[0]
	})

	// warm 0 drains the pool: no QEMU, no VM state, no network slot left.
	if _, stderr, code := p.cli("", "env", "set", name, "--warm", "0"); code != 0 {
		t.Fatalf("corral env set --warm 0: %s", stderr)
	}
	p.warmEnv(name, "the pool to drain", func(e *corral.Environment) bool { return e.WarmReady == 0 })
	eventually(t, time.Minute, "nothing of the pool left", func() bool {
		vms, _ := filepath.Glob(filepath.Join(p.DataDir, "vms", "sb-*"))
		return len(instanceQEMUPids(p)) == 0 && len(vms) == 0 && len(p.sandboxDirs()) == 0
	})
	if err := p.Client.DeleteEnvironment(ctx, name); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	assertNoLeftovers(t, p)
}

// eventCounts counts the events since since by "SANDBOX TYPE"; ok is false when they could not be
// read.
func eventCounts(p *corralProc, since time.Time) (map[string]int, bool) {
	evs, err := p.Client.Events(context.Background(), corral.EventQuery{Since: since})
	if err != nil {
		return nil, false
	}
	defer evs.Close()
	seen := map[string]int{}
	for {
		ev, err := evs.Next()
		if err != nil {
			return seen, true
		}
		seen[ev.Sandbox+" "+ev.Type]++
	}
}
