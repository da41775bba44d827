package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestKill9AndReadopt kills corral up with SIGKILL: sandboxes keep running, a restarted corral
// re-adopts them, and one whose processes died meanwhile is marked failed.
func TestKill9AndReadopt(t *testing.T) { forRuntimes(t, testKill9AndReadopt) }

func testKill9AndReadopt(t *testing.T, rt string) {
	// Networking on whatever the host's resolv.conf says (the upstream is never asked here): the
	// sandbox that dies has a network, whose slot must go with it.
	p := withBaseOn(t, rt, "--dns-upstream", "127.0.0.1:5353")
	ctx := context.Background()
	keep := p.create(corral.CreateRequest{})
	dies := p.create(corral.CreateRequest{Network: &corral.NetworkPolicy{Allow: []string{"198.51.100.9:80/tcp"}}})
	p.sh(keep.ID, "echo before > /root/state")
	bg, err := p.Client.StartCommand(ctx, keep.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo started; sleep 300"}})
	if err != nil {
		t.Fatal(err)
	}

	p.Kill9()
	// With corral down, the sandbox's processes are alive; kill every process of the other one.
	if rt == "microvm" {
		// A VM is one QEMU process.
		pids := qemuPids(dies.ID)
		if len(pids) != 1 {
			t.Fatalf("QEMU processes of %s: %v, want one", dies.ID, pids)
		}
		syscall.Kill(pids[0], syscall.SIGKILL)
	} else if n := killCgroup(t, p.Cgroup, dies.ID); n == 0 {
		t.Fatalf("found no processes of %s in its cgroup", dies.ID)
	}
	p.Restart()

	if got := p.sh(keep.ID, "cat /root/state"); got != "before\n" {
		t.Fatalf("state after re-adoption = %q", got)
	}
	c, err := p.Client.Command(ctx, keep.ID, bg.ID)
	if err != nil || c.State != "running" {
		t.Fatalf("background command after re-adoption = %+v, %v; want still running", c, err)
	}
	st, err := p.Client.Attach(ctx, keep.ID, bg.ID, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Next()
	st.Close()
	if err != nil || string(ev.Data) != "started\n" {
		t.Fatalf("output kept across the restart: %+v, %v", ev, err)
	}
	got, err := p.Client.GetSandbox(ctx, dies.ID)
	if err != nil || got.State != corral.StateFailed || !strings.HasPrefix(got.Reason, "error:") {
		t.Fatalf("sandbox whose processes died while corral was down = %+v, %v; want failed with a reason", got, err)
	}
	// Its runtime state is gone: deleting the survivor and stopping leaves nothing at all.
	if _, err := p.Client.DeleteSandbox(ctx, keep.ID); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	assertNoLeftovers(t, p)
}

// killCgroup SIGKILLs every process in the sandbox's pids cgroup and returns how many there were.
func killCgroup(t *testing.T, parent, id string) int {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/pids", parent, "*"+id+"*", "cgroup.procs"))
	if len(matches) == 0 {
		matches, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup/memory", parent, "*"+id+"*", "cgroup.procs"))
	}
	n := 0
	for _, f := range matches {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(s)
			if pid > 0 && syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, f := range matches {
		for time.Now().Before(deadline) {
			b, _ := os.ReadFile(f)
			if strings.TrimSpace(string(b)) == "" {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return n
}

// TestSIGTERMKeepsSandboxes: a clean shutdown leaves sandboxes running for the next start.
func TestSIGTERMKeepsSandboxes(t *testing.T) {
	p := withBase(t)
	sb := p.create(corral.CreateRequest{})
	p.Stop()
	p.Restart()
	if got := p.sh(sb.ID, "echo ok"); got != "ok\n" {
		t.Fatalf("after a clean restart: %q", got)
	}
}
