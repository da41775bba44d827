package e2e

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/egress/netlab"
	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
)

// The test's internet (internal/egress/netlab): web servers on .1 ("mirror.test", the pypi
// service), .2 ("github.test") and .3 (the grader, by address), and the zone's DNS server.
const (
	inetMirror = "198.51.100.1"
	inetGitHub = "198.51.100.2"
	inetGrader = "198.51.100.3"
	inetDNS    = "198.51.100.53"
)

func startInternet(t *testing.T) *netlab.Internet {
	t.Helper()
	in, err := netlab.Start(randHex(2), netip.MustParsePrefix("198.51.100.0/24"), []netlab.Host{{Name: "mirror.test", Addr: inetMirror}, {Name: "github.test", Addr: inetGitHub}, {Name: "grader.test", Addr: inetGrader}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.Close(); err != nil {
			t.Error(err)
		}
	})
	return in
}

// TestEgressPolicy: default deny, named services through the edge's resolver, address rules,
// the always-blocked set, DNS bypass, runtime updates, counters, and nothing left after delete.
func TestEgressPolicy(t *testing.T) {
	needRoot(t)
	startInternet(t)
	services := filepath.Join(t.TempDir(), "services.json")
	os.WriteFile(services, []byte(`{"services": {
		"pypi": {"domains": ["mirror.test"], "description": "the package mirror"},
		"github": {"domains": ["github.test"]},
		"grader": {"addresses": ["`+inetGrader+`:80/tcp"]}}}`), 0o644)
	p := withBase(t, "--services", services, "--dns-upstream", inetDNS)
	ctx := context.Background()

	// fetch GETs http://HOST/ with busybox's nslookup and nc (busybox-static's wget crashes in
	// glibc's static resolver) and returns the body's last line; ok is false when it got none.
	fetch := func(id, url string) (string, bool) {
		host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
		script := `h=` + host + `; ip=$h
case $h in *[a-z]*) ip=$(nslookup $h 2>/dev/null | awk '/^Address: /{a=$2} END{print a}');; esac
[ -n "$ip" ] || exit 3
printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' $h | timeout 4 nc -w 2 $ip 80 | tail -n 1`
		out, _, _ := p.run(id, "/bin/sh", "-c", script)
		out = strings.TrimSpace(out)
		return out, strings.HasPrefix(out, "served by")
	}
	sb := p.create(corral.CreateRequest{Network: &corral.NetworkPolicy{Allow: []string{"pypi"}}})
	if sb.Network == nil || sb.Network.Mode != corral.NetworkAllowlist || sb.NetworkAddress == "" {
		t.Fatalf("created sandbox network = %+v, address %q", sb.Network, sb.NetworkAddress)
	}
	if out, ok := fetch(sb.ID, "http://mirror.test/"); !ok || out != "served by "+inetMirror {
		diag, _, _ := p.run(sb.ID, "/bin/sh", "-c", "cat /etc/resolv.conf; ip addr; ip route; nslookup mirror.test 2>&1; true")
		t.Fatalf("allowed service: %q\n%s", out, diag)
	}
	// The name is checked, not only the address: a request to the mirror's address (learned
	// through DNS) that names another host is refused by the edge's proxy.
	mismatch := `printf 'GET / HTTP/1.0\r\nHost: github.test\r\n\r\n' | timeout 4 nc -w 2 ` + inetMirror + ` 80`
	if out, _, _ := p.run(sb.ID, "/bin/sh", "-c", mismatch); strings.Contains(out, "served by") || !strings.Contains(out, "403") {
		t.Errorf("Host header naming a host outside the policy, to an allowed address: %q", out)
	}
	for _, url := range []string{"http://github.test/", "http://" + inetGrader + "/", "http://" + inetGitHub + "/",
		"http://169.254.169.254/", "http://198.51.100.254/", "http://10.0.0.1/"} {
		if out, ok := fetch(sb.ID, url); ok {
			t.Errorf("%s reachable under allow=pypi: %q", url, out)
		}
	}
	// DNS only through the edge's resolver: another server is unreachable, and names outside the
	// policy are refused.
	if out, _, _ := p.run(sb.ID, "/bin/sh", "-c", "nslookup mirror.test "+inetDNS+" 2>&1; true"); strings.Contains(out, inetMirror) {
		t.Errorf("DNS to another server answered: %q", out)
	}
	if out, _, _ := p.run(sb.ID, "/bin/sh", "-c", "nslookup github.test 2>&1; true"); strings.Contains(out, inetGitHub) {
		t.Errorf("a name outside the policy resolved: %q", out)
	}
	got, err := p.Client.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Egress == nil || got.Egress.Blocked["dns_refused"] == 0 || got.Egress.Blocked["no_rule"] == 0 ||
		got.Egress.Blocked["blocked_range"] == 0 || got.Egress.Blocked["dns_bypass"] == 0 || got.Egress.Blocked["sni_mismatch"] == 0 ||
		got.Egress.BlockedPer1000Actions == 0 {
		t.Errorf("egress counters = %+v", got.Egress)
	}
	// Metrics carry the same counters.
	req, _ := http.NewRequest("GET", p.URL+"/v1/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+p.Token)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Error(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := `corral_egress_blocked_total{sandbox="` + sb.ID + `",reason="dns_refused"}`; !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s:\n%s", want, body)
		}
	}
	// Root inside has no raw sockets: ping cannot even start.
	if out, _, _ := p.run(sb.ID, "/bin/sh", "-c", "ping -c 1 -W 1 "+inetMirror+" 2>&1; true"); strings.Contains(out, "1 packets received") {
		t.Errorf("ping got through: %q", out)
	}
	log, err := p.Client.BlockedAttempts(ctx, sb.ID)
	if err != nil || len(log) == 0 || log[len(log)-1].Reason == "" {
		t.Errorf("blocked attempts = %+v, %v", log, err)
	}
	var sawName, sawPacket bool
	for _, b := range log {
		sawName = sawName || (b.Name == "github.test" && b.Reason == "dns_refused")
		sawPacket = sawPacket || (b.Dest == inetGrader && b.Port == 80 && b.Protocol == "tcp" && b.Reason == "no_rule")
	}
	if !sawName {
		t.Errorf("the refused query for github.test is not in the blocked log: %+v", log)
	}
	if !sawPacket {
		t.Errorf("the dropped connection to %s:80 is not in the blocked log: %+v", inetGrader, log)
	}

	// Stages: setup allowed pypi; the agent stage allows nothing; the test stage the grader.
	if _, err := p.Client.SetNetwork(ctx, sb.ID, corral.NetworkPolicy{Mode: corral.NetworkAllowlist}); err != nil {
		t.Fatal(err)
	}
	if out, ok := fetch(sb.ID, "http://"+inetMirror+"/"); ok {
		t.Errorf("still reachable after the policy allowed nothing: %q", out)
	}
	if _, err := p.Client.SetNetwork(ctx, sb.ID, corral.NetworkPolicy{Allow: []string{"grader"}}); err != nil {
		t.Fatal(err)
	}
	if out, ok := fetch(sb.ID, "http://"+inetGrader+"/"); !ok || out != "served by "+inetGrader {
		t.Errorf("grader after the update: %q", out)
	}
	if out, ok := fetch(sb.ID, "http://mirror.test/"); ok {
		t.Errorf("mirror after the update: %q", out)
	}

	// Bad policies: a clear 400 naming the rule, the running policy unchanged.
	for _, bad := range []corral.NetworkPolicy{
		{Allow: []string{"nosuchservice"}}, {Allow: []string{"*.com"}}, {Allow: []string{"10.0.0.0/8"}},
		{Allow: []string{"1.2.3.4/33"}}, {Mode: "wide-open"},
	} {
		_, err := p.Client.SetNetwork(ctx, sb.ID, bad)
		if !corral.IsInvalid(err) {
			t.Errorf("SetNetwork(%+v): %v, want invalid", bad, err)
		}
	}
	if out, ok := fetch(sb.ID, "http://"+inetGrader+"/"); !ok {
		t.Errorf("a refused update changed the running policy: %q", out)
	}
	if _, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Network: &corral.NetworkPolicy{Allow: []string{"169.254.169.254"}}}); !corral.IsInvalid(err) {
		t.Errorf("create allowing the metadata address: %v, want invalid", err)
	}

	// A domain allowed on one port only: its addresses are reachable on that port, not on 80.
	portOnly := p.create(corral.CreateRequest{Network: &corral.NetworkPolicy{Allow: []string{"mirror.test:8080/tcp"}}})
	if out, ok := fetch(portOnly.ID, "http://mirror.test/"); ok {
		t.Errorf("mirror.test:80 reachable under allow=mirror.test:8080/tcp: %q", out)
	}
	p.Client.DeleteSandbox(ctx, portOnly.ID)

	// A sandbox without a policy has loopback only.
	plain := p.create(corral.CreateRequest{})
	if out, ok := fetch(plain.ID, "http://"+inetMirror+"/"); ok {
		t.Errorf("sandbox without networking reached the internet: %q", out)
	}
	// Open mode: the internet, but never the blocked set.
	open := p.create(corral.CreateRequest{Network: &corral.NetworkPolicy{Mode: corral.NetworkOpen, Deny: []string{inetGitHub}}})
	if _, ok := fetch(open.ID, "http://"+inetMirror+"/"); !ok {
		t.Errorf("open mode cannot reach the internet")
	}
	for _, url := range []string{"http://" + inetGitHub + "/", "http://169.254.169.254/", "http://" + sb.NetworkAddress + "/"} {
		if out, ok := fetch(open.ID, url); ok {
			t.Errorf("open mode reached %s: %q", url, out)
		}
	}

	// gVisor sandboxes get the same network: gVisor's netstack in the slot's namespace, the same
	// host rules, resolver and proxy; and a checkpoint/restore keeps it.
	t.Run("gvisor", func(t *testing.T) {
		needGVisor(t)
		gv := p.create(corral.CreateRequest{Runtime: "gvisor", Network: &corral.NetworkPolicy{Allow: []string{"pypi"}}})
		if out, ok := fetch(gv.ID, "http://mirror.test/"); !ok {
			t.Errorf("gVisor, allowed service: %q", out)
		}
		for _, url := range []string{"http://github.test/", "http://" + inetGitHub + "/", "http://169.254.169.254/"} {
			if out, ok := fetch(gv.ID, url); ok {
				t.Errorf("gVisor reached %s: %q", url, out)
			}
		}
		if _, err := p.Client.PauseSandbox(ctx, gv.ID); err != nil {
			t.Fatal(err)
		}
		if out, ok := fetch(gv.ID, "http://mirror.test/"); !ok {
			t.Errorf("gVisor after checkpoint/restore: %q", out)
		}
		// A pause cut short by a crash (checkpointed; the record still says running): the
		// next start restores it with its address, and its network works.
		if _, err := p.Client.PauseSandbox(ctx, gv.ID); err != nil {
			t.Fatal(err)
		}
		p.Kill9()
		recordRunning(t, p, gv.ID)
		p.Restart()
		if got, err := p.Client.GetSandbox(ctx, gv.ID); err != nil || got.State != corral.StateRunning {
			t.Errorf("gVisor sandbox after a pause cut short and a restart: %+v, %v", got, err)
		}
		if out, ok := fetch(gv.ID, "http://mirror.test/"); !ok {
			t.Errorf("gVisor restored by reconcile after a pause cut short: %q", out)
		}
		if _, err := p.Client.DeleteSandbox(ctx, gv.ID); err != nil {
			t.Fatal(err)
		}
	})

	// A restart keeps the policies in force.
	p.Kill9()
	p.Restart()
	if out, ok := fetch(sb.ID, "http://"+inetGrader+"/"); !ok {
		t.Errorf("grader after a restart: %q", out)
	}
	if out, ok := fetch(sb.ID, "http://"+inetMirror+"/"); ok {
		t.Errorf("mirror reachable after a restart: %q", out)
	}
	for _, id := range []string{sb.ID, plain.ID, open.ID} {
		if _, err := p.Client.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	p.Stop()
	assertNoLeftovers(t, p)
}

// TestServiceCatalogAPI: without --services, the operator manages the catalog through the API;
// it is validated, used by new policies and kept across restarts.
func TestServiceCatalogAPI(t *testing.T) {
	p := withBase(t, "--dns-upstream", "127.0.0.1:5353")
	ctx := context.Background()
	if _, err := p.Client.SetNetworkServices(ctx, []byte(`{"services": {"grader": {"addresses": ["10.9.9.9:80/tcp"]}, "bad": {}}}`)); !corral.IsInvalid(err) {
		t.Fatalf("a catalog with a service naming nothing: %v, want invalid", err)
	}
	if _, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Network: &corral.NetworkPolicy{Allow: []string{"grader"}}}); !corral.IsInvalid(err) {
		t.Fatalf("a policy naming a service before the catalog has it: %v, want invalid", err)
	}
	catalog := filepath.Join(t.TempDir(), "services.json")
	os.WriteFile(catalog, []byte(`{"services": {"grader": {"addresses": ["10.9.9.9:80/tcp"], "description": "the grader"}}}`), 0o644)
	if out, stderr, code := p.cli("", "net", "services", "--set", catalog); code != 0 || !strings.Contains(out, "grader") {
		t.Fatalf("corral net services --set: %s %s", out, stderr)
	}
	sb := p.create(corral.CreateRequest{Network: &corral.NetworkPolicy{Allow: []string{"grader"}}})
	p.Stop()
	p.Restart()
	list, err := p.Client.NetworkServices(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "grader" {
		t.Fatalf("catalog after a restart: %+v, %v", list, err)
	}
	if _, err := p.Client.SetNetwork(ctx, sb.ID, corral.NetworkPolicy{Allow: []string{"grader"}}); err != nil {
		t.Fatalf("policy naming the saved service after a restart: %v", err)
	}
	p.Client.DeleteSandbox(ctx, sb.ID)
}

// recordRunning rewrites sandbox id's record as running, as a pause that crashed before it was
// recorded leaves it. Corral must be stopped.
func recordRunning(t *testing.T, p *corralProc, id string) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(p.DataDir, "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	rec.State, rec.PausedAt = corral.StateRunning, time.Time{}
	if err := st.PutSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
}
