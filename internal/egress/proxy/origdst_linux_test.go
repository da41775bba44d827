package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

func TestParseSockaddrIn(t *testing.T) {
	b := make([]byte, 16)
	binary.NativeEndian.PutUint16(b, unix.AF_INET)
	binary.BigEndian.PutUint16(b[2:], 443)
	copy(b[4:], []byte{192, 0, 2, 7})
	if got, err := parseSockaddrIn(b); err != nil || got != netip.MustParseAddrPort("192.0.2.7:443") {
		t.Errorf("parseSockaddrIn = %v, %v", got, err)
	}
	binary.NativeEndian.PutUint16(b, unix.AF_INET6)
	if _, err := parseSockaddrIn(b); err == nil {
		t.Error("AF_INET6 accepted")
	}
}

// TestOriginalDstRedirect runs the proxy with the real SO_ORIGINAL_DST behind a real nftables
// redirect rule. A thread moved into a new network namespace holds the rule, the proxy's listener
// and the client; the proxy dials the original destination from the test's own namespace, where
// the backend listens on the same loopback address.
func TestOriginalDstRedirect(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and nftables rules")
	}
	backendAddr := netip.MustParseAddr("127.0.0.50")
	backend := serveHTTP(t, backendAddr, nil)
	cfg := Config{
		Resolve: func(_ context.Context, name string) ([]netip.Addr, error) {
			if name == "allowed.test" {
				return []netip.Addr{backendAddr}, nil
			}
			return nil, nil
		},
		IsBlocked: func(netip.Addr) bool { return false },
	}
	lookup := func(src netip.Addr) (Sandbox, bool) {
		return Sandbox{ID: "sb-1", Policy: testPolicy{}}, src == srcSandbox
	}
	p, err := New(cfg, lookup, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })

	var redirected, direct *net.TCPConn
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine, namespace and all
		var err error
		redirected, direct, err = inNewNetns(p, backend)
		errc <- err
	}()
	if err := <-errc; err != nil {
		if errors.Is(err, errSkip) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	defer redirected.Close()
	defer direct.Close()

	redirected.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(redirected, "GET /via HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
	b, err := io.ReadAll(redirected)
	if err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 200") || !strings.HasSuffix(string(b), "http allowed.test /via") {
		t.Errorf("through the redirect: %q, %v", b, err)
	}
	// A connection made to the listener itself has no other destination: the proxy must not
	// connect to itself.
	direct.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(direct, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	if b, _ := io.ReadAll(direct); len(b) != 0 {
		t.Errorf("direct: read %q, want the connection closed", b)
	}
	s := p.Stats()
	if s.Allowed != 1 || s.NoOriginalDst != 1 {
		t.Errorf("stats %+v, want 1 allowed and 1 without original destination", s)
	}
}

var errSkip = errors.New("skip")

// inNewNetns moves the calling thread, which must be locked, into a new network namespace with
// loopback up and a rule redirecting TCP from srcSandbox to backend's port to the proxy, which
// listens there. It returns a connection to backend (redirected) and one to the proxy itself.
func inNewNetns(p *Proxy, backend netip.AddrPort) (redirected, direct *net.TCPConn, err error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return nil, nil, errors.Join(errSkip, err)
	}
	if err := loopbackUp(); err != nil {
		return nil, nil, err
	}
	bound, err := p.Listen(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		return nil, nil, err
	}
	nft := &nftables.Conn{}
	tbl := nft.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "proxytest"})
	ch := nft.AddChain(&nftables.Chain{Name: "out", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	src := srcSandbox.As4()
	nft.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src[:]},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, backend.Port())},
		&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, bound.Port())},
		&expr.Redir{RegisterProtoMin: 1},
	}})
	if err := nft.Flush(); err != nil {
		return nil, nil, errors.Join(errSkip, err)
	}
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(srcSandbox, 0)), Timeout: 5 * time.Second}
	c1, err := d.Dial("tcp4", backend.String())
	if err != nil {
		return nil, nil, err
	}
	c2, err := d.Dial("tcp4", bound.String())
	if err != nil {
		c1.Close()
		return nil, nil, err
	}
	return c1.(*net.TCPConn), c2.(*net.TCPConn), nil
}

// loopbackUp sets lo up in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
