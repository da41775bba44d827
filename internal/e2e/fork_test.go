package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// counterScript counts in a loop, writing each value to /root/count.
const counterScript = `i=0; while :; do i=$((i+1)); echo $i > /root/count.tmp; mv /root/count.tmp /root/count; sleep 0.05; done`

// readCount reads the counter of sandbox id (0 when it has not written yet).
func (p *corralProc) readCount(id string) int {
	p.t.Helper()
	out, _, _ := p.run(id, "cat", "/root/count")
	n, _ := strconv.Atoi(strings.TrimSpace(out))
	return n
}

// TestFork: a fork's copies go on from the source's state (a counting process keeps counting
// from where it was, files are there) and diverge; the source runs on; forked_from and labels
// are set; runc forks its disk only, and refuses a fork of its processes; a microvm's copies
// get their own hostname and address, and its disk-only fork boots fresh VMs on copies of the
// disk; deletes leave nothing.
func TestFork(t *testing.T) {
	forRuntimes(t, func(t *testing.T, rt string) {
		testFork(t, rt)
		if rt == "microvm" {
			t.Run("disk-only", testForkMicroVMDiskOnly)
		}
	})
}

func testFork(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	// Networked (an allowlist that allows nothing): each copy gets a network slot of its own.
	src := p.create(corral.CreateRequest{Labels: map[string]string{"role": "source"},
		Network: &corral.NetworkPolicy{Mode: corral.NetworkAllowlist}})
	p.sh(src.ID, "echo before > /root/file")
	if _, err := p.Client.StartCommand(ctx, src.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", counterScript}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the counter to count", func() bool { return p.readCount(src.ID) > 20 })

	if rt == "runc" {
		_, err := p.Client.Fork(ctx, src.ID, corral.ForkRequest{Count: 2})
		if !corral.IsConflict(err) || !strings.Contains(err.Error(), "disk_only") {
			t.Fatalf("fork of a runc sandbox's processes: %v, want a 409 naming disk_only", err)
		}
		if list, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{}); len(list) != 1 {
			t.Fatalf("a refused fork left sandboxes: %d listed", len(list))
		}
	}

	atFork := p.readCount(src.ID)
	req := corral.ForkRequest{Count: 2, Labels: map[string]string{"branch": "b"}, DiskOnly: rt == "runc"}
	start := time.Now()
	copies, err := p.Client.Fork(ctx, src.ID, req)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Logf("fork of 2 copies took %v", time.Since(start))
	for _, l := range strings.Split(p.Logs(), "\n") {
		if strings.Contains(l, `msg="sandbox forked"`) {
			t.Logf("corral: %s", l) // with how long the source stood (source_stopped)
		}
	}
	if len(copies) != 2 {
		t.Fatalf("fork made %d copies, want 2", len(copies))
	}
	for _, c := range copies {
		if c.State != corral.StateRunning || c.ForkedFrom != src.ID || c.Labels["branch"] != "b" || c.Labels["role"] != "source" || c.ID == src.ID {
			t.Fatalf("copy %+v: want running, forked_from %s, labels role=source branch=b", c, src.ID)
		}
		got, err := p.Client.GetSandbox(ctx, c.ID)
		if err != nil || got.ForkedFrom != src.ID {
			t.Fatalf("get copy %s: forked_from %q, %v", c.ID, got.ForkedFrom, err)
		}
		if got.NetworkAddress == "" || got.NetworkAddress == src.NetworkAddress || got.Network == nil || got.Network.Mode != corral.NetworkAllowlist {
			t.Fatalf("copy %s: address %q (source %q), policy %+v: want an address of its own and the source's policy", c.ID, got.NetworkAddress, src.NetworkAddress, got.Network)
		}
		if out := p.sh(c.ID, "ip -4 addr show eth0"); !strings.Contains(out, " "+got.NetworkAddress+"/") {
			t.Fatalf("copy %s: its eth0 does not have its address %s: %s", c.ID, got.NetworkAddress, out)
		}
		if out := p.sh(c.ID, "cat /root/file"); out != "before\n" {
			t.Fatalf("copy %s: /root/file = %q, want the source's", c.ID, out)
		}
	}

	if rt == "microvm" {
		for _, c := range copies {
			if c.Boot != "fork" {
				t.Errorf("copy %s: boot %q, want fork", c.ID, c.Boot)
			}
		}
		// Its own hostname and its own network: the copy's traffic leaves through its own
		// namespace (a blocked attempt is counted for it) from its own address.
		for _, c := range copies {
			if out := p.sh(c.ID, "hostname"); out != c.ID+"\n" {
				t.Fatalf("copy %s: hostname %q, want its ID", c.ID, out)
			}
			got, _ := p.Client.GetSandbox(ctx, c.ID)
			if out := p.sh(c.ID, "ip -4 addr show eth0 | grep -c inet; ip route | grep default"); !strings.HasPrefix(out, "1\n") || strings.Contains(out, src.NetworkAddress) {
				t.Fatalf("copy %s: eth0 keeps more than its own address, or the source's route: %q", c.ID, out)
			}
			p.sh(c.ID, "nc -w 2 203.0.113.9 80 </dev/null; true")
			// The edge's resolver, at the copy's gateway (its resolv.conf rewritten), knows a
			// sandbox by its source address: a refused name counted for the copy came from its own.
			if out := p.sh(c.ID, "nslookup fork-check.test 2>&1; true"); strings.Contains(out, "timed out") {
				t.Fatalf("copy %s: no answer from its resolver: %q", c.ID, out)
			}
			eventually(t, 10*time.Second, "copy "+c.ID+"'s blocked attempt and refused name to be counted", func() bool {
				g, err := p.Client.GetSandbox(ctx, c.ID)
				return err == nil && g.Egress != nil && g.Egress.BlockedTotal > 0 && g.Egress.Blocked["dns_refused"] > 0
			})
			t.Logf("copy %s: address %s", c.ID, got.NetworkAddress)
		}
		if out := p.sh(src.ID, "hostname"); out != src.ID+"\n" {
			t.Fatalf("the source's hostname changed: %q", out)
		}
	}
	if rt != "runc" {
		// The counting process goes on in each copy from where it was.
		for _, c := range copies {
			first := p.readCount(c.ID)
			if first < atFork {
				t.Fatalf("copy %s counts from %d, below the %d the source had reached before the fork", c.ID, first, atFork)
			}
			eventually(t, 30*time.Second, "copy "+c.ID+" to go on counting", func() bool { return p.readCount(c.ID) > first+3 })
			if out := p.sh(c.ID, "pidof sh >/dev/null && echo alive"); out != "alive\n" {
				t.Fatalf("copy %s: counter process %q", c.ID, out)
			}
			t.Logf("copy %s: %d at the fork, counted from %d", c.ID, atFork, first)
		}
	} else {
		// Disk only: the counter's file is there, its process is not.
		for _, c := range copies {
			if n := p.readCount(c.ID); n < atFork {
				t.Fatalf("copy %s: /root/count = %d, below the %d written before the fork", c.ID, n, atFork)
			}
		}
	}
	// Events: each copy was created (as a fork of the source), started and forked, once.
	st, err := p.Client.Events(ctx, corral.EventQuery{Types: []string{corral.EventCreated, corral.EventForked}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for {
		ev, err := st.Next()
		if err != nil {
			break
		}
		if ev.Reason == "fork of "+src.ID {
			seen[ev.Sandbox+" "+ev.Type]++
		}
	}
	st.Close()
	for _, c := range copies {
		if seen[c.ID+" created"] != 1 || seen[c.ID+" forked"] != 1 {
			t.Fatalf("events of copy %s: %v; want one created and one forked, each naming the source", c.ID, seen)
		}
	}

	// The source runs on, with its address.
	if out := p.sh(src.ID, "ip -4 addr show eth0"); !strings.Contains(out, " "+src.NetworkAddress+"/") {
		t.Fatalf("the source lost its address %s: %s", src.NetworkAddress, out)
	}
	after := p.readCount(src.ID)
	eventually(t, 30*time.Second, "the source to go on counting", func() bool { return p.readCount(src.ID) > after+3 })
	// Its disk takes writes again (a microvm's was inactivated by the migration, and cont
	// activates it again: a write to an inactive disk would abort its QEMU).
	if out := p.sh(src.ID, "echo after > /root/after && sync && cat /root/after"); out != "after\n" {
		t.Fatalf("the source after the fork: a synced write gives %q", out)
	}

	// Copies do not share a random stream: the first bytes each reads from /dev/urandom differ.
	rnd := map[string]bool{}
	for _, c := range copies {
		rnd[p.sh(c.ID, "head -c 16 /dev/urandom | od -An -tx1")] = true
	}
	if len(rnd) != len(copies) {
		t.Fatalf("copies read the same bytes from /dev/urandom: %v", rnd)
	}

	// Each copy diverges on its own.
	for i, c := range copies {
		p.sh(c.ID, "echo mine-"+strconv.Itoa(i)+" > /root/own")
	}
	for i, c := range copies {
		if out := p.sh(c.ID, "cat /root/own"); out != "mine-"+strconv.Itoa(i)+"\n" {
			t.Fatalf("copy %s: /root/own = %q", c.ID, out)
		}
	}
	if out := p.sh(src.ID, "cat /root/own 2>/dev/null || echo none"); out != "none\n" {
		t.Fatalf("the source sees a copy's file: %q", out)
	}

	// A paused source is refused; so is a stopped one.
	if _, err := p.Client.PauseSandbox(ctx, copies[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.Fork(ctx, copies[0].ID, req); !corral.IsConflict(err) || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("fork of a paused sandbox: %v, want a 409 naming paused", err)
	}
	if _, err := p.Client.DeleteSandbox(ctx, copies[1].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.Fork(ctx, copies[1].ID, req); !corral.IsConflict(err) {
		t.Fatalf("fork of a deleted sandbox: %v, want 409", err)
	}

	for _, id := range []string{src.ID, copies[0].ID} {
		if _, err := p.Client.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	assertNoForkImages(t, p)
	p.Stop()
	assertNoLeftovers(t, p)
}

// assertNoForkImages fails if a fork image is left in the runtimes' state directories.
func assertNoForkImages(t *testing.T, p *corralProc) {
	t.Helper()
	for _, d := range []string{"sandboxes", "vms"} {
		if ents, _ := os.ReadDir(filepath.Join(p.DataDir, d, ".forks")); len(ents) > 0 {
			t.Errorf("fork images left behind in %s: %d", d, len(ents))
		}
	}
}

// testForkMicroVMDiskOnly: a disk-only fork of a microvm boots a new VM on a copy of its disk:
// the source's files are there (the fork syncs the guest first), its processes are not, the
// copy has its own hostname, and writes stay on their side.
func testForkMicroVMDiskOnly(t *testing.T) {
	p := withBaseOn(t, "microvm")
	ctx := context.Background()
	src := p.create(corral.CreateRequest{})
	p.sh(src.ID, "echo before > /root/file")
	if _, err := p.Client.StartCommand(ctx, src.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 1000"}}); err != nil {
		t.Fatal(err)
	}
	copies, err := p.Client.Fork(ctx, src.ID, corral.ForkRequest{Count: 1, DiskOnly: true})
	if err != nil {
		t.Fatalf("disk-only fork: %v", err)
	}
	c := copies[0]
	if out := p.sh(c.ID, "cat /root/file; hostname; pidof sleep || echo none"); out != "before\n"+c.ID+"\nnone\n" {
		t.Fatalf("copy %s: %q; want the source's file, its own hostname and no sleep", c.ID, out)
	}
	p.sh(c.ID, "echo copy > /root/own")
	if out := p.sh(src.ID, "cat /root/own 2>/dev/null || echo none; echo after > /root/file2; cat /root/file2"); out != "none\nafter\n" {
		t.Fatalf("the source after a disk-only fork: %q", out)
	}
	for _, id := range []string{src.ID, c.ID} {
		if _, err := p.Client.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	assertNoForkImages(t, p)
	p.Stop()
	assertNoLeftovers(t, p)
}

// TestForkBadInput: a fork with a bad count, a bad label or an unknown source is a 4xx that makes
// nothing; a quota that admits fewer copies than asked refuses them all.
func TestForkBadInput(t *testing.T) {
	needRoot(t)
	needGVisor(t)
	p := withBaseOn(t, "gvisor")
	ctx := context.Background()
	src := p.create(corral.CreateRequest{Limits: corral.Limits{MemoryBytes: 128 << 20}})
	post := func(id, body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/sandboxes/"+id+"/fork", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+p.Token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	for _, c := range []struct {
		name, id, body string
		want           int
		says           string
	}{
		{"count 0", src.ID, `{"count": 0}`, 400, "count"},
		{"count negative", src.ID, `{"count": -1}`, 400, "count"},
		{"count over the max", src.ID, `{"count": 65}`, 400, "count"},
		{"bad label", src.ID, `{"labels": {"": "x"}}`, 400, "label"},
		{"unknown field", src.ID, `{"copies": 2}`, 400, "copies"},
		{"unknown sandbox", "sb-local-aaaaaaaaaaaaaaaa", `{}`, 404, "sb-local-aaaaaaaaaaaaaaaa"},
		{"not an ID", "nope", `{}`, 400, "id"},
	} {
		code, body := post(c.id, c.body)
		if code != c.want || !strings.Contains(body, c.says) {
			t.Errorf("%s: %d %s, want %d naming %q", c.name, code, body, c.want, c.says)
		}
	}
	// A project whose quota admits one more sandbox: a fork of 2 makes none.
	for _, args := range [][]string{{"project", "create", "q"}, {"quota", "set", "q", "--sandboxes", "2"}} {
		if out, errOut, code := p.cli("", args...); code != 0 {
			t.Fatalf("corral %v: %s %s", args, out, errOut)
		}
	}
	q := p.create(corral.CreateRequest{Project: "q"})
	if _, err := p.Client.Fork(ctx, q.ID, corral.ForkRequest{Count: 2}); err == nil || !(corral.IsConflict(err) || strings.Contains(err.Error(), "quota")) {
		t.Fatalf("fork over the quota: %v, want refused", err)
	}
	list, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{Project: "q"})
	if len(list) != 1 {
		t.Fatalf("a fork refused by the quota left %d sandboxes in the project, want 1", len(list))
	}
	// And one that fits is made.
	copies, err := p.Client.Fork(ctx, q.ID, corral.ForkRequest{})
	if err != nil || len(copies) != 1 {
		t.Fatalf("fork within the quota: %v (%d copies)", err, len(copies))
	}
	// Every refusal left nothing: only the two sources and the one copy are live.
	list, _ = p.Client.ListSandboxes(ctx, corral.ListOptions{})
	live := 0
	for _, sb := range list {
		if sb.State == corral.StateRunning {
			live++
		}
	}
	if live != 3 {
		b, _ := json.Marshal(list)
		t.Fatalf("%d running sandboxes after the refusals, want 3: %s", live, b)
	}
	// CLI: -o json answers {"sandboxes": [...]}, and --count 0 is refused before any call.
	out, errOut, code := p.cli("", "fork", q.ID, "--count", "0")
	if code == 0 || !strings.Contains(errOut, "--count") {
		t.Fatalf("corral fork --count 0: exit %d, %s %s", code, out, errOut)
	}
}
