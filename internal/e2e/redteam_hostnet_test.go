package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamHostNetwork (issue 22 item 7): a networked sandbox, even one whose policy is open,
// reaches nothing on the host: not its gateway on the API's port or another, not the API's port
// on the host's primary address or on another sandbox's gateway, not the host's loopback. Each
// attempt at the host is counted in the sandbox's "host" counter and listed by `corral net log`
// like every other blocked attempt.
func TestRedTeamHostNetwork(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	_, apiPort, _ := net.SplitHostPort(p.Listen)
	other := p.create(corral.CreateRequest{Network: &corral.NetworkPolicy{Mode: corral.NetworkAllowlist}})
	otherGW := gatewayOf(t, other)
	hostIP := primaryIPv4(t)

	forRuntimes(t, func(t *testing.T, rt string) {
		req := corral.CreateRequest{Network: &corral.NetworkPolicy{Mode: corral.NetworkOpen}}
		if rt == "microvm" {
			req.Tier, req.Limits.MemoryBytes = "microvm", 256<<20
		} else {
			req.Runtime = rt
		}
		sb := p.create(req)
		gw := gatewayOf(t, sb)
		targets := []netip.AddrPort{
			netip.AddrPortFrom(gw, uint16(atoi(t, apiPort))),
			netip.AddrPortFrom(gw, 22),
			netip.AddrPortFrom(hostIP, uint16(atoi(t, apiPort))),
			netip.AddrPortFrom(otherGW, uint16(atoi(t, apiPort))),
		}
		var script strings.Builder
		for _, a := range targets {
			fmt.Fprintf(&script, "nc -w 2 %s %d </dev/null >/dev/null 2>&1 && echo connected %s\n", a.Addr(), a.Port(), a)
		}
		// 127.0.0.1 inside is the sandbox's own loopback: the host's is out of reach.
		fmt.Fprintf(&script, "nc -w 2 127.0.0.1 %s </dev/null >/dev/null 2>&1 && echo connected loopback\ntrue\n", apiPort)
		if out := p.sh(sb.ID, script.String()); out != "" {
			t.Errorf("attempts at the host got through:\n%s", out)
		}

		// Counted: every attempt's packets (a SYN and its retries) in the host counter.
		eventually(t, 10*time.Second, "the attempts at the host to be counted", func() bool {
			got, err := p.Client.GetSandbox(ctx, sb.ID)
			return err == nil && got.Egress != nil && got.Egress.Blocked["host"] >= uint64(len(targets))
		})
		// Listed: each destination in `corral net log`, with the reason host.
		eventually(t, 10*time.Second, "the attempts at the host in corral net log", func() bool {
			out, _, code := p.cli("", "net", "log", sb.ID, "-o", "json")
			var log []corral.BlockedAttempt
			if code != 0 || json.Unmarshal([]byte(out), &log) != nil {
				return false
			}
			seen := map[netip.AddrPort]bool{}
			for _, b := range log {
				if a, err := netip.ParseAddr(b.Dest); err == nil && b.Reason == "host" && b.Protocol == "tcp" {
					seen[netip.AddrPortFrom(a, uint16(b.Port))] = true
				}
			}
			for _, a := range targets {
				if !seen[a] {
					t.Logf("net log has no host attempt at %s yet: %s", a, out)
					return false
				}
			}
			return true
		})
		// The table view says so too.
		if out, _, _ := p.cli("", "net", "log", sb.ID); !strings.Contains(out, "host") || !strings.Contains(out, gw.String()) {
			t.Errorf("corral net log:\n%s\nwant host attempts at %s", out, gw)
		}
	})
	// The other sandbox made no attempt: none is counted against it.
	if got, err := p.Client.GetSandbox(ctx, other.ID); err != nil || got.Egress == nil || got.Egress.Blocked["host"] != 0 {
		t.Errorf("the sandbox whose gateway was tried: %+v, %v; want no host attempts counted", got.Egress, err)
	}
}

// gatewayOf returns a networked sandbox's gateway: the host side of its /30, just below its
// address.
func gatewayOf(t *testing.T, sb *corral.Sandbox) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(sb.NetworkAddress)
	if err != nil {
		t.Fatalf("sandbox %s network address %q: %v", sb.ID, sb.NetworkAddress, err)
	}
	return a.Prev()
}

// primaryIPv4 returns the host's address on its default route.
func primaryIPv4(t *testing.T) netip.Addr {
	t.Helper()
	c, err := net.Dial("udp4", "1.1.1.1:9") // no packet is sent: this only picks a route
	if err != nil {
		t.Skipf("no default IPv4 route: %v", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}
