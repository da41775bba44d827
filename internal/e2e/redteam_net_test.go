package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/egress/netlab"
	corral "github.com/corral-dev/corral/sdk/go"
)

// The red-team internet: its own /24 (TestEgressPolicy's is 198.51.100.0/24, and the host's
// own address may be in 192.0.2.0/24), a mirror that policies allow and a host they do not.
const (
	rtMirror = "203.0.113.1"
	rtOther  = "203.0.113.2"
)

// TestRedTeamNetwork attacks the network boundary from a networked sandbox of each runtime:
// other sandboxes, every address of the host (the API listens on all of them here), the
// metadata address, IPv6, DNS tunnelling and Host/SNI spoofing. Each attempt gets nothing, and
// those the edge counts show in the sandbox's egress counters.
func TestRedTeamNetwork(t *testing.T) {
	needRoot(t)
	in, err := netlab.Start(randHex(2), netip.MustParsePrefix("203.0.113.0/24"), []netlab.Host{{Name: "mirror.test", Addr: rtMirror}, {Name: "other.test", Addr: rtOther}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.Close(); err != nil {
			t.Error(err)
		}
	})
	services := filepath.Join(t.TempDir(), "services.json")
	os.WriteFile(services, []byte(`{"services": {"mirror": {"domains": ["mirror.test"]}}}`), 0o644)
	// A listener of the host's on every address, which no sandbox may reach.
	hostL, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostL.Close()
	go func() {
		for {
			c, err := hostL.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host-listener\n"))
			c.Close()
		}
	}()
	_, hostPort, _ := net.SplitHostPort(hostL.Addr().String())
	forRuntimes(t, func(t *testing.T, rt string) {
		port := strings.Split(freePort(t), ":")[1]
		flags := []string{"--services", services, "--dns-upstream", in.DNS, "--listen", "0.0.0.0:" + port}
		p := withBaseOn(t, rt, flags...)
		testRedTeamNetwork(t, p, port, hostPort)
	})
}

func testRedTeamNetwork(t *testing.T, p *corralProc, apiPort, hostPort string) {
	ctx := context.Background()
	c := p.Client
	// The target: a runc sandbox serving on port 8080, in open mode.
	target, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Runtime: "runc", Network: &corral.NetworkPolicy{Mode: corral.NetworkOpen}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartCommand(ctx, target.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "while true; do echo sandbox-b | nc -l -p 8080; done"}}); err != nil {
		t.Fatal(err)
	}
	sb := p.create(corral.CreateRequest{Network: &corral.NetworkPolicy{Allow: []string{"mirror"}}})
	if _, err := c.WriteFile(ctx, sb.ID, "/root/probe", bytes.NewReader(probeBinary(t)), corral.WriteFileOptions{Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	sh := func(script string) string {
		t.Helper()
		out, _, _ := p.run(sb.ID, "/bin/sh", "-c", script)
		return strings.TrimSpace(out)
	}
	blocked := func(reason string) uint64 {
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil || got.Egress == nil {
			t.Fatalf("egress counters: %+v, %v", got, err)
		}
		return got.Egress.Blocked[reason]
	}
	counted := func(t *testing.T, reason string, before uint64) {
		t.Helper()
		eventually(t, 10*time.Second, "a "+reason+" drop counted", func() bool { return blocked(reason) > before })
	}
	// The network works: the allowed mirror answers, by name.
	get := `ip=$(nslookup mirror.test 2>/dev/null | awk '/^Address: /{a=$2} END{print a}'); printf 'GET / HTTP/1.0\r\nHost: mirror.test\r\n\r\n' | timeout 5 nc -w 3 $ip 80 | tail -n 1`
	// Retried for a while: a lookup lost to a slow guest is not the boundary's doing; a network
	// that never works still fails here. (A microvm under TCG once ran on a clock of 4 ms steps
	// and lost every lookup: the guests now boot with tsc=reliable.)
	for deadline := time.Now().Add(60 * time.Second); ; {
		out := sh(get)
		if out == "served by "+rtMirror {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the allowed mirror: %q (the network is broken, nothing below would mean anything)", out)
		}
		t.Logf("the allowed mirror: %q; trying again", out)
		time.Sleep(time.Second)
	}

	t.Run("metadata", func(t *testing.T) {
		before := blocked("blocked_range")
		if out := sh("/root/probe dial tcp 169.254.169.254:80"); out != "refused" {
			t.Fatalf("169.254.169.254:80: %s", out)
		}
		counted(t, "blocked_range", before)
	})
	t.Run("dns tunnel", func(t *testing.T) {
		refused, tunnel, typ := blocked("dns_refused"), blocked("dns_tunnel"), blocked("dns_type")
		label := strings.Repeat(randHex(15), 2) // 60 characters: a valid label
		var script []string
		for i := range 3 {
			script = append(script, fmt.Sprintf("/root/probe dnsq %s%d.%s.exfil.test 1", label, i, label))
		}
		script = append(script, "/root/probe dnsq "+strings.Repeat(label+".", 5)+"exfil.test 1", // a name over 253
			"/root/probe dnsq aGVsbG8+d29ybGQ=.exfil.test 1", // base64, not a hostname
			"/root/probe dnsq mirror.test 16",                // TXT of an allowed name
			"/root/probe dnsq mirror.test 1")                 // the control: answered
		want := strings.Repeat("no answer\n", 6) + "answered"
		if out := sh(strings.Join(script, "; ")); out != want {
			t.Fatalf("tunnelling queries: %q, want %q", out, want)
		}
		counted(t, "dns_refused", refused)
		counted(t, "dns_tunnel", tunnel)
		counted(t, "dns_type", typ)
		log, err := c.BlockedAttempts(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		var seen bool
		for _, b := range log {
			seen = seen || (b.Reason == "dns_refused" && strings.HasPrefix(b.Name, label))
		}
		if !seen {
			t.Fatalf("the tunnelling queries are not in the blocked log: %+v", log)
		}
	})
	t.Run("host header allowed name to a disallowed address", func(t *testing.T) {
		before := blocked("no_rule")
		if out := sh("printf 'GET / HTTP/1.0\\r\\nHost: mirror.test\\r\\n\\r\\n' | timeout 5 nc -w 3 " + rtOther + " 80"); strings.Contains(out, "served by") {
			t.Fatalf("Host: mirror.test to %s: %q", rtOther, out)
		}
		counted(t, "no_rule", before)
	})
	t.Run("host header disallowed name to an allowed address", func(t *testing.T) {
		before := blocked("sni_mismatch")
		if out := sh("printf 'GET / HTTP/1.0\\r\\nHost: other.test\\r\\n\\r\\n' | timeout 5 nc -w 3 " + rtMirror + " 80"); strings.Contains(out, "served by") {
			t.Fatalf("Host: other.test to the mirror: %q", out)
		}
		counted(t, "sni_mismatch", before)
	})
	t.Run("sni allowed name to a disallowed address", func(t *testing.T) {
		before := blocked("no_rule")
		if out := sh("/root/probe tls " + rtOther + ":443 mirror.test"); out != "refused" {
			t.Fatalf("TLS naming mirror.test to %s: %s", rtOther, out)
		}
		counted(t, "no_rule", before)
	})
	t.Run("sni disallowed name to an allowed address", func(t *testing.T) {
		before := blocked("sni_mismatch")
		if out := sh("/root/probe tls " + rtMirror + ":443 other.test"); out != "refused" {
			t.Fatalf("TLS naming other.test to the mirror: %s", out)
		}
		counted(t, "sni_mismatch", before)
	})
	t.Run("raw sockets", func(t *testing.T) {
		if out := sh("/root/probe raw"); out != "refused" {
			t.Fatalf("raw sockets: %s", out)
		}
	})

	// The widest policy from here on: open mode still never reaches other sandboxes or the host.
	if _, err := c.SetNetwork(ctx, sb.ID, corral.NetworkPolicy{Mode: corral.NetworkOpen}); err != nil {
		t.Fatal(err)
	}
	if out := sh("/root/probe dial tcp " + rtOther + ":80"); out != "connected" {
		t.Fatalf("open mode cannot reach the internet: %s", out)
	}
	t.Run("ipv6", func(t *testing.T) {
		if out := sh("grep -v -e ' lo$' /proc/net/if_inet6 | grep -v '^fe80' | wc -l"); out != "0" {
			t.Errorf("a global IPv6 address: %s", sh("cat /proc/net/if_inet6"))
		}
		if out := sh("grep -v -e ' lo$' /proc/net/ipv6_route | grep -v '^fe80' | grep -v '^ff00' | wc -l"); out != "0" {
			t.Errorf("an IPv6 route: %s", sh("cat /proc/net/ipv6_route"))
		}
		for _, addr := range []string{"[fd00::2]:" + apiPort, "[2001:db8::1]:80", "[::ffff:" + rtOther + "]:80", "[64:ff9b::" + rtOther + "]:80"} {
			if strings.HasPrefix(addr, "[::ffff:") {
				continue // an IPv4-mapped address is IPv4 (reachable in open mode): not an IPv6 path
			}
			if out := sh("/root/probe dial tcp6 " + addr); out != "refused" {
				t.Errorf("tcp6 %s: %s", addr, out)
			}
		}
	})
	t.Run("sandbox to sandbox", func(t *testing.T) {
		// The target serves (seen from inside it), so a refusal below is the boundary's.
		if out, _, _ := p.run(target.ID, "/bin/sh", "-c", "nc 127.0.0.1 8080 </dev/null"); strings.TrimSpace(out) != "sandbox-b" {
			t.Fatalf("the target's own listener: %q", out)
		}
		gw := prevAddr(target.NetworkAddress)
		targets := []string{target.NetworkAddress + ":8080", target.NetworkAddress + ":22"}
		for _, port := range []string{"8080", apiPort, hostPort} {
			targets = append(targets, gw+":"+port)
		}
		if out := sh("/root/probe dials tcp " + strings.Join(targets, " ")); out != "none" {
			t.Fatalf("sandbox %s reached the other sandbox or its gateway: %s", sb.ID, out)
		}
		// ...and the other way.
		if out, _, _ := p.run(target.ID, "/bin/sh", "-c", "nc -z -w 2 "+sb.NetworkAddress+" 22 && echo connected || echo refused"); strings.TrimSpace(out) != "refused" {
			t.Errorf("the target reached %s: %s", sb.NetworkAddress, out)
		}
	})
	t.Run("host addresses and the API port", func(t *testing.T) {
		addrs := []string{prevAddr(sb.NetworkAddress), "203.0.113.254"}
		ifaddrs, _ := net.InterfaceAddrs()
		for _, a := range ifaddrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				addrs = append(addrs, ipn.IP.String())
			}
		}
		// The probe connects where it may (open mode), so "none" below is the boundary's.
		if out := sh("/root/probe dials tcp " + rtOther + ":80"); out != "connected "+rtOther+":80" {
			t.Fatalf("dials to the internet in open mode: %s", out)
		}
		var targets []string
		for _, a := range addrs {
			for _, port := range []string{apiPort, hostPort, "22"} {
				targets = append(targets, net.JoinHostPort(a, port))
			}
		}
		if out := sh("/root/probe dials tcp " + strings.Join(targets, " ")); out != "none" {
			// Other tests add and remove addresses on this host (their own internets): one
			// that is gone is routed out like any other, so only those still the host's count.
			if reached := stillLocal(t, out); len(reached) > 0 {
				t.Errorf("host addresses reached: %s", strings.Join(reached, " "))
			}
		}
		// Loopback inside is the sandbox's own, never the host's.
		if out := sh("/root/probe dial tcp 127.0.0.1:" + apiPort); out != "refused" {
			t.Errorf("127.0.0.1:%s inside: %s", apiPort, out)
		}
	})
	t.Run("metadata in open mode", func(t *testing.T) {
		before := blocked("blocked_range")
		if out := sh("/root/probe dial tcp 169.254.169.254:80"); out != "refused" {
			t.Fatalf("169.254.169.254:80: %s", out)
		}
		counted(t, "blocked_range", before)
	})
}

// prevAddr is the IPv4 address before a (a slot's host side, for its sandbox's address).
func prevAddr(a string) string { return netip.MustParseAddr(a).Prev().String() }

// stillLocal returns the targets the probe's "connected ADDR:PORT..." line names whose address is
// still one of the host's.
func stillLocal(t *testing.T, probeOut string) []string {
	t.Helper()
	local := map[string]bool{}
	ifaddrs, _ := net.InterfaceAddrs()
	for _, a := range ifaddrs {
		if ipn, ok := a.(*net.IPNet); ok {
			local[ipn.IP.String()] = true
		}
	}
	var out []string
	for _, target := range strings.Fields(strings.TrimPrefix(probeOut, "connected")) {
		host, _, err := net.SplitHostPort(target)
		if err != nil || local[host] {
			out = append(out, target)
		}
	}
	return out
}
