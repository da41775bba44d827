package egress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/corral-dev/corral/internal/egress/netlab"
	"golang.org/x/sys/unix"
)

// dialFrom connects from inside the slot's namespace; it returns the error, nil when connected.
func dialFrom(t *testing.T, s *Slot, addr string) (net.Conn, error) {
	var c net.Conn
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		ns, nerr := netns.GetFromPath(s.Netns)
		if nerr != nil {
			err = nerr
			return
		}
		defer ns.Close()
		if err = netns.Set(ns); err != nil {
			return
		}
		c, err = net.DialTimeout("tcp", addr, 400*time.Millisecond)
	}()
	<-done
	return c, err
}

func newTestManager(t *testing.T) (*Manager, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veths and nftables tables")
	}
	b := make([]byte, 2)
	rand.Read(b)
	tag := hex.EncodeToString(b)
	pool := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 201+int(b[0])%40, b[1]))
	m, err := New(context.Background(), Config{Pool: pool, Tag: tag, Ready: 1, Blocked: []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("127.0.0.0/8"),
	}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if tables, _ := m.nft.ListTables(); len(tables) > 0 {
			for _, tb := range tables {
				if strings.HasPrefix(tb.Name, m.tableName()) {
					t.Errorf("table left: %s", tb.Name)
				}
			}
		}
		links, _ := netlink.LinkList()
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, m.ifPrefix()) {
				t.Errorf("veth left: %s", l.Attrs().Name)
			}
		}
		if ents, _ := os.ReadDir("/run/netns"); len(ents) > 0 {
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), "corral-"+tag+"-") {
					t.Errorf("namespace left: %s", e.Name())
				}
			}
		}
	})
	return m, tag
}

func TestPolicyEnforced(t *testing.T) {
	m, tag := newTestManager(t)
	in, err := netlab.Start(tag, netip.MustParsePrefix("203.0.113.0/24"), []netlab.Host{{Name: "a.test", Addr: "203.0.113.1"}, {Name: "b.test", Addr: "203.0.113.2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	ctx := context.Background()
	s, err := m.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(s)
	// No policy yet: nothing gets out.
	if c, err := dialFrom(t, s, "203.0.113.1:80"); err == nil {
		c.Close()
		t.Fatal("connected before any policy was applied")
	}
	allow := SlotPolicy{Allow: []NetRule{{Prefix: netip.MustParsePrefix("203.0.113.1/32"), Proto: unix.IPPROTO_TCP, PortLo: 80, PortHi: 80}}}
	if err := m.Apply(s, allow, false); err != nil {
		t.Fatal(err)
	}
	// The first connection also resolves the gateway's MAC (after the refused attempt above, the
	// neighbour entry may be failed and probing): on a loaded host that can outlast one dial.
	c, err := dialFrom(t, s, "203.0.113.1:80")
	for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); {
		c, err = dialFrom(t, s, "203.0.113.1:80")
	}
	if err != nil {
		t.Fatalf("allowed destination: %v", err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	b, _ := io.ReadAll(c)
	c.Close()
	if !strings.Contains(string(b), "served by 203.0.113.1") {
		t.Fatalf("allowed destination answered %q", b)
	}
	for _, addr := range []string{"203.0.113.2:80", s.HostAddr.String() + ":22", "169.254.169.254:80", "10.1.2.3:80"} {
		if c, err := dialFrom(t, s, addr); err == nil {
			c.Close()
			t.Errorf("connected to %s, which the policy does not allow", addr)
		}
	}
	cnt, err := m.Counters(s)
	if err != nil {
		t.Fatal(err)
	}
	if cnt[ReasonNoRule] == 0 || cnt[ReasonBlocked] == 0 || cnt[ReasonHost] == 0 {
		t.Errorf("counters = %v, want no_rule, blocked_range and host counted", cnt)
	}
	// Another slot's gateway is the host too: counted as this slot's attempt at the host, not
	// the other's.
	other, err := m.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(other)
	before := cnt[ReasonHost]
	if c, err := dialFrom(t, s, other.HostAddr.String()+":7070"); err == nil {
		c.Close()
		t.Errorf("connected to another slot's gateway %s", other.HostAddr)
	}
	if cnt, _ := m.Counters(s); cnt[ReasonHost] <= before {
		t.Errorf("host count %d after a dial to another slot's gateway, was %d", cnt[ReasonHost], before)
	}
	if cnt, _ := m.Counters(other); cnt[ReasonHost] != 0 {
		t.Errorf("the other slot counted %d attempts at the host it never made", cnt[ReasonHost])
	}
	// A new policy applies to an open connection from its next packet.
	c, err = dialFrom(t, s, "203.0.113.1:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := m.Apply(s, SlotPolicy{}, false); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	if b, _ := io.ReadAll(c); len(b) > 0 {
		t.Errorf("open connection still works after the policy forbade it: %q", b)
	}
	// DNS-learned addresses allowed on one port only.
	if err := m.AllowAddrPort(s, netip.MustParseAddr("203.0.113.1"), unix.IPPROTO_TCP, []uint16{81}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if c, err := dialFrom(t, s, "203.0.113.1:80"); err == nil {
		c.Close()
		t.Errorf("port 80 reachable with only port 81 allowed")
	}
	if err := m.AllowAddrPort(s, netip.MustParseAddr("203.0.113.1"), unix.IPPROTO_TCP, []uint16{80}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if c, err := dialFrom(t, s, "203.0.113.1:80"); err != nil {
		t.Errorf("address and port allowed through DNS: %v", err)
	} else {
		c.Close()
	}
	// DNS-learned addresses.
	if err := m.AllowAddr(s, netip.MustParseAddr("203.0.113.2"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if c, err := dialFrom(t, s, "203.0.113.2:80"); err != nil {
		t.Errorf("address allowed through DNS: %v", err)
	} else {
		c.Close()
	}
}
