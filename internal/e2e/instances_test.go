package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestCorralsSideBySide runs three Corrals on one host with no network or cgroup flags, as an
// operator trying something beside a running one would: each gets its own network tag, pool,
// NFLOG group, cgroup parent and VM uids from the host registry; starting and stopping the
// others leaves the first one's running sandboxes, their processes and their networks alone;
// each counts its own blocked attempts; explicit settings that collide are refused at start
// with a message naming the other data dir.
func TestCorralsSideBySide(t *testing.T) {
	needRoot(t)
	startInternet(t)
	ctx := context.Background()
	start := func() *corralProc {
		p := startCorralAuto(t, "--dns-upstream", inetDNS)
		p.importDir("base", "test", corral.KindBase, busyboxRootfs(t))
		return p
	}
	grader := &corral.NetworkPolicy{Allow: []string{inetGrader + "/32"}}
	fetch := func(p *corralProc, id string) string {
		out, _, _ := p.run(id, "/bin/sh", "-c", `printf 'GET / HTTP/1.0\r\n\r\n' | timeout 4 nc -w 2 `+inetGrader+` 80 | tail -n 1`)
		return strings.TrimSpace(out)
	}
	counter := func(p *corralProc, id string) int {
		out := strings.TrimSpace(p.sh(id, "cat /tmp/n"))
		n, err := strconv.Atoi(out)
		if err != nil {
			t.Fatalf("counter %q: %v", out, err)
		}
		return n
	}
	a := start()
	sa := a.create(corral.CreateRequest{Network: grader})
	// The counter is renamed into place: a reader never sees it truncated.
	a.sh(sa.ID, `(n=0; while :; do n=$((n+1)); echo $n > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.1; done) >/dev/null 2>&1 &`)
	if got := fetch(a, sa.ID); got != "served by "+inetGrader {
		t.Fatalf("first Corral's sandbox cannot reach the grader: %q", got)
	}

	b := start()
	sb := b.create(corral.CreateRequest{Network: grader})
	c := start()
	sc := c.create(corral.CreateRequest{Network: grader})
	seen := map[string]string{}
	for _, p := range []*corralProc{a, b, c} {
		for _, k := range []string{"tag " + p.NetTag, "pool " + p.NetPool, "cgroup " + p.Cgroup} {
			if other, dup := seen[k]; dup {
				t.Fatalf("%s shared by %s and %s", k, other, p.DataDir)
			}
			seen[k] = p.DataDir
		}
	}
	for _, x := range []struct {
		p  *corralProc
		id string
	}{{a, sa.ID}, {b, sb.ID}, {c, sc.ID}} {
		if got := fetch(x.p, x.id); got != "served by "+inetGrader {
			t.Fatalf("sandbox of %s cannot reach the grader: %q", x.p.DataDir, got)
		}
	}

	// The third stops (its sandboxes keep running, by design), a fourth starts: nothing of the
	// first is touched.
	c.Stop()
	d := start()
	sd := d.create(corral.CreateRequest{Network: grader})
	if got := fetch(d, sd.ID); got != "served by "+inetGrader {
		t.Fatalf("fourth Corral's sandbox: %q", got)
	}
	before := counter(a, sa.ID)
	eventually(t, 10*time.Second, "the first Corral's background process to go on counting", func() bool {
		return counter(a, sa.ID) > before
	})
	if got := fetch(a, sa.ID); got != "served by "+inetGrader {
		t.Fatalf("first Corral's sandbox lost its network after others started and stopped: %q", got)
	}
	if got, err := a.Client.GetSandbox(ctx, sa.ID); err != nil || got.State != corral.StateRunning {
		t.Fatalf("first Corral's sandbox: %+v, %v", got, err)
	}
	if !strings.Contains(a.Logs(), "host resources of this data dir") || strings.Contains(a.Logs(), "removing runtime state of a sandbox the store does not run") {
		t.Fatalf("first Corral's log:\n%s", a.Logs())
	}

	// Blocked attempts are counted by the Corral whose sandbox made them, not swallowed by the
	// first one to take a shared NFLOG group.
	for _, x := range []struct {
		p  *corralProc
		id string
	}{{a, sa.ID}, {b, sb.ID}, {d, sd.ID}} {
		x.p.run(x.id, "/bin/sh", "-c", "timeout 3 nc -w 1 "+inetGitHub+" 80 </dev/null; true")
		eventually(t, 10*time.Second, "the blocked attempt to be counted in "+x.p.DataDir, func() bool {
			log, err := x.p.Client.BlockedAttempts(ctx, x.id)
			return err == nil && len(log) > 0
		})
	}

	// Explicit settings that collide with a running (or stopped) instance are refused at start.
	for _, flags := range [][]string{
		{"--net-pool", a.NetPool},
		{"--net-tag", b.NetTag},
		{"--cgroup-parent", c.Cgroup},
	} {
		dir := t.TempDir()
		args := append([]string{"up", "--data-dir", dir, "--listen", freePort(t), "--runc", runcPath()}, flags...)
		out, err := exec.Command(filepath.Join(binDir, "corral"), args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "another Corral (data dir ") {
			t.Fatalf("corral up %v: %v\n%s", flags, err, out)
		}
		if _, err := os.Stat(filepath.Join(dir, "corral.db")); err == nil {
			t.Fatalf("a refused start made a store in %s", dir)
		}
	}

	// c's sandbox outlived c; restarting c re-adopts it with its own resources.
	c.Restart()
	if got, err := c.Client.GetSandbox(ctx, sc.ID); err != nil || got.State != corral.StateRunning {
		t.Fatalf("third Corral's sandbox after its restart: %+v, %v", got, err)
	}
	if got := fetch(c, sc.ID); got != "served by "+inetGrader {
		t.Fatalf("third Corral's sandbox after its restart: %q", got)
	}
	for _, p := range []*corralProc{a, b, c, d} {
		p.cleanup()
		assertNoLeftovers(t, p)
	}
}
