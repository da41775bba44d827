package daemon

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/egress"
	"github.com/corral-dev/corral/internal/egress/dns"
	"github.com/corral-dev/corral/internal/egress/nflog"
	"github.com/corral-dev/corral/internal/egress/proxy"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/netpolicy"
	"github.com/corral-dev/corral/internal/store"
)

// NetConfig configures sandbox networking in `corral up`.
type NetConfig struct {
	// Disabled turns networking off: every sandbox gets loopback only and policies other than
	// "none" are refused.
	Disabled bool
	// Pool is the sandbox address pool; Tag tells this instance's interfaces and tables apart
	// from another's on the same host. Empty: the host registry chooses (internal/hostreg:
	// "0" and 10.200.0.0/16 for the default data dir when free).
	Pool, Tag string
	// Services is the service catalog file (JSON: {"services": {"NAME": {"domains": [...],
	// "addresses": [...]}}}); empty: no services.
	Services string
	// DNSUpstreams are the resolvers the edge's resolver forwards allowed names to
	// (ADDR[:PORT]); default: the nameservers of /etc/resolv.conf.
	DNSUpstreams []string
	// MaxRules bounds one policy's rules (default 256).
	MaxRules int
}

// proxyPort is where the name-checking proxy listens on each sandbox's gateway address.
const proxyPort = 3129

// network holds what startNetwork made, for shutdown.
type network struct {
	mgr *egress.Manager
	res *dns.Resolver
	prx *proxy.Proxy
	log *nflog.Reader
}

func (n *network) close() {
	if n == nil {
		return
	}
	n.log.Close()
	n.prx.Close()
	n.res.Close()
	n.mgr.Close()
}

// resolveA asks the upstreams for name's IPv4 addresses, for the proxy's re-resolution. A name
// that does not exist is errdefs.ErrNotFound.
func resolveA(ups []netip.AddrPort) func(ctx context.Context, name string) ([]netip.Addr, error) {
	c := &mdns.Client{Timeout: 2 * time.Second}
	return func(ctx context.Context, name string) ([]netip.Addr, error) {
		q := new(mdns.Msg)
		q.SetQuestion(mdns.Fqdn(name), mdns.TypeA)
		var lastErr error
		for _, up := range ups {
			r, _, err := c.ExchangeContext(ctx, q, up.String())
			if err != nil {
				lastErr = err
				continue
			}
			if r.Rcode == mdns.RcodeNameError {
				return nil, errdefs.NotFound("%s", name)
			}
			var out []netip.Addr
			for _, rr := range r.Answer {
				if a, ok := rr.(*mdns.A); ok {
					if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
						out = append(out, ip)
					}
				}
			}
			return out, nil
		}
		return nil, fmt.Errorf("resolve %s: %w", name, lastErr)
	}
}

// startNetwork sets up sandbox networking; lookup is the edge's resolver view, bound later. own
// returns the records of the sandboxes this node may still run, whose network slots are kept.
func startNetwork(ctx context.Context, cfg Config, group uint16, own func(context.Context) ([]*store.Sandbox, error), lookup *func(netip.Addr) (dns.Sandbox, bool),
	proxyLookup *func(netip.Addr) (proxy.Sandbox, bool), dropped *func(src, dst netip.Addr, proto string, port uint16, reason string, at time.Time),
	log *slog.Logger) (*edge.NetConfig, *network, error) {
	nc := cfg.Net
	if nc.Disabled {
		return nil, nil, nil
	}
	pool := netip.MustParsePrefix("10.200.0.0/16")
	if nc.Pool != "" {
		p, err := netip.ParsePrefix(nc.Pool)
		if err != nil {
			return nil, nil, fmt.Errorf("--net-pool %q: %w", nc.Pool, err)
		}
		pool = p
	}
	var cat *netpolicy.Catalog
	if nc.Services != "" {
		c, err := netpolicy.LoadCatalog(nc.Services)
		if err != nil {
			return nil, nil, fmt.Errorf("--services: %w", err)
		}
		cat = c
	}
	ups, err := upstreams(nc.DNSUpstreams)
	if err != nil {
		return nil, nil, err
	}
	var host []netip.Prefix
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !pool.Contains(p.Addr()) {
				host = append(host, netip.PrefixFrom(p.Addr(), 32))
			}
		}
	}
	var control []netip.Prefix
	if ap, err := netip.ParseAddrPort(cfg.Listen); err == nil && ap.Addr().Is4() && !ap.Addr().IsUnspecified() {
		control = append(control, netip.PrefixFrom(ap.Addr(), 32))
	}
	blocked := netpolicy.BlockedSet(host, control, pool)

	// Slots of sandboxes that outlived the last run are kept; the edge re-adopts them.
	var keep []int
	recs, err := own(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, r := range recs {
		if r.NetSlot != nil && slices.Contains(store.LiveStates(), r.State) {
			keep = append(keep, *r.NetSlot)
		}
	}
	// Each instance logs its drops to its own NFLOG group, handed out by the host registry.
	drops, err := nflog.Listen(ctx, group, 0, func(ev nflog.Event) {
		if _, reason, ok := egress.ParseLogPrefix(ev.Prefix); ok {
			(*dropped)(ev.Src, ev.Dst, ev.Proto, ev.DstPort, reason, ev.At)
		}
	}, log)
	if err != nil {
		return nil, nil, fmt.Errorf("NFLOG group %d: %w", group, err)
	}
	mgr, err := egress.New(ctx, egress.Config{Pool: pool, Tag: nc.Tag, Blocked: blocked.Prefixes(), ProxyPort: proxyPort, LogGroup: group}, keep, log)
	if err != nil {
		drops.Close()
		return nil, nil, fmt.Errorf("sandbox networking: %w (corral up --no-net runs without it)", err)
	}
	res, err := dns.New(dns.Config{Upstreams: ups}, func(src netip.Addr) (dns.Sandbox, bool) { return (*lookup)(src) }, log)
	if err != nil {
		drops.Close()
		mgr.Close()
		return nil, nil, err
	}
	isBlocked := func(a netip.Addr) bool { _, in := blocked.Contains(a); return in || !a.Is4() }
	prx, err := proxy.New(proxy.Config{Resolve: resolveA(ups), IsBlocked: isBlocked},
		func(src netip.Addr) (proxy.Sandbox, bool) { return (*proxyLookup)(src) }, log)
	if err != nil {
		drops.Close()
		res.Close()
		mgr.Close()
		return nil, nil, err
	}
	dir := filepath.Join(cfg.DataDir, "net")
	// Root's: the resolv.conf files in it are bind-mounted by path (0644, for the sandboxes'
	// users), and no host user has a reason to reach them.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	services := 0
	if cat != nil {
		services = len(cat.Names())
	}
	log.Info("DNS resolver for sandboxes", "upstreams", ups, "services", services)
	return &edge.NetConfig{Manager: mgr, Resolver: res, Proxy: prx, ProxyPort: proxyPort, Catalog: cat, CatalogFromFile: nc.Services != "", Dir: dir, Pool: pool.String(),
			Env: netpolicy.Env{Blocked: blocked, MaxRules: nc.MaxRules}},
		&network{mgr: mgr, res: res, prx: prx, log: drops}, nil
}

// upstreams parses --dns-upstream values, or reads /etc/resolv.conf.
func upstreams(list []string) ([]netip.AddrPort, error) {
	if len(list) == 0 {
		f, err := os.Open("/etc/resolv.conf")
		if err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "nameserver" {
					list = append(list, f[1])
				}
			}
			f.Close()
		}
	}
	var out []netip.AddrPort
	for _, s := range list {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			out = append(out, ap)
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("--dns-upstream %q: want ADDR or ADDR:PORT", s)
		}
		out = append(out, netip.AddrPortFrom(a, 53))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no DNS upstream: pass --dns-upstream (none in /etc/resolv.conf)")
	}
	return out, nil
}
