// Package dns is the resolver the edge runs for sandboxes under an egress policy. It answers only
// sandboxes it can identify by a query's source address, forwards the names their policy allows to
// the upstream resolvers, hands every IPv4 address it answers to the enforcement layer
// (Sandbox.Allow) for as long as the sandbox may use it, and refuses everything else: names the
// policy denies, query types that carry data (TXT, NULL, ANY, ...), malformed or oversized names,
// and queries over a sandbox's rate. It is never an open resolver.
//
// Lifecycle: New, then Listen on each address sandboxes send queries to (UDP and TCP on the same
// port), Unlisten when one goes away, and Close once. Each listener owns two serving goroutines,
// which end at Unlisten or Close; queries in flight end at the upstream timeout or at Close,
// whichever comes first.
//
// Lock order: Resolver.mu and limiter.mu are never held together.
package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	miekg "github.com/miekg/dns"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Defaults of Config.
const (
	DefaultTimeout = 2 * time.Second
	DefaultMinTTL  = 30 * time.Second
	DefaultMaxTTL  = time.Hour
	DefaultRate    = 200
	DefaultBurst   = 400
)

// The reasons passed to Sandbox.Blocked.
const (
	// ReasonRefused: the sandbox's policy does not allow the name.
	ReasonRefused = "dns_refused"
	// ReasonType: a query class or type other than IN A, AAAA or CNAME.
	ReasonType = "dns_type"
	// ReasonTunnel: a query shaped like tunnelling: more than one question, a name longer than 253
	// characters, a label longer than 63, or characters outside letters, digits, '-' and '_'.
	ReasonTunnel = "dns_tunnel"
	// ReasonRate: the sandbox is over its query rate.
	ReasonRate = "dns_rate"
)

// Config configures a Resolver. Zero fields take the defaults documented on each.
type Config struct {
	// Upstreams are the resolvers that allowed queries are forwarded to: UDP, then TCP when the UDP
	// answer is truncated. At least one is required.
	Upstreams []netip.AddrPort
	// Timeout bounds one attempt at one upstream (default 2s). A failed attempt is retried once,
	// on the next upstream when there are several.
	Timeout time.Duration
	// MinTTL and MaxTTL clamp the lifetime handed to Sandbox.Allow (defaults 30s and 1h). Answer
	// TTLs are cut to MaxTTL, so a sandbox never caches an address longer than its allow-set entry
	// lives.
	MinTTL, MaxTTL time.Duration
	// Rate and Burst size each sandbox's token bucket: queries per second and the most at once
	// (defaults 200 and 400).
	Rate  float64
	Burst int
	// DenyNXDomain answers names the policy denies with NXDOMAIN instead of REFUSED. Every other
	// refusal is REFUSED.
	DenyNXDomain bool
}

func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MinTTL == 0 {
		c.MinTTL = DefaultMinTTL
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	return c
}

// maxTTL is the largest TTL a DNS record can carry.
const maxTTL = time.Duration(1<<31-1) * time.Second

// Validate reports the first invalid field of c, after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	if len(c.Upstreams) == 0 {
		return errdefs.Invalid("dns.upstreams", "at least one upstream resolver is required")
	}
	for _, u := range c.Upstreams {
		if !u.IsValid() || u.Port() == 0 || u.Addr().IsUnspecified() {
			return errdefs.Invalid("dns.upstreams", "%s is not an address and port", u)
		}
	}
	switch {
	case c.Timeout < 0:
		return errdefs.Invalid("dns.timeout", "must be positive, got %s", c.Timeout)
	case c.MinTTL < time.Second:
		return errdefs.Invalid("dns.min_ttl", "must be at least 1s, got %s", c.MinTTL)
	case c.MaxTTL < c.MinTTL || c.MaxTTL > maxTTL:
		return errdefs.Invalid("dns.max_ttl", "must be between min_ttl %s and %s, got %s", c.MinTTL, maxTTL, c.MaxTTL)
	case !(c.Rate > 0):
		return errdefs.Invalid("dns.rate", "must be positive, got %g", c.Rate)
	case c.Burst < 1:
		return errdefs.Invalid("dns.burst", "must be at least 1, got %d", c.Burst)
	}
	return nil
}

// Policy decides which names a sandbox may resolve.
type Policy interface {
	// AllowsName reports whether the sandbox may resolve name (lowercase, no trailing dot), and the
	// rule that decided, for logs.
	AllowsName(name string) (allowed bool, rule string)
}

// Sandbox is what the resolver needs to know about the sandbox behind a source address. Nil
// functions are skipped; a nil Policy allows nothing.
type Sandbox struct {
	// ID names the sandbox in logs.
	ID     string
	Policy Policy
	// Allow is called for every IPv4 address answered for an allowed name, with the queried name
	// and, when a CNAME chain led elsewhere, again with the owner name of the address record (both
	// lowercase, no trailing dot). The enforcement layer adds ip to the sandbox's allow set for
	// ttl, which is clamped to [Config.MinTTL, Config.MaxTTL]. Loopback, link-local, multicast and
	// unspecified addresses are answered but never passed to Allow.
	Allow func(name string, ip netip.Addr, ttl time.Duration)
	// Blocked is called for every refused query with one of the Reason constants.
	Blocked func(name string, qtype uint16, reason string)
}

// LookupFunc returns the sandbox that owns src, a query's source address. It is called for every
// query, concurrently, and must be fast.
type LookupFunc func(src netip.Addr) (Sandbox, bool)

// Stats is a snapshot of a Resolver's counters since New. Per-sandbox counts are the caller's, via
// Sandbox.Blocked.
type Stats struct {
	Queries       uint64 // messages handled, from any source
	UnknownSource uint64 // refused because the source is no sandbox's; never forwarded
	Malformed     uint64 // answered FORMERR or NOTIMP: no question, or not a standard query
	Allowed       uint64 // allowed by policy: forwarded, or AAAA answered empty
	EmptyAAAA     uint64 // of Allowed, AAAA queries answered with an empty NOERROR
	RefusedName   uint64 // ReasonRefused
	RefusedType   uint64 // ReasonType
	RefusedTunnel uint64 // ReasonTunnel
	RefusedRate   uint64 // ReasonRate
	// UpstreamErrors counts allowed queries answered SERVFAIL because no upstream answered.
	UpstreamErrors uint64
}

type counters struct {
	queries, unknownSource, malformed, allowed, emptyAAAA                atomic.Uint64
	refusedName, refusedType, refusedTunnel, refusedRate, upstreamErrors atomic.Uint64
}

// Resolver answers sandboxes' DNS queries. Its methods are safe for concurrent use.
type Resolver struct {
	cfg    Config
	lookup LookupFunc
	log    *slog.Logger
	limits *limiter
	udp    *miekg.Client
	tcp    *miekg.Client
	stats  counters
	// next picks the first upstream of a query, round robin.
	next atomic.Uint64
	// ctx ends at Close and bounds every upstream exchange.
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// listeners holds the serving addresses. Protected by mu.
	listeners map[netip.AddrPort]*listener
	// closed is set by Close. Protected by mu.
	closed bool
}

// New returns a Resolver that serves the sandboxes lookup knows. It listens nowhere until Listen.
func New(cfg Config, lookup LookupFunc, log *slog.Logger) (*Resolver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("dns config: %w", err)
	}
	if lookup == nil {
		return nil, errdefs.Invalid("lookup", "a sandbox lookup is required")
	}
	cfg = cfg.withDefaults()
	cfg.Upstreams = slices.Clone(cfg.Upstreams)
	ctx, cancel := context.WithCancel(context.Background())
	return &Resolver{
		cfg:       cfg,
		lookup:    lookup,
		log:       log,
		limits:    newLimiter(cfg.Rate, cfg.Burst),
		udp:       &miekg.Client{Net: "udp", Timeout: cfg.Timeout, UDPSize: upstreamUDPSize},
		tcp:       &miekg.Client{Net: "tcp", Timeout: cfg.Timeout},
		ctx:       ctx,
		cancel:    cancel,
		listeners: make(map[netip.AddrPort]*listener),
	}, nil
}

// listener is one address served over UDP and TCP.
type listener struct {
	udp, tcp *miekg.Server
	// wg counts the two serving goroutines.
	wg sync.WaitGroup
}

// Listen serves queries on addr over UDP and TCP and returns the address bound: with port 0, both
// protocols get the same free port. It fails if the resolver is closed or addr is taken.
func (r *Resolver) Listen(addr netip.AddrPort) (netip.AddrPort, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return netip.AddrPort{}, fmt.Errorf("listen %s: %w", addr, net.ErrClosed)
	}
	if _, ok := r.listeners[addr]; ok {
		return netip.AddrPort{}, errdefs.Conflict("listen %s: already listening", addr)
	}
	pc, ln, err := bind(addr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("listen %s: %w", addr, err)
	}
	bound := netip.AddrPortFrom(addr.Addr(), uint16(pc.LocalAddr().(*net.UDPAddr).Port))
	handler := miekg.HandlerFunc(r.serveDNS)
	l := &listener{
		udp: &miekg.Server{PacketConn: pc, Handler: handler, MsgAcceptFunc: acceptQuery},
		tcp: &miekg.Server{Listener: ln, Handler: handler, MsgAcceptFunc: acceptQuery},
	}
	if err := r.serve(l, l.udp, "udp", bound); err != nil {
		ln.Close()
		return netip.AddrPort{}, fmt.Errorf("listen %s: %w", addr, err)
	}
	if err := r.serve(l, l.tcp, "tcp", bound); err != nil {
		ln.Close()
		l.udp.Shutdown()
		l.wg.Wait()
		return netip.AddrPort{}, fmt.Errorf("listen %s: %w", addr, err)
	}
	r.listeners[bound] = l
	r.log.Info("dns listening", "addr", bound)
	return bound, nil
}

// bind opens UDP and TCP sockets on addr. With port 0 it retries a few times to find a port free
// for both.
func bind(addr netip.AddrPort) (*net.UDPConn, *net.TCPListener, error) {
	for try := 0; ; try++ {
		pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		if err != nil {
			return nil, nil, err
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr.Addr(), uint16(port))))
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		if addr.Port() != 0 || try == 4 {
			return nil, nil, err
		}
	}
}

// serve starts srv on a goroutine counted by l.wg and returns once it serves, or fails to start.
func (r *Resolver) serve(l *listener, srv *miekg.Server, proto string, addr netip.AddrPort) error {
	started := make(chan struct{})
	failed := make(chan error, 1)
	srv.NotifyStartedFunc = func() { close(started) }
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		if err := srv.ActivateAndServe(); err != nil {
			r.log.Error("dns serve", "addr", addr, "proto", proto, "err", err)
			failed <- err
		}
	}()
	select {
	case <-started:
		return nil
	case err := <-failed:
		return fmt.Errorf("serve %s: %w", proto, err)
	}
}

// shutdown stops both servers and waits for their goroutines, which wait for the queries in flight.
func (l *listener) shutdown() {
	l.tcp.Shutdown()
	l.udp.Shutdown()
	l.wg.Wait()
}

// Unlisten stops serving addr, as returned by Listen, and frees its ports once the queries in
// flight on it are answered.
func (r *Resolver) Unlisten(addr netip.AddrPort) error {
	r.mu.Lock()
	l, ok := r.listeners[addr]
	delete(r.listeners, addr)
	r.mu.Unlock()
	if !ok {
		return errdefs.NotFound("dns listener %s", addr)
	}
	l.shutdown()
	r.log.Info("dns stopped listening", "addr", addr)
	return nil
}

// Addrs returns the addresses served, sorted.
func (r *Resolver) Addrs() []netip.AddrPort {
	r.mu.Lock()
	defer r.mu.Unlock()
	addrs := make([]netip.AddrPort, 0, len(r.listeners))
	for a := range r.listeners {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.AddrPort.Compare)
	return addrs
}

// Close stops every listener, cancels the upstream queries in flight and waits for the serving
// goroutines to end. Later calls do nothing.
func (r *Resolver) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	ls := r.listeners
	r.listeners = nil
	r.mu.Unlock()

	r.cancel()
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Go(l.shutdown)
	}
	wg.Wait()
	return nil
}

// Stats returns a snapshot of the counters.
func (r *Resolver) Stats() Stats {
	c := &r.stats
	return Stats{
		Queries:        c.queries.Load(),
		UnknownSource:  c.unknownSource.Load(),
		Malformed:      c.malformed.Load(),
		Allowed:        c.allowed.Load(),
		EmptyAAAA:      c.emptyAAAA.Load(),
		RefusedName:    c.refusedName.Load(),
		RefusedType:    c.refusedType.Load(),
		RefusedTunnel:  c.refusedTunnel.Load(),
		RefusedRate:    c.refusedRate.Load(),
		UpstreamErrors: c.upstreamErrors.Load(),
	}
}

// errNoAnswer is an upstream answer other than NOERROR or NXDOMAIN.
var errNoAnswer = errors.New("no usable answer")
