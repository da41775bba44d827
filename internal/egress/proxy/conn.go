package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

var (
	// errTooLarge: no whole ClientHello or request header block within Config.MaxPeek bytes.
	errTooLarge = errors.New("ClientHello or request header larger than the peek limit")
	// errNotRedirected: the original destination is the proxy itself, or not IPv4.
	errNotRedirected = errors.New("not a redirected IPv4 connection")
)

// lingerTimeout bounds writing a refusal and then reading what the client still sends, so that
// closing with unread bytes does not reset the connection before the client reads the refusal.
const lingerTimeout = time.Second

// lingerMax is the most bytes read and dropped after a refusal.
const lingerMax = 64 << 10

// TLS alert descriptions (RFC 8446 section 6) sent in place of a ServerHello, so that a TLS
// client learns why its handshake ended.
const (
	alertInternalError = 80
	alertAccessDenied  = 49
)

// alert returns a plaintext fatal TLS alert record.
func alert(description byte) []byte { return []byte{21, 3, 3, 0, 2, 2, description} }

// bufPool holds the copy buffers of spliced connections.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// hello is what the proxy read from a connection before judging it.
type hello struct {
	// head is every byte read, to be sent on to the destination.
	head []byte
	// tls is set when head starts with a TLS handshake record; otherwise it is taken for HTTP.
	tls bool
	// name is the name asked for, normalized; with errHostMismatch, the request target's.
	name string
}

// handle judges one connection and, if it is allowed, copies its bytes to and from the original
// destination. It owns c and closes it; Close closes it early.
func (p *Proxy) handle(c *net.TCPConn) {
	defer c.Close()
	defer context.AfterFunc(p.ctx, func() { c.Close() })()

	src := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	sb, ok := p.lookup(src)
	if !ok {
		p.stats.unknownSource.Add(1)
		p.log.Debug("egress proxy connection from unknown source closed", "src", src)
		return
	}
	log := p.log.With("sandbox", sb.ID)
	if !p.acquire(sb.ID) {
		p.stats.overloaded.Add(1)
		log.Debug("egress proxy connection over the sandbox's limit closed", "limit", p.cfg.MaxConnsPerSandbox)
		return
	}
	defer p.release(sb.ID)
	dst, err := p.originalDst(c)
	if err != nil {
		p.stats.noOriginalDst.Add(1)
		log.Warn("egress proxy connection closed", "src", src, "err", err)
		return
	}

	h, err := p.readHello(c)
	if err != nil {
		reason := refusalReason(err)
		if reason == "" {
			p.stats.incomplete.Add(1)
			log.Debug("egress proxy connection closed before a ClientHello or request", "dest", dst, "read", len(h.head), "err", err)
			return
		}
		p.refuse(c, sb, log, h, Attempt{Reason: reason, Name: h.name, Dest: dst, Proto: "tcp"}, "", err)
		return
	}
	reason, rule, err := p.check(sb, h.name, dst)
	if err != nil {
		p.stats.resolveErrors.Add(1)
		log.Warn("egress proxy connection closed", "name", h.name, "dest", dst, "err", err)
		p.fail(c, h, alertInternalError, "502 Bad Gateway", "the egress proxy could not resolve "+h.name+"\n")
		return
	}
	if reason != "" {
		p.refuse(c, sb, log, h, Attempt{Reason: reason, Name: h.name, Dest: dst, Proto: "tcp"}, rule, nil)
		return
	}

	d := net.Dialer{Timeout: p.cfg.DialTimeout}
	nc, err := d.DialContext(p.ctx, "tcp4", dst.String())
	if err != nil {
		p.stats.dialErrors.Add(1)
		log.Info("egress proxy connect", "name", h.name, "dest", dst, "err", err)
		p.fail(c, h, alertInternalError, "502 Bad Gateway", "the egress proxy could not connect to "+h.name+"\n")
		return
	}
	up := nc.(*net.TCPConn)
	defer up.Close()
	defer context.AfterFunc(p.ctx, func() { up.Close() })()
	p.stats.allowed.Add(1)
	log.Debug("egress proxy connected", "name", h.name, "dest", dst, "rule", rule)
	start := time.Now()
	sent, received := p.splice(c, up, h.head)
	log.Debug("egress proxy connection ended", "name", h.name, "dest", dst, "sent", sent, "received", received,
		"duration", time.Since(start))
}

// originalDst returns c's original destination, which must be an IPv4 address other than the
// proxy's own: a connection made to the listener directly must not make the proxy connect to
// itself.
func (p *Proxy) originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	dst, err := p.cfg.OriginalDst(c)
	if err != nil {
		return netip.AddrPort{}, err
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if !dst.Addr().Is4() || dst.Port() == 0 || dst == netip.AddrPortFrom(local.Addr().Unmap(), local.Port()) {
		return netip.AddrPort{}, fmt.Errorf("original destination %s: %w", dst, errNotRedirected)
	}
	return dst, nil
}

// readHello reads from c until the bytes make a whole ClientHello or request header block, or
// prove not to, within PeekTimeout and MaxPeek bytes. Its error is a parser's verdict,
// errTooLarge, or the read error that ended the wait; h holds what was read in every case.
func (p *Proxy) readHello(c *net.TCPConn) (h hello, err error) {
	if err := c.SetReadDeadline(time.Now().Add(p.cfg.PeekTimeout)); err != nil {
		return h, fmt.Errorf("read first bytes: %w", err)
	}
	buf := make([]byte, min(p.cfg.MaxPeek, 4<<10))
	n, need := 0, 1
	for {
		if n == len(buf) {
			if n >= p.cfg.MaxPeek {
				return h, errTooLarge
			}
			buf = append(buf, make([]byte, min(2*n, p.cfg.MaxPeek)-n)...)
		}
		k, rerr := c.Read(buf[n:])
		fresh := buf[n : n+k]
		n += k
		h.head = buf[:n]
		// Parse again only when it can get further: for TLS, once need bytes are there; for
		// HTTP, when a line ends, or on the first bytes, to refuse other protocols at once.
		if k > 0 && n >= need && (n-k <= maxMethodLen || h.head[0] == recordTypeHandshake || bytes.IndexByte(fresh, '\n') >= 0) {
			var perr error
			h.tls = h.head[0] == recordTypeHandshake
			if h.tls {
				h.name, need, perr = parseClientHello(h.head)
				if perr == errIncomplete && need > p.cfg.MaxPeek {
					return h, errTooLarge
				}
			} else {
				h.name, perr = parseHTTPHost(h.head)
			}
			if perr != errIncomplete {
				if perr == nil {
					perr = c.SetReadDeadline(time.Time{})
				}
				return h, perr
			}
		}
		if rerr != nil {
			return h, fmt.Errorf("read first bytes: %w", rerr)
		}
	}
}

// refusalReason returns the Reason for a readHello error that refuses the connection, or "" for
// one that only ends it.
func refusalReason(err error) string {
	switch {
	case errors.Is(err, errHostMismatch):
		return ReasonSNIMismatch
	case errors.Is(err, errMalformed), errors.Is(err, errNoName), errors.Is(err, errIPLiteral),
		errors.Is(err, errBadName), errors.Is(err, errTooLarge):
		return ReasonNoSNI
	}
	return ""
}

// check judges a connection to dst for name, in order: the sandbox's policy, the blocked ranges,
// the name's current addresses. It returns the reason of a refusal, or "", and the policy's rule;
// an error means that the name could not be resolved.
func (p *Proxy) check(sb Sandbox, name string, dst netip.AddrPort) (reason, rule string, err error) {
	if sb.Policy == nil {
		return ReasonSNIMismatch, "no policy", nil
	}
	ok, rule := sb.Policy.AllowsName(name)
	if !ok {
		return ReasonSNIMismatch, rule, nil
	}
	if p.cfg.IsBlocked(dst.Addr()) {
		return ReasonBlockedRange, rule, nil
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.ResolveTimeout)
	defer cancel()
	addrs, err := p.cfg.Resolve(ctx, name)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return "", rule, fmt.Errorf("resolve %s: %w", name, err)
	}
	for _, a := range addrs {
		if a.Unmap() == dst.Addr() {
			return "", rule, nil
		}
	}
	return ReasonNameAddressMismatch, rule, nil
}

// refuse counts and reports a refused connection and tells the client: a 403 response for HTTP,
// a fatal TLS alert for TLS. rule and err, either may be empty, explain it in the log.
func (p *Proxy) refuse(c *net.TCPConn, sb Sandbox, log *slog.Logger, h hello, a Attempt, rule string, err error) {
	p.stats.refuse(a.Reason)
	args := []any{"name", a.Name, "dest", a.Dest, "reason", a.Reason}
	if rule != "" {
		args = append(args, "rule", rule)
	}
	if err != nil {
		args = append(args, "err", err)
	}
	log.Info("egress proxy refused connection", args...)
	if sb.Blocked != nil {
		sb.Blocked(a)
	}
	msg := "refused by the sandbox's egress policy: " + a.Reason
	if a.Name != "" {
		msg += " " + a.Name
	}
	p.fail(c, h, alertAccessDenied, "403 Forbidden", msg+"\n")
}

// fail ends a connection that will not be connected: it writes an HTTP response with status and
// body, or a TLS alert with description, and lingers a moment to read what the client still
// sends.
func (p *Proxy) fail(c *net.TCPConn, h hello, description byte, status, body string) {
	c.SetDeadline(time.Now().Add(lingerTimeout))
	if h.tls {
		c.Write(alert(description))
	} else {
		fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			status, len(body), body)
	}
	c.CloseWrite()
	io.Copy(io.Discard, io.LimitReader(c, lingerMax))
}

// activity is the time bytes last moved in either direction of a spliced connection.
type activity struct {
	idle time.Duration
	last atomic.Int64 // Unix nanoseconds
}

func (a *activity) touch()                  { a.last.Store(time.Now().UnixNano()) }
func (a *activity) deadline() time.Time     { return time.Unix(0, a.last.Load()).Add(a.idle) }
func (a *activity) idleAt(t time.Time) bool { return !t.Before(a.deadline()) }

// splice sends head to up, then copies bytes both ways until both directions end: at EOF, which it
// passes on as a half-close, or at an error or IdleTimeout, which end both. It returns the bytes
// sent to up and received from it. It owns one goroutine, which ends before it returns.
func (p *Proxy) splice(c, up *net.TCPConn, head []byte) (sent, received uint64) {
	a := &activity{idle: p.cfg.IdleTimeout}
	a.touch()
	up.SetWriteDeadline(time.Now().Add(a.idle))
	if _, err := up.Write(head); err != nil {
		return 0, 0
	}
	p.stats.bytesUp.Add(uint64(len(head)))
	done := make(chan uint64, 1)
	go func() { done <- a.pipe(c, up, &p.stats.bytesDown) }()
	sent = uint64(len(head)) + a.pipe(up, c, &p.stats.bytesUp)
	return sent, <-done
}

// pipe copies src to dst until src ends: at EOF it half-closes dst; at an error, a write that
// takes IdleTimeout, or IdleTimeout without bytes moving either way, it closes both, which ends
// the other direction too. It returns the bytes copied, which it also adds to count as they go.
func (a *activity) pipe(dst, src *net.TCPConn, count *atomic.Uint64) uint64 {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var total uint64
	for {
		src.SetReadDeadline(a.deadline())
		n, err := src.Read(buf)
		if n > 0 {
			a.touch()
			dst.SetWriteDeadline(time.Now().Add(a.idle))
			w, werr := dst.Write(buf[:n])
			total += uint64(w)
			count.Add(uint64(w))
			if werr != nil {
				src.Close()
				dst.Close()
				return total
			}
			a.touch()
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			dst.CloseWrite()
			return total
		case errors.Is(err, os.ErrDeadlineExceeded) && !a.idleAt(time.Now()):
			// The other direction moved since: wait on.
		default:
			src.Close()
			dst.Close()
			return total
		}
	}
}
