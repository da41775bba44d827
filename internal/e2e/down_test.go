package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/hostreg"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestCorralDown: `corral down` on a data dir whose corral up runs with sandboxes of every
// runtime (a networked runc one, a paused one, gVisor and microvm where installed, an fncall
// pool) stops that corral, ends every sandbox and leaves nothing of the data dir on the host:
// no mount, loop device, cgroup (the control cgroup included), netns, veth, nftables table,
// QEMU, lazyd, or host registry claim. corral up then starts again on the same data dir.
func TestCorralDown(t *testing.T) {
	needRoot(t)
	startInternet(t)
	p := startCorralAuto(t, "--dns-upstream", inetDNS)
	p.importDir("base", "test", corral.KindBase, busyboxRootfs(t))
	ctx := context.Background()

	net := p.create(corral.CreateRequest{Network: &corral.NetworkPolicy{Allow: []string{inetGrader + "/32"}}})
	p.sh(net.ID, "sleep 1000 >/dev/null 2>&1 &")
	paused := p.create(corral.CreateRequest{})
	if _, err := p.Client.PauseSandbox(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	ids := []string{net.ID, paused.ID}
	if _, err := os.Stat("/var/cache/corral/runsc"); err == nil {
		ids = append(ids, p.create(corral.CreateRequest{Runtime: "gvisor"}).ID)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err == nil {
		if _, err := os.Stat("/var/cache/corral/guest-kernel/current/vmlinuz"); err == nil {
			ids = append(ids, p.create(corral.CreateRequest{Tier: "microvm", Limits: corral.Limits{MemoryBytes: 256 << 20}}).ID)
		}
	}
	if _, err := p.Client.CreateFncallEnv(ctx, corral.FncallEnv{Name: "down", Base: "base:test", PoolMin: 1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the fncall pool to start a container", func() bool {
		list, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{State: corral.StateRunning})
		for _, sb := range list {
			if sb.Tier == "fncall" {
				return true
			}
		}
		return false
	})

	out, err := exec.Command(filepath.Join(binDir, "corral"), "down", "--data-dir", p.DataDir, "--runc", runcPath()).CombinedOutput()
	if err != nil {
		t.Fatalf("corral down: %v\n%s", err, out)
	}
	select {
	case <-p.waitDone:
	case <-time.After(5 * time.Second):
		t.Fatalf("corral up still runs after corral down:\n%s", out)
	}
	t.Logf("corral down:\n%s", out)
	if !strings.Contains(string(out), "nothing of the data dir is left on the host") {
		t.Fatalf("corral down said:\n%s", out)
	}
	p.checkLazyd()
	assertNoLeftovers(t, p)
	if ctl, _ := filepath.Glob("/sys/fs/cgroup/*" + p.Cgroup + "-ctl"); len(ctl) > 0 {
		t.Errorf("control cgroup left behind: %v", ctl)
	}
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + p.Cgroup); len(dirs) > 0 {
		t.Errorf("cgroup parent left behind: %v", dirs)
	}
	reg, err := hostreg.Open("")
	if err != nil {
		t.Fatal(err)
	}
	claims, _ := reg.List()
	for _, c := range claims {
		if c.DataDir == p.DataDir {
			t.Errorf("host registry claim left behind: %+v", c)
		}
	}

	// The data dir itself is intact: corral up starts on it, every sandbox recorded as deleted.
	p.Restart()
	for _, id := range ids {
		got, err := p.Client.GetSandbox(ctx, id)
		if err != nil || got.State != corral.StateStopped || got.Reason != corral.ReasonDeleted {
			t.Errorf("sandbox %s after corral down: %+v, %v", id, got, err)
		}
	}
	if _, err := p.Client.Layer(ctx, "base", "test"); err != nil {
		t.Errorf("the base layer did not survive corral down: %v", err)
	}
}
