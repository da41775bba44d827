//go:build !linux

package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// originalDst needs Linux connection tracking (SO_ORIGINAL_DST).
func originalDst(net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, fmt.Errorf("original destination: %w", errors.ErrUnsupported)
}
