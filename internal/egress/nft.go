package egress

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/egress/nflog"
)

// nftables layout, one table per Corral instance (tag), family inet:
//
//	table inet corral-<tag>
//	  set blocked   ipv4_addr, interval     the always-blocked ranges (netpolicy.BlockedSet)
//	  set dns-<n>   ipv4_addr, timeout      addresses the resolver answered for slot n's allowed names
//	  set dnsp-<n>  ipv4_addr . inet_proto . inet_service, timeout   the same, for names allowed
//	                                        on some ports or one protocol only
//	  chain forward (hook forward, filter, policy accept: the host's other traffic is not ours)
//	    iifname "<host veth n>" ip saddr <sandbox n> jump slot-<n>     one rule per slot
//	    iifname "cr<tag>-*" counter drop                             spoofed source, IPv6, unknown
//	    oifname "cr<tag>-*" ct state established,related accept      replies
//	    oifname "cr<tag>-*" counter drop                             nothing reaches a sandbox uninvited
//	  chain input (hook input, filter, policy accept)
//	    iifname "cr<tag>-*" tcp dport <proxy> ct status dnat accept  (connections prerouting redirected)
//	    per slot n, what arrives on its veth (iifname "<host veth n>"), tagged corral-slot:<n>:
//	      ip daddr <host side of its slot> udp/tcp dport 53 accept   its resolver
//	      tcp dport <proxy> ct status dnat accept                    its redirected connections
//	      log group <g> (rate-limited)           "host": its gateway's other ports (the API's
//	      counter drop                           included), the host's other addresses, other
//	                                             slots' gateways; read as slot n's by Counters
//	    iifname "cr<tag>-*" counter drop                             the host itself is unreachable
//	  chain slot-<n>   the sandbox's policy, evaluated for every packet it sends (no "established
//	                   accept" first: a new policy applies to open connections at once)
//	    udp/tcp dport 53 counter drop            "dns_bypass": DNS only through the edge's resolver
//	    <deny rules> counter drop                "denied"
//	    <rules the catalog opened inside the blocked set> accept
//	    ip daddr @blocked counter drop           "blocked_range"
//	    <allow rules> accept
//	    ip daddr @dns-<n> accept
//	    ip daddr . meta l4proto . th dport @dnsp-<n> accept   (names allowed on some ports only)
//	    (open mode) accept
//	    counter drop                             "no_rule"
//	table ip corral-<tag>-nat
//	  chain postrouting (hook postrouting, srcnat): ip saddr <pool> oifname != "cr<tag>-*" masquerade
//
// Rules carry their reason in UserData so their counters can be read back by reason.

// Reasons a packet is dropped; they are the keys of Counters.
const (
	ReasonDNSBypass = "dns_bypass"
	ReasonDenied    = "denied"
	ReasonBlocked   = "blocked_range"
	ReasonNoRule    = "no_rule"
	// ReasonHost is a packet to the host itself, on any of its addresses (the slot's input rules).
	ReasonHost = "host"
)

// NetRule is an address rule: a prefix, a protocol (0: TCP and UDP) and a port range (0-0:
// every port). Only TCP and UDP ever match: ICMP and other protocols are dropped.
type NetRule struct {
	Prefix         netip.Prefix
	Proto          uint8
	PortLo, PortHi uint16
}

// SlotPolicy is what a slot's chain enforces.
type SlotPolicy struct {
	// Open accepts what no rule decided (mode open); otherwise it is dropped (allowlist).
	Open bool
	// Deny is dropped first; Opened (operator-approved addresses inside the blocked set) is
	// accepted before the blocked set is dropped; Allow is accepted after.
	Deny, Opened, Allow []NetRule
}

func ifnameBytes(name string) []byte {
	b := make([]byte, 16)
	copy(b, name)
	return b
}

func matchIIF(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(name)},
	}
}

// matchIfPrefix matches an interface name starting with prefix (iifname "prefix*").
func matchIfPrefix(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(prefix)},
	}
}

func matchIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// matchAddr matches the IPv4 source (offset 12) or destination (16) against prefix.
func matchAddr(offset uint32, p netip.Prefix) []expr.Any {
	addr := p.Masked().Addr().As4()
	mask := net4Mask(p.Bits())
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask[:], Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
	}
}

func net4Mask(bits int) [4]byte {
	var m [4]byte
	binary.BigEndian.PutUint32(m[:], ^uint32(0)<<(32-bits))
	if bits == 0 {
		m = [4]byte{}
	}
	return m
}

func matchL4(proto uint8) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// matchDport matches the transport destination port (TCP and UDP both have it at offset 2).
func matchDport(lo, hi uint16) []expr.Any {
	load := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	if lo == hi {
		return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(lo)}}
	}
	return []expr.Any{load, &expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: be16(lo), ToData: be16(hi)}}
}

// lookupDaddrProtoPort matches "ip daddr . meta l4proto . th dport @set" (a concatenated set;
// each part in its own 32-bit register, as nft lays concatenations out).
func lookupDaddrProtoPort(set *nftables.Set) []expr.Any {
	const r0, r1, r2 = 8, 9, 10 // NFT_REG32_00.. 02
	return []expr.Any{
		&expr.Payload{DestRegister: r0, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r1},
		&expr.Payload{DestRegister: r2, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: r0, SetName: set.Name, SetID: set.ID},
	}
}

// dnsPortKey is the key of a (address, protocol, port) element of a slot's dnsp set.
func dnsPortKey(ip netip.Addr, proto uint8, port uint16) []byte {
	a := ip.As4()
	k := make([]byte, 12)
	copy(k, a[:])
	k[4] = proto
	binary.BigEndian.PutUint16(k[8:], port)
	return k
}

func lookupDaddr(set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

func matchCtEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
			Xor:  []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

// matchCtDNAT matches connections whose destination was rewritten (ct status dnat).
func matchCtDNAT() []expr.Any {
	const ipsDstNAT = 1 << 5 // IPS_DST_NAT
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, ipsDstNAT), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

// netRuleExprs returns the matches of r (without verdict), one list per protocol.
func netRuleExprs(r NetRule) [][]expr.Any {
	protos := []uint8{r.Proto}
	if r.Proto == 0 {
		protos = []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP}
	}
	var out [][]expr.Any
	for _, p := range protos {
		m := cat(matchAddr(16, r.Prefix), matchL4(p))
		if r.PortLo != 0 || r.PortHi != 0 {
			m = cat(m, matchDport(r.PortLo, r.PortHi))
		}
		out = append(out, m)
	}
	return out
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// reasonTag marks a counting rule with its reason, for reading the counters back.
func reasonTag(reason string) []byte { return []byte("corral:" + reason) }

func reasonOf(r *nftables.Rule) string {
	s, ok := strings.CutPrefix(string(r.UserData), "corral:")
	if !ok {
		return ""
	}
	return s
}

// LogPrefix is the NFLOG prefix of slot n's drops for reason (see ParseLogPrefix).
func LogPrefix(slot int, reason string) string { return "corral:" + strconv.Itoa(slot) + ":" + reason }

// ParseLogPrefix undoes LogPrefix.
func ParseLogPrefix(p string) (slot int, reason string, ok bool) {
	rest, ok := strings.CutPrefix(p, "corral:")
	if !ok {
		return 0, "", false
	}
	n, reason, ok := strings.Cut(rest, ":")
	if !ok {
		return 0, "", false
	}
	slot, err := strconv.Atoi(n)
	return slot, reason, err == nil
}

// slotRules returns the rules of slot n's chain for p. With logGroup set, each drop is preceded
// by a rule with the same match that logs the packet (rate-limited) to that NFLOG group, so the
// edge can attribute blocked attempts to destination, port and protocol.
func slotRules(t *nftables.Table, c *nftables.Chain, dns, dnsp *nftables.Set, blocked *nftables.Set, p SlotPolicy, n int, logGroup uint16) []*nftables.Rule {
	var rules []*nftables.Rule
	add := func(ud []byte, e ...expr.Any) {
		rules = append(rules, &nftables.Rule{Table: t, Chain: c, Exprs: e, UserData: ud})
	}
	drop := func(reason string, m []expr.Any) {
		if logGroup != 0 {
			add(nil, cat(m, nflog.LogExprs(logGroup, LogPrefix(n, reason)))...)
		}
		add(reasonTag(reason), cat(m, []expr.Any{&expr.Counter{}, verdict(expr.VerdictDrop)})...)
	}
	for _, proto := range []uint8{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		drop(ReasonDNSBypass, cat(matchL4(proto), matchDport(53, 53)))
	}
	for _, r := range p.Deny {
		if r.Proto == 0 && r.PortLo == 0 && r.PortHi == 0 {
			drop(ReasonDenied, matchAddr(16, r.Prefix)) // every protocol, ICMP included
			continue
		}
		for _, m := range netRuleExprs(r) {
			drop(ReasonDenied, m)
		}
	}
	for _, r := range p.Opened {
		for _, m := range netRuleExprs(r) {
			add(nil, append(m, verdict(expr.VerdictAccept))...)
		}
	}
	drop(ReasonBlocked, lookupDaddr(blocked))
	for _, r := range p.Allow {
		for _, m := range netRuleExprs(r) {
			add(nil, append(m, verdict(expr.VerdictAccept))...)
		}
	}
	add(nil, append(lookupDaddr(dns), verdict(expr.VerdictAccept))...)
	add(nil, append(lookupDaddrProtoPort(dnsp), verdict(expr.VerdictAccept))...)
	if p.Open {
		add(nil, verdict(expr.VerdictAccept))
	}
	drop(ReasonNoRule, nil)
	return rules
}

// hostRules returns slot s's rules in the input chain, all matching what arrives on its veth
// and tagged with its slot (slotTag): its resolver and (proxyPort not 0) its redirected proxy
// connections are accepted, anything else it sends to the host is dropped and counted (the
// one counter, read as ReasonHost), logged first (rate-limited, as the slot chain's drops) to
// logGroup when set.
func hostRules(t *nftables.Table, c *nftables.Chain, s *Slot, proxyPort, logGroup uint16) []*nftables.Rule {
	var rules []*nftables.Rule
	add := func(e ...expr.Any) {
		rules = append(rules, &nftables.Rule{Table: t, Chain: c, Exprs: cat(matchIIF(s.HostIf), e), UserData: []byte(slotTag(s.Index))})
	}
	for _, proto := range []uint8{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		add(cat(matchIPv4(), matchAddr(16, netip.PrefixFrom(s.HostAddr, 32)), matchL4(proto), matchDport(53, 53),
			[]expr.Any{verdict(expr.VerdictAccept)})...)
	}
	if proxyPort != 0 {
		add(cat(matchL4(unix.IPPROTO_TCP), matchDport(proxyPort, proxyPort), matchCtDNAT(), []expr.Any{verdict(expr.VerdictAccept)})...)
	}
	if logGroup != 0 {
		add(nflog.LogExprs(logGroup, LogPrefix(s.Index, ReasonHost))...)
	}
	add(&expr.Counter{}, verdict(expr.VerdictDrop))
	return rules
}

// prefixElements turns prefixes into interval set elements: overlapping and adjacent ranges
// merged (the kernel refuses overlapping intervals), each range as its first address and the
// address after its last one, marked as an interval end, with the gap before the first range
// closed explicitly as nft itself does.
func prefixElements(ps []netip.Prefix) []nftables.SetElement {
	type span struct{ lo, hi uint64 } // hi exclusive, so 2^32 fits
	var spans []span
	for _, p := range ps {
		if !p.Addr().Is4() {
			continue
		}
		a := p.Masked().Addr().As4()
		lo := uint64(binary.BigEndian.Uint32(a[:]))
		spans = append(spans, span{lo, lo + 1<<(32-p.Bits())})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 && s.lo <= merged[n-1].hi {
			merged[n-1].hi = max(merged[n-1].hi, s.hi)
			continue
		}
		merged = append(merged, s)
	}
	key := func(v uint64) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }
	var els []nftables.SetElement
	if len(merged) > 0 && merged[0].lo > 0 {
		els = append(els, nftables.SetElement{Key: key(0), IntervalEnd: true})
	}
	for _, s := range merged {
		els = append(els, nftables.SetElement{Key: key(s.lo)})
		if s.hi < 1<<32 {
			els = append(els, nftables.SetElement{Key: key(s.hi), IntervalEnd: true})
		}
	}
	return els
}

// ttlClamp bounds a DNS-learned address's lifetime in a set.
func ttlClamp(d time.Duration) time.Duration {
	return min(max(d, 30*time.Second), time.Hour)
}

func errNft(what string, err error) error { return fmt.Errorf("nftables: %s: %w", what, err) }
