package netpolicy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// DefaultMaxRules is the number of allow and deny rules together that a policy may have when
// Env.MaxRules is not set.
const DefaultMaxRules = 256

// The reasons AllowsAddr gives for refusing an address.
const (
	ReasonNoRule  = "no_rule"       // no rule allows it (default deny)
	ReasonDenied  = "denied"        // a deny rule matches
	ReasonBlocked = "blocked_range" // the always-blocked set holds it (or it is IPv6)
)

// Env is what Compile needs from the deployment.
type Env struct {
	// Blocked is the always-blocked set (see BlockedSet). Its zero value still blocks the reserved
	// ranges.
	Blocked Blocked
	// MaxRules caps the allow and deny rules of one policy together; 0 or less means
	// DefaultMaxRules. Catalog services count as one rule each, whatever they expand to.
	MaxRules int
}

// NetRule is an address rule in compiled form: traffic to Prefix on a port in Ports over one of
// Proto's protocols.
type NetRule struct {
	Prefix netip.Prefix
	Ports  PortRange
	Proto  Proto
	// Rule is the policy rule this came from, normalised ("203.0.113.0/24:443", "gateway"); empty
	// in Compiled.BlockedNets.
	Rule string
	// Service is the catalog service this came from; empty for an address rule of the policy.
	Service string
}

// Matches reports whether traffic to ip:port over proto falls under r.
func (r NetRule) Matches(ip netip.Addr, port uint16, proto Proto) bool {
	return r.Prefix.Contains(ip) && r.Ports.Contains(port) && r.Proto.Has(proto)
}

// covers reports whether r matches all traffic that q matches.
func (r NetRule) covers(q NetRule) bool {
	return r.Prefix.Bits() <= q.Prefix.Bits() && r.Prefix.Contains(q.Prefix.Addr()) &&
		r.Ports.covers(q.Ports) && r.Proto.Has(q.Proto)
}

// DomainRule is a domain rule in compiled form: names matching Pattern, and the addresses they
// resolve to on a port in Ports over one of Proto's protocols.
type DomainRule struct {
	// Pattern is "pypi.org" (that name only) or "*.example.com" (any name below example.com).
	Pattern string
	Ports   PortRange
	Proto   Proto
	// Rule is the policy rule this came from, normalised ("pypi.org:443", "pypi").
	Rule string
	// Service is the catalog service this came from; empty for a domain rule of the policy.
	Service string
}

// Matches reports whether the query name (lowercase, without a trailing dot) falls under r.
func (r DomainRule) Matches(name string) bool {
	if base, ok := strings.CutPrefix(r.Pattern, "*."); ok {
		return len(name) > len(base)+1 && strings.HasSuffix(name, base) && name[len(name)-len(base)-1] == '.'
	}
	return name == r.Pattern
}

// String returns the pattern with its port and protocol in rule syntax, and the service it came
// from: "*.pythonhosted.org:443 (service pypi)".
func (r DomainRule) String() string {
	s := Rule{Domain: r.Pattern, Ports: r.Ports, Proto: r.Proto}.String()
	if r.Service != "" {
		s += " (service " + r.Service + ")"
	}
	return s
}

// Compiled is a policy in the form enforcement needs. Enforcement decides a packet to an IPv4
// address, port and protocol in this order, the first match winning:
//
//  1. Blocked or BlockedNets: drop.
//  2. DenyNets, or an address a name matching DenyDomains resolved to (on the rule's ports): drop.
//  3. AllowNets, or an address a name matching AllowDomains resolved to (on the rule's ports):
//     accept.
//  4. Mode "open": accept. Otherwise drop.
//
// All IPv6 egress is dropped. The DNS resolver answers only names AllowsName allows, and should
// not hand out addresses in the always-blocked set for names that are not a catalog service's.
//
// A Compiled is made by Compile and read-only afterwards; its methods are safe for concurrent
// use. Its slices are sorted and free of duplicates and of rules another rule covers.
type Compiled struct {
	// Mode is "none", "allowlist" or "open".
	Mode string
	// AllowNets are the address rules of the policy and the addresses of the catalog services
	// it allows.
	AllowNets []NetRule
	// DenyNets are the address rules of the deny list, catalog services' addresses included.
	DenyNets []NetRule
	// AllowDomains are the domain rules of the policy and the domains of the catalog services it
	// allows.
	AllowDomains []DomainRule
	// DenyDomains are the domain rules of the deny list, catalog services' domains included.
	DenyDomains []DomainRule
	// Blocked is the always-blocked set minus every address an allowed catalog service opened,
	// as the fewest prefixes. Enforcement drops these before anything else.
	Blocked []netip.Prefix
	// BlockedNets are the addresses of the always-blocked set that an allowed catalog service
	// opened only for some ports or protocols, with the ports and protocols it did not open.
	// Enforcement drops these before anything else too, so that mode "open" does not reach them.
	BlockedNets []NetRule
	// Opened are the AllowNets that lie, wholly or partly, in the always-blocked set: the private
	// addresses of allowed catalog services. It serves enforcement that keeps the whole
	// always-blocked set in one place for every sandbox instead of Blocked and BlockedNets; the
	// order deny rules (drop), Opened (accept), the whole set (drop), AllowNets (accept), mode
	// "open" (accept), drop decides the same as the order above.
	Opened []NetRule
	// Source is the policy with its mode made explicit and its rules normalised and
	// de-duplicated, for the API to show.
	Source Policy

	allowNames, denyNames nameIndex
}

// Compile checks a policy against the catalog and the deployment and compiles it. Mode defaults
// as Policy.Mode says; mode "none" takes no rules. Service rules expand to the service's
// domains and addresses (narrowed to the rule's port and protocol, if it names them); address
// rules in the allow list may not touch the always-blocked set, which only catalog services may
// open. Every error wraps errdefs.ErrInvalid, names the field (network.allow[3]) and quotes the
// rule.
func Compile(p Policy, cat *Catalog, env Env) (*Compiled, error) {
	mode := p.Mode
	if mode == "" {
		mode = ModeNone
		if len(p.Allow) > 0 {
			mode = ModeAllowlist
		}
	}
	switch mode {
	case ModeNone, ModeAllowlist, ModeOpen:
	default:
		return nil, errdefs.Invalid("network.mode", "%q: want %q, %q or %q", p.Mode,
			ModeNone, ModeAllowlist, ModeOpen)
	}
	limit := env.MaxRules
	if limit <= 0 {
		limit = DefaultMaxRules
	}
	if n := len(p.Allow) + len(p.Deny); n > limit {
		return nil, errdefs.Invalid("network", "%d allow and deny rules; the limit is %d", n, limit)
	}
	if mode == ModeNone {
		if len(p.Allow) > 0 {
			return nil, errdefs.Invalid("network.allow", "mode %q allows no egress and takes no rules; use mode %q", mode, ModeAllowlist)
		}
		if len(p.Deny) > 0 {
			return nil, errdefs.Invalid("network.deny", "mode %q allows no egress, so deny rules have no effect", mode)
		}
	}

	allow, err := expand(p.Allow, "network.allow", true, cat, env.Blocked)
	if err != nil {
		return nil, err
	}
	deny, err := expand(p.Deny, "network.deny", false, cat, env.Blocked)
	if err != nil {
		return nil, err
	}
	c := &Compiled{
		Mode:         mode,
		AllowNets:    normalizeNets(allow.nets),
		DenyNets:     normalizeNets(deny.nets),
		AllowDomains: normalizeDomains(allow.domains),
		DenyDomains:  normalizeDomains(deny.domains),
		Source:       Policy{Mode: mode, Allow: allow.source, Deny: deny.source},
	}
	full := env.Blocked.Prefixes()
	c.Blocked, c.BlockedNets = carve(full, allow.opened)
	for _, r := range normalizeNets(allow.opened) {
		if slices.ContainsFunc(full, r.Prefix.Overlaps) {
			c.Opened = append(c.Opened, r)
		}
	}
	c.allowNames = newNameIndex(c.AllowDomains)
	c.denyNames = newNameIndex(c.DenyDomains)
	return c, nil
}

// expansion is one list of rules (allow or deny) turned into compiled rules.
type expansion struct {
	source  []string // the rules, normalised, first occurrence only
	nets    []NetRule
	domains []DomainRule
	opened  []NetRule // catalog services' addresses (allow list only): may open blocked ranges
}

func expand(rules []string, field string, allow bool, cat *Catalog, blocked Blocked) (expansion, error) {
	var x expansion
	for i, s := range rules {
		f := fmt.Sprintf("%s[%d]", field, i)
		r, err := parseRule(s)
		if err != nil {
			return x, errdefs.Invalid(f, "%q: %v", s, err)
		}
		canon := r.String()
		if slices.Contains(x.source, canon) {
			continue
		}
		x.source = append(x.source, canon)
		switch r.Kind() {
		case KindAddress:
			if allow {
				if br, ok := blocked.overlap(r.Prefix); ok {
					hint := ""
					if r.Prefix.Bits() == 0 {
						hint = `; for the whole internet, use mode "open"`
					}
					return x, errdefs.Invalid(f, "%q would open %s (%s): only the operator's service catalog may allow it%s",
						s, br.Prefix, br.Why, hint)
				}
			}
			x.nets = append(x.nets, NetRule{Prefix: r.Prefix, Ports: r.Ports, Proto: r.Proto, Rule: canon})
		case KindDomain:
			x.domains = append(x.domains, DomainRule{Pattern: r.Domain, Ports: r.Ports, Proto: r.Proto, Rule: canon})
		case KindService:
			if err := x.addService(r, canon, allow, cat); err != nil {
				return x, errdefs.Invalid(f, "%q: %v", s, err)
			}
		}
	}
	return x, nil
}

// addService adds a catalog service's domains and addresses, narrowed to r's ports and protocols.
func (x *expansion) addService(r Rule, canon string, allow bool, cat *Catalog) error {
	svc := cat.lookup(r.Service)
	if svc == nil {
		return fmt.Errorf("no service %q in the operator's catalog%s", r.Service, cat.hint())
	}
	n := 0
	for _, d := range svc.domains {
		ports, ok := d.Ports.intersect(r.Ports)
		if proto := d.Proto & r.Proto; ok && proto != 0 {
			x.domains = append(x.domains, DomainRule{Pattern: d.Domain, Ports: ports, Proto: proto, Rule: canon, Service: r.Service})
			n++
		}
	}
	for _, a := range svc.addrs {
		ports, ok := a.Ports.intersect(r.Ports)
		if proto := a.Proto & r.Proto; ok && proto != 0 {
			nr := NetRule{Prefix: a.Prefix, Ports: ports, Proto: proto, Rule: canon, Service: r.Service}
			x.nets = append(x.nets, nr)
			if allow {
				x.opened = append(x.opened, nr)
			}
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("service %q has no domain or address on the port and protocol the rule names", r.Service)
	}
	return nil
}

// hint lists the catalog's services for an unknown-service error.
func (c *Catalog) hint() string {
	names := c.Names()
	switch {
	case len(names) == 0:
		return " (the catalog is empty)"
	case len(names) > 10:
		names = append(names[:10], "...")
	}
	return " (it has " + strings.Join(names, ", ") + ")"
}

// normalizeNets sorts rules and drops those another rule covers (of equal rules, the first).
func normalizeNets(in []NetRule) []NetRule {
	rules := slices.Clone(in)
	slices.SortStableFunc(rules, compareNets)
	var out []NetRule
	for i, r := range rules {
		covered := false
		for j, o := range rules {
			if j != i && o.covers(r) && (j < i || !r.covers(o)) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, r)
		}
	}
	return out
}

func compareNets(a, b NetRule) int {
	return cmp.Or(a.Prefix.Compare(b.Prefix), cmp.Compare(a.Ports.First, b.Ports.First),
		cmp.Compare(a.Ports.Last, b.Ports.Last), cmp.Compare(a.Proto, b.Proto))
}

// normalizeDomains sorts rules and drops those another rule with the same pattern covers (of
// equal rules, the first).
func normalizeDomains(in []DomainRule) []DomainRule {
	rules := slices.Clone(in)
	slices.SortStableFunc(rules, func(a, b DomainRule) int {
		return cmp.Or(strings.Compare(a.Pattern, b.Pattern), cmp.Compare(a.Ports.First, b.Ports.First),
			cmp.Compare(a.Ports.Last, b.Ports.Last), cmp.Compare(a.Proto, b.Proto))
	})
	covers := func(a, b DomainRule) bool {
		return a.Pattern == b.Pattern && a.Ports.covers(b.Ports) && a.Proto.Has(b.Proto)
	}
	var out []DomainRule
	for i, r := range rules {
		covered := false
		for j, o := range rules {
			if j != i && covers(o, r) && (j < i || !covers(r, o)) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, r)
		}
	}
	return out
}

// carve takes the addresses that allowed catalog services open out of the blocked set. It returns
// the blocked prefixes no service opened at all, and, for addresses opened for some ports or
// protocols only, the ports and protocols that stay blocked.
func carve(blocked []netip.Prefix, opened []NetRule) ([]netip.Prefix, []NetRule) {
	bs := mergePrefixes(blocked)
	if len(opened) == 0 {
		return bs, nil
	}
	var bspans []span
	for _, p := range bs {
		bspans = append(bspans, spanOf(p))
	}
	// Cut the address space at every boundary of a blocked range or an opened rule: within
	// each piece, being blocked and the set of rules that apply are the same for every address.
	var cuts []uint64
	for _, s := range bspans {
		cuts = append(cuts, uint64(s.lo), uint64(s.hi)+1)
	}
	for _, o := range opened {
		s := spanOf(o.Prefix)
		cuts = append(cuts, uint64(s.lo), uint64(s.hi)+1)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)

	type piece struct {
		span
		tcp, udp []PortRange // the ports still blocked
	}
	var rest []span
	var pieces []piece
	for k := 0; k+1 < len(cuts); k++ {
		s := span{uint32(cuts[k]), uint32(cuts[k+1] - 1)}
		if !slices.ContainsFunc(bspans, func(b span) bool { return b.lo <= s.lo && s.lo <= b.hi }) {
			continue
		}
		var tcp, udp []PortRange
		covered := false
		for _, o := range opened {
			if !o.Prefix.Contains(addrOf(s.lo)) {
				continue
			}
			covered = true
			if o.Proto.Has(ProtoTCP) {
				tcp = append(tcp, o.Ports)
			}
			if o.Proto.Has(ProtoUDP) {
				udp = append(udp, o.Ports)
			}
		}
		if !covered {
			rest = append(rest, s)
			continue
		}
		p := piece{s, complementPorts(tcp), complementPorts(udp)}
		if len(p.tcp) == 0 && len(p.udp) == 0 {
			continue
		}
		if n := len(pieces); n > 0 && uint64(pieces[n-1].hi)+1 == uint64(s.lo) &&
			slices.Equal(pieces[n-1].tcp, p.tcp) && slices.Equal(pieces[n-1].udp, p.udp) {
			pieces[n-1].hi = s.hi
			continue
		}
		pieces = append(pieces, p)
	}
	var nets []NetRule
	for _, p := range pieces {
		for _, pfx := range prefixesOf([]span{p.span}) {
			if slices.Equal(p.tcp, p.udp) {
				for _, r := range p.tcp {
					nets = append(nets, NetRule{Prefix: pfx, Ports: r, Proto: ProtoBoth})
				}
				continue
			}
			for _, r := range p.tcp {
				nets = append(nets, NetRule{Prefix: pfx, Ports: r, Proto: ProtoTCP})
			}
			for _, r := range p.udp {
				nets = append(nets, NetRule{Prefix: pfx, Ports: r, Proto: ProtoUDP})
			}
		}
	}
	return prefixesOf(rest), nets
}

// AllowsAddr reports whether the policy lets traffic out to ip:port over proto ("tcp" or "udp"),
// judged by address rules only: addresses that allowed names resolve to are the resolver's to
// add. It follows the order Compiled documents. When allowed, reason is the policy rule that
// allows it, or "open"; when refused, it is ReasonBlocked, ReasonDenied or ReasonNoRule.
// IPv4-mapped IPv6 addresses are judged as IPv4; other IPv6 addresses are blocked.
func (c *Compiled) AllowsAddr(ip netip.Addr, port uint16, proto string) (allowed bool, reason string) {
	ip = ip.Unmap()
	if !ip.Is4() {
		return false, ReasonBlocked
	}
	for _, p := range c.Blocked {
		if p.Contains(ip) {
			return false, ReasonBlocked
		}
	}
	pr, ok := ParseProto(proto)
	if !ok {
		return false, ReasonNoRule
	}
	for _, r := range c.BlockedNets {
		if r.Matches(ip, port, pr) {
			return false, ReasonBlocked
		}
	}
	for _, r := range c.DenyNets {
		if r.Matches(ip, port, pr) {
			return false, ReasonDenied
		}
	}
	for _, r := range c.AllowNets {
		if r.Matches(ip, port, pr) {
			return true, r.Rule
		}
	}
	if c.Mode == ModeOpen {
		return true, ModeOpen
	}
	return false, ReasonNoRule
}

// AllowsName reports whether the resolver may answer a query for name. Case and one trailing dot
// are ignored. A deny rule wins over an allow rule, but only a deny rule for all ports and both
// protocols refuses the name itself; narrower ones are enforced on the resolved addresses (see
// NameRules). rule is the rule that decided ("*.pythonhosted.org (service pypi)", or "open"), or
// ReasonNoRule when nothing allows the name.
func (c *Compiled) AllowsName(name string) (allowed bool, rule string) {
	if c.Mode == ModeNone {
		return false, ReasonNoRule
	}
	allow, deny := c.NameRules(name)
	for _, d := range deny {
		if d.Ports == AllPorts && d.Proto == ProtoBoth {
			return false, d.String()
		}
	}
	if len(allow) > 0 {
		return true, allow[0].String()
	}
	if c.Mode == ModeOpen {
		return true, ModeOpen
	}
	return false, ReasonNoRule
}

// NameRules returns the allow and deny domain rules that match name (case and one trailing dot
// ignored), so the resolver can open the addresses it hands out on the rules' ports only. A name
// that is not a well-formed domain (empty labels, over 253 characters) matches nothing.
func (c *Compiled) NameRules(name string) (allow, deny []DomainRule) {
	n, ok := queryName(name)
	if !ok {
		return nil, nil
	}
	return c.allowNames.match(n, c.AllowDomains), c.denyNames.match(n, c.DenyDomains)
}

// queryName lowercases a query name and drops one trailing dot; ok is false for a name with an
// empty label or over 253 characters.
func queryName(name string) (string, bool) {
	n := lowerASCII(strings.TrimSuffix(name, "."))
	if n == "" || len(n) > 253 || n[0] == '.' || n[len(n)-1] == '.' || strings.Contains(n, "..") {
		return "", false
	}
	return n, true
}

// nameIndex finds the domain rules matching a name in one map lookup per label.
type nameIndex struct {
	exact map[string][]int // pattern -> rule indexes
	wild  map[string][]int // "example.com" for "*.example.com" -> rule indexes
}

func newNameIndex(rules []DomainRule) nameIndex {
	x := nameIndex{exact: map[string][]int{}, wild: map[string][]int{}}
	for i, r := range rules {
		if base, ok := strings.CutPrefix(r.Pattern, "*."); ok {
			x.wild[base] = append(x.wild[base], i)
		} else {
			x.exact[r.Pattern] = append(x.exact[r.Pattern], i)
		}
	}
	return x
}

func (x nameIndex) match(name string, rules []DomainRule) []DomainRule {
	var out []DomainRule
	for _, i := range x.exact[name] {
		out = append(out, rules[i])
	}
	// Every proper suffix that starts a label: "b.example.com" and "example.com" for
	// "a.b.example.com" (the name itself is not its own subdomain).
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			for _, j := range x.wild[name[i+1:]] {
				out = append(out, rules[j])
			}
		}
	}
	return out
}

// NetSet is the prefixes that share a port range and protocols: one set for nftables.
type NetSet struct {
	Proto    Proto
	Ports    PortRange
	Prefixes []netip.Prefix // the fewest prefixes, in address order
}

// GroupNets groups rules by port range and protocols, merging each group's prefixes, so
// enforcement can load one prefix set per group. Groups are ordered by port range, then
// protocols.
func GroupNets(rules []NetRule) []NetSet {
	type key struct {
		ports PortRange
		proto Proto
	}
	groups := map[key][]netip.Prefix{}
	for _, r := range rules {
		k := key{r.Ports, r.Proto}
		groups[k] = append(groups[k], r.Prefix)
	}
	out := make([]NetSet, 0, len(groups))
	for k, ps := range groups {
		out = append(out, NetSet{Proto: k.proto, Ports: k.ports, Prefixes: mergePrefixes(ps)})
	}
	slices.SortFunc(out, func(a, b NetSet) int {
		return cmp.Or(cmp.Compare(a.Ports.First, b.Ports.First), cmp.Compare(a.Ports.Last, b.Ports.Last),
			cmp.Compare(a.Proto, b.Proto))
	})
	return out
}
