package dns

import (
	"strings"
	"testing"
	"time"

	miekg "github.com/miekg/dns"
)

// FuzzShapeAnswer feeds arbitrary upstream responses to shapeAnswer and checks that the sandbox
// gets only the chain from the queried name, TTLs no longer than the maximum, and grants only for
// IPv4 unicast addresses with clamped TTLs.
//
//	go test -run '^$' -fuzz FuzzShapeAnswer -fuzztime 60s ./internal/egress/dns
func FuzzShapeAnswer(f *testing.F) {
	for _, rrs := range [][]string{
		zone["allowed.test. A"],
		zone["www.allowed.test. A"],
		zone["local.allowed.test. A"],
		{"allowed.test. 60 IN CNAME allowed.test.", "allowed.test. 60 IN A 192.0.2.1"},
		{"allowed.test. 60 IN CNAME b.test.", "b.test. 60 IN CNAME allowed.test."},
		{"ALLOWED.test. 4294967295 IN A 192.0.2.1", "allowed.test. 60 CH A 192.0.2.2"},
	} {
		m := new(miekg.Msg).SetQuestion("allowed.test.", miekg.TypeA)
		for _, s := range rrs {
			m.Answer = append(m.Answer, mustRR(s))
		}
		m.Ns = append(m.Ns, mustRR("allowed.test. 86400 IN SOA ns.test. a.test. 1 2 3 4 5"), mustRR("allowed.test. 60 IN NS ns.test."))
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
		f.Add(b, true)
	}
	const minTTL, maxTTL = 30 * time.Second, time.Hour
	f.Fuzz(func(t *testing.T, data []byte, cname bool) {
		resp := new(miekg.Msg)
		if resp.Unpack(data) != nil {
			return
		}
		qname, qtype := "allowed.test.", miekg.TypeA
		if len(resp.Question) > 0 {
			qname = resp.Question[0].Name
		}
		if cname {
			qtype = miekg.TypeCNAME
		}
		a := shapeAnswer(qname, qtype, resp, minTTL, maxTTL)
		if len(a.answer) > maxChain+1+len(resp.Answer) {
			t.Errorf("%d records answered from %d", len(a.answer), len(resp.Answer))
		}
		// Each record continues the chain: its owner is the queried name or the last CNAME target.
		cur := qname
		for i, rr := range append(a.answer, a.authority...) {
			h := rr.Header()
			if h.Ttl > uint32(maxTTL/time.Second) {
				t.Errorf("TTL %d over the maximum: %s", h.Ttl, rr)
			}
			if i >= len(a.answer) {
				if h.Rrtype != miekg.TypeSOA {
					t.Errorf("authority record %s, want SOA only", rr)
				}
				continue
			}
			if !strings.EqualFold(h.Name, cur) || h.Class != miekg.ClassINET {
				t.Errorf("record %s off the chain at %s", rr, cur)
			}
			switch rr := rr.(type) {
			case *miekg.CNAME:
				cur = rr.Target
			case *miekg.A:
				if qtype != miekg.TypeA {
					t.Errorf("A record %s answers a %s query", rr, miekg.Type(qtype))
				}
			default:
				t.Errorf("record %s answered, want only CNAME and A", rr)
			}
		}
		for _, g := range a.grants {
			if !g.ip.Is4() || !g.ip.IsGlobalUnicast() || g.ttl < minTTL || g.ttl > maxTTL {
				t.Errorf("grant %v", g)
			}
		}
		if len(a.grants) > 0 && a.owner != policyName(cur) {
			t.Errorf("owner %q, want %q", a.owner, policyName(cur))
		}
	})
}

// FuzzCheckQuestion feeds arbitrary queries to checkQuestion and checks that whatever it lets
// through to a policy is one IN question of type A, AAAA or CNAME for a plain host name.
//
//	go test -run '^$' -fuzz FuzzCheckQuestion -fuzztime 60s ./internal/egress/dns
func FuzzCheckQuestion(f *testing.F) {
	for _, q := range []struct {
		name  string
		qtype uint16
	}{
		{"allowed.test.", miekg.TypeA},
		{"Allowed.Test.", miekg.TypeAAAA},
		{`a\000b.test.`, miekg.TypeA},
		{"a.test.", miekg.TypeTXT},
		{"_dmarc.a.test.", miekg.TypeCNAME},
		{".", miekg.TypeA},
	} {
		b, err := new(miekg.Msg).SetQuestion(q.name, q.qtype).Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := new(miekg.Msg)
		if req.Unpack(data) != nil || len(req.Question) == 0 {
			return
		}
		name, reason := checkQuestion(req)
		if reason != "" {
			return
		}
		q := req.Question[0]
		if len(req.Question) != 1 || q.Qclass != miekg.ClassINET ||
			q.Qtype != miekg.TypeA && q.Qtype != miekg.TypeAAAA && q.Qtype != miekg.TypeCNAME {
			t.Errorf("question %v passed", req.Question)
		}
		if name != strings.ToLower(name) || strings.HasSuffix(name, ".") || strings.ContainsAny(name, `\ *`) || len(name) > 253 || name == "" {
			t.Errorf("name %q passed", name)
		}
	})
}
