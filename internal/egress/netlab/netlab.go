// Package netlab builds a small internet inside a network namespace on this machine, for tests
// and benchmarks of sandbox networking: a /24 (use a documentation range — 192.0.2.0/24,
// 198.51.100.0/24, 203.0.113.0/24 — so no real host is ever contacted; one per concurrent user,
// since each is routed on the host) behind a veth whose host side is .254, web servers on a few
// of its addresses and a DNS server on .53 that serves their names. Nothing in it reaches beyond
// the machine.
package netlab

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/nsutil"
)

// Host is one web server of the internet.
type Host struct {
	Name string // its DNS name, e.g. "mirror.test"
	Addr string // its address in 198.51.100.0/24
}

// Internet is a running namespace with its servers. Close removes it all.
type Internet struct {
	NsPath, HostIf string
	Hosts          []Host
	// Gateway is the host side (.254), DNS the zone's server (.53, port 53).
	Gateway, DNS string
	closers      []func()
}

// Start builds the namespace (named after tag: 1-4 of [a-z0-9]) for the /24 net, with one web
// server per host on port 80. Each answers "served by ADDR\n", and GET /blob?size=N streams N
// zero bytes.
func Start(tag string, net24 netip.Prefix, hosts []Host) (_ *Internet, err error) {
	if !net24.Addr().Is4() || net24.Bits() != 24 {
		return nil, fmt.Errorf("netlab: %s is not an IPv4 /24", net24)
	}
	b := net24.Masked().Addr().As4()
	at := func(last byte) string { return netip.AddrFrom4([4]byte{b[0], b[1], b[2], last}).String() }
	in := &Internet{NsPath: "/run/netns/corral-lab-" + tag, HostIf: "cl" + tag, Hosts: hosts, Gateway: at(254), DNS: at(53)}
	defer func() {
		if err != nil {
			in.Close()
		}
	}()
	os.MkdirAll("/run/netns", 0o755)
	f, err := os.OpenFile(in.NsPath, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return nil, err
	}
	f.Close()
	in.closers = append(in.closers, func() {
		if l, err := netlink.LinkByName(in.HostIf); err == nil {
			netlink.LinkDel(l)
		}
		unix.Unmount(in.NsPath, unix.MNT_DETACH)
		os.Remove(in.NsPath)
	})
	if err := onNewThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return err
		}
		return unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), in.NsPath, "", unix.MS_BIND, "")
	}); err != nil {
		return nil, fmt.Errorf("netlab: namespace: %w", err)
	}
	if err := in.wire(); err != nil {
		return nil, fmt.Errorf("netlab: %w", err)
	}
	zone := map[string]string{}
	for _, h := range hosts {
		zone[strings.ToLower(h.Name)+"."] = h.Addr
		var ln net.Listener
		if err := in.Do(func() (err error) { ln, err = net.Listen("tcp", h.Addr+":80"); return err }); err != nil {
			return nil, fmt.Errorf("netlab: listen %s: %w", h.Addr, err)
		}
		addr := h.Addr
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n, err := strconv.ParseInt(r.URL.Query().Get("size"), 10, 64); err == nil && r.URL.Path == "/blob" {
				w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
				io.CopyN(w, zeros{}, n)
				return
			}
			io.WriteString(w, "served by "+addr+"\n")
		})}
		go srv.Serve(ln)
		in.closers = append(in.closers, func() { srv.Close() })
	}
	var pc net.PacketConn
	if err := in.Do(func() (err error) { pc, err = net.ListenPacket("udp", in.DNS+":53"); return err }); err != nil {
		return nil, fmt.Errorf("netlab: DNS: %w", err)
	}
	ds := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 && q.Question[0].Qtype == dns.TypeA {
			if ip, ok := zone[strings.ToLower(q.Question[0].Name)]; ok {
				rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A " + ip)
				m.Answer = append(m.Answer, rr)
			} else {
				m.Rcode = dns.RcodeNameError
			}
		}
		w.WriteMsg(m)
	})}
	go ds.ActivateAndServe()
	in.closers = append(in.closers, func() { ds.Shutdown() })
	return in, nil
}

func (in *Internet) wire() error {
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: in.HostIf}, PeerName: in.HostIf + "p"}); err != nil {
		return err
	}
	ns, err := netns.GetFromPath(in.NsPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	peer, err := netlink.LinkByName(in.HostIf + "p")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetNsFd(peer, int(ns)); err != nil {
		return err
	}
	host, err := netlink.LinkByName(in.HostIf)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(host, mustAddr(in.Gateway+"/24")); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	p, err := h.LinkByName(in.HostIf + "p")
	if err != nil {
		return err
	}
	addrs := []string{in.DNS}
	for _, x := range in.Hosts {
		addrs = append(addrs, x.Addr)
	}
	for _, a := range addrs {
		if err := h.AddrAdd(p, mustAddr(a+"/24")); err != nil {
			return fmt.Errorf("address %s: %w", a, err)
		}
	}
	if err := h.LinkSetUp(p); err != nil {
		return err
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		h.LinkSetUp(lo)
	}
	return h.RouteAdd(&netlink.Route{LinkIndex: p.Attrs().Index, Gw: net.ParseIP(in.Gateway)})
}

// Do runs f on a thread inside the namespace (sockets it opens stay there); the thread is
// discarded afterwards.
func (in *Internet) Do(f func() error) error { return nsutil.InNetns(in.NsPath, f) }

// DNSAddr is the zone server's address, for corral up --dns-upstream.
func (in *Internet) DNSAddr() netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(in.DNS), 53)
}

// Close stops the servers and removes the namespace and veth.
func (in *Internet) Close() error {
	for i := len(in.closers) - 1; i >= 0; i-- {
		in.closers[i]()
	}
	in.closers = nil
	if _, err := os.Stat(in.NsPath); err == nil {
		return errors.New("netlab: namespace still present after Close")
	}
	return nil
}

// onNewThread runs f on a locked OS thread that ends with it, so a namespace switch never leaks.
func onNewThread(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		done <- f()
	}()
	return <-done
}

func mustAddr(s string) *netlink.Addr {
	a, err := netlink.ParseAddr(s)
	if err != nil {
		panic(err)
	}
	return a
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
