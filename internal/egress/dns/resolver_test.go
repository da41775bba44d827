package dns

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	miekg "github.com/miekg/dns"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Sources of the test sandboxes; anything else on loopback is unknown.
var (
	srcA       = netip.MustParseAddr("127.0.0.2")
	srcB       = netip.MustParseAddr("127.0.0.3")
	srcUnknown = netip.MustParseAddr("127.0.0.9")
)

// zone is the fake upstream's data, by "name type". big.allowed.test. is added by startUpstream.
var zone = map[string][]string{
	"allowed.test. A": {
		"allowed.test. 5 IN A 192.0.2.1",
		"allowed.test. 5 IN A 192.0.2.2",
	},
	"long.allowed.test. A": {"long.allowed.test. 86400 IN A 192.0.2.3"},
	"www.allowed.test. A": {
		"www.allowed.test. 600 IN CNAME edge.cdn.example.",
		"edge.cdn.example. 120 IN CNAME e1.cdn.example.",
		"e1.cdn.example. 300 IN A 198.51.100.7",
		// Off the chain: neither answered nor allowed.
		"evil.example. 300 IN A 203.0.113.66",
	},
	"www.allowed.test. CNAME": {"www.allowed.test. 600 IN CNAME edge.cdn.example."},
	"local.allowed.test. A": {
		"local.allowed.test. 60 IN A 127.0.0.1",
		"local.allowed.test. 60 IN A 169.254.169.254",
		"local.allowed.test. 60 IN A 192.0.2.9",
	},
	"txt.allowed.test. TXT": {`txt.allowed.test. 60 IN TXT "secret"`},
	"denied.test. A":        {"denied.test. 60 IN A 192.0.2.66"},
}

// bigAnswers is how many A records big.allowed.test. has: more than 512 bytes, less than 1232.
const bigAnswers = 40

// upstream is a fake upstream resolver on loopback, UDP and TCP on one port. Over UDP it answers
// big.allowed.test. truncated, so that only TCP gets the records.
type upstream struct {
	addr netip.AddrPort

	mu sync.Mutex
	// asked counts questions by "name type"; tcp counts those over TCP. Protected by mu.
	asked map[string]int
	tcp   int
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{asked: make(map[string]int)}
	pc, ln, err := bind(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	u.addr = netip.AddrPortFrom(srcLoopback, uint16(pc.LocalAddr().(*net.UDPAddr).Port))
	for _, srv := range []*miekg.Server{
		{PacketConn: pc, Handler: miekg.HandlerFunc(u.serve)},
		{Listener: ln, Handler: miekg.HandlerFunc(u.serve)},
	} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.ActivateAndServe()
		}()
		<-started
		t.Cleanup(func() {
			srv.Shutdown()
			<-done
		})
	}
	return u
}

var srcLoopback = netip.MustParseAddr("127.0.0.1")

func (u *upstream) serve(w miekg.ResponseWriter, req *miekg.Msg) {
	q := req.Question[0]
	key := strings.ToLower(q.Name) + " " + miekg.Type(q.Qtype).String()
	_, tcp := source(w.RemoteAddr())
	u.mu.Lock()
	u.asked[key]++
	if tcp {
		u.tcp++
	}
	u.mu.Unlock()

	out := new(miekg.Msg).SetReply(req)
	out.RecursionAvailable = true
	if opt := req.IsEdns0(); opt != nil {
		out.SetEdns0(opt.UDPSize(), false)
	}
	switch {
	case key == "big.allowed.test. A":
		if !tcp {
			out.Truncated = true
			break
		}
		for i := range bigAnswers {
			out.Answer = append(out.Answer, mustRR(fmt.Sprintf("big.allowed.test. 60 IN A 192.0.2.%d", 100+i)))
		}
	case key == "missing.allowed.test. A":
		out.Rcode = miekg.RcodeNameError
		out.Ns = append(out.Ns, mustRR("allowed.test. 86400 IN SOA ns.allowed.test. admin.allowed.test. 1 7200 3600 1209600 86400"))
	default:
		for _, s := range zone[key] {
			out.Answer = append(out.Answer, mustRR(s))
		}
	}
	w.WriteMsg(out)
}

// askedAbout returns how often the upstream was asked about name (any type, any transport).
func (u *upstream) askedAbout(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for k, c := range u.asked {
		if strings.HasPrefix(k, name+" ") {
			n += c
		}
	}
	return n
}

func mustRR(s string) miekg.RR {
	rr, err := miekg.NewRR(s)
	if err != nil {
		panic(err)
	}
	return rr
}

// suffixPolicy allows the names it lists and their subdomains.
type suffixPolicy []string

func (p suffixPolicy) AllowsName(name string) (bool, string) {
	for _, s := range p {
		if name == s || strings.HasSuffix(name, "."+s) {
			return true, "allow " + s
		}
	}
	return false, "default deny"
}

type allowCall struct {
	name string
	ip   netip.Addr
	ttl  time.Duration
}

type blockCall struct {
	name   string
	qtype  uint16
	reason string
}

// recorder is one test sandbox; it records what the resolver tells it.
type recorder struct {
	id     string
	policy Policy

	mu sync.Mutex
	// allows and blocks are the calls so far. Protected by mu.
	allows []allowCall
	blocks []blockCall
}

func (s *recorder) sandbox() Sandbox {
	return Sandbox{
		ID:     s.id,
		Policy: s.policy,
		Allow: func(name string, ip netip.Addr, ttl time.Duration) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.allows = append(s.allows, allowCall{name, ip, ttl})
		},
		Blocked: func(name string, qtype uint16, reason string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.blocks = append(s.blocks, blockCall{name, qtype, reason})
		},
	}
}

// take returns the calls so far and forgets them.
func (s *recorder) take() ([]allowCall, []blockCall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, b := s.allows, s.blocks
	s.allows, s.blocks = nil, nil
	return a, b
}

// env is a resolver listening on 127.0.0.1, its upstream, and two sandboxes.
type env struct {
	r    *Resolver
	addr netip.AddrPort
	up   *upstream
	a, b *recorder
}

// newEnv starts an upstream and a resolver using it; cfg.Upstreams defaults to that upstream.
func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	e := &env{
		up: startUpstream(t),
		a:  &recorder{id: "sb-a", policy: suffixPolicy{"allowed.test"}},
		b:  &recorder{id: "sb-b", policy: suffixPolicy{"allowed.test"}},
	}
	if cfg.Upstreams == nil {
		cfg.Upstreams = []netip.AddrPort{e.up.addr}
	}
	sandboxes := map[netip.Addr]*recorder{srcA: e.a, srcB: e.b}
	lookup := func(src netip.Addr) (Sandbox, bool) {
		s, ok := sandboxes[src]
		if !ok {
			return Sandbox{}, false
		}
		return s.sandbox(), true
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := New(cfg, lookup, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	e.r = r
	e.addr, err = r.Listen(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// exchange sends m from src to server over proto ("udp" or "tcp").
func exchange(server netip.AddrPort, src netip.Addr, proto string, m *miekg.Msg) (*miekg.Msg, error) {
	var local net.Addr = &net.UDPAddr{IP: src.AsSlice()}
	if proto == "tcp" {
		local = &net.TCPAddr{IP: src.AsSlice()}
	}
	c := &miekg.Client{Net: proto, Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: local, Timeout: 5 * time.Second}}
	resp, _, err := c.Exchange(m, server.String())
	return resp, err
}

// ask queries name and qtype from src with an EDNS buffer of 1232 bytes.
func ask(t *testing.T, server netip.AddrPort, src netip.Addr, proto, name string, qtype uint16) *miekg.Msg {
	t.Helper()
	m := new(miekg.Msg).SetQuestion(name, qtype)
	m.SetEdns0(1232, false)
	resp, err := exchange(server, src, proto, m)
	if err != nil {
		t.Fatalf("query %s %s over %s: %v", name, miekg.Type(qtype), proto, err)
	}
	return resp
}

// records renders rrs as "name ttl type data" strings.
func records(rrs []miekg.RR) []string {
	var out []string
	for _, rr := range rrs {
		h := rr.Header()
		data := strings.TrimPrefix(rr.String(), h.String())
		out = append(out, fmt.Sprintf("%s %d %s %s", h.Name, h.Ttl, miekg.Type(h.Rrtype), data))
	}
	return out
}

func TestAllowedAnswers(t *testing.T) {
	e := newEnv(t, Config{})
	ip := netip.MustParseAddr
	tests := []struct {
		name       string
		qtype      uint16
		wantRcode  int
		wantAnswer []string
		wantAllow  []allowCall
	}{{
		name:       "allowed.test.",
		qtype:      miekg.TypeA,
		wantAnswer: []string{"allowed.test. 5 A 192.0.2.1", "allowed.test. 5 A 192.0.2.2"},
		wantAllow:  []allowCall{{"allowed.test", ip("192.0.2.1"), 30 * time.Second}, {"allowed.test", ip("192.0.2.2"), 30 * time.Second}},
	}, {
		name:       "Long.Allowed.Test.",
		qtype:      miekg.TypeA,
		wantAnswer: []string{"long.allowed.test. 3600 A 192.0.2.3"},
		wantAllow:  []allowCall{{"long.allowed.test", ip("192.0.2.3"), time.Hour}},
	}, {
		name:  "www.allowed.test.",
		qtype: miekg.TypeA,
		wantAnswer: []string{
			"www.allowed.test. 600 CNAME edge.cdn.example.",
			"edge.cdn.example. 120 CNAME e1.cdn.example.",
			"e1.cdn.example. 300 A 198.51.100.7",
		},
		wantAllow: []allowCall{{"www.allowed.test", ip("198.51.100.7"), 300 * time.Second}, {"e1.cdn.example", ip("198.51.100.7"), 300 * time.Second}},
	}, {
		name:       "www.allowed.test.",
		qtype:      miekg.TypeCNAME,
		wantAnswer: []string{"www.allowed.test. 600 CNAME edge.cdn.example."},
	}, {
		name:  "local.allowed.test.",
		qtype: miekg.TypeA,
		wantAnswer: []string{
			"local.allowed.test. 60 A 127.0.0.1",
			"local.allowed.test. 60 A 169.254.169.254",
			"local.allowed.test. 60 A 192.0.2.9",
		},
		wantAllow: []allowCall{{"local.allowed.test", ip("192.0.2.9"), 60 * time.Second}},
	}, {
		name:      "missing.allowed.test.",
		qtype:     miekg.TypeA,
		wantRcode: miekg.RcodeNameError,
	}, {
		name:  "allowed.test.",
		qtype: miekg.TypeAAAA,
	}}
	for _, proto := range []string{"udp", "tcp"} {
		for _, tt := range tests {
			t.Run(proto+"/"+tt.name+"/"+miekg.Type(tt.qtype).String(), func(t *testing.T) {
				resp := ask(t, e.addr, srcA, proto, tt.name, tt.qtype)
				if resp.Rcode != tt.wantRcode {
					t.Errorf("rcode = %s, want %s", miekg.RcodeToString[resp.Rcode], miekg.RcodeToString[tt.wantRcode])
				}
				if got := records(resp.Answer); !slices.Equal(got, tt.wantAnswer) {
					t.Errorf("answer = %q, want %q", got, tt.wantAnswer)
				}
				allows, blocks := e.a.take()
				if !slices.Equal(allows, tt.wantAllow) {
					t.Errorf("Allow calls = %v, want %v", allows, tt.wantAllow)
				}
				if len(blocks) != 0 {
					t.Errorf("Blocked calls = %v, want none", blocks)
				}
			})
		}
	}
	e.up.mu.Lock()
	defer e.up.mu.Unlock()
	if n := e.up.asked["allowed.test. AAAA"]; n != 0 {
		t.Errorf("upstream asked for AAAA %d times, want 0", n)
	}
}

func TestNegativeAnswerKeepsCappedSOA(t *testing.T) {
	e := newEnv(t, Config{MaxTTL: 10 * time.Minute})
	resp := ask(t, e.addr, srcA, "udp", "missing.allowed.test.", miekg.TypeA)
	if resp.Rcode != miekg.RcodeNameError {
		t.Fatalf("rcode = %s, want NXDOMAIN", miekg.RcodeToString[resp.Rcode])
	}
	if len(resp.Ns) != 1 || resp.Ns[0].Header().Rrtype != miekg.TypeSOA || resp.Ns[0].Header().Ttl != 600 {
		t.Errorf("authority = %q, want one SOA with TTL 600", records(resp.Ns))
	}
}

func TestTTLClamp(t *testing.T) {
	tests := []struct {
		cfg       Config
		name      string
		wantTTL   uint32
		wantAllow time.Duration
	}{
		{Config{}, "allowed.test.", 5, 30 * time.Second},
		{Config{}, "long.allowed.test.", 3600, time.Hour},
		{Config{MinTTL: time.Minute, MaxTTL: 10 * time.Minute}, "allowed.test.", 5, time.Minute},
		{Config{MinTTL: time.Minute, MaxTTL: 10 * time.Minute}, "long.allowed.test.", 600, 10 * time.Minute},
		{Config{MinTTL: 2 * time.Second, MaxTTL: 3 * time.Second}, "allowed.test.", 3, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%s-%s", tt.name, tt.cfg.MinTTL, tt.cfg.MaxTTL), func(t *testing.T) {
			e := newEnv(t, tt.cfg)
			resp := ask(t, e.addr, srcA, "udp", tt.name, miekg.TypeA)
			if len(resp.Answer) == 0 {
				t.Fatalf("no answer")
			}
			for _, rr := range resp.Answer {
				if got := rr.Header().Ttl; got != tt.wantTTL {
					t.Errorf("answer TTL = %d, want %d", got, tt.wantTTL)
				}
			}
			allows, _ := e.a.take()
			for _, a := range allows {
				if a.ttl != tt.wantAllow {
					t.Errorf("Allow ttl = %s, want %s", a.ttl, tt.wantAllow)
				}
			}
		})
	}
}

func TestRefused(t *testing.T) {
	twoQuestions := new(miekg.Msg).SetQuestion("allowed.test.", miekg.TypeA)
	twoQuestions.Question = append(twoQuestions.Question, miekg.Question{Name: "x.allowed.test.", Qtype: miekg.TypeA, Qclass: miekg.ClassINET})
	chaos := new(miekg.Msg).SetQuestion("version.bind.", miekg.TypeA)
	chaos.Question[0].Qclass = miekg.ClassCHAOS

	tests := []struct {
		desc       string
		cfg        Config
		m          *miekg.Msg
		wantRcode  int
		wantBlock  blockCall
		wantStats  Stats
		wantUpName string // a name the upstream must not have been asked about
	}{{
		desc:      "denied name",
		m:         new(miekg.Msg).SetQuestion("denied.test.", miekg.TypeA),
		wantRcode: miekg.RcodeRefused,
		wantBlock: blockCall{"denied.test", miekg.TypeA, ReasonRefused},
		wantStats: Stats{Queries: 1, RefusedName: 1},
	}, {
		desc:      "denied name answered NXDOMAIN",
		cfg:       Config{DenyNXDomain: true},
		m:         new(miekg.Msg).SetQuestion("DENIED.test.", miekg.TypeA),
		wantRcode: miekg.RcodeNameError,
		wantBlock: blockCall{"denied.test", miekg.TypeA, ReasonRefused},
		wantStats: Stats{Queries: 1, RefusedName: 1},
	}, {
		desc:      "denied AAAA",
		m:         new(miekg.Msg).SetQuestion("denied.test.", miekg.TypeAAAA),
		wantRcode: miekg.RcodeRefused,
		wantBlock: blockCall{"denied.test", miekg.TypeAAAA, ReasonRefused},
		wantStats: Stats{Queries: 1, RefusedName: 1},
	}, {
		desc:      "TXT of an allowed name",
		m:         new(miekg.Msg).SetQuestion("txt.allowed.test.", miekg.TypeTXT),
		wantRcode: miekg.RcodeRefused,
		wantBlock: blockCall{"txt.allowed.test", miekg.TypeTXT, ReasonType},
		wantStats: Stats{Queries: 1, RefusedType: 1},
	}, {
		desc:      "ANY",
		m:         new(miekg.Msg).SetQuestion("allowed.test.", miekg.TypeANY),
		wantRcode: miekg.RcodeRefused,
		wantBlock: blockCall{"allowed.test", miekg.TypeANY, ReasonType},
		wantStats: Stats{Queries: 1, RefusedType: 1},
	}, {
		desc:      "NULL",
		m:         new(miekg.Msg).SetQuestion("allowed.test.", miekg.TypeNULL),
		wantRcode: miekg.RcodeRefused,
		wantBlock: blockCall{"allowed.test", miekg.TypeNULL, ReasonType},
		wantStats: Stats{Queries: 1, RefusedType: 1},
	}, {
		desc:      "CHAOS class",
		m:         chaos,
		wantRcode: miekg.RcodeRefused,
		wantBlock: blockCall{"version.bind", miekg.TypeA, ReasonType},
		wantStats: Stats{Queries: 1, RefusedType: 1},
	}, {
		desc:      "two questions",
		m:         twoQuestions,
		wantRcode: miekg.RcodeRefused,
		wantBlock: blockCall{"allowed.test", miekg.TypeA, ReasonTunnel},
		wantStats: Stats{Queries: 1, RefusedTunnel: 1},
	}, {
		desc:      "binary label",
		m:         new(miekg.Msg).SetQuestion(`a\000\255b.allowed.test.`, miekg.TypeA),
		wantRcode: miekg.RcodeRefused,
		wantBlock: blockCall{`a\000\255b.allowed.test`, miekg.TypeA, ReasonTunnel},
		wantStats: Stats{Queries: 1, RefusedTunnel: 1},
	}}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			e := newEnv(t, tt.cfg)
			resp, err := exchange(e.addr, srcA, "udp", tt.m)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Rcode != tt.wantRcode || len(resp.Answer) != 0 {
				t.Errorf("rcode = %s with %d answers, want %s with none", miekg.RcodeToString[resp.Rcode], len(resp.Answer), miekg.RcodeToString[tt.wantRcode])
			}
			allows, blocks := e.a.take()
			if want := []blockCall{tt.wantBlock}; !slices.Equal(blocks, want) {
				t.Errorf("Blocked calls = %v, want %v", blocks, want)
			}
			if len(allows) != 0 {
				t.Errorf("Allow calls = %v, want none", allows)
			}
			if got := e.r.Stats(); got != tt.wantStats {
				t.Errorf("stats = %+v, want %+v", got, tt.wantStats)
			}
			e.up.mu.Lock()
			defer e.up.mu.Unlock()
			if len(e.up.asked) != 0 {
				t.Errorf("upstream asked %v, want nothing", e.up.asked)
			}
		})
	}
}

func TestUnknownSource(t *testing.T) {
	e := newEnv(t, Config{})
	for _, proto := range []string{"udp", "tcp"} {
		resp := ask(t, e.addr, srcUnknown, proto, "allowed.test.", miekg.TypeA)
		if resp.Rcode != miekg.RcodeRefused || len(resp.Answer) != 0 || resp.RecursionAvailable {
			t.Errorf("%s: rcode = %s, %d answers, RA = %t; want REFUSED, none, false", proto, miekg.RcodeToString[resp.Rcode], len(resp.Answer), resp.RecursionAvailable)
		}
	}
	if n := e.up.askedAbout("allowed.test."); n != 0 {
		t.Errorf("upstream asked %d times, want 0", n)
	}
	for _, s := range []*recorder{e.a, e.b} {
		if allows, blocks := s.take(); len(allows)+len(blocks) != 0 {
			t.Errorf("sandbox %s got calls %v %v, want none", s.id, allows, blocks)
		}
	}
	if got, want := e.r.Stats(), (Stats{Queries: 2, UnknownSource: 2}); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
}

func TestMalformed(t *testing.T) {
	e := newEnv(t, Config{})
	noQuestion := new(miekg.Msg)
	noQuestion.Id = miekg.Id()
	notify := new(miekg.Msg).SetNotify("allowed.test.")
	for _, tt := range []struct {
		desc string
		m    *miekg.Msg
		want int
	}{
		{"no question", noQuestion, miekg.RcodeFormatError},
		{"notify", notify, miekg.RcodeNotImplemented},
	} {
		resp, err := exchange(e.addr, srcA, "udp", tt.m)
		if err != nil {
			t.Fatalf("%s: %v", tt.desc, err)
		}
		if resp.Rcode != tt.want {
			t.Errorf("%s: rcode = %s, want %s", tt.desc, miekg.RcodeToString[resp.Rcode], miekg.RcodeToString[tt.want])
		}
	}
	if got := e.r.Stats().Malformed; got != 2 {
		t.Errorf("Malformed = %d, want 2", got)
	}
}

func TestRateLimit(t *testing.T) {
	// A rate this low adds no token while the test runs.
	e := newEnv(t, Config{Rate: 0.001, Burst: 3})
	for i := range 3 {
		if resp := ask(t, e.addr, srcA, "udp", "allowed.test.", miekg.TypeA); resp.Rcode != miekg.RcodeSuccess {
			t.Fatalf("query %d: rcode = %s, want NOERROR", i, miekg.RcodeToString[resp.Rcode])
		}
	}
	e.a.take()
	resp := ask(t, e.addr, srcA, "tcp", "allowed.test.", miekg.TypeA)
	if resp.Rcode != miekg.RcodeRefused {
		t.Errorf("over the rate: rcode = %s, want REFUSED", miekg.RcodeToString[resp.Rcode])
	}
	if _, blocks := e.a.take(); !slices.Equal(blocks, []blockCall{{"allowed.test", miekg.TypeA, ReasonRate}}) {
		t.Errorf("Blocked calls = %v, want one %s", blocks, ReasonRate)
	}
	if resp := ask(t, e.addr, srcB, "udp", "allowed.test.", miekg.TypeA); resp.Rcode != miekg.RcodeSuccess {
		t.Errorf("another sandbox: rcode = %s, want NOERROR", miekg.RcodeToString[resp.Rcode])
	}
	if got := e.r.Stats(); got.RefusedRate != 1 || got.Allowed != 4 {
		t.Errorf("stats = %+v, want RefusedRate 1, Allowed 4", got)
	}
}

func TestLimiter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := newLimiter(10, 2)
	steps := []struct {
		id   string
		at   time.Duration
		want bool
	}{
		{"a", 0, true},
		{"a", 0, true},
		{"a", 0, false},
		{"b", 0, true},
		{"a", 50 * time.Millisecond, false},
		{"a", 100 * time.Millisecond, true},
		{"a", 100 * time.Millisecond, false},
		{"a", time.Hour, true},
		{"a", time.Hour, true},
		{"a", time.Hour, false},
	}
	for i, s := range steps {
		if got := l.allow(s.id, t0.Add(s.at)); got != s.want {
			t.Errorf("step %d: allow(%s, +%s) = %t, want %t", i, s.id, s.at, got, s.want)
		}
	}
	// The sweep at +1h dropped b, whose bucket had long refilled.
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.buckets["b"]; ok || len(l.buckets) != 1 {
		t.Errorf("buckets after sweep = %v, want only a", l.buckets)
	}
}

func TestUpstreamFailures(t *testing.T) {
	dead := deadAddr(t)
	t.Run("down", func(t *testing.T) {
		e := newEnv(t, Config{Upstreams: []netip.AddrPort{dead}, Timeout: 500 * time.Millisecond})
		resp := ask(t, e.addr, srcA, "udp", "allowed.test.", miekg.TypeA)
		if resp.Rcode != miekg.RcodeServerFailure {
			t.Errorf("rcode = %s, want SERVFAIL", miekg.RcodeToString[resp.Rcode])
		}
		if allows, blocks := e.a.take(); len(allows)+len(blocks) != 0 {
			t.Errorf("calls %v %v, want none", allows, blocks)
		}
		if got, want := e.r.Stats(), (Stats{Queries: 1, Allowed: 1, UpstreamErrors: 1}); got != want {
			t.Errorf("stats = %+v, want %+v", got, want)
		}
	})
	t.Run("retry on the other", func(t *testing.T) {
		e := newEnv(t, Config{Timeout: 500 * time.Millisecond})
		e2 := newEnv(t, Config{Upstreams: []netip.AddrPort{dead, e.up.addr}, Timeout: 500 * time.Millisecond})
		// Round robin starts on each upstream in turn; every query must succeed.
		for i := range 4 {
			if resp := ask(t, e2.addr, srcA, "udp", "allowed.test.", miekg.TypeA); resp.Rcode != miekg.RcodeSuccess || len(resp.Answer) != 2 {
				t.Errorf("query %d: rcode = %s with %d answers, want NOERROR with 2", i, miekg.RcodeToString[resp.Rcode], len(resp.Answer))
			}
		}
		if got := e2.r.Stats().UpstreamErrors; got != 0 {
			t.Errorf("UpstreamErrors = %d, want 0", got)
		}
	})
}

// deadAddr returns a loopback UDP address nothing listens on: queries to it fail at once.
func deadAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(srcLoopback, uint16(pc.LocalAddr().(*net.UDPAddr).Port))
	pc.Close()
	return addr
}

func TestTruncation(t *testing.T) {
	e := newEnv(t, Config{})
	// The upstream truncates over UDP; the resolver asks again over TCP and answers in full.
	resp := ask(t, e.addr, srcA, "udp", "big.allowed.test.", miekg.TypeA)
	if resp.Truncated || len(resp.Answer) != bigAnswers {
		t.Errorf("EDNS 1232 over UDP: TC = %t with %d answers, want false with %d", resp.Truncated, len(resp.Answer), bigAnswers)
	}
	e.up.mu.Lock()
	upTCP := e.up.tcp
	e.up.mu.Unlock()
	if upTCP != 1 {
		t.Errorf("upstream asked over TCP %d times, want 1", upTCP)
	}
	if allows, _ := e.a.take(); len(allows) != bigAnswers {
		t.Errorf("%d Allow calls, want %d", len(allows), bigAnswers)
	}

	// Without EDNS a UDP answer holds 512 bytes: the sandbox gets TC and asks over TCP.
	plain := new(miekg.Msg).SetQuestion("big.allowed.test.", miekg.TypeA)
	resp, err := exchange(e.addr, srcA, "udp", plain)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Truncated || len(resp.Answer) >= bigAnswers {
		t.Errorf("plain UDP: TC = %t with %d answers, want true with fewer than %d", resp.Truncated, len(resp.Answer), bigAnswers)
	}
	resp, err = exchange(e.addr, srcA, "tcp", plain)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Truncated || len(resp.Answer) != bigAnswers {
		t.Errorf("plain TCP: TC = %t with %d answers, want false with %d", resp.Truncated, len(resp.Answer), bigAnswers)
	}
}

func TestConcurrent(t *testing.T) {
	e := newEnv(t, Config{})
	queries := []struct {
		name  string
		qtype uint16
		rcode int
		n     int
	}{
		{"allowed.test.", miekg.TypeA, miekg.RcodeSuccess, 2},
		{"www.allowed.test.", miekg.TypeA, miekg.RcodeSuccess, 3},
		{"allowed.test.", miekg.TypeAAAA, miekg.RcodeSuccess, 0},
		{"denied.test.", miekg.TypeA, miekg.RcodeRefused, 0},
		{"txt.allowed.test.", miekg.TypeTXT, miekg.RcodeRefused, 0},
	}
	const workers, each = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		src, proto := srcA, "udp"
		if w%2 == 1 {
			src = srcB
		}
		if w%4 >= 2 {
			proto = "tcp"
		}
		wg.Go(func() {
			for i := range each {
				q := queries[(w+i)%len(queries)]
				m := new(miekg.Msg).SetQuestion(q.name, q.qtype)
				resp, err := exchange(e.addr, src, proto, m)
				switch {
				case err != nil:
					errs <- err
				case resp.Rcode != q.rcode || len(resp.Answer) != q.n:
					errs <- fmt.Errorf("%s %s: rcode %s with %d answers, want %s with %d", q.name, miekg.Type(q.qtype),
						miekg.RcodeToString[resp.Rcode], len(resp.Answer), miekg.RcodeToString[q.rcode], q.n)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := e.r.Stats(); got.Queries != workers*each || int(got.RefusedName+got.RefusedType) != 2*workers*each/len(queries) {
		t.Errorf("stats = %+v, want %d queries, %d refused", got, workers*each, 2*workers*each/len(queries))
	}
}

func TestListenUnlistenClose(t *testing.T) {
	e := newEnv(t, Config{})
	second, err := e.r.Listen(netip.MustParseAddrPort("127.0.0.4:0"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := e.r.Addrs(), []netip.AddrPort{e.addr, second}; !slices.Equal(got, want) {
		t.Errorf("Addrs() = %v, want %v", got, want)
	}
	if _, err := e.r.Listen(second); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Listen(%s) again: err = %v, want a conflict", second, err)
	}
	ask(t, second, srcA, "udp", "allowed.test.", miekg.TypeA)

	if err := e.r.Unlisten(second); err != nil {
		t.Fatal(err)
	}
	if err := e.r.Unlisten(second); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Unlisten twice: err = %v, want not found", err)
	}
	assertFree(t, second)
	ask(t, e.addr, srcA, "tcp", "allowed.test.", miekg.TypeA)

	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	assertFree(t, e.addr)
	if len(e.r.Addrs()) != 0 {
		t.Errorf("Addrs() after Close = %v, want none", e.r.Addrs())
	}
	if _, err := e.r.Listen(e.addr); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Listen after Close: err = %v, want net.ErrClosed", err)
	}
	if err := e.r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// assertFree checks that addr's UDP and TCP ports can be bound again.
func assertFree(t *testing.T, addr netip.AddrPort) {
	t.Helper()
	pc, ln, err := bind(addr)
	if err != nil {
		t.Fatalf("%s still bound: %v", addr, err)
	}
	pc.Close()
	ln.Close()
}

func TestCloseCancelsUpstreamQueries(t *testing.T) {
	// An upstream that reads queries and never answers.
	hole, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	received := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := hole.ReadFrom(buf); err != nil {
				return
			}
			select {
			case received <- struct{}{}:
			default:
			}
		}
	}()
	e := newEnv(t, Config{Upstreams: []netip.AddrPort{hole.LocalAddr().(*net.UDPAddr).AddrPort()}, Timeout: time.Minute})
	done := make(chan error, 1)
	go func() {
		_, err := exchange(e.addr, srcA, "tcp", new(miekg.Msg).SetQuestion("allowed.test.", miekg.TypeA))
		done <- err
	}()
	<-received
	start := time.Now()
	e.r.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %s with a query in flight, want well under the upstream timeout", d)
	}
	<-done
	if got := e.r.Stats().UpstreamErrors; got != 0 {
		t.Errorf("UpstreamErrors = %d, want 0: a query cut by Close is no upstream error", got)
	}
}

func TestConfigValidate(t *testing.T) {
	up := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}
	tests := []struct {
		cfg       Config
		wantField string
	}{
		{Config{Upstreams: up}, ""},
		{Config{}, "dns.upstreams"},
		{Config{Upstreams: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:0")}}, "dns.upstreams"},
		{Config{Upstreams: []netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:53")}}, "dns.upstreams"},
		{Config{Upstreams: up, Timeout: -time.Second}, "dns.timeout"},
		{Config{Upstreams: up, MinTTL: time.Millisecond}, "dns.min_ttl"},
		{Config{Upstreams: up, MinTTL: time.Hour, MaxTTL: time.Minute}, "dns.max_ttl"},
		{Config{Upstreams: up, MaxTTL: 100 * 365 * 24 * time.Hour}, "dns.max_ttl"},
		{Config{Upstreams: up, Rate: -1}, "dns.rate"},
		{Config{Upstreams: up, Burst: -1}, "dns.burst"},
	}
	for i, tt := range tests {
		err := tt.cfg.Validate()
		if got := errdefs.Field(err); got != tt.wantField {
			t.Errorf("%d: Validate() = %v, want field %q", i, err, tt.wantField)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%d: Validate() = %v, want ErrInvalid", i, err)
		}
	}
	if _, err := New(Config{Upstreams: up}, nil, slog.New(slog.DiscardHandler)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("New without lookup: err = %v, want ErrInvalid", err)
	}
}
