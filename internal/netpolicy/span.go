package netpolicy

import (
	"cmp"
	"encoding/binary"
	"math/bits"
	"net/netip"
	"slices"
)

// span is an inclusive range of IPv4 addresses as integers. Set arithmetic on prefixes (merging,
// subtracting the addresses a catalog service opens) is done on spans and turned back into
// prefixes at the end.
type span struct{ lo, hi uint32 }

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func addrOf(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// spanOf returns the addresses of an IPv4 prefix.
func spanOf(p netip.Prefix) span {
	lo := u32(p.Masked().Addr())
	size := uint64(1) << (32 - p.Bits())
	return span{lo, uint32(uint64(lo) + size - 1)}
}

// mergeSpans sorts spans and joins those that overlap or touch.
func mergeSpans(in []span) []span {
	s := slices.Clone(in)
	slices.SortFunc(s, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	var out []span
	for _, x := range s {
		if n := len(out); n > 0 && uint64(x.lo) <= uint64(out[n-1].hi)+1 {
			out[n-1].hi = max(out[n-1].hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// prefixesOf returns the fewest prefixes that cover exactly the spans, in address order.
func prefixesOf(spans []span) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range mergeSpans(spans) {
		lo, hi := uint64(s.lo), uint64(s.hi)
		for lo <= hi {
			// The largest aligned block that starts at lo and ends by hi.
			size := uint64(1) << 32
			if lo != 0 {
				size = uint64(1) << bits.TrailingZeros64(lo)
			}
			for lo+size-1 > hi {
				size >>= 1
			}
			out = append(out, netip.PrefixFrom(addrOf(uint32(lo)), 32-bits.TrailingZeros64(size)))
			lo += size
		}
	}
	return out
}

// mergePrefixes returns the fewest prefixes that cover the same addresses as ps.
func mergePrefixes(ps []netip.Prefix) []netip.Prefix {
	spans := make([]span, 0, len(ps))
	for _, p := range ps {
		spans = append(spans, spanOf(p))
	}
	return prefixesOf(spans)
}

// unionPorts sorts port ranges and joins those that overlap or touch.
func unionPorts(in []PortRange) []PortRange {
	s := slices.Clone(in)
	slices.SortFunc(s, func(a, b PortRange) int { return cmp.Compare(a.First, b.First) })
	var out []PortRange
	for _, r := range s {
		if n := len(out); n > 0 && uint32(r.First) <= uint32(out[n-1].Last)+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// complementPorts returns the ports 0-65535 not in any of the ranges.
func complementPorts(in []PortRange) []PortRange {
	var out []PortRange
	next := uint32(0) // the lowest port not yet covered or emitted
	for _, r := range unionPorts(in) {
		if uint32(r.First) > next {
			out = append(out, PortRange{uint16(next), r.First - 1})
		}
		next = uint32(r.Last) + 1
	}
	if next <= 65535 {
		out = append(out, PortRange{uint16(next), 65535})
	}
	return out
}
