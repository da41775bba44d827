// Package egress gives sandboxes a network: a network namespace per sandbox with a veth pair to
// the host and an address from a pool, NAT for allowed traffic, and an nftables chain per sandbox
// that enforces its policy on the host, out of the sandbox's reach (see nft.go for the layout).
// Namespaces, veths and base rules are prepared ahead in a small pool of slots, so networking
// adds little to creation time; a released slot is destroyed, never reused as is.
//
// Slot n of pool P (a /30 each) has host address P+4n+1 and sandbox address P+4n+2; its host
// veth is cr<tag>-<n>, its namespace is /run/netns/corral-<tag>-<n> (visible to `ip netns`),
// and its chain is slot-<n> in table inet corral-<tag>.
package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
)

// Config configures a Manager.
type Config struct {
	// Pool is the IPv4 prefix sandboxes' addresses come from, a /30 per sandbox; default
	// 10.200.0.0/16.
	Pool netip.Prefix
	// Tag distinguishes this instance's interfaces, namespaces and nftables tables from another's
	// on the same host: 1-4 of [a-z0-9]; default "0".
	Tag string
	// Ready is how many slots are kept prepared; default 4, negative for none.
	Ready int
	// Blocked is the always-blocked set (netpolicy.BlockedSet); it should contain Pool.
	Blocked []netip.Prefix
	// NetnsDir holds the namespaces' bind mounts; default /run/netns.
	NetnsDir string
	// ProxyPort, when set, is where the edge's name-checking proxy (internal/egress/proxy)
	// listens on each slot's host address: TCP to ports 80 and 443 of addresses a sandbox
	// learned through DNS is redirected there, so the HTTP Host or TLS SNI must name an allowed
	// domain that resolves to that address.
	ProxyPort uint16
	// LogGroup, when set, is the NFLOG group every drop of a slot's chain is logged to
	// (rate-limited; prefix LogPrefix), for attribution by internal/egress/nflog.
	LogGroup uint16
}

var tagRE = lazyregexp.New(`^[a-z0-9]{1,4}$`)

func (c *Config) setDefaults() {
	if !c.Pool.IsValid() {
		c.Pool = netip.MustParsePrefix("10.200.0.0/16")
	}
	if c.Tag == "" {
		c.Tag = "0"
	}
	if c.Ready == 0 {
		c.Ready = 4
	}
	if c.NetnsDir == "" {
		c.NetnsDir = "/run/netns"
	}
}

func (c *Config) validate() error {
	if !c.Pool.Addr().Is4() || c.Pool.Bits() > 28 || c.Pool != c.Pool.Masked() {
		return errdefs.Invalid("net_pool", "%s: want an IPv4 prefix of /28 or larger, its own network address", c.Pool)
	}
	if !tagRE.MatchString(c.Tag) {
		return errdefs.Invalid("net_tag", "%q: want 1-4 of [a-z0-9]", c.Tag)
	}
	return nil
}

// Slot is one sandbox's network.
type Slot struct {
	Index int
	// Netns is the path of the namespace's bind mount: the OCI spec's network namespace path.
	Netns string
	// HostAddr is the host side of the veth (the sandbox's gateway and DNS server); SandboxAddr
	// is the sandbox's own address.
	HostAddr, SandboxAddr netip.Addr
	// HostIf is the host side's interface name.
	HostIf string
}

// Manager prepares, hands out and destroys slots, and applies policies to them.
type Manager struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	used  map[int]bool // slot indices in use or being prepared/destroyed; protected by mu
	ready []*Slot      // prepared, unused; protected by mu
	nft   *nftables.Conn
	table *nftables.Table
	fwd   *nftables.Chain
	input *nftables.Chain
	pre   *nftables.Chain // nat prerouting: the redirects to the proxy
	block *nftables.Set

	refill chan struct{}
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

// New sets up the host side (forwarding, NAT, the base nftables table) and starts preparing
// slots. keep lists slot indices that live sandboxes still use (after a restart): they are left
// alone; every other slot of this tag found on the host is destroyed.
func New(ctx context.Context, cfg Config, keep []int, log *slog.Logger) (*Manager, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg, log: log, used: map[int]bool{}, refill: make(chan struct{}, 1)}
	for _, i := range keep {
		m.used[i] = true
	}
	if err := os.MkdirAll(cfg.NetnsDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	conn, err := nftables.New()
	if err != nil {
		return nil, errNft("connect", err)
	}
	m.nft = conn
	if err := m.setupTables(); err != nil {
		return nil, err
	}
	m.removeStale()
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	m.stop = stop
	if cfg.Ready > 0 {
		m.wg.Add(1)
		go m.refillLoop(bg)
		m.kick()
	}
	log.Info("sandbox networking ready", "pool", cfg.Pool, "tag", cfg.Tag, "ready_slots", max(cfg.Ready, 0))
	return m, nil
}

func (m *Manager) tableName() string { return "corral-" + m.cfg.Tag }
func (m *Manager) ifPrefix() string  { return "cr" + m.cfg.Tag + "-" }

// setupTables (re)creates this instance's tables with the base chains; slot chains of slots in
// m.used are recreated by their owners (Reapply).
func (m *Manager) setupTables() error {
	c := m.nft
	// Start from nothing: a crashed predecessor's table is replaced whole.
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyIPv4} {
		tables, _ := c.ListTablesOfFamily(fam)
		for _, t := range tables {
			if t.Name == m.tableName() || t.Name == m.tableName()+"-nat" {
				c.DelTable(t)
			}
		}
	}
	if err := c.Flush(); err != nil {
		return errNft("remove old tables", err)
	}
	m.table = c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: m.tableName()})
	accept := nftables.ChainPolicyAccept
	m.fwd = c.AddChain(&nftables.Chain{Name: "forward", Table: m.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	m.input = c.AddChain(&nftables.Chain{Name: "input", Table: m.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	m.block = &nftables.Set{Table: m.table, Name: "blocked", KeyType: nftables.TypeIPAddr, Interval: true}
	if err := c.AddSet(m.block, prefixElements(m.cfg.Blocked)); err != nil {
		return errNft("blocked set", err)
	}
	m.pre = c.AddChain(&nftables.Chain{Name: "prerouting", Table: m.table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	pfx := m.ifPrefix()
	if m.cfg.ProxyPort != 0 {
		// Only connections the prerouting chain redirected may reach the proxy's port.
		c.AddRule(&nftables.Rule{Table: m.table, Chain: m.input,
			Exprs: cat(matchIfPrefix(expr.MetaKeyIIFNAME, pfx), matchL4(unix.IPPROTO_TCP), matchDport(m.cfg.ProxyPort, m.cfg.ProxyPort),
				matchCtDNAT(), []expr.Any{verdict(expr.VerdictAccept)})})
	}
	// forward: per-slot jumps are inserted before these (see addSlotRules).
	c.AddRule(&nftables.Rule{Table: m.table, Chain: m.fwd, UserData: reasonTag("spoofed"),
		Exprs: cat(matchIfPrefix(expr.MetaKeyIIFNAME, pfx), []expr.Any{&expr.Counter{}, verdict(expr.VerdictDrop)})})
	c.AddRule(&nftables.Rule{Table: m.table, Chain: m.fwd,
		Exprs: cat(matchIfPrefix(expr.MetaKeyOIFNAME, pfx), matchCtEstablished(), []expr.Any{verdict(expr.VerdictAccept)})})
	c.AddRule(&nftables.Rule{Table: m.table, Chain: m.fwd, UserData: reasonTag("inbound"),
		Exprs: cat(matchIfPrefix(expr.MetaKeyOIFNAME, pfx), []expr.Any{&expr.Counter{}, verdict(expr.VerdictDrop)})})
	c.AddRule(&nftables.Rule{Table: m.table, Chain: m.input, UserData: reasonTag("host"),
		Exprs: cat(matchIfPrefix(expr.MetaKeyIIFNAME, pfx), []expr.Any{&expr.Counter{}, verdict(expr.VerdictDrop)})})

	nat := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: m.tableName() + "-nat"})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: nat, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	oifPrefix := matchIfPrefix(expr.MetaKeyOIFNAME, pfx)
	oifPrefix[1].(*expr.Cmp).Op = expr.CmpOpNeq
	c.AddRule(&nftables.Rule{Table: nat, Chain: post,
		Exprs: cat(matchAddr(12, m.cfg.Pool), oifPrefix, []expr.Any{&expr.Masq{}})})
	if err := c.Flush(); err != nil {
		return errNft("create tables", err)
	}
	return nil
}

// Close stops preparing slots and destroys the prepared, unused ones. Slots in use stay, and so
// do the tables (sandboxes keep their network while corral restarts); with none in use, the
// tables go too, so nothing of the network is left on the host.
func (m *Manager) Close() error {
	m.stop()
	m.wg.Wait()
	m.mu.Lock()
	ready := m.ready
	m.ready = nil
	m.mu.Unlock()
	var errs []error
	for _, s := range ready {
		errs = append(errs, m.Release(s))
	}
	m.mu.Lock()
	idle := len(m.used) == 0
	if idle {
		m.nft.DelTable(m.table)
		m.nft.DelTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: m.tableName() + "-nat"})
		errs = append(errs, m.nft.Flush())
	}
	m.mu.Unlock()
	return errors.Join(errs...)
}

func (m *Manager) kick() {
	select {
	case m.refill <- struct{}{}:
	default:
	}
}

func (m *Manager) refillLoop(ctx context.Context) {
	defer m.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.refill:
		}
		for ctx.Err() == nil {
			m.mu.Lock()
			need := len(m.ready) < m.cfg.Ready
			m.mu.Unlock()
			if !need {
				break
			}
			s, err := m.prepare()
			if err != nil {
				m.log.Error("prepare network slot", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				break
			}
			m.mu.Lock()
			m.ready = append(m.ready, s)
			m.mu.Unlock()
		}
	}
}

// Acquire returns a prepared slot (or prepares one) for a sandbox; its chain drops everything
// until Apply.
func (m *Manager) Acquire(ctx context.Context) (*Slot, error) {
	m.mu.Lock()
	if n := len(m.ready); n > 0 {
		s := m.ready[n-1]
		m.ready = m.ready[:n-1]
		m.mu.Unlock()
		m.kick()
		return s, nil
	}
	m.mu.Unlock()
	m.kick()
	return m.prepare()
}

// Slot returns slot i's description (for a sandbox re-adopted after a restart).
func (m *Manager) Slot(i int) *Slot {
	host, sb := m.addrs(i)
	return &Slot{Index: i, Netns: m.netnsPath(i), HostAddr: host, SandboxAddr: sb, HostIf: m.hostIf(i)}
}

// Release destroys slot s: namespace, veth, chain, DNS set. Idempotent.
func (m *Manager) Release(s *Slot) error {
	err := m.destroy(s.Index)
	if err == nil {
		m.mu.Lock()
		delete(m.used, s.Index)
		m.mu.Unlock()
	}
	return err
}

func (m *Manager) netnsPath(i int) string {
	return filepath.Join(m.cfg.NetnsDir, "corral-"+m.cfg.Tag+"-"+strconv.Itoa(i))
}
func (m *Manager) hostIf(i int) string { return m.ifPrefix() + strconv.Itoa(i) }
func (m *Manager) peerIf(i int) string { return "cp" + m.cfg.Tag + "-" + strconv.Itoa(i) }
func slotChain(i int) string           { return "slot-" + strconv.Itoa(i) }
func slotTag(i int) string             { return "corral-slot:" + strconv.Itoa(i) }
func dnsSet(i int) string              { return "dns-" + strconv.Itoa(i) }
func dnsPortSet(i int) string          { return "dnsp-" + strconv.Itoa(i) }

func (m *Manager) dnsSets(i int) (any, ports *nftables.Set) {
	return &nftables.Set{Table: m.table, Name: dnsSet(i), KeyType: nftables.TypeIPAddr, HasTimeout: true},
		&nftables.Set{Table: m.table, Name: dnsPortSet(i), Concatenation: true, HasTimeout: true,
			KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
}

func (m *Manager) addrs(i int) (host, sandbox netip.Addr) {
	a := m.cfg.Pool.Addr().As4()
	base := binary.BigEndian.Uint32(a[:]) + uint32(i)*4
	var h, s [4]byte
	binary.BigEndian.PutUint32(h[:], base+1)
	binary.BigEndian.PutUint32(s[:], base+2)
	return netip.AddrFrom4(h), netip.AddrFrom4(s)
}

func (m *Manager) slots() int { return 1 << (32 - m.cfg.Pool.Bits()) / 4 }

// claim reserves a free slot index.
func (m *Manager) claim() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.slots() {
		if !m.used[i] {
			m.used[i] = true
			return i, nil
		}
	}
	return 0, errdefs.Unavailable("no free sandbox network in %s: all %d in use", m.cfg.Pool, m.slots())
}

// prepare makes a slot: namespace, veth pair, addresses, routes, chain (drop all), DNS set.
func (m *Manager) prepare() (_ *Slot, err error) {
	i, err := m.claim()
	if err != nil {
		return nil, err
	}
	s := m.Slot(i)
	defer func() {
		if err != nil {
			m.destroy(i)
			m.mu.Lock()
			delete(m.used, i)
			m.mu.Unlock()
		}
	}()
	if err := newNetns(s.Netns); err != nil {
		return nil, fmt.Errorf("network slot %d: %w", i, err)
	}
	ns, err := netns.GetFromPath(s.Netns)
	if err != nil {
		return nil, fmt.Errorf("network slot %d: open namespace: %w", i, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("network slot %d: netlink in namespace: %w", i, err)
	}
	defer h.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: s.HostIf}, PeerName: m.peerIf(i)}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("network slot %d: add veth: %w", i, err)
	}
	// No IPv6 on the host side (IPv6 egress is blocked; this also keeps link-local off).
	os.WriteFile("/proc/sys/net/ipv6/conf/"+s.HostIf+"/disable_ipv6", []byte("1"), 0o644)
	peer, err := netlink.LinkByName(m.peerIf(i))
	if err != nil {
		return nil, fmt.Errorf("network slot %d: %w", i, err)
	}
	if err := netlink.LinkSetNsFd(peer, int(ns)); err != nil {
		return nil, fmt.Errorf("network slot %d: move veth: %w", i, err)
	}
	host, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		return nil, fmt.Errorf("network slot %d: %w", i, err)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: prefixNet(s.HostAddr, 30)}); err != nil {
		return nil, fmt.Errorf("network slot %d: host address: %w", i, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("network slot %d: host link up: %w", i, err)
	}
	inner, err := h.LinkByName(m.peerIf(i))
	if err != nil {
		return nil, fmt.Errorf("network slot %d: %w", i, err)
	}
	if err := h.LinkSetName(inner, "eth0"); err != nil {
		return nil, fmt.Errorf("network slot %d: rename: %w", i, err)
	}
	if err := h.AddrAdd(inner, &netlink.Addr{IPNet: prefixNet(s.SandboxAddr, 30)}); err != nil {
		return nil, fmt.Errorf("network slot %d: sandbox address: %w", i, err)
	}
	if err := h.LinkSetUp(inner); err != nil {
		return nil, fmt.Errorf("network slot %d: link up: %w", i, err)
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		h.LinkSetUp(lo)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: inner.Attrs().Index, Gw: s.HostAddr.AsSlice()}); err != nil {
		return nil, fmt.Errorf("network slot %d: default route: %w", i, err)
	}
	if err := m.addSlotRules(s); err != nil {
		return nil, fmt.Errorf("network slot %d: %w", i, err)
	}
	return s, nil
}

func prefixNet(a netip.Addr, bits int) *netipNet { return toIPNet(netip.PrefixFrom(a, bits)) }

// addSlotRules creates the slot's DNS set, its chain (dropping everything: no policy yet) and
// its jump and input rules.
func (m *Manager) addSlotRules(s *Slot) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.nft
	dns, dnsp := m.dnsSets(s.Index)
	if err := c.AddSet(dns, nil); err != nil {
		return errNft("dns set", err)
	}
	if err := c.AddSet(dnsp, nil); err != nil {
		return errNft("dns port set", err)
	}
	ch := c.AddChain(&nftables.Chain{Name: slotChain(s.Index), Table: m.table})
	for _, r := range slotRules(m.table, ch, dns, dnsp, m.block, SlotPolicy{}, s.Index, m.cfg.LogGroup) {
		c.AddRule(r)
	}
	// Inserted at the top of forward/input, before the catch-all drops.
	c.InsertRule(&nftables.Rule{Table: m.table, Chain: m.fwd, UserData: []byte("corral-slot:" + strconv.Itoa(s.Index)),
		Exprs: cat(matchIIF(s.HostIf), matchIPv4(), matchAddr(12, netip.PrefixFrom(s.SandboxAddr, 32)), []expr.Any{jump(slotChain(s.Index))})})
	if m.cfg.ProxyPort != 0 {
		redirect := []expr.Any{&expr.Immediate{Register: 1, Data: be16(m.cfg.ProxyPort)}, &expr.Redir{RegisterProtoMin: 1}}
		for _, port := range []uint16{80, 443} {
			for _, lookup := range [][]expr.Any{lookupDaddr(dns), lookupDaddrProtoPort(dnsp)} {
				c.AddRule(&nftables.Rule{Table: m.table, Chain: m.pre, UserData: []byte("corral-slot:" + strconv.Itoa(s.Index)),
					Exprs: cat(matchIIF(s.HostIf), matchIPv4(), matchL4(unix.IPPROTO_TCP), matchDport(port, port), lookup, redirect)})
			}
		}
	}
	// Everything the sandbox sends to the host itself (any of its addresses: its own gateway,
	// the host's primary address, other sandboxes' gateways) is, after its resolver and its
	// redirected proxy connections, dropped, logged and counted as the sandbox's (ReasonHost).
	// Inserted at the top of input, in reverse, so they come in hostRules' order.
	rules := hostRules(m.table, m.input, s, m.cfg.ProxyPort, m.cfg.LogGroup)
	for i := len(rules) - 1; i >= 0; i-- {
		c.InsertRule(rules[i])
	}
	if err := c.Flush(); err != nil {
		return errNft("slot rules", err)
	}
	return nil
}

// Apply replaces slot s's policy atomically: one nftables transaction flushes its chain and
// adds the new rules, so no packet sees a half-applied policy; packets of open connections are
// judged by the new rules from the next packet on. The DNS set is emptied unless keepDNS.
func (m *Manager) Apply(s *Slot, p SlotPolicy, keepDNS bool) error {
	c := m.nft
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := &nftables.Chain{Name: slotChain(s.Index), Table: m.table}
	// Rules refer to existing sets by name; no lookup of the set's ID is needed.
	dns, dnsp := m.dnsSets(s.Index)
	c.FlushChain(ch)
	if !keepDNS {
		c.FlushSet(dns)
		c.FlushSet(dnsp)
	}
	for _, r := range slotRules(m.table, ch, dns, dnsp, m.block, p, s.Index, m.cfg.LogGroup) {
		c.AddRule(r)
	}
	if err := c.Flush(); err != nil {
		return errNft("apply policy", err)
	}
	return nil
}

// AllowAddr adds ip to slot s's DNS-learned set for ttl (clamped to [30s, 1h]).
func (m *Manager) AllowAddr(s *Slot, ip netip.Addr, ttl time.Duration) error {
	if !ip.Is4() {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	set := &nftables.Set{Table: m.table, Name: dnsSet(s.Index), KeyType: nftables.TypeIPAddr, HasTimeout: true}
	k := ip.As4()
	if err := m.nft.SetAddElements(set, []nftables.SetElement{{Key: k[:], Timeout: ttlClamp(ttl)}}); err != nil {
		return errNft("allow address", err)
	}
	return m.nft.Flush()
}

// AllowAddrPort adds (ip, proto, port) to slot s's DNS-learned set for names allowed on some
// ports or one protocol only, for ttl (clamped to [30s, 1h]).
func (m *Manager) AllowAddrPort(s *Slot, ip netip.Addr, proto uint8, ports []uint16, ttl time.Duration) error {
	if !ip.Is4() || len(ports) == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, set := m.dnsSets(s.Index)
	els := make([]nftables.SetElement, len(ports))
	for i, p := range ports {
		els[i] = nftables.SetElement{Key: dnsPortKey(ip, proto, p), Timeout: ttlClamp(ttl)}
	}
	if err := m.nft.SetAddElements(set, els); err != nil {
		return errNft("allow address and port", err)
	}
	return m.nft.Flush()
}

// Counters returns slot s's blocked-packet counts by reason: its policy's drops (slot chain)
// and its attempts at the host (its rules in input, ReasonHost).
func (m *Manager) Counters(s *Slot) (map[string]uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rules, err := m.nft.GetRules(m.table, &nftables.Chain{Name: slotChain(s.Index), Table: m.table})
	if err != nil {
		return nil, errNft("read counters", err)
	}
	out := map[string]uint64{}
	// The slot's rules in input carry its slot tag (for destroy); its one counter is ReasonHost.
	input, err := m.nft.GetRules(m.table, m.input)
	if err != nil {
		return nil, errNft("read counters", err)
	}
	for _, r := range input {
		if string(r.UserData) != slotTag(s.Index) {
			continue
		}
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				out[ReasonHost] += c.Packets
			}
		}
	}
	for _, r := range rules {
		reason := reasonOf(r)
		if reason == "" {
			continue
		}
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				out[reason] += c.Packets
			}
		}
	}
	return out, nil
}

// destroy removes everything of slot i that exists. Preconditions: i is claimed.
func (m *Manager) destroy(i int) error {
	var errs []error
	m.mu.Lock()
	c := m.nft
	for _, ch := range []*nftables.Chain{m.fwd, m.input, m.pre} {
		rules, err := c.GetRules(m.table, ch)
		if err != nil {
			continue
		}
		for _, r := range rules {
			if string(r.UserData) == "corral-slot:"+strconv.Itoa(i) {
				c.DelRule(r)
			}
		}
	}
	c.Flush()
	c.DelChain(&nftables.Chain{Name: slotChain(i), Table: m.table})
	c.Flush() // fails harmlessly when there is no such chain
	c.DelSet(&nftables.Set{Table: m.table, Name: dnsSet(i)})
	c.Flush()
	c.DelSet(&nftables.Set{Table: m.table, Name: dnsPortSet(i)})
	c.Flush()
	m.mu.Unlock()
	if l, err := netlink.LinkByName(m.hostIf(i)); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete veth %s: %w", m.hostIf(i), err))
		}
	}
	p := m.netnsPath(i)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeStale destroys slots of this tag left on the host that nobody keeps.
func (m *Manager) removeStale() {
	prefix := "corral-" + m.cfg.Tag + "-"
	ents, _ := os.ReadDir(m.cfg.NetnsDir)
	found := map[int]bool{}
	for _, e := range ents {
		if n, ok := strings.CutPrefix(e.Name(), prefix); ok {
			if i, err := strconv.Atoi(n); err == nil {
				found[i] = true
			}
		}
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if n, ok := strings.CutPrefix(l.Attrs().Name, m.ifPrefix()); ok {
			if i, err := strconv.Atoi(n); err == nil {
				found[i] = true
			}
		}
	}
	for i := range found {
		if !m.used[i] {
			if err := m.destroy(i); err != nil {
				m.log.Warn("remove stale network slot", "slot", i, "err", err)
			}
		}
	}
}

// newNetns creates a network namespace bind-mounted at path, on a thread that is thrown away
// afterwards (a goroutine locked to its thread that exits without unlocking ends the thread), so
// no Go thread is ever left in the wrong namespace.
func newNetns(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

type netipNet = net.IPNet

func toIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Adopt takes back slot i of a sandbox that outlived a restart of corral (New was told to keep
// it): its namespace and veth are still there, its rules are made again (New started the tables
// afresh); Apply its policy next.
func (m *Manager) Adopt(i int) (*Slot, error) {
	s := m.Slot(i)
	if _, err := os.Stat(s.Netns); err != nil {
		return nil, fmt.Errorf("network slot %d: %w", i, err)
	}
	if _, err := netlink.LinkByName(s.HostIf); err != nil {
		return nil, fmt.Errorf("network slot %d: veth %s: %w", i, s.HostIf, err)
	}
	m.mu.Lock()
	m.used[i] = true
	m.mu.Unlock()
	if err := m.addSlotRules(s); err != nil {
		return nil, fmt.Errorf("network slot %d: %w", i, err)
	}
	return s, nil
}

// Reconfigure puts back slot s's address and default route inside its namespace (idempotent).
// gVisor's netstack takes them over when its sandbox starts, removing them from the namespace's
// eth0, so a gVisor sandbox restored from a checkpoint needs them there again to take them over.
func (m *Manager) Reconfigure(s *Slot) error {
	ns, err := netns.GetFromPath(s.Netns)
	if err != nil {
		return fmt.Errorf("network slot %d: %w", s.Index, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("network slot %d: %w", s.Index, err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("network slot %d: %w", s.Index, err)
	}
	if err := h.AddrReplace(eth, &netlink.Addr{IPNet: prefixNet(s.SandboxAddr, 30)}); err != nil {
		return fmt.Errorf("network slot %d: address: %w", s.Index, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("network slot %d: link up: %w", s.Index, err)
	}
	if err := h.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: s.HostAddr.AsSlice()}); err != nil {
		return fmt.Errorf("network slot %d: default route: %w", s.Index, err)
	}
	return nil
}
