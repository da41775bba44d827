// Package proxy is the transparent TCP proxy that checks which host a sandbox's web traffic is
// for. The host's nftables rules redirect a sandbox's TCP connections to ports 80 and 443 to a
// Proxy listener; the proxy recovers the original destination (SO_ORIGINAL_DST), reads without
// answering the TLS ClientHello's server name (SNI) or the HTTP/1.x Host header, and connects the
// sandbox to that destination only if the sandbox's policy allows the name, the name resolves to
// the destination right now, and the destination is outside the blocked ranges. A sandbox that
// resolves an allowed name and then sends another one, or that connects to a shared CDN address
// for another host, is refused. TLS is never terminated: the proxy reads the ClientHello, then
// copies bytes.
//
// The protocol is told by the first byte (22, a TLS handshake record, or else HTTP/1.x), not by
// the port, so the rules may redirect other ports too.
//
// What it cannot see: after the first request, later requests on a kept-alive HTTP/1.1
// connection, and everything inside TLS (HTTP/2 connection reuse across names, domain fronting,
// Encrypted Client Hello), may name other hosts served at the same verified address. The proxy
// narrows egress to the addresses of allowed names and to the first name asked for; it is no
// HTTP-level filter.
//
// Lifecycle: New, then Listen on each address the rules redirect to, and Close once. Each listener
// owns an accept goroutine, each connection a goroutine and, while its bytes are copied, a second
// one; all end at Close, which closes every listener and connection and waits for them.
//
// Lock order: only Proxy.mu, never held while calling out.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Defaults of Config.
const (
	DefaultDialTimeout        = 5 * time.Second
	DefaultPeekTimeout        = 5 * time.Second
	DefaultResolveTimeout     = 5 * time.Second
	DefaultMaxPeek            = 16 << 10
	DefaultIdleTimeout        = 5 * time.Minute
	DefaultMaxConns           = 10000
	DefaultMaxConnsPerSandbox = 1000
)

// Bounds of Config.MaxPeek.
const (
	minPeek = 1 << 10
	maxPeek = 1 << 20
)

// The reasons of a refused Attempt.
const (
	// ReasonSNIMismatch: the policy does not allow the name of the ClientHello or request, or an
	// HTTP request target names another host than its Host header.
	ReasonSNIMismatch = "sni_mismatch"
	// ReasonNameAddressMismatch: the original destination is none of the name's current addresses.
	ReasonNameAddressMismatch = "name_address_mismatch"
	// ReasonBlockedRange: the original destination is in a blocked range (Config.IsBlocked).
	ReasonBlockedRange = "blocked_range"
	// ReasonNoSNI: no name to check: a ClientHello without server_name or a request without Host,
	// an IP address or malformed name instead, a header block over Config.MaxPeek, or bytes that
	// are neither a TLS ClientHello nor an HTTP/1.x request.
	ReasonNoSNI = "no_sni"
)

// reasons lists the Reason constants; Stats.Refused has one entry for each.
var reasons = [...]string{ReasonSNIMismatch, ReasonNameAddressMismatch, ReasonBlockedRange, ReasonNoSNI}

// Config configures a Proxy. Zero fields take the defaults documented on each.
type Config struct {
	// Resolve returns the current addresses of name (lowercase, no trailing dot), following
	// CNAMEs, as the sandbox's resolver would answer them. It is called for every connection with
	// an allowed name, concurrently, so it should cache within the answers' TTLs. A name without
	// addresses is an empty answer or an error wrapping errdefs.ErrNotFound; any other error is a
	// failure of resolution, and the connection is closed unjudged. Required.
	Resolve func(ctx context.Context, name string) ([]netip.Addr, error)
	// IsBlocked reports destinations never connected to, whatever the name; the proxy dials from
	// the host, so this must cover the host's own and internal networks (default
	// DefaultIsBlocked).
	IsBlocked func(netip.Addr) bool
	// OriginalDst returns the destination a redirected connection was sent to (default: the
	// connection's SO_ORIGINAL_DST, IPv4 only). Tests replace it.
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	// DialTimeout bounds connecting to the destination (default 5s).
	DialTimeout time.Duration
	// PeekTimeout bounds the wait for a whole ClientHello or request header block, from accept
	// (default 5s), so that slow senders cannot hold connections.
	PeekTimeout time.Duration
	// ResolveTimeout bounds one call of Resolve (default 5s).
	ResolveTimeout time.Duration
	// MaxPeek is the most bytes read for a ClientHello or request header block, between 1 KiB and
	// 1 MiB (default 16 KiB); longer ones are refused with ReasonNoSNI.
	MaxPeek int
	// IdleTimeout closes a connection whose bytes have stopped moving in both directions for this
	// long (default 5m).
	IdleTimeout time.Duration
	// MaxConns bounds the connections open at once, from accept to close (default 10000), and
	// MaxConnsPerSandbox those of one sandbox (default 1000), so that one sandbox cannot take
	// them all. Connections over either bound are closed at once and counted in Stats.Overloaded.
	MaxConns, MaxConnsPerSandbox int
}

func (c Config) withDefaults() Config {
	if c.IsBlocked == nil {
		c.IsBlocked = DefaultIsBlocked
	}
	if c.OriginalDst == nil {
		c.OriginalDst = originalDst
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.PeekTimeout == 0 {
		c.PeekTimeout = DefaultPeekTimeout
	}
	if c.ResolveTimeout == 0 {
		c.ResolveTimeout = DefaultResolveTimeout
	}
	if c.MaxPeek == 0 {
		c.MaxPeek = DefaultMaxPeek
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MaxConnsPerSandbox == 0 {
		c.MaxConnsPerSandbox = DefaultMaxConnsPerSandbox
	}
	return c
}

// Validate reports the first invalid field of c, after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Resolve == nil:
		return errdefs.Invalid("proxy.resolve", "a resolver is required")
	case c.DialTimeout < 0:
		return errdefs.Invalid("proxy.dial_timeout", "must be positive, got %s", c.DialTimeout)
	case c.PeekTimeout < 0:
		return errdefs.Invalid("proxy.peek_timeout", "must be positive, got %s", c.PeekTimeout)
	case c.ResolveTimeout < 0:
		return errdefs.Invalid("proxy.resolve_timeout", "must be positive, got %s", c.ResolveTimeout)
	case c.IdleTimeout < 0:
		return errdefs.Invalid("proxy.idle_timeout", "must be positive, got %s", c.IdleTimeout)
	case c.MaxPeek < minPeek || c.MaxPeek > maxPeek:
		return errdefs.Invalid("proxy.max_peek", "must be between %d and %d bytes, got %d", minPeek, maxPeek, c.MaxPeek)
	case c.MaxConns < 1:
		return errdefs.Invalid("proxy.max_conns", "must be at least 1, got %d", c.MaxConns)
	case c.MaxConnsPerSandbox < 1:
		return errdefs.Invalid("proxy.max_conns_per_sandbox", "must be at least 1, got %d", c.MaxConnsPerSandbox)
	}
	return nil
}

// blockedPrefixes are the IPv4 ranges DefaultIsBlocked adds to the non-global and private ones.
var blockedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),     // "this network"
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT, used by cloud metadata services
	netip.MustParsePrefix("192.0.0.0/24"),  // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"), // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),   // reserved
}

// DefaultIsBlocked reports addresses that are not public unicast: loopback, link-local,
// multicast, unspecified, private (RFC 1918, fc00::/7), carrier-grade NAT and reserved ranges.
func DefaultIsBlocked(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsGlobalUnicast() || a.IsPrivate() {
		return true
	}
	for _, p := range blockedPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Policy decides which names a sandbox may connect to.
type Policy interface {
	// AllowsName reports whether the sandbox may connect to name (lowercase, no trailing dot),
	// and the rule that decided, for logs.
	AllowsName(name string) (allowed bool, rule string)
}

// Attempt is a connection the proxy refused.
type Attempt struct {
	// Reason is one of the Reason constants.
	Reason string
	// Name is the name asked for, lowercase without a trailing dot; empty with ReasonNoSNI.
	Name string
	// Dest is the original destination.
	Dest netip.AddrPort
	// Proto is always "tcp".
	Proto string
}

// Sandbox is what the proxy needs to know about the sandbox behind a source address. A nil
// Policy allows nothing; a nil Blocked is skipped.
type Sandbox struct {
	// ID names the sandbox in logs.
	ID     string
	Policy Policy
	// Blocked is called for every refused connection, on the connection's goroutine, before the
	// connection is closed; it must not block for long.
	Blocked func(Attempt)
}

// LookupFunc returns the sandbox that owns src, a connection's source address. It is called for
// every connection, concurrently, and must be fast.
type LookupFunc func(src netip.Addr) (Sandbox, bool)

// Stats is a snapshot of a Proxy's counters since New. Per-sandbox counts are the caller's, via
// Sandbox.Blocked.
type Stats struct {
	Accepted      uint64 // connections accepted, from any source
	Overloaded    uint64 // closed at once: MaxConns, or MaxConnsPerSandbox of its sandbox, were open
	UnknownSource uint64 // closed: the source is no sandbox's
	NoOriginalDst uint64 // closed: no original destination (not redirected, or not IPv4)
	// Incomplete counts connections closed before a whole ClientHello or request header block
	// arrived: the client hung up, or PeekTimeout passed.
	Incomplete uint64
	// Refused counts refusals by reason; it has an entry for each Reason constant.
	Refused map[string]uint64
	// ResolveErrors counts connections closed because Config.Resolve failed.
	ResolveErrors uint64
	// DialErrors counts allowed connections whose destination could not be reached.
	DialErrors uint64
	// Allowed counts connections connected to their destination.
	Allowed uint64
	// BytesUp and BytesDown count bytes copied to destinations (peeked bytes included) and back.
	BytesUp, BytesDown uint64
	// Open is the number of connections open now, from accept to close.
	Open int64
}

type counters struct {
	accepted, overloaded, unknownSource, noOriginalDst, incomplete atomic.Uint64
	resolveErrors, dialErrors, allowed, bytesUp, bytesDown         atomic.Uint64
	refused                                                        [len(reasons)]atomic.Uint64
	open                                                           atomic.Int64
}

func (c *counters) refuse(reason string) {
	for i, r := range reasons {
		if r == reason {
			c.refused[i].Add(1)
		}
	}
}

// Proxy checks and forwards sandboxes' redirected connections. Its methods are safe for
// concurrent use.
type Proxy struct {
	cfg    Config
	lookup LookupFunc
	log    *slog.Logger
	stats  counters
	// slots holds a token for each open connection, MaxConns at most.
	slots chan struct{}
	// ctx ends at Close; it bounds dials and resolutions and closes every connection.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts the accept and connection goroutines.
	wg sync.WaitGroup

	mu sync.Mutex
	// listeners holds the listening sockets by bound address. Protected by mu.
	listeners map[netip.AddrPort]*net.TCPListener
	// perSandbox counts the open connections of each sandbox with any, by ID. Protected by mu.
	perSandbox map[string]int
	// closed is set by Close. Protected by mu.
	closed bool
}

// New returns a Proxy for the sandboxes lookup knows. It listens nowhere until Listen. A nil log
// discards.
func New(cfg Config, lookup LookupFunc, log *slog.Logger) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	if lookup == nil {
		return nil, errdefs.Invalid("lookup", "a sandbox lookup is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Proxy{
		cfg:        cfg,
		lookup:     lookup,
		log:        log,
		slots:      make(chan struct{}, cfg.MaxConns),
		ctx:        ctx,
		cancel:     cancel,
		listeners:  make(map[netip.AddrPort]*net.TCPListener),
		perSandbox: make(map[string]int),
	}, nil
}

// Listen accepts connections on addr, an IPv4 address, and returns the address bound (port 0
// picks a free port). It fails if the proxy is closed or addr is taken. An nftables redirect
// sends a connection to the primary address of the interface it came in on (a sandbox's host
// veth), so listen on 0.0.0.0 or on each of those; DNAT can name one address. Connections made
// to a listener directly, not redirected, are closed.
func (p *Proxy) Listen(addr netip.AddrPort) (netip.AddrPort, error) {
	if !addr.Addr().Is4() {
		return netip.AddrPort{}, errdefs.Invalid("addr", "%s is not an IPv4 address and port", addr)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return netip.AddrPort{}, fmt.Errorf("listen %s: %w", addr, net.ErrClosed)
	}
	if _, ok := p.listeners[addr]; ok {
		return netip.AddrPort{}, errdefs.Conflict("listen %s: already listening", addr)
	}
	ln, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(addr))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("listen %s: %w", addr, err)
	}
	bound := netip.AddrPortFrom(addr.Addr(), uint16(ln.Addr().(*net.TCPAddr).Port))
	p.listeners[bound] = ln
	p.wg.Add(1)
	go p.serve(ln, bound)
	p.log.Info("egress proxy listening", "addr", bound)
	return bound, nil
}

// Unlisten stops listening on addr (as Listen returned it); connections already accepted go on.
// errdefs.ErrNotFound if it is not listening there.
func (p *Proxy) Unlisten(addr netip.AddrPort) error {
	p.mu.Lock()
	ln, ok := p.listeners[addr]
	delete(p.listeners, addr)
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFound("proxy listener %s", addr)
	}
	p.log.Info("egress proxy stopped listening", "addr", addr)
	return ln.Close()
}

// serve accepts connections until ln is closed and hands each to its own goroutine.
func (p *Proxy) serve(ln *net.TCPListener, addr netip.AddrPort) {
	defer p.wg.Done()
	var backoff time.Duration
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return // Close, or Unlisten of this address
			}
			// Out of file descriptors or the like: wait a little, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.log.Warn("egress proxy accept", "addr", addr, "err", err)
			select {
			case <-time.After(backoff):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		p.stats.accepted.Add(1)
		select {
		case p.slots <- struct{}{}:
		default:
			p.stats.overloaded.Add(1)
			c.Close()
			continue
		}
		p.stats.open.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() {
				p.stats.open.Add(-1)
				<-p.slots
			}()
			p.handle(c)
		}()
	}
}

// acquire counts a connection of sandbox id, unless it has MaxConnsPerSandbox open already.
func (p *Proxy) acquire(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.perSandbox[id] >= p.cfg.MaxConnsPerSandbox {
		return false
	}
	p.perSandbox[id]++
	return true
}

// release uncounts a connection counted by acquire.
func (p *Proxy) release(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.perSandbox[id]--; p.perSandbox[id] <= 0 {
		delete(p.perSandbox, id)
	}
}

// Close stops every listener, closes every connection and waits for their goroutines to end.
// Later calls do nothing.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	ls := p.listeners
	p.listeners = nil
	p.mu.Unlock()

	p.cancel()
	for _, ln := range ls {
		ln.Close()
	}
	p.wg.Wait()
	return nil
}

// Stats returns a snapshot of the counters.
func (p *Proxy) Stats() Stats {
	c := &p.stats
	s := Stats{
		Accepted:      c.accepted.Load(),
		Overloaded:    c.overloaded.Load(),
		UnknownSource: c.unknownSource.Load(),
		NoOriginalDst: c.noOriginalDst.Load(),
		Incomplete:    c.incomplete.Load(),
		Refused:       make(map[string]uint64, len(reasons)),
		ResolveErrors: c.resolveErrors.Load(),
		DialErrors:    c.dialErrors.Load(),
		Allowed:       c.allowed.Load(),
		BytesUp:       c.bytesUp.Load(),
		BytesDown:     c.bytesDown.Load(),
		Open:          c.open.Load(),
	}
	for i, r := range reasons {
		s.Refused[r] = c.refused[i].Load()
	}
	return s
}
