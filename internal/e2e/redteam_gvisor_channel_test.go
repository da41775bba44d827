package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamGVisorChannel replays, from inside a sandbox as root, the hijack of the agent's
// control channel found on gVisor (issue 22 item 1): look for the channel (socket files,
// /proc/net/unix, the agent's descriptors), connect to it, list commands, quiesce the agent,
// unlink its socket, bind one in its place and serve forged replies. Every step must find
// nothing or be refused, and the next exec, and the trajectory's record of it, must be
// authentic. The channel must also survive what it must: a pause (a checkpoint and restore on
// gVisor) with a process keeping its state across it, a kill -9 and restart of corral up (the
// sandbox is re-adopted), and delete must leave nothing (no holder process either).
func TestRedTeamGVisorChannel(t *testing.T) { forRuntimes(t, testRedTeamGVisorChannel) }

func testRedTeamGVisorChannel(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	probe := buildHijackProbe(t)
	sb := p.create(corral.CreateRequest{})
	f, err := os.Open(probe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := p.Client.WriteFile(ctx, sb.ID, "/root/gvhijack", f, corral.WriteFileOptions{Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	// A process whose state lives only in memory, to follow across the pause and the restart.
	if _, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c",
		"i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done"}}); err != nil {
		t.Fatal(err)
	}

	// 1. Look for the channel, connect, list, quiesce, unlink.
	out := p.sh(sb.ID, "/root/gvhijack scan")
	t.Logf("scan:\n%s", out)
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, ": ")
		lines[k] = v
	}
	for _, c := range []struct{ step, want string }{
		{"socket files", "0 []"},
		{"unix sockets", "0 []"},
		{"open agent fds", "0 []"},
	} {
		if got := lines[c.step]; got != c.want {
			t.Errorf("%s: %q, want %q", c.step, got, c.want)
		}
	}
	for k, v := range lines {
		switch {
		case strings.HasPrefix(k, "list commands via"), strings.HasPrefix(k, "quiesce via"), strings.HasPrefix(k, "unlink"):
			if !strings.HasPrefix(v, "refused") {
				t.Errorf("%s: %s, want refused", k, v)
			}
		}
	}
	if _, ok := lines["quiesce via /.corral/agent.sock"]; !ok {
		t.Errorf("the probe did not try the old socket path:\n%s", out)
	}

	// 2. Bind sockets where the old one was (and an abstract one) and serve forged replies.
	if _, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/root/gvhijack", "forge", "/.corral/agent.sock"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the forger to bind", func() bool {
		o, _, exit := p.run(sb.ID, "/bin/sh", "-c", "cat /tmp/forger.ready 2>/dev/null")
		return exit.Code == 0 && strings.Contains(o, "/.corral/agent.sock")
	})

	// 3. Later execs are authentic, and so is the trajectory.
	assertAuthentic := func(when string) {
		t.Helper()
		want := fmt.Sprintf("authentic-%d", 6*7)
		o, e, exit := p.run(sb.ID, "/bin/sh", "-c", "echo authentic-$((6*7)); echo to-stderr >&2; exit 3")
		if strings.TrimSpace(o) != want || strings.TrimSpace(e) != "to-stderr" || exit == nil || exit.Code != 3 {
			t.Fatalf("%s: exec = %q, %q, %+v; want %q, to-stderr, exit 3", when, o, e, exit, want)
		}
		traj, err := p.Client.Trajectory(ctx, sb.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		var last *corral.TrajectoryEntry
		for i := range traj {
			if traj[i].Kind == "exec" && strings.Contains(fmt.Sprint(traj[i].Request), "authentic-") {
				last = &traj[i]
			}
		}
		if last == nil || last.Exit == nil || last.Exit.Code != 3 {
			t.Fatalf("%s: trajectory's last authentic exec = %+v", when, last)
		}
		var rec strings.Builder
		for _, ev := range last.Output {
			rec.Write(ev.Data)
		}
		if got := rec.String(); !strings.Contains(got, want) || strings.Contains(got, "FORGED") {
			t.Fatalf("%s: trajectory recorded output %q, want %q", when, got, want)
		}
		if hits := strings.TrimSpace(p.sh(sb.ID, "cat /tmp/forger.hits")); hits != "0" {
			t.Fatalf("%s: the forger was reached %s times", when, hits)
		}
	}
	assertAuthentic("after the hijack")

	counter := func() int { // /tmp/n is replaced whole (mv), never read half-written
		t.Helper()
		out := strings.TrimSpace(p.sh(sb.ID, "cat /tmp/n"))
		n, err := strconv.Atoi(out)
		if err != nil {
			t.Fatalf("counter: %q", out)
		}
		return n
	}
	eventually(t, 10*time.Second, "the counter to start", func() bool {
		_, _, exit := p.run(sb.ID, "/bin/sh", "-c", "test -s /tmp/n")
		return exit.Code == 0
	})
	// 4. A pause (a checkpoint on gVisor): the counter resumes where it was, the forger stays
	// bound and unreached.
	n0 := counter()
	if _, err := p.Client.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.ResumeSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if n1 := counter(); n1 < n0 {
		t.Errorf("counter after resume = %d, before pause %d: state lost", n1, n0)
	}
	eventually(t, 10*time.Second, "the counter to run after resume", func() bool { return counter() > n0+1 })
	assertAuthentic("after pause and resume")

	// 5. kill -9 of corral up and a restart: the sandbox is re-adopted through the same channel.
	if rt == "microvm" {
		t.Logf("QEMU processes of %s before kill -9: %v", sb.ID, qemuPids(sb.ID))
	}
	p.Kill9()
	p.Restart()
	n2 := counter()
	eventually(t, 10*time.Second, "the counter to run after the restart", func() bool { return counter() > n2 })
	assertAuthentic("after kill -9 and restart")

	// 6. Delete leaves nothing.
	if _, err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	assertNoLeftovers(t, p)
}

// buildHijackProbe builds testdata/gvhijack (static) once per test and returns its path.
func buildHijackProbe(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "gvhijack")
	cmd := exec.Command("go", "build", "-o", out, "./testdata/gvhijack")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the hijack probe: %v\n%s", err, b)
	}
	return out
}
