package egress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNetns runs f on a thread inside the namespace at path; the thread is discarded afterwards.
func inNetns(t *testing.T, path string, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		f()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// internet is a namespace standing in for the internet: 203.0.113.1/24 behind a veth whose
// host side is 203.0.113.254, with an HTTP server on ports 8080 and 8081.
type internet struct {
	path, hostIf string
}

func newInternet(t *testing.T, tag string) *internet {
	t.Helper()
	in := &internet{path: "/run/netns/corral-test-inet-" + tag, hostIf: "ct" + tag}
	os.MkdirAll("/run/netns", 0o755)
	if err := newNetns(in.path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(in.hostIf); err == nil {
			netlink.LinkDel(l)
		}
		unix.Unmount(in.path, unix.MNT_DETACH)
		os.Remove(in.path)
	})
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: in.hostIf}, PeerName: in.hostIf + "p"}); err != nil {
		t.Fatal(err)
	}
	ns, _ := netns.GetFromPath(in.path)
	defer ns.Close()
	peer, _ := netlink.LinkByName(in.hostIf + "p")
	netlink.LinkSetNsFd(peer, int(ns))
	host, _ := netlink.LinkByName(in.hostIf)
	netlink.AddrAdd(host, &netlink.Addr{IPNet: toIPNet(netip.MustParsePrefix("203.0.113.254/24"))})
	netlink.LinkSetUp(host)
	h, _ := netlink.NewHandleAt(ns)
	defer h.Close()
	p, _ := h.LinkByName(in.hostIf + "p")
	h.AddrAdd(p, &netlink.Addr{IPNet: toIPNet(netip.MustParsePrefix("203.0.113.1/24"))})
	h.LinkSetUp(p)
	if lo, err := h.LinkByName("lo"); err == nil {
		h.LinkSetUp(lo)
	}
	h.RouteAdd(&netlink.Route{LinkIndex: p.Attrs().Index, Gw: net.ParseIP("203.0.113.254")})
	for _, port := range []int{8080, 8081} {
		var ln net.Listener
		inNetns(t, in.path, func() {
			var err error
			ln, err = net.Listen("tcp", fmt.Sprintf("203.0.113.1:%d", port))
			if err != nil {
				t.Error(err)
			}
		})
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "hello from "+r.Host)
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
	return in
}

// dialFrom connects from inside the slot's namespace; it returns the error, nil when connected.
func dialFrom(t *testing.T, s *Slot, addr string) (net.Conn, error) {
	var c net.Conn
	var err error
	inNetns(t, s.Netns, func() {
		c, err = net.DialTimeout("tcp", addr, 400*time.Millisecond)
	})
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
	newInternet(t, tag)
	ctx := context.Background()
	s, err := m.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(s)
	// No policy yet: nothing gets out.
	if c, err := dialFrom(t, s, "203.0.113.1:8080"); err == nil {
		c.Close()
		t.Fatal("connected before any policy was applied")
	}
	allow := SlotPolicy{Allow: []NetRule{{Prefix: netip.MustParsePrefix("203.0.113.1/32"), Proto: unix.IPPROTO_TCP, PortLo: 8080, PortHi: 8080}}}
	if err := m.Apply(s, allow, false); err != nil {
		t.Fatal(err)
	}
	c, err := dialFrom(t, s, "203.0.113.1:8080")
	if err != nil {
		t.Fatalf("allowed destination: %v", err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	b, _ := io.ReadAll(c)
	c.Close()
	if !strings.Contains(string(b), "hello from x") {
		t.Fatalf("allowed destination answered %q", b)
	}
	for _, addr := range []string{"203.0.113.1:8081", s.HostAddr.String() + ":22", "169.254.169.254:80", "10.1.2.3:80"} {
		if c, err := dialFrom(t, s, addr); err == nil {
			c.Close()
			t.Errorf("connected to %s, which the policy does not allow", addr)
		}
	}
	cnt, err := m.Counters(s)
	if err != nil {
		t.Fatal(err)
	}
	if cnt[ReasonNoRule] == 0 || cnt[ReasonBlocked] == 0 {
		t.Errorf("counters = %v, want no_rule and blocked_range counted", cnt)
	}
	// A new policy applies to an open connection from its next packet.
	c, err = dialFrom(t, s, "203.0.113.1:8080")
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
	// DNS-learned addresses.
	if err := m.AllowAddr(s, netip.MustParseAddr("203.0.113.1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if c, err := dialFrom(t, s, "203.0.113.1:8081"); err != nil {
		t.Errorf("address allowed through DNS: %v", err)
	} else {
		c.Close()
	}
}
