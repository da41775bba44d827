package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// testEnv blocks a host at 192.0.2.1, a control plane at 192.0.2.2 and the pool 10.200.0.0/16.
// 203.0.113.0/24 and 198.51.100.0/24 play the internet.
func testEnv() Env {
	return Env{Blocked: BlockedSet(
		[]netip.Prefix{pfx("192.0.2.1/32")},
		[]netip.Prefix{pfx("192.0.2.2/32")},
		pfx("10.200.0.0/16"),
	)}
}

func mustCompile(t *testing.T, p Policy) *Compiled {
	t.Helper()
	c, err := Compile(p, testCatalog(t), testEnv())
	if err != nil {
		t.Fatalf("Compile(%+v): %v", p, err)
	}
	return c
}

func allow(rules ...string) Policy { return Policy{Allow: rules} }

func TestCompileModes(t *testing.T) {
	tests := []struct {
		in   Policy
		mode string
	}{
		{Policy{}, "none"},
		{Policy{Mode: "none"}, "none"},
		{allow("pypi"), "allowlist"},
		{Policy{Mode: "allowlist"}, "allowlist"},
		{Policy{Mode: "open"}, "open"},
		{Policy{Mode: "open", Allow: []string{"gateway"}, Deny: []string{"203.0.113.7"}}, "open"},
	}
	for _, tt := range tests {
		c := mustCompile(t, tt.in)
		if c.Mode != tt.mode || c.Source.Mode != tt.mode {
			t.Errorf("Compile(%+v): mode %q, source mode %q, want %q", tt.in, c.Mode, c.Source.Mode, tt.mode)
		}
	}
}

func TestCompileRejects(t *testing.T) {
	tests := []struct {
		name  string
		in    Policy
		field string
		msg   string
	}{
		{"unknown mode", Policy{Mode: "closed"}, "network.mode", `"closed": want "none", "allowlist" or "open"`},
		{"rules in mode none", Policy{Mode: "none", Allow: []string{"pypi"}}, "network.allow", `mode "none"`},
		{"deny alone", Policy{Deny: []string{"pypi"}}, "network.deny", `mode "none"`},

		// The always-blocked set, from a user.
		{"private", allow("pypi", "10.0.0.0/8"), "network.allow[1]",
			`"10.0.0.0/8" would open 10.0.0.0/8 (private range): only the operator's service catalog may allow it`},
		{"metadata", allow("169.254.169.254"), "network.allow[0]", `would open 169.254.0.0/16 (link-local, cloud metadata)`},
		{"metadata port", allow("169.254.169.254:80/tcp"), "network.allow[0]", `"169.254.169.254:80/tcp" would open 169.254.0.0/16`},
		{"other sandboxes", allow("10.200.3.4:22"), "network.allow[0]", `would open 10.200.0.0/16 (sandbox pool, other sandboxes)`},
		{"host", allow("192.0.2.0/24"), "network.allow[0]", `would open 192.0.2.1/32 (host address)`},
		{"control plane", allow("192.0.2.2:443"), "network.allow[0]", `would open 192.0.2.2/32 (control plane)`},
		{"loopback", allow("127.0.0.1:8080"), "network.allow[0]", `would open 127.0.0.0/8 (loopback)`},
		{"multicast", allow("224.0.0.251:5353/udp"), "network.allow[0]", `would open 224.0.0.0/4 (multicast)`},
		{"broadcast", allow("255.255.255.255"), "network.allow[0]", `would open 255.255.255.255/32 (broadcast)`},
		{"wider than a range", allow("172.0.0.0/8"), "network.allow[0]", `would open 172.16.0.0/12 (private range)`},
		{"everything", allow("0.0.0.0/0"), "network.allow[0]", `"0.0.0.0/0" would open 224.0.0.0/4 (multicast): only the operator's service catalog may allow it; for the whole internet, use mode "open"`},
		{"CGNAT", allow("100.64.1.1"), "network.allow[0]", `would open 100.64.0.0/10 (shared address space)`},

		// Syntax, with the field of the offending rule.
		{"bad wildcard", allow("pypi", "github", "*.com"), "network.allow[2]", `"*.com": a wildcard needs at least two labels`},
		{"bad deny", Policy{Allow: []string{"pypi"}, Deny: []string{"foo*.bar"}}, "network.deny[0]", `"foo*.bar"`},
		{"bad CIDR", allow("1.2.3.4/33"), "network.allow[0]", `"1.2.3.4/33"`},
		{"IPv6", allow("[2001:db8::1]:443"), "network.allow[0]", "IPv6 egress is blocked"},
		{"IPv6 deny", Policy{Mode: "open", Deny: []string{"2001:db8::/32"}}, "network.deny[0]", "IPv6 egress is blocked"},

		// Services.
		{"unknown service", allow("pypi", "npm"), "network.allow[1]", `"npm": no service "npm" in the operator's catalog (it has gateway, github, infra, ntp, pypi)`},
		{"service off its ports", allow("ntp:443"), "network.allow[0]", `"ntp:443": service "ntp" has no domain or address on the port`},
		{"service off its protocol", allow("gateway/udp"), "network.allow[0]", `service "gateway" has no domain or address`},
	}
	for _, tt := range tests {
		c, err := Compile(tt.in, testCatalog(t), testEnv())
		if err == nil {
			t.Errorf("%s: Compile(%+v) = %+v, want an error", tt.name, tt.in, c)
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v is not ErrInvalid", tt.name, err)
		}
		if got := errdefs.Field(err); got != tt.field {
			t.Errorf("%s: field = %q, want %q (%v)", tt.name, got, tt.field, err)
		}
		if !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: error = %q, want it to contain %q", tt.name, err, tt.msg)
		}
	}

	// Without a catalog every service is unknown.
	if _, err := Compile(allow("pypi"), nil, testEnv()); err == nil || !strings.Contains(err.Error(), "catalog is empty") {
		t.Errorf("Compile without a catalog: %v, want an unknown-service error", err)
	}
}

func TestCompileLimits(t *testing.T) {
	rules := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("203.0.%d.%d", 113+i/256, i%256))
		}
		return out
	}
	cat := testCatalog(t)
	if _, err := Compile(allow(rules(DefaultMaxRules)...), cat, testEnv()); err != nil {
		t.Errorf("%d rules: %v", DefaultMaxRules, err)
	}
	_, err := Compile(allow(rules(DefaultMaxRules+1)...), cat, testEnv())
	if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != "network" || !strings.Contains(err.Error(), "the limit is 256") {
		t.Errorf("%d rules: error = %v, want ErrInvalid on network naming the limit", DefaultMaxRules+1, err)
	}

	env := testEnv()
	env.MaxRules = 3
	p := Policy{Allow: []string{"pypi", "github"}, Deny: []string{"203.0.113.7"}}
	if _, err := Compile(p, cat, env); err != nil {
		t.Errorf("3 rules, limit 3: %v", err)
	}
	p.Deny = append(p.Deny, "203.0.113.8")
	if _, err := Compile(p, cat, env); err == nil || !strings.Contains(err.Error(), "4 allow and deny rules; the limit is 3") {
		t.Errorf("4 rules, limit 3: error = %v, want the limit named", err)
	}
}

func TestCompileNormalizes(t *testing.T) {
	c := mustCompile(t, Policy{
		Allow: []string{
			"PyPI.org", "pypi.org.", "pypi", "pypi.org:443", // all covered by the service's pypi.org
			"203.0.113.7/32", "203.0.113.7", "203.0.113.0/24", // the /24 covers the address
			"198.51.100.0/24:443/tcp", "198.51.100.0/24:443", "198.51.100.9:443/udp",
			"198.51.100.77/24:80",
		},
		Deny: []string{"*.Example.com", "*.example.com."},
	})
	wantSource := Policy{
		Mode: "allowlist",
		Allow: []string{"pypi.org", "pypi", "pypi.org:443", "203.0.113.7", "203.0.113.0/24",
			"198.51.100.0/24:443/tcp", "198.51.100.0/24:443", "198.51.100.9:443/udp", "198.51.100.0/24:80"},
		Deny: []string{"*.example.com"},
	}
	if c.Source.Mode != wantSource.Mode || !slices.Equal(c.Source.Allow, wantSource.Allow) || !slices.Equal(c.Source.Deny, wantSource.Deny) {
		t.Errorf("Source = %+v\nwant     %+v", c.Source, wantSource)
	}

	var nets []string
	for _, r := range c.AllowNets {
		nets = append(nets, Rule{Prefix: r.Prefix, Ports: r.Ports, Proto: r.Proto}.String())
	}
	if want := []string{"198.51.100.0/24:80", "198.51.100.0/24:443", "203.0.113.0/24"}; !slices.Equal(nets, want) {
		t.Errorf("AllowNets = %v, want %v", nets, want)
	}
	var domains []string
	for _, r := range c.AllowDomains {
		domains = append(domains, r.String())
	}
	if want := []string{"*.pythonhosted.org (service pypi)", "pypi.org"}; !slices.Equal(domains, want) {
		t.Errorf("AllowDomains = %v, want %v", domains, want)
	}
	if len(c.DenyDomains) != 1 || c.DenyDomains[0].Pattern != "*.example.com" {
		t.Errorf("DenyDomains = %+v, want one *.example.com", c.DenyDomains)
	}
}

func TestCompileServicePort(t *testing.T) {
	c := mustCompile(t, allow("github:443/tcp"))
	for _, r := range c.AllowDomains {
		if r.Ports != (PortRange{443, 443}) || r.Proto != ProtoTCP || r.Service != "github" || r.Rule != "github:443/tcp" {
			t.Errorf("domain rule %+v, want 443/tcp from github:443/tcp", r)
		}
	}
	if len(c.AllowDomains) != 3 {
		t.Errorf("AllowDomains = %+v, want github's three", c.AllowDomains)
	}
	want := []NetRule{{Prefix: pfx("140.82.112.0/20"), Ports: PortRange{443, 443}, Proto: ProtoTCP, Rule: "github:443/tcp", Service: "github"}}
	if !slices.Equal(c.AllowNets, want) {
		t.Errorf("AllowNets = %+v, want %+v", c.AllowNets, want)
	}
	// The catalog's own port narrows the rule's range.
	c = mustCompile(t, allow("infra:9050-9200"))
	want = []NetRule{{Prefix: pfx("10.0.0.5/32"), Ports: PortRange{9050, 9100}, Proto: ProtoBoth, Rule: "infra:9050-9200", Service: "infra"}}
	if !slices.Equal(c.AllowNets, want) {
		t.Errorf("AllowNets = %+v, want %+v", c.AllowNets, want)
	}
}

func TestWildcardMatching(t *testing.T) {
	c := mustCompile(t, allow("*.example.com", "exact.org"))
	tests := []struct {
		name string
		want bool
	}{
		{"a.example.com", true},
		{"a.b.example.com", true},
		{"A.Example.COM.", true},
		{"example.com", false},
		{"example.com.", false},
		{"badexample.com", false},
		{"a.badexample.com", false},
		{"example.com.evil.net", false},
		{"a.example.com.evil.net", false},
		{"exact.org", true},
		{"EXACT.ORG.", true},
		{"a.exact.org", false},
		{"", false},
		{".", false},
		{".example.com", false},
		{"a..example.com", false},
		{"a.example.com..", false},
	}
	for _, tt := range tests {
		got, rule := c.AllowsName(tt.name)
		if got != tt.want {
			t.Errorf("AllowsName(%q) = %v (%s), want %v", tt.name, got, rule, tt.want)
		}
		if (tt.want && rule == ReasonNoRule) || (!tt.want && rule != ReasonNoRule) {
			t.Errorf("AllowsName(%q) rule = %q", tt.name, rule)
		}
	}
	r := DomainRule{Pattern: "*.example.com"}
	for name, want := range map[string]bool{"a.example.com": true, "a.b.example.com": true, "example.com": false, "badexample.com": false, ".example.com": false} {
		if got := r.Matches(name); got != want {
			t.Errorf("DomainRule.Matches(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestDenyWins(t *testing.T) {
	c := mustCompile(t, Policy{
		Allow: []string{"*.example.com", "203.0.113.0/24", "github", "gateway"},
		Deny:  []string{"bad.example.com", "*.evil.example.com", "ports.example.com:80", "203.0.113.7", "203.0.113.8:22/tcp", "10.0.0.5"},
	})
	names := []struct {
		name string
		want bool
		rule string
	}{
		{"good.example.com", true, "*.example.com"},
		{"bad.example.com", false, "bad.example.com"},
		{"sub.bad.example.com", true, "*.example.com"},
		{"x.evil.example.com", false, "*.evil.example.com"},
		{"evil.example.com", true, "*.example.com"},
		// A deny for one port does not refuse the name: it applies to the addresses.
		{"ports.example.com", true, "*.example.com"},
		{"github.com", true, "github.com (service github)"},
	}
	for _, tt := range names {
		got, rule := c.AllowsName(tt.name)
		if got != tt.want || rule != tt.rule {
			t.Errorf("AllowsName(%q) = %v, %q, want %v, %q", tt.name, got, rule, tt.want, tt.rule)
		}
	}
	allowRules, denyRules := c.NameRules("ports.example.com")
	if len(allowRules) != 1 || len(denyRules) != 1 || denyRules[0].Ports != (PortRange{80, 80}) {
		t.Errorf("NameRules(ports.example.com) = %+v, %+v, want one allow and the port-80 deny", allowRules, denyRules)
	}

	addrs := []struct {
		ip     string
		port   uint16
		proto  string
		want   bool
		reason string
	}{
		{"203.0.113.6", 443, "tcp", true, "203.0.113.0/24"},
		{"203.0.113.7", 443, "tcp", false, ReasonDenied},
		{"203.0.113.8", 22, "tcp", false, ReasonDenied},
		{"203.0.113.8", 22, "udp", true, "203.0.113.0/24"},
		{"203.0.113.8", 23, "tcp", true, "203.0.113.0/24"},
		// A denied catalog address stays denied.
		{"10.0.0.5", 8080, "tcp", false, ReasonDenied},
	}
	for _, tt := range addrs {
		got, reason := c.AllowsAddr(netip.MustParseAddr(tt.ip), tt.port, tt.proto)
		if got != tt.want || reason != tt.reason {
			t.Errorf("AllowsAddr(%s:%d/%s) = %v, %q, want %v, %q", tt.ip, tt.port, tt.proto, got, reason, tt.want, tt.reason)
		}
	}

	// In mode open, deny rules and services in the deny list still refuse.
	open := mustCompile(t, Policy{Mode: "open", Deny: []string{"github", "*.evil.example"}})
	for name, want := range map[string]bool{"github.com": false, "api.github.com": false, "x.evil.example": false, "pypi.org": true} {
		if got, rule := open.AllowsName(name); got != want {
			t.Errorf("open: AllowsName(%q) = %v (%s), want %v", name, got, rule, want)
		}
	}
	if got, reason := open.AllowsAddr(netip.MustParseAddr("140.82.113.3"), 443, "tcp"); got || reason != ReasonDenied {
		t.Errorf("open: github's address = %v, %q, want denied", got, reason)
	}
}

func TestAllowsAddrReasons(t *testing.T) {
	allowlist := mustCompile(t, allow("203.0.113.0/24:443/tcp", "pypi"))
	open := mustCompile(t, Policy{Mode: "open"})
	none := mustCompile(t, Policy{})
	tests := []struct {
		c      *Compiled
		ip     string
		port   uint16
		proto  string
		want   bool
		reason string
	}{
		{allowlist, "203.0.113.5", 443, "tcp", true, "203.0.113.0/24:443/tcp"},
		{allowlist, "203.0.113.5", 443, "udp", false, ReasonNoRule},
		{allowlist, "203.0.113.5", 80, "tcp", false, ReasonNoRule},
		{allowlist, "198.51.100.1", 443, "tcp", false, ReasonNoRule},
		{allowlist, "203.0.113.5", 443, "icmp", false, ReasonNoRule},
		{allowlist, "169.254.169.254", 80, "tcp", false, ReasonBlocked},
		{allowlist, "10.200.0.9", 22, "tcp", false, ReasonBlocked},
		{allowlist, "192.0.2.1", 7070, "tcp", false, ReasonBlocked},
		{allowlist, "192.0.2.2", 443, "tcp", false, ReasonBlocked},
		{allowlist, "192.0.2.3", 443, "tcp", false, ReasonNoRule},
		{allowlist, "2001:db8::1", 443, "tcp", false, ReasonBlocked},
		{allowlist, "::ffff:203.0.113.5", 443, "tcp", true, "203.0.113.0/24:443/tcp"},
		{open, "198.51.100.1", 443, "tcp", true, "open"},
		{open, "198.51.100.1", 53, "udp", true, "open"},
		{open, "10.1.2.3", 443, "tcp", false, ReasonBlocked},
		{open, "127.0.0.1", 80, "tcp", false, ReasonBlocked},
		{open, "::ffff:169.254.169.254", 80, "tcp", false, ReasonBlocked},
		{open, "255.255.255.255", 67, "udp", false, ReasonBlocked},
		{open, "2001:db8::1", 443, "tcp", false, ReasonBlocked},
		{none, "198.51.100.1", 443, "tcp", false, ReasonNoRule},
		{none, "10.0.0.1", 443, "tcp", false, ReasonBlocked},
	}
	for _, tt := range tests {
		got, reason := tt.c.AllowsAddr(netip.MustParseAddr(tt.ip), tt.port, tt.proto)
		if got != tt.want || reason != tt.reason {
			t.Errorf("%s: AllowsAddr(%s, %d, %s) = %v, %q, want %v, %q", tt.c.Mode, tt.ip, tt.port, tt.proto, got, reason, tt.want, tt.reason)
		}
	}
	if ok, rule := none.AllowsName("pypi.org"); ok || rule != ReasonNoRule {
		t.Errorf("none: AllowsName(pypi.org) = %v, %q", ok, rule)
	}
	if ok, _ := allowlist.AllowsName("files.pythonhosted.org"); !ok {
		t.Errorf("allowlist: AllowsName(files.pythonhosted.org) refused")
	}
	if ok, rule := open.AllowsName("anything.example"); !ok || rule != "open" {
		t.Errorf("open: AllowsName(anything.example) = %v, %q", ok, rule)
	}
}

// TestPrivateService checks that a catalog service opens exactly its addresses, ports and
// protocols in the always-blocked set, in both modes, and only for policies that allow it.
func TestPrivateService(t *testing.T) {
	for _, mode := range []string{"allowlist", "open"} {
		c := mustCompile(t, Policy{Mode: mode, Allow: []string{"gateway"}})
		tests := []struct {
			ip     string
			port   uint16
			proto  string
			want   bool
			reason string
		}{
			{"10.0.0.5", 8080, "tcp", true, "gateway"},
			{"10.0.0.5", 8080, "udp", false, ReasonBlocked},
			{"10.0.0.5", 8079, "tcp", false, ReasonBlocked},
			{"10.0.0.5", 8081, "tcp", false, ReasonBlocked},
			{"10.0.0.5", 0, "tcp", false, ReasonBlocked},
			{"10.0.0.5", 22, "tcp", false, ReasonBlocked},
			{"10.0.0.4", 8080, "tcp", false, ReasonBlocked},
			{"10.0.0.6", 8080, "tcp", false, ReasonBlocked},
		}
		for _, tt := range tests {
			got, reason := c.AllowsAddr(netip.MustParseAddr(tt.ip), tt.port, tt.proto)
			if got != tt.want || reason != tt.reason {
				t.Errorf("%s: AllowsAddr(%s:%d/%s) = %v, %q, want %v, %q", mode, tt.ip, tt.port, tt.proto, got, reason, tt.want, tt.reason)
			}
		}
		if slices.ContainsFunc(c.Blocked, func(p netip.Prefix) bool { return p.Contains(netip.MustParseAddr("10.0.0.5")) }) {
			t.Errorf("%s: Blocked still holds 10.0.0.5: %v", mode, c.Blocked)
		}
		wantNets := []NetRule{
			{Prefix: pfx("10.0.0.5/32"), Ports: PortRange{0, 8079}, Proto: ProtoTCP},
			{Prefix: pfx("10.0.0.5/32"), Ports: PortRange{8081, 65535}, Proto: ProtoTCP},
			{Prefix: pfx("10.0.0.5/32"), Ports: AllPorts, Proto: ProtoUDP},
		}
		if !slices.Equal(c.BlockedNets, wantNets) {
			t.Errorf("%s: BlockedNets = %+v, want %+v", mode, c.BlockedNets, wantNets)
		}
		wantOpened := []NetRule{{Prefix: pfx("10.0.0.5/32"), Ports: PortRange{8080, 8080}, Proto: ProtoTCP, Rule: "gateway", Service: "gateway"}}
		if !slices.Equal(c.Opened, wantOpened) {
			t.Errorf("%s: Opened = %+v, want %+v", mode, c.Opened, wantOpened)
		}
	}

	// Not allowed, not opened; a service in the deny list opens nothing either.
	for _, p := range []Policy{allow("pypi"), {Mode: "open", Deny: []string{"gateway"}}} {
		c := mustCompile(t, p)
		if got, reason := c.AllowsAddr(netip.MustParseAddr("10.0.0.5"), 8080, "tcp"); got || (reason != ReasonBlocked) {
			t.Errorf("%+v: gateway = %v, %q, want blocked", p, got, reason)
		}
		if c.BlockedNets != nil || !slices.Equal(c.Blocked, testEnv().Blocked.Prefixes()) {
			t.Errorf("%+v: Blocked = %v, BlockedNets = %v, want the full set", p, c.Blocked, c.BlockedNets)
		}
	}
}

// TestBlockedCarving checks Blocked and BlockedNets against the definition, on addresses and
// ports around every boundary: traffic is blocked when the full blocked set holds the address
// and no allowed catalog address rule matches it. It also checks that the other enforcement
// order Compiled documents (deny, Opened, the whole set, allow) decides the same.
func TestBlockedCarving(t *testing.T) {
	env := testEnv()
	full := env.Blocked.Prefixes()
	policies := []Policy{
		allow("gateway", "infra"),
		allow("gateway", "infra:9000/udp"),
		{Mode: "open", Allow: []string{"infra", "github"}},
		{Mode: "open", Allow: []string{"infra"}, Deny: []string{"10.0.0.5:9050"}},
		allow("gateway:8080"),
	}
	// layout is the order of a single shared blocked set.
	layout := func(c *Compiled, ip netip.Addr, port uint16, proto Proto) bool {
		match := func(rules []NetRule) bool {
			return slices.ContainsFunc(rules, func(r NetRule) bool { return r.Matches(ip, port, proto) })
		}
		switch {
		case match(c.DenyNets):
			return false
		case match(c.Opened):
			return true
		case slices.ContainsFunc(full, func(p netip.Prefix) bool { return p.Contains(ip) }):
			return false
		case match(c.AllowNets):
			return true
		}
		return c.Mode == "open"
	}
	ips := []string{"10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.52", "10.0.0.53", "10.0.0.54", "169.254.169.253",
		"169.254.169.254", "169.254.169.255", "140.82.112.0", "140.82.127.255", "9.255.255.255", "11.0.0.0",
		"203.0.113.1", "10.200.0.1"}
	ports := []uint16{0, 1, 22, 53, 54, 79, 80, 81, 8079, 8080, 8081, 8999, 9000, 9050, 9100, 9101, 65535}
	for _, p := range policies {
		c, err := Compile(p, testCatalog(t), env)
		if err != nil {
			t.Fatal(err)
		}
		var opened []NetRule
		for _, r := range c.AllowNets {
			if r.Service != "" {
				opened = append(opened, r)
			}
		}
		for _, s := range ips {
			ip := netip.MustParseAddr(s)
			_, inSet := env.Blocked.Contains(ip)
			for _, port := range ports {
				for _, proto := range []Proto{ProtoTCP, ProtoUDP} {
					wantBlocked := inSet && !slices.ContainsFunc(opened, func(r NetRule) bool { return r.Matches(ip, port, proto) })
					got, reason := c.AllowsAddr(ip, port, proto.String())
					if gotBlocked := !got && reason == ReasonBlocked; gotBlocked != wantBlocked {
						t.Errorf("%+v: AllowsAddr(%s:%d/%s) = %v, %q; blocked should be %v", p, ip, port, proto, got, reason, wantBlocked)
					}
					if l := layout(c, ip, port, proto); l != got {
						t.Errorf("%+v: %s:%d/%s: the shared-set order says %v, AllowsAddr %v (%s)", p, ip, port, proto, l, got, reason)
					}
				}
			}
		}
	}
}

func TestBlockedSet(t *testing.T) {
	var zero Blocked
	for _, s := range []string{"10.1.2.3", "169.254.169.254", "127.0.0.1", "0.1.2.3", "100.64.0.1", "172.31.255.255",
		"192.168.1.1", "224.0.0.1", "240.0.0.1", "255.255.255.255"} {
		if _, ok := zero.Contains(netip.MustParseAddr(s)); !ok {
			t.Errorf("the zero Blocked does not hold %s", s)
		}
	}
	for _, s := range []string{"192.0.2.1", "198.51.100.1", "203.0.113.1", "8.8.8.8", "172.32.0.1", "100.128.0.1", "2001:db8::1"} {
		if r, ok := zero.Contains(netip.MustParseAddr(s)); ok {
			t.Errorf("the zero Blocked holds %s (%v)", s, r)
		}
	}

	b := BlockedSet([]netip.Prefix{pfx("192.0.2.1/32"), pfx("2001:db8::1/128"), pfx("::ffff:198.51.100.7/128")},
		[]netip.Prefix{pfx("203.0.113.9/32")}, pfx("10.200.0.0/16"))
	for s, why := range map[string]string{
		"192.0.2.1":       "host address",
		"198.51.100.7":    "host address",
		"203.0.113.9":     "control plane",
		"10.200.1.1":      "sandbox pool, other sandboxes",
		"10.1.1.1":        "private range",
		"::ffff:10.1.1.1": "private range",
	} {
		if r, ok := b.Contains(netip.MustParseAddr(s)); !ok || r.Why != why {
			t.Errorf("Contains(%s) = %+v, %v, want %q", s, r, ok, why)
		}
	}
	want := []netip.Prefix{pfx("0.0.0.0/8"), pfx("10.0.0.0/8"), pfx("100.64.0.0/10"), pfx("127.0.0.0/8"), pfx("169.254.0.0/16"),
		pfx("172.16.0.0/12"), pfx("192.0.2.1/32"), pfx("192.168.0.0/16"), pfx("198.51.100.7/32"), pfx("203.0.113.9/32"), pfx("224.0.0.0/3")}
	if got := b.Prefixes(); !slices.Equal(got, want) {
		t.Errorf("Prefixes() = %v\nwant        %v", got, want)
	}
	if n := len(b.Ranges()); n != len(reserved)+4 {
		t.Errorf("Ranges() has %d entries, want %d", n, len(reserved)+4)
	}
}

func TestGroupNets(t *testing.T) {
	rules := []NetRule{
		{Prefix: pfx("203.0.113.0/25"), Ports: PortRange{443, 443}, Proto: ProtoTCP},
		{Prefix: pfx("203.0.113.128/25"), Ports: PortRange{443, 443}, Proto: ProtoTCP},
		{Prefix: pfx("198.51.100.7/32"), Ports: PortRange{443, 443}, Proto: ProtoTCP},
		{Prefix: pfx("198.51.100.0/24"), Ports: AllPorts, Proto: ProtoBoth},
		{Prefix: pfx("198.51.100.9/32"), Ports: PortRange{53, 53}, Proto: ProtoUDP},
	}
	got := GroupNets(rules)
	want := []NetSet{
		{Proto: ProtoBoth, Ports: AllPorts, Prefixes: []netip.Prefix{pfx("198.51.100.0/24")}},
		{Proto: ProtoUDP, Ports: PortRange{53, 53}, Prefixes: []netip.Prefix{pfx("198.51.100.9/32")}},
		{Proto: ProtoTCP, Ports: PortRange{443, 443}, Prefixes: []netip.Prefix{pfx("198.51.100.7/32"), pfx("203.0.113.0/24")}},
	}
	if len(got) != len(want) {
		t.Fatalf("GroupNets = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Proto != want[i].Proto || got[i].Ports != want[i].Ports || !slices.Equal(got[i].Prefixes, want[i].Prefixes) {
			t.Errorf("GroupNets[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// FuzzCompile checks that compiling any policy never panics, refuses only with ErrInvalid naming
// a field, and that the normalised Source compiles to the same result.
//
//	go test -run '^$' -fuzz FuzzCompile -fuzztime 60s ./internal/netpolicy
func FuzzCompile(f *testing.F) {
	f.Add("", "pypi", "203.0.113.0/24:443/tcp", "*.example.com")
	f.Add("open", "gateway", "infra:9000-9050/udp", "10.0.0.5:9010")
	f.Add("allowlist", "github:443", "10.0.0.0/8", "")
	f.Add("none", "", "", "pypi")
	cat, err := ParseCatalog([]byte(testCatalogJSON))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, mode, a1, a2, d1 string) {
		p := Policy{Mode: mode}
		for _, r := range []string{a1, a2} {
			if r != "" {
				p.Allow = append(p.Allow, r)
			}
		}
		if d1 != "" {
			p.Deny = []string{d1}
		}
		c, err := Compile(p, cat, testEnv())
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) == "" {
				t.Fatalf("Compile(%+v): %v is not ErrInvalid with a field", p, err)
			}
			return
		}
		again, err := Compile(c.Source, cat, testEnv())
		if err != nil {
			t.Fatalf("Compile(%+v) gave Source %+v, which does not compile: %v", p, c.Source, err)
		}
		if again.Mode != c.Mode || !slices.Equal(again.Source.Allow, c.Source.Allow) || !slices.Equal(again.Source.Deny, c.Source.Deny) ||
			!slices.Equal(again.AllowNets, c.AllowNets) || !slices.Equal(again.DenyNets, c.DenyNets) ||
			!slices.Equal(again.AllowDomains, c.AllowDomains) || !slices.Equal(again.DenyDomains, c.DenyDomains) ||
			!slices.Equal(again.Blocked, c.Blocked) || !slices.Equal(again.BlockedNets, c.BlockedNets) || !slices.Equal(again.Opened, c.Opened) {
			t.Fatalf("Compile(%+v) and Compile of its Source %+v differ", p, c.Source)
		}
	})
}
