package netpolicy

import (
	"net/netip"
	"slices"
)

// BlockedRange is one range of the always-blocked set and why it is there.
type BlockedRange struct {
	Prefix netip.Prefix
	// Why names the range for error messages and logs: "private range", "sandbox pool", ...
	Why string
}

// reserved is the part of the always-blocked set that does not depend on the deployment.
// The documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) are deliberately
// absent: tests use them as "the internet".
var reserved = []BlockedRange{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network range"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private range"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local, cloud metadata"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private range"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private range"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved range"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
}

// Blocked is the always-blocked set: addresses no sandbox may reach unless a catalog service
// names them. The zero Blocked holds the fixed reserved ranges (private, loopback, link-local,
// multicast, ...), so forgetting to build one never opens them; BlockedSet adds the deployment's
// own addresses. IPv6 is not listed: all IPv6 egress is dropped.
type Blocked struct {
	local []BlockedRange // the deployment's addresses; the reserved ranges are always added
}

// BlockedSet returns the always-blocked set of a deployment: the host's own addresses, the
// control-plane and edge addresses, the sandbox address pool (other sandboxes), and the fixed
// reserved ranges. Prefixes that are not IPv4 (or IPv4-mapped IPv6) are skipped, as is an
// invalid pool.
func BlockedSet(host, control []netip.Prefix, pool netip.Prefix) Blocked {
	var b Blocked
	add := func(p netip.Prefix, why string) {
		if p, ok := ipv4Prefix(p); ok {
			b.local = append(b.local, BlockedRange{p, why})
		}
	}
	for _, p := range host {
		add(p, "host address")
	}
	for _, p := range control {
		add(p, "control plane")
	}
	add(pool, "sandbox pool, other sandboxes")
	return b
}

// Ranges returns every range of the set: the deployment's own first, then the reserved ones.
func (b Blocked) Ranges() []BlockedRange {
	return append(slices.Clone(b.local), reserved...)
}

// Prefixes returns the fewest prefixes covering the set, in address order.
func (b Blocked) Prefixes() []netip.Prefix {
	var ps []netip.Prefix
	for _, r := range b.Ranges() {
		ps = append(ps, r.Prefix)
	}
	return mergePrefixes(ps)
}

// Contains reports whether ip is in the set, and the range it is in. IPv4-mapped IPv6 addresses
// are looked up as IPv4; other IPv6 addresses are reported as not in the set, since no rule can
// allow them anyway.
func (b Blocked) Contains(ip netip.Addr) (BlockedRange, bool) {
	ip = ip.Unmap()
	var best BlockedRange
	for _, r := range b.Ranges() {
		if r.Prefix.Contains(ip) && (!best.Prefix.IsValid() || r.Prefix.Bits() > best.Prefix.Bits()) {
			best = r
		}
	}
	return best, best.Prefix.IsValid()
}

// overlap returns the blocked range that best explains why p may not be opened: the smallest
// range containing p, or else the largest range inside p. ok is false when p touches no range.
func (b Blocked) overlap(p netip.Prefix) (BlockedRange, bool) {
	var inside, contains BlockedRange
	for _, r := range b.Ranges() {
		if !r.Prefix.Overlaps(p) {
			continue
		}
		if r.Prefix.Bits() <= p.Bits() {
			if !contains.Prefix.IsValid() || r.Prefix.Bits() > contains.Prefix.Bits() {
				contains = r
			}
		} else if !inside.Prefix.IsValid() || r.Prefix.Bits() < inside.Prefix.Bits() {
			inside = r
		}
	}
	if contains.Prefix.IsValid() {
		return contains, true
	}
	return inside, inside.Prefix.IsValid()
}

// ipv4Prefix returns p as a masked IPv4 prefix, unmapping an IPv4-mapped IPv6 one.
func ipv4Prefix(p netip.Prefix) (netip.Prefix, bool) {
	switch {
	case !p.IsValid():
		return netip.Prefix{}, false
	case p.Addr().Is4():
		return p.Masked(), true
	case p.Addr().Is4In6() && p.Bits() >= 96:
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked(), true
	}
	return netip.Prefix{}, false
}
