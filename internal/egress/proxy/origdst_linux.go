package proxy

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// originalDst returns the destination c was sent to before an nftables redirect or DNAT rule
// rewrote it, from its connection tracking entry (getsockopt SO_ORIGINAL_DST). IPv4 only. For a
// connection that no rule rewrote, the kernel answers the address c was accepted on.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: %T has no socket", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	// The kernel fills a struct sockaddr_in; IPv6Mreq is the x/sys getter of a large enough
	// buffer (16 bytes of it are used).
	var sa *unix.IPv6Mreq
	var serr error
	if err := raw.Control(func(fd uintptr) {
		sa, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: getsockopt SO_ORIGINAL_DST: %w", serr)
	}
	return parseSockaddrIn(sa.Multiaddr[:])
}

// parseSockaddrIn decodes a struct sockaddr_in: family in host order, then port and address in
// network order.
func parseSockaddrIn(b []byte) (netip.AddrPort, error) {
	if family := binary.NativeEndian.Uint16(b[0:2]); family != unix.AF_INET {
		return netip.AddrPort{}, fmt.Errorf("original destination: address family %d, want AF_INET", family)
	}
	port := binary.BigEndian.Uint16(b[2:4])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port), nil
}
