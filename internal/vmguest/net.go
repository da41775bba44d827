package vmguest

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// setupNetwork brings up lo and, when n is set, the interface with n's MAC (waiting up to timeout
// for virtio_net to probe it): its MTU, its address, up, and a default route via n.Gateway.
func setupNetwork(n *Net, timeout time.Duration) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("network: lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("network: bring lo up: %w", err)
	}
	if n == nil {
		return nil
	}
	mac, err := net.ParseMAC(n.MAC)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	link, err := waitLink(mac, timeout)
	if err != nil {
		return err
	}
	name := link.Attrs().Name
	if n.MTU > 0 {
		if err := netlink.LinkSetMTU(link, n.MTU); err != nil {
			return fmt.Errorf("network: set the MTU of %s: %w", name, err)
		}
	}
	addr, err := netlink.ParseAddr(n.Address)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if err := netlink.AddrReplace(link, addr); err != nil { // Replace: a restarted agent (vm tier) runs this again
		return fmt.Errorf("network: add %s to %s: %w", n.Address, name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("network: bring %s up: %w", name, err)
	}
	gw := net.ParseIP(n.Gateway)
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("network: default route via %s: %w", n.Gateway, err)
	}
	return nil
}

// waitLink waits for the interface with hardware address mac.
func waitLink(mac net.HardwareAddr, timeout time.Duration) (netlink.Link, error) {
	deadline := time.Now().Add(timeout)
	for {
		links, err := netlink.LinkList()
		if err != nil {
			return nil, fmt.Errorf("network: list interfaces: %w", err)
		}
		var seen []string
		for _, l := range links {
			if a := l.Attrs(); a != nil {
				if strings.EqualFold(a.HardwareAddr.String(), mac.String()) {
					return l, nil
				}
				seen = append(seen, a.Name+"="+a.HardwareAddr.String())
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("network: no interface with MAC %s after %v (have %s)", mac, timeout, strings.Join(seen, " "))
		}
		time.Sleep(pollInterval)
	}
}
