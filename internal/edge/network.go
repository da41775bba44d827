package edge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/egress"
	"github.com/corral-dev/corral/internal/egress/dns"
	"github.com/corral-dev/corral/internal/egress/proxy"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/store"
)

// Sandbox networking. A sandbox whose policy is not "none" gets a slot from egress.Manager (its
// own namespace, veth and address), an nftables chain that enforces its compiled policy, and the
// edge's DNS resolver on its gateway address, which answers only the names the policy allows and
// adds what it answered to the sandbox's allow set. The policy can be replaced while the sandbox
// runs (SetNetwork). Every blocked attempt is counted: packets by reason from the chain's
// counters, DNS refusals by the resolver, and the latest refusals are kept for `corral net log`.

// NetConfig enables sandbox networking on an Edge.
type NetConfig struct {
	Manager  *egress.Manager
	Resolver *dns.Resolver
	// Proxy, when set, checks the Host/SNI of TCP 80/443 to addresses learned through DNS; it
	// listens on each slot's gateway at ProxyPort (the Manager redirects there).
	Proxy     *proxy.Proxy
	ProxyPort uint16
	// Catalog is the service catalog at start; SetCatalog replaces it while corral runs.
	Catalog *netpolicy.Catalog
	// CatalogFromFile says Catalog came from corral up --services, which then wins over one saved
	// through the API (at the next start too).
	CatalogFromFile bool
	Env             netpolicy.Env
	// Dir holds one resolv.conf per networked sandbox.
	Dir string
	// Pool is the address pool, for display.
	Pool string
}

// recentBlocked is how many blocked attempts each sandbox keeps for `corral net log`.
const recentBlocked = 256

// sandboxNet is a networked sandbox's state on the edge.
type sandboxNet struct {
	slot   *egress.Slot
	policy atomic.Pointer[netpolicy.Compiled]

	mu     sync.Mutex
	counts map[string]uint64      // refusals of the resolver and the proxy, by reason; protected by mu
	recent []model.BlockedAttempt // newest last, at most recentBlocked; protected by mu
}

func (n *sandboxNet) blocked(a model.BlockedAttempt) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.counts[a.Reason]++
	n.remember(a)
}

// remember keeps a in the latest attempts. Preconditions: n.mu is held.
func (n *sandboxNet) remember(a model.BlockedAttempt) {
	n.recent = append(n.recent, a)
	if len(n.recent) > recentBlocked {
		n.recent = append(n.recent[:0], n.recent[len(n.recent)-recentBlocked:]...)
	}
}

// compileNetwork validates a create request's or an update's policy.
func (e *Edge) compileNetwork(p *model.NetworkPolicy) (*netpolicy.Compiled, error) {
	if p == nil {
		p = &model.NetworkPolicy{}
	}
	cat := e.catalog.Load()
	var env netpolicy.Env
	if e.cfg.Net != nil {
		env = e.cfg.Net.Env
	}
	c, err := netpolicy.Compile(netpolicy.Policy(*p), cat, env)
	if err != nil {
		return nil, err
	}
	if c.Mode != model.NetworkNone && e.cfg.Net == nil {
		why := e.cfg.NetOff
		if why == "" {
			why = "not configured"
		}
		return nil, errdefs.Invalid("network", "sandbox networking is off on this node (%s): only mode none is possible", why)
	}
	return c, nil
}

// netpolicy keeps types of its own (issue 29 item 5), the API's field for field: the edge turns
// them into the API's where a record or an answer takes them, and nowhere else.
// apiserver.TestNetworkConversion holds their JSON equal.

// apiPolicy is a compiled policy's source (its mode explicit, its rules normalised) as the API's
// NetworkPolicy, which the sandbox's record keeps and shows.
func apiPolicy(c *netpolicy.Compiled) *model.NetworkPolicy {
	p := model.NetworkPolicy(c.Source)
	return &p
}

// APIServices is the catalog's services as the API lists them.
func APIServices(s []netpolicy.Service) []model.NetworkService {
	out := make([]model.NetworkService, len(s))
	for i, v := range s {
		out[i] = model.NetworkService(v)
	}
	return out
}

// slotPolicy turns a compiled policy into the rules of the sandbox's chain: deny (and the
// blocked addresses' ports a catalog service did not open), then what the catalog opened inside
// the blocked set, then the blocked set, then the allow rules.
func (e *Edge) slotPolicy(c *netpolicy.Compiled) egress.SlotPolicy {
	p := egress.SlotPolicy{Open: c.Mode == model.NetworkOpen}
	for _, r := range append(append([]netpolicy.NetRule(nil), c.DenyNets...), c.BlockedNets...) {
		p.Deny = append(p.Deny, netRule(r))
	}
	for _, r := range c.Opened {
		p.Opened = append(p.Opened, netRule(r))
	}
	for _, r := range c.AllowNets {
		p.Allow = append(p.Allow, netRule(r))
	}
	return p
}

func netRule(r netpolicy.NetRule) egress.NetRule {
	out := egress.NetRule{Prefix: r.Prefix}
	if !(r.Ports.First <= 1 && r.Ports.Last == 65535) {
		out.PortLo, out.PortHi = r.Ports.First, r.Ports.Last
	}
	switch r.Proto {
	case netpolicy.ProtoTCP:
		out.Proto = unix.IPPROTO_TCP
	case netpolicy.ProtoUDP:
		out.Proto = unix.IPPROTO_UDP
	}
	return out
}

// attachNetwork gives a new sandbox its network: a slot with the policy applied, the resolver
// listening on its gateway, and a resolv.conf naming it. It returns the paths for the runtime.
func (e *Edge) attachNetwork(ctx context.Context, rec *store.Sandbox, c *netpolicy.Compiled) (*sandboxNet, string, error) {
	nc := e.cfg.Net
	slot, err := nc.Manager.Acquire(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("network: %w", err)
	}
	n := &sandboxNet{slot: slot, counts: map[string]uint64{}}
	n.policy.Store(c)
	resolv, err := e.wireNetwork(rec.ID, n, false)
	if err != nil {
		e.detachNetwork(rec.ID, n)
		return nil, "", err
	}
	rec.NetSlot = &slot.Index
	rec.NetworkAddress = slot.SandboxAddr.String()
	return n, resolv, nil
}

// wireNetwork applies n's policy to its slot, registers it with the resolver and writes its
// resolv.conf (again, after a restart: keepDNS keeps the addresses already learned).
func (e *Edge) wireNetwork(id string, n *sandboxNet, keepDNS bool) (string, error) {
	nc := e.cfg.Net
	if err := nc.Manager.Apply(n.slot, e.slotPolicy(n.policy.Load()), keepDNS); err != nil {
		return "", fmt.Errorf("network: %w", err)
	}
	e.netMu.Lock()
	e.bySrc[n.slot.SandboxAddr] = &netTarget{id: id, net: n}
	e.netMu.Unlock()
	if _, err := nc.Resolver.Listen(netip.AddrPortFrom(n.slot.HostAddr, 53)); err != nil {
		return "", fmt.Errorf("network: resolver on %s: %w", n.slot.HostAddr, err)
	}
	if nc.Proxy != nil {
		if _, err := nc.Proxy.Listen(netip.AddrPortFrom(n.slot.HostAddr, nc.ProxyPort)); err != nil {
			return "", fmt.Errorf("network: proxy on %s: %w", n.slot.HostAddr, err)
		}
	}
	resolv := filepath.Join(nc.Dir, id+".resolv.conf")
	body := fmt.Sprintf("# written by corral: the edge's resolver answers only the names this sandbox's policy allows\nnameserver %s\noptions ndots:0 attempts:2 timeout:2\n", n.slot.HostAddr)
	if err := os.WriteFile(resolv, []byte(body), 0o644); err != nil {
		return "", fmt.Errorf("network: %w", err)
	}
	// Every user inside the sandbox reads it, whatever the daemon's umask (077) took off.
	if err := os.Chmod(resolv, 0o644); err != nil {
		return "", fmt.Errorf("network: %w", err)
	}
	return resolv, nil
}

// detachNetwork releases what attachNetwork or adoptNetwork set up. Idempotent.
func (e *Edge) detachNetwork(id string, n *sandboxNet) {
	if n == nil {
		return
	}
	nc := e.cfg.Net
	e.netMu.Lock()
	delete(e.bySrc, n.slot.SandboxAddr)
	e.netMu.Unlock()
	if err := nc.Resolver.Unlisten(netip.AddrPortFrom(n.slot.HostAddr, 53)); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		e.log.Warn("stop resolver", "sandbox", id, "err", err)
	}
	if nc.Proxy != nil {
		if err := nc.Proxy.Unlisten(netip.AddrPortFrom(n.slot.HostAddr, nc.ProxyPort)); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			e.log.Warn("stop proxy", "sandbox", id, "err", err)
		}
	}
	if err := nc.Manager.Release(n.slot); err != nil {
		e.log.Error("release network slot", "sandbox", id, "slot", n.slot.Index, "err", err)
	}
	os.Remove(filepath.Join(nc.Dir, id+".resolv.conf"))
}

// releaseSlot destroys the network slot of a sandbox found dead or half-created after a restart.
func (e *Edge) releaseSlot(rec *store.Sandbox) {
	if rec.NetSlot == nil || e.cfg.Net == nil {
		return
	}
	if err := e.cfg.Net.Manager.Release(e.cfg.Net.Manager.Slot(*rec.NetSlot)); err != nil {
		e.log.Error("release network slot", "sandbox", rec.ID, "slot", *rec.NetSlot, "err", err)
	}
	os.Remove(filepath.Join(e.cfg.Net.Dir, rec.ID+".resolv.conf"))
	rec.NetSlot = nil
}

// adoptNetwork re-creates a re-adopted sandbox's network state after a restart of corral.
func (e *Edge) adoptNetwork(rec *store.Sandbox) (*sandboxNet, error) {
	if rec.NetSlot == nil || e.cfg.Net == nil {
		return nil, nil
	}
	c, err := e.compileNetwork(rec.Network)
	if err != nil {
		return nil, fmt.Errorf("recompile network policy: %w", err)
	}
	slot, err := e.cfg.Net.Manager.Adopt(*rec.NetSlot)
	if err != nil {
		return nil, err
	}
	n := &sandboxNet{slot: slot, counts: map[string]uint64{}}
	n.policy.Store(c)
	if _, err := e.wireNetwork(rec.ID, n, true); err != nil {
		return nil, err
	}
	return n, nil
}

// netTarget is what the resolver needs of a sandbox.
type netTarget struct {
	id  string
	net *sandboxNet
}

// ResolverLookup is the DNS resolver's view of the sandboxes: by source address.
func (e *Edge) ResolverLookup(src netip.Addr) (dns.Sandbox, bool) {
	e.netMu.Lock()
	t := e.bySrc[src]
	e.netMu.Unlock()
	if t == nil {
		return dns.Sandbox{}, false
	}
	n := t.net
	return dns.Sandbox{
		ID:     t.id,
		Policy: n.policy.Load(),
		Allow: func(name string, ip netip.Addr, ttl time.Duration) {
			if err := e.allowResolved(n, name, ip, ttl); err != nil {
				e.log.Error("allow resolved address", "sandbox", t.id, "name", name, "ip", ip, "err", err)
			}
		},
		Blocked: func(name string, qtype uint16, reason string) {
			n.blocked(model.BlockedAttempt{At: time.Now().UTC(), Reason: reason, Name: name, Protocol: "dns", Port: 53})
		},
	}, true
}

// maxPortsPerName bounds the (address, port) entries one answered name may add; a name allowed
// on more ports than this is allowed on every port of its addresses (and logged).
const maxPortsPerName = 256

// allowResolved lets the sandbox reach ip, which the resolver answered for name, on the ports and
// protocols of the rules that allow name: every port when one of them has no port limit.
func (e *Edge) allowResolved(n *sandboxNet, name string, ip netip.Addr, ttl time.Duration) error {
	m := e.cfg.Net.Manager
	rules, _ := n.policy.Load().NameRules(name)
	if n.policy.Load().Mode == model.NetworkOpen && len(rules) == 0 {
		return nil // open mode reaches it anyway
	}
	type key struct {
		proto uint8
		port  uint16
	}
	var wanted []key
	for _, r := range rules {
		if r.Ports.First <= 1 && r.Ports.Last == 65535 && r.Proto == netpolicy.ProtoBoth {
			return m.AllowAddr(n.slot, ip, ttl)
		}
		for _, proto := range []struct {
			p  netpolicy.Proto
			ip uint8
		}{{netpolicy.ProtoTCP, unix.IPPROTO_TCP}, {netpolicy.ProtoUDP, unix.IPPROTO_UDP}} {
			if !r.Proto.Has(proto.p) {
				continue
			}
			for port := int(max(r.Ports.First, 1)); port <= int(r.Ports.Last); port++ {
				wanted = append(wanted, key{proto.ip, uint16(port)})
				if len(wanted) > maxPortsPerName {
					e.log.Warn("name allowed on too many ports to list: allowing every port of its addresses", "name", name, "rule", r.Rule)
					return m.AllowAddr(n.slot, ip, ttl)
				}
			}
		}
	}
	for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
		var ports []uint16
		for _, k := range wanted {
			if k.proto == proto {
				ports = append(ports, k.port)
			}
		}
		if err := m.AllowAddrPort(n.slot, ip, proto, ports, ttl); err != nil {
			return err
		}
	}
	return nil
}

// ProxyLookup is the name-checking proxy's view of the sandboxes: by source address.
func (e *Edge) ProxyLookup(src netip.Addr) (proxy.Sandbox, bool) {
	e.netMu.Lock()
	t := e.bySrc[src]
	e.netMu.Unlock()
	if t == nil {
		return proxy.Sandbox{}, false
	}
	n := t.net
	return proxy.Sandbox{
		ID:     t.id,
		Policy: n.policy.Load(),
		Blocked: func(a proxy.Attempt) {
			n.blocked(model.BlockedAttempt{At: time.Now().UTC(), Reason: a.Reason, Name: a.Name,
				Dest: a.Dest.Addr().String(), Port: int(a.Dest.Port()), Protocol: a.Proto})
		},
	}, true
}

// LoggedDrop records a packet the sandbox's chain dropped and logged (NFLOG): its destination,
// port and protocol go into the latest attempts (the chain's counters already count it).
func (e *Edge) LoggedDrop(src, dst netip.Addr, proto string, port uint16, reason string, at time.Time) {
	e.netMu.Lock()
	t := e.bySrc[src]
	e.netMu.Unlock()
	if t == nil {
		return
	}
	t.net.mu.Lock()
	t.net.remember(model.BlockedAttempt{At: at.UTC(), Reason: reason, Dest: dst.String(), Port: int(port), Protocol: proto})
	t.net.mu.Unlock()
}

// SetNetwork replaces a running sandbox's egress policy. It takes effect for the next packet of
// every connection; the record keeps it across restarts.
func (e *Edge) SetNetwork(ctx context.Context, id string, p model.NetworkPolicy) (*store.Sandbox, error) {
	c, err := e.compileNetwork(&p)
	if err != nil {
		return nil, err
	}
	sb, err := e.ownSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone {
		return nil, errdefs.Conflict("sandbox %s stopped", id)
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	n := sb.net
	if n == nil {
		if c.Mode != model.NetworkNone {
			return nil, errdefs.Conflict("sandbox %s was created without networking (network mode none): its network cannot be turned on later; create it with a policy", id)
		}
		return rec, nil
	}
	if err := e.cfg.Net.Manager.Apply(n.slot, e.slotPolicy(c), false); err != nil {
		return nil, err
	}
	n.policy.Store(c)
	rec.Network = apiPolicy(c)
	if err := e.records.PutSandbox(ctx, rec); err != nil {
		return nil, err
	}
	e.log.Info("network policy replaced", "sandbox", id, "mode", c.Mode, "allow", len(c.Source.Allow), "deny", len(c.Source.Deny))
	return e.withNetStats(rec), nil
}

// BlockedAttempts returns a sandbox's latest blocked attempts, oldest first.
func (e *Edge) BlockedAttempts(ctx context.Context, id string) ([]model.BlockedAttempt, error) {
	sb, err := e.liveSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.net == nil {
		return []model.BlockedAttempt{}, nil
	}
	sb.net.mu.Lock()
	defer sb.net.mu.Unlock()
	return append([]model.BlockedAttempt{}, sb.net.recent...), nil
}

// withNetStats fills the live egress counters of a running sandbox's record.
func (e *Edge) withNetStats(rec *store.Sandbox) *store.Sandbox {
	if sb := e.lookup(rec.ID); sb != nil && sb.net != nil {
		rec.Egress = e.withNetStatsOf(sb)
	}
	return rec
}

// withNetStatsOf counts a networked sandbox's blocked attempts: packets by reason from its
// chain's counters, refusals of the resolver and the proxy, and its data-plane actions.
func (e *Edge) withNetStatsOf(sb *sandbox) *model.EgressStats {
	st := &model.EgressStats{Blocked: map[string]uint64{}}
	if cnt, err := e.cfg.Net.Manager.Counters(sb.net.slot); err == nil {
		for k, v := range cnt {
			st.Blocked[k] += v
		}
	}
	sb.net.mu.Lock()
	for k, v := range sb.net.counts {
		st.Blocked[k] += v
	}
	sb.net.mu.Unlock()
	for _, v := range st.Blocked {
		st.BlockedTotal += v
	}
	st.Actions = sb.actions.Load()
	if st.Actions > 0 {
		st.BlockedPer1000Actions = float64(st.BlockedTotal) * 1000 / float64(st.Actions)
	}
	return st
}

// NetworkServices lists the operator's service catalog.
func (e *Edge) NetworkServices() []model.NetworkService {
	cat := e.catalog.Load()
	if cat == nil {
		return []model.NetworkService{}
	}
	return APIServices(cat.Services())
}

// catalogSetting is the store key of the catalog saved through the API.
const catalogSetting = store.CatalogSetting

// SetCatalog replaces the service catalog with raw (the --services file's JSON shape) and saves
// it. Policies compiled before keep the services as they were until they are set again.
func (e *Edge) SetCatalog(ctx context.Context, raw []byte) ([]model.NetworkService, error) {
	if e.cfg.Net == nil {
		return nil, errdefs.Invalid("catalog", "sandbox networking is off on this node (%s)", e.cfg.NetOff)
	}
	if e.cfg.Net.CatalogFromFile {
		return nil, errdefs.Conflict("the catalog comes from corral up --services: change that file and restart, or start without --services to manage it through the API")
	}
	cat, err := netpolicy.ParseCatalog(raw)
	if err != nil {
		return nil, err
	}
	if err := e.store.PutSetting(ctx, catalogSetting, raw); err != nil {
		return nil, err
	}
	e.catalog.Store(cat)
	e.catalogRaw.Store(&raw)
	e.log.Info("service catalog replaced", "services", len(cat.Names()))
	return APIServices(cat.Services()), nil
}

// syncCatalog takes up a catalog saved through another edge of a cluster (the nodes share one
// store), within a flush interval. A catalog from --services stays this node's own.
func (e *Edge) syncCatalog(ctx context.Context) error {
	if e.cfg.Net == nil || e.cfg.Net.CatalogFromFile {
		return nil
	}
	changed, err := e.readCatalog(ctx)
	if changed {
		e.log.Info("service catalog saved through the API taken up", "services", len(e.catalog.Load().Names()))
	}
	return err
}

// loadCatalog picks the catalog at start: --services, else the one saved through the API.
func (e *Edge) loadCatalog(ctx context.Context) error {
	if e.cfg.Net == nil {
		return nil
	}
	if e.cfg.Net.CatalogFromFile {
		e.catalog.Store(e.cfg.Net.Catalog)
		return nil
	}
	_, err := e.readCatalog(ctx)
	return err
}

// readCatalog puts the catalog saved through the API in force, when there is one and it is not
// the one in force already (changed).
func (e *Edge) readCatalog(ctx context.Context) (changed bool, err error) {
	raw, err := e.settings.ServiceCatalog(ctx)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if old := e.catalogRaw.Load(); old != nil && bytes.Equal(*old, raw) {
		return false, nil
	}
	cat, err := netpolicy.ParseCatalog(raw)
	if err != nil {
		return false, fmt.Errorf("the service catalog saved through the API: %w", err)
	}
	e.catalog.Store(cat)
	e.catalogRaw.Store(&raw)
	return true, nil
}
