package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestControlPlaneUnderLoad fills the host's CPUs with busy sandboxes whose output nobody reads
// (5 sandboxes of 1 CPU on this host's 2 cores, 40 busy commands each, every one printing) and
// checks that corral itself keeps answering: it runs in its own cgroup, which outweighs the
// sandboxes' CPU, and the sandboxes' parent leaves it memory headroom. The latencies are logged;
// the assertions are liveness bounds, not performance figures (docs/RELIABILITY.md has those).
func TestControlPlaneUnderLoad(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()

	// Corral's process is in its control cgroup, the sandboxes' parent has a memory limit.
	self, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(self), p.Cgroup+"-ctl") {
		t.Fatalf("corral up is not in its control cgroup %s-ctl:\n%s", p.Cgroup, self)
	}
	if lim, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", p.Cgroup, "memory.limit_in_bytes")); err == nil {
		if n, _ := strconv.ParseInt(strings.TrimSpace(string(lim)), 10, 64); n <= 0 || n >= 1<<60 {
			t.Fatalf("the sandboxes' parent has no memory limit: %s", lim)
		}
	}

	const sandboxes, loops = 5, 40
	for range sandboxes {
		sb := p.create(corral.CreateRequest{Limits: corral.Limits{CPUs: 1}})
		for range loops {
			script := `while :; do echo busy-busy-busy-busy-busy-busy-busy; done`
			if _, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", script}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(3 * time.Second) // let the load build; this measures under it, it waits for nothing

	var health, execs []time.Duration
	probe := p.create(corral.CreateRequest{})
	for range 20 {
		start := time.Now()
		resp, err := http.Get(p.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		health = append(health, time.Since(start))
	}
	for range 5 {
		start := time.Now()
		if _, _, exit := p.run(probe.ID, "true"); exit.Code != 0 {
			t.Fatalf("exec under load: %+v", exit)
		}
		execs = append(execs, time.Since(start))
	}
	var rss string
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "VmRSS:") {
				rss = strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:"))
			}
		}
	}
	t.Logf("corral up RSS under load: %s", rss)
	slices.Sort(health)
	slices.Sort(execs)
	t.Logf("under load: /healthz p50 %s max %s; exec true p50 %s max %s", health[len(health)/2], health[len(health)-1], execs[len(execs)/2], execs[len(execs)-1])
	if health[len(health)/2] > 2*time.Second || execs[len(execs)/2] > 10*time.Second {
		t.Fatalf("corral stopped answering under load: /healthz p50 %s, exec p50 %s", health[len(health)/2], execs[len(execs)/2])
	}
}
