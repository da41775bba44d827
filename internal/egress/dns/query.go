package dns

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	miekg "github.com/miekg/dns"
)

// upstreamUDPSize is the EDNS buffer size offered to upstreams and the most sent to a sandbox over
// UDP: the DNS Flag Day 2020 figure, which avoids IP fragmentation.
const upstreamUDPSize = 1232

// maxChain bounds the CNAME records followed from the queried name.
const maxChain = 16

// headerQR is the bit of a DNS header that marks a response.
const headerQR = 1 << 15

// acceptQuery is the servers' first look at a message, before it is parsed. Responses are dropped
// unanswered: answering them could loop between resolvers. Everything else reaches serveDNS, which
// answers unknown sources before looking further.
func acceptQuery(h miekg.Header) miekg.MsgAcceptAction {
	if h.Bits&headerQR != 0 {
		return miekg.MsgIgnore
	}
	return miekg.MsgAccept
}

// serveDNS answers one query. The checks run in this order: known source, rate, a standard query
// with a question, its shape and type, the policy.
func (r *Resolver) serveDNS(w miekg.ResponseWriter, req *miekg.Msg) {
	r.stats.queries.Add(1)
	src, tcp := source(w.RemoteAddr())
	sb, ok := r.lookup(src)
	if !ok {
		r.stats.unknownSource.Add(1)
		r.log.Debug("dns query from unknown source refused", "src", src)
		r.write(w, req, reply(req, miekg.RcodeRefused), tcp, r.log)
		return
	}
	log := r.log.With("sandbox", sb.ID)
	if !r.limits.allow(sb.ID, time.Now()) {
		r.refuse(w, req, tcp, sb, log, ReasonRate, "")
		return
	}
	if req.Opcode != miekg.OpcodeQuery || len(req.Question) == 0 {
		r.stats.malformed.Add(1)
		rcode := miekg.RcodeFormatError
		if req.Opcode != miekg.OpcodeQuery {
			rcode = miekg.RcodeNotImplemented
		}
		log.Debug("dns malformed query", "opcode", miekg.OpcodeToString[req.Opcode], "questions", len(req.Question))
		r.write(w, req, reply(req, rcode), tcp, log)
		return
	}
	name, reason := checkQuestion(req)
	if reason != "" {
		r.refuse(w, req, tcp, sb, log, reason, "")
		return
	}
	allowed, rule := false, "no policy"
	if sb.Policy != nil {
		allowed, rule = sb.Policy.AllowsName(name)
	}
	if !allowed {
		r.refuse(w, req, tcp, sb, log, ReasonRefused, rule)
		return
	}
	r.stats.allowed.Add(1)
	q := req.Question[0]
	if q.Qtype == miekg.TypeAAAA {
		// IPv6 egress is blocked; an empty answer makes clients use IPv4 at once.
		r.stats.emptyAAAA.Add(1)
		log.Debug("dns query answered empty", "name", name, "qtype", "AAAA", "rule", rule)
		r.write(w, req, reply(req, miekg.RcodeSuccess), tcp, log)
		return
	}
	r.forward(w, req, tcp, sb, log, name, rule)
}

// refuse answers req with REFUSED (NXDOMAIN for denied names when so configured), counts it under
// reason and tells the sandbox. rule is the policy rule that decided, if any.
func (r *Resolver) refuse(w miekg.ResponseWriter, req *miekg.Msg, tcp bool, sb Sandbox, log *slog.Logger, reason, rule string) {
	var name string
	var qtype uint16
	if len(req.Question) > 0 {
		name, qtype = policyName(req.Question[0].Name), req.Question[0].Qtype
	}
	rcode, level := miekg.RcodeRefused, slog.LevelInfo
	switch reason {
	case ReasonRefused:
		r.stats.refusedName.Add(1)
		if r.cfg.DenyNXDomain {
			rcode = miekg.RcodeNameError
		}
	case ReasonType:
		r.stats.refusedType.Add(1)
	case ReasonTunnel:
		r.stats.refusedTunnel.Add(1)
	case ReasonRate:
		r.stats.refusedRate.Add(1)
		// A sandbox over its rate would flood the log; Blocked counts each one.
		level = slog.LevelDebug
	}
	attrs := []any{"name", name, "qtype", miekg.Type(qtype).String(), "reason", reason}
	if rule != "" {
		attrs = append(attrs, "rule", rule)
	}
	log.Log(context.Background(), level, "dns query refused", attrs...)
	if sb.Blocked != nil {
		sb.Blocked(name, qtype, reason)
	}
	r.write(w, req, reply(req, rcode), tcp, log)
}

// forward answers an allowed query from the upstreams and hands the addresses answered to the
// sandbox's allow set.
func (r *Resolver) forward(w miekg.ResponseWriter, req *miekg.Msg, tcp bool, sb Sandbox, log *slog.Logger, name, rule string) {
	q := req.Question[0]
	resp, err := r.exchange(q.Name, q.Qtype)
	if err != nil {
		if r.ctx.Err() == nil {
			r.stats.upstreamErrors.Add(1)
			log.Warn("dns upstream failed", "name", name, "qtype", miekg.Type(q.Qtype).String(), "err", err)
		}
		r.write(w, req, reply(req, miekg.RcodeServerFailure), tcp, log)
		return
	}
	a := shapeAnswer(q.Name, q.Qtype, resp, r.cfg.MinTTL, r.cfg.MaxTTL)
	if sb.Allow != nil {
		for _, g := range a.grants {
			sb.Allow(name, g.ip, g.ttl)
			if a.owner != name {
				sb.Allow(a.owner, g.ip, g.ttl)
			}
		}
	}
	out := reply(req, resp.Rcode)
	out.Answer, out.Ns = a.answer, a.authority
	log.Debug("dns query answered", "name", name, "qtype", miekg.Type(q.Qtype).String(), "rule", rule,
		"rcode", miekg.RcodeToString[resp.Rcode], "answers", len(a.answer), "allowed", len(a.grants))
	r.write(w, req, out, tcp, log)
}

// reply returns a response to req with rcode and no records.
func reply(req *miekg.Msg, rcode int) *miekg.Msg {
	out := new(miekg.Msg)
	out.SetRcode(req, rcode)
	out.RecursionAvailable = rcode != miekg.RcodeRefused
	return out
}

// write sends out, cut to what req's transport and EDNS buffer size allow (TC set when cut).
func (r *Resolver) write(w miekg.ResponseWriter, req, out *miekg.Msg, tcp bool, log *slog.Logger) {
	size := miekg.MaxMsgSize
	opt := req.IsEdns0()
	if opt != nil {
		out.SetEdns0(upstreamUDPSize, false)
	}
	if !tcp {
		size = miekg.MinMsgSize
		if opt != nil {
			size = min(max(int(opt.UDPSize()), miekg.MinMsgSize), upstreamUDPSize)
		}
	}
	out.Truncate(size)
	if err := w.WriteMsg(out); err != nil {
		log.Debug("dns write answer", "err", err)
	}
}

// source returns the address a query came from and whether it came over TCP.
func source(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap(), false
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// checkQuestion returns the name req asks for as policies see it, or the reason to refuse req.
// Preconditions: req has at least one question.
func checkQuestion(req *miekg.Msg) (name, reason string) {
	q := req.Question[0]
	name = policyName(q.Name)
	switch {
	case len(req.Question) > 1:
		return name, ReasonTunnel
	case q.Qclass != miekg.ClassINET:
		return name, ReasonType
	case q.Qtype != miekg.TypeA && q.Qtype != miekg.TypeAAAA && q.Qtype != miekg.TypeCNAME:
		return name, ReasonType
	case !validName(name):
		return name, ReasonTunnel
	}
	return name, ""
}

// policyName returns fqdn lowercase without its trailing dot.
func policyName(fqdn string) string {
	return strings.ToLower(strings.TrimSuffix(fqdn, "."))
}

// validName reports whether name (lowercase, no trailing dot) is a host name: at most 253
// characters, labels of 1 to 63 letters, digits, '-' or '_'. The parser already bounds lengths; the
// character set keeps escaped binary data (\DDD) out of upstream queries and policies.
func validName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range []byte(label) {
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// exchange asks the upstreams about qname, round robin, retrying once on the next upstream.
func (r *Resolver) exchange(qname string, qtype uint16) (*miekg.Msg, error) {
	m := new(miekg.Msg)
	m.SetQuestion(qname, qtype)
	m.SetEdns0(upstreamUDPSize, false)
	n := uint64(len(r.cfg.Upstreams))
	first := r.next.Add(1)
	m.Id = miekg.Id()
	resp, err := r.exchangeOne(m, r.cfg.Upstreams[first%n])
	if err == nil || r.ctx.Err() != nil {
		return resp, err
	}
	m.Id = miekg.Id()
	resp, retryErr := r.exchangeOne(m, r.cfg.Upstreams[(first+1)%n])
	if retryErr != nil {
		return nil, fmt.Errorf("%w; retry: %w", err, retryErr)
	}
	return resp, nil
}

// exchangeOne asks up over UDP, then over TCP if the answer is truncated, and accepts only a
// NOERROR or NXDOMAIN answer to the question asked.
func (r *Resolver) exchangeOne(m *miekg.Msg, up netip.AddrPort) (*miekg.Msg, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Timeout)
	defer cancel()
	resp, err := exchangeOn(ctx, r.udp, m, up.String())
	if err == nil && resp.Truncated {
		resp, err = exchangeOn(ctx, r.tcp, m, up.String())
	}
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", up, err)
	}
	if resp.Rcode != miekg.RcodeSuccess && resp.Rcode != miekg.RcodeNameError {
		return nil, fmt.Errorf("query %s: answered %s: %w", up, miekg.RcodeToString[resp.Rcode], errNoAnswer)
	}
	q := m.Question[0]
	if len(resp.Question) != 1 || !strings.EqualFold(resp.Question[0].Name, q.Name) ||
		resp.Question[0].Qtype != q.Qtype || resp.Question[0].Qclass != q.Qclass {
		return nil, fmt.Errorf("query %s: answer to another question: %w", up, errNoAnswer)
	}
	return resp, nil
}

// exchangeOn sends m to addr with c; the connection closes when ctx ends, so Close does not wait
// for slow upstreams.
func exchangeOn(ctx context.Context, c *miekg.Client, m *miekg.Msg, addr string) (*miekg.Msg, error) {
	co, err := c.DialContext(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer co.Close()
	stop := context.AfterFunc(ctx, func() { co.Close() })
	defer stop()
	resp, _, err := c.ExchangeWithConnContext(ctx, m, co)
	return resp, err
}

// answer is what a sandbox gets from an upstream response.
type answer struct {
	// answer is the CNAME chain from the queried name and the A records at its end; authority is
	// the SOA records, for negative caching. TTLs are cut to the maximum.
	answer, authority []miekg.RR
	// owner is the owner name of the A records (lowercase, no trailing dot): the queried name, or
	// the end of the CNAME chain.
	owner string
	// grants are the addresses for the sandbox's allow set.
	grants []grant
}

type grant struct {
	ip  netip.Addr
	ttl time.Duration
}

// shapeAnswer keeps from resp only what answers qname and qtype: the CNAME chain from qname (one
// link for a CNAME query) and, for an A query, the A records at its end. Records off the chain
// never reach the sandbox or its allow set. Grants take each A record's TTL clamped to
// [minTTL, maxTTL], and carry only addresses a sandbox may reach through its allow set: IPv4
// unicast, not loopback or link-local.
func shapeAnswer(qname string, qtype uint16, resp *miekg.Msg, minTTL, maxTTL time.Duration) answer {
	var a answer
	cur := qname
	for range maxChain + 1 {
		var cname *miekg.CNAME
		var addrs []*miekg.A
		for _, rr := range resp.Answer {
			h := rr.Header()
			if h.Class != miekg.ClassINET || !strings.EqualFold(h.Name, cur) {
				continue
			}
			switch rr := rr.(type) {
			case *miekg.A:
				addrs = append(addrs, rr)
			case *miekg.CNAME:
				if cname == nil {
					cname = rr
				}
			}
		}
		if qtype == miekg.TypeA && len(addrs) > 0 {
			a.owner = policyName(cur)
			for _, rr := range addrs {
				a.answer = append(a.answer, rr)
				ip, ok := netip.AddrFromSlice(rr.A)
				ip = ip.Unmap()
				if !ok || !ip.Is4() || !ip.IsGlobalUnicast() {
					continue
				}
				ttl := time.Duration(rr.Hdr.Ttl) * time.Second
				a.grants = append(a.grants, grant{ip: ip, ttl: min(max(ttl, minTTL), maxTTL)})
			}
			break
		}
		if cname == nil {
			break
		}
		a.answer = append(a.answer, cname)
		if qtype == miekg.TypeCNAME {
			break
		}
		cur = cname.Target
	}
	for _, rr := range resp.Ns {
		if rr.Header().Rrtype == miekg.TypeSOA {
			a.authority = append(a.authority, rr)
		}
	}
	capTTL := uint32(maxTTL / time.Second)
	for _, rr := range a.answer {
		rr.Header().Ttl = min(rr.Header().Ttl, capTTL)
	}
	for _, rr := range a.authority {
		rr.Header().Ttl = min(rr.Header().Ttl, capTTL)
	}
	return a
}
