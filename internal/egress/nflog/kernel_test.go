package nflog

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

const (
	testGroup  = 7
	testPrefix = "corral:7:no_rule"
)

var (
	blockedAddr = netip.MustParseAddr("127.0.0.9")  // logged and dropped
	markerAddr  = netip.MustParseAddr("127.0.0.10") // logged by a rule of its own, then dropped
)

// kernelResult is what the scenario in a test namespace saw.
type kernelResult struct {
	events     []Event
	floodSent  int   // datagrams sent in the flood
	floodErrs  int   // of them, those the kernel refused (dropped by the output hook)
	dupErr     error // a second Listen on the same group
	stats      Stats
	closeAgain error
}

// TestKernel logs real packets dropped by nftables in a fresh network namespace. It needs root.
func TestKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace with nftables log rules (run the tests as root)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type outcome struct {
		res kernelResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		// Never unlocked: the thread leaves the process with this goroutine, and its namespace
		// goes with the last socket in it.
		runtime.LockOSThread()
		res, err := kernelScenario(ctx)
		done <- outcome{res, err}
	}()
	out := <-done
	if out.err != nil {
		t.Fatal(out.err)
	}
	res := out.res

	find := func(proto string, port uint16) (Event, bool) {
		for _, ev := range res.events {
			if ev.Proto == proto && ev.DstPort == port {
				return ev, true
			}
		}
		return Event{}, false
	}
	for _, want := range []struct {
		proto string
		port  uint16
	}{{"udp", 4444}, {"tcp", 5555}} {
		ev, ok := find(want.proto, want.port)
		if !ok {
			t.Errorf("no event for %s to %v:%d; events: %+v", want.proto, blockedAddr, want.port, res.events)
			continue
		}
		if ev.Prefix != testPrefix || ev.Dst != blockedAddr || !ev.Src.IsLoopback() || ev.At.IsZero() {
			t.Errorf("event for %s/%d = %+v, want prefix %q, dst %v, a loopback source and a time",
				want.proto, want.port, ev, testPrefix, blockedAddr)
		}
	}

	// The flood: every datagram dropped, only about the burst logged.
	if res.floodErrs != res.floodSent {
		t.Errorf("flood: %d of %d datagrams refused, want all: the limit must not let any through", res.floodErrs, res.floodSent)
	}
	var flooded int
	for _, ev := range res.events {
		if ev.DstPort == 4445 {
			flooded++
		}
	}
	t.Logf("%d events, %d of %d flood datagrams logged, stats %+v", len(res.events), flooded, res.floodSent, res.stats)
	if flooded == 0 || flooded >= res.floodSent {
		t.Errorf("flood: %d of %d datagrams logged, want some but fewer than all (burst %d)", flooded, res.floodSent, LogBurst)
	}
	if res.stats.Received != uint64(len(res.events)) || res.stats.ParseErrors != 0 || res.stats.Overruns != 0 {
		t.Errorf("Stats = %+v, want %d received, no errors or overruns", res.stats, len(res.events))
	}
	if !errors.Is(res.dupErr, errdefs.ErrConflict) {
		t.Errorf("second Listen on group %d = %v, want ErrConflict", testGroup, res.dupErr)
	}
	if res.closeAgain != nil {
		t.Errorf("second Close = %v, want nil", res.closeAgain)
	}
}

// kernelScenario runs on a locked thread: it moves the thread to a new network namespace, listens,
// adds the rules, sends the packets and collects the events until the marker's arrives.
func kernelScenario(ctx context.Context) (res kernelResult, err error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return res, fmt.Errorf("unshare network namespace: %w", err)
	}
	if err := loUp(); err != nil {
		return res, err
	}

	events := make(chan Event, 4096)
	r, err := Listen(ctx, testGroup, 0, func(ev Event) { events <- ev }, nil)
	if err != nil {
		return res, fmt.Errorf("Listen: %w", err)
	}
	defer r.Close()
	if r2, err := Listen(ctx, testGroup, 0, func(Event) {}, nil); err == nil {
		r2.Close()
	} else {
		res.dupErr = err
	}

	ns, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return res, err
	}
	defer ns.Close()
	nft, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return res, fmt.Errorf("nftables: %w", err)
	}
	table := addRules(nft)
	if err := nft.Flush(); err != nil {
		return res, fmt.Errorf("add nftables rules: %w", err)
	}
	defer func() {
		nft.DelTable(table)
		if derr := nft.Flush(); derr != nil && err == nil {
			err = fmt.Errorf("delete nftables table: %w", derr)
		}
	}()

	if err := sendUDP(blockedAddr, 4444); err == nil {
		return res, errors.New("udp to the blocked address went out: the rule did not drop it")
	}
	if c, err := net.DialTimeout("tcp", netip.AddrPortFrom(blockedAddr, 5555).String(), time.Second); err == nil {
		c.Close()
		return res, errors.New("tcp to the blocked address connected: the rule did not drop it")
	}
	// A flood well past the burst, fast enough that the rate adds little.
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(blockedAddr, 4445)))
	if err != nil {
		return res, err
	}
	res.floodSent = 4 * LogBurst
	for range res.floodSent {
		if _, err := c.Write([]byte("x")); err != nil {
			res.floodErrs++
		}
	}
	c.Close()
	// The marker is logged after everything above (one socket, in order), by a rule with a limit
	// of its own, so its event means all the others have been read.
	sendUDP(markerAddr, 1)

	for {
		select {
		case ev := <-events:
			if ev.Dst == markerAddr {
				res.stats = r.Stats()
				res.stats.Received-- // the marker's
				if err := r.Close(); err != nil {
					return res, fmt.Errorf("Close: %w", err)
				}
				res.closeAgain = r.Close()
				return res, nil
			}
			res.events = append(res.events, ev)
		case <-ctx.Done():
			return res, fmt.Errorf("waiting for the marker's event (stats %+v, %d events): %w", r.Stats(), len(res.events), ctx.Err())
		}
	}
}

// addRules queues table inet nflogtest with an output chain:
//
//	ip daddr 127.0.0.9 limit ... log group 7 prefix "corral:7:no_rule"
//	ip daddr 127.0.0.9 counter drop
//	ip daddr 127.0.0.10 limit ... log group 7 prefix "marker"
//	ip daddr 127.0.0.10 drop
func addRules(c *nftables.Conn) *nftables.Table {
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "nflogtest"})
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	daddr := func(a netip.Addr) []expr.Any {
		b := a.As4()
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]},
		}
	}
	for _, r := range []struct {
		addr   netip.Addr
		prefix string
	}{{blockedAddr, testPrefix}, {markerAddr, "marker"}} {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(daddr(r.addr), LogExprs(testGroup, r.prefix)...)})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch,
			Exprs: append(daddr(r.addr), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})})
	}
	return t
}

func sendUDP(a netip.Addr, port uint16) error {
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, port)))
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte("hello"))
	return err
}

// loUp brings up the loopback interface of the calling thread's namespace.
func loUp() error {
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
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// TestListenWithoutNetAdmin drops CAP_NET_ADMIN from one thread (capabilities are per thread)
// and expects Listen there to be denied, not reported as a conflict. It needs root.
func TestListenWithoutNetAdmin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: drops CAP_NET_ADMIN from a thread that had it (run the tests as root)")
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread's capabilities are changed, so it must not run other code.
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		data[0].Effective &^= 1 << unix.CAP_NET_ADMIN
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		r, err := Listen(context.Background(), testGroup+1, 0, func(Event) {}, nil)
		if err == nil {
			r.Close()
			err = errors.New("no error")
		}
		errc <- err
	}()
	if err := <-errc; !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("Listen without CAP_NET_ADMIN = %v, want ErrDenied", err)
	}
}
