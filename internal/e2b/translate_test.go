package e2b

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestExportedDocs checks that every exported identifier of the package has a doc comment: the
// servers that mount the gateway, and the envd slice that checks its tokens, are written against
// them.
func TestExportedDocs(t *testing.T) { doccheck.Exported(t, ".") }

func TestNetworkPolicy(t *testing.T) {
	off, on := false, true
	tests := []struct {
		name        string
		internet    *bool
		allow, deny []string
		want        corral.NetworkPolicy
		wantErr     string // prefix of the message
	}{
		{name: "default: internet", want: corral.NetworkPolicy{Mode: corral.NetworkOpen}},
		{name: "flag on", internet: &on, want: corral.NetworkPolicy{Mode: corral.NetworkOpen}},
		{name: "flag off", internet: &off, want: corral.NetworkPolicy{Mode: corral.NetworkNone}},
		{name: "deny all", deny: []string{allTraffic}, want: corral.NetworkPolicy{Mode: corral.NetworkNone}},
		{name: "allowlist", deny: []string{allTraffic, "8.8.8.8"}, allow: []string{"1.1.1.1", "*.github.com"},
			want: corral.NetworkPolicy{Mode: corral.NetworkAllowlist, Allow: []string{"1.1.1.1", "*.github.com"}}},
		{name: "flag off with allow", internet: &off, allow: []string{"pypi.org"},
			want: corral.NetworkPolicy{Mode: corral.NetworkAllowlist, Allow: []string{"pypi.org"}}},
		{name: "allow all wins", internet: &off, allow: []string{allTraffic}, deny: []string{"1.2.3.4"},
			want: corral.NetworkPolicy{Mode: corral.NetworkOpen}},
		{name: "open with deny", deny: []string{"1.2.3.4", "5.6.0.0/16"}, allow: []string{"9.9.9.9"},
			want: corral.NetworkPolicy{Mode: corral.NetworkOpen, Deny: []string{"1.2.3.4", "5.6.0.0/16"}}},
		{name: "allow cut out of deny", deny: []string{"1.0.0.0/30"}, allow: []string{"1.0.0.1"},
			want: corral.NetworkPolicy{Mode: corral.NetworkOpen, Deny: []string{"1.0.0.0/32", "1.0.0.2/31"}}},
		{name: "deny wholly allowed back", deny: []string{"1.0.0.4/30"}, allow: []string{"1.0.0.0/24"},
			want: corral.NetworkPolicy{Mode: corral.NetworkOpen}},
		{name: "domain deny, unrelated domain allow", deny: []string{"evil.com"}, allow: []string{"good.com"},
			want: corral.NetworkPolicy{Mode: corral.NetworkOpen, Deny: []string{"evil.com"}}},
		{name: "domain allow inside domain deny", deny: []string{"*.example.com"}, allow: []string{"api.example.com"}, wantErr: "network.allowOut"},
		{name: "domain allow against address deny", deny: []string{"1.2.3.4"}, allow: []string{"example.com"}, wantErr: "network.allowOut"},
		{name: "address allow against domain deny", deny: []string{"evil.com"}, allow: []string{"1.2.3.4"}, wantErr: "network.allowOut"},
		{name: "empty entry", allow: []string{" "}, deny: []string{allTraffic}, wantErr: "network.allowOut[0]"},
		{name: "too many rules", deny: []string{"0.0.0.0/1"}, allow: manyHoles(300), wantErr: "network.denyOut"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := networkPolicy(tt.internet, tt.allow, tt.deny)
			if tt.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one starting with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func manyHoles(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%d.%d.0.1", 1+i/200, i%200))
	}
	return out
}

// TestSubtractPrefixes checks the cut-out against every address of a small range.
func TestSubtractPrefixes(t *testing.T) {
	p := netip.MustParsePrefix("10.0.0.0/26")
	holes := []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32"), netip.MustParsePrefix("10.0.0.32/28"), netip.MustParsePrefix("10.9.0.0/16")}
	rest := subtractPrefixes(p, holes)
	for a := p.Addr(); p.Contains(a); a = a.Next() {
		inHole := slices.ContainsFunc(holes, func(h netip.Prefix) bool { return h.Contains(a) })
		inRest := 0
		for _, r := range rest {
			if r.Contains(a) {
				inRest++
			}
		}
		if inHole && inRest != 0 || !inHole && inRest != 1 {
			t.Fatalf("%s: in a hole %v, covered %d times by %v", a, inHole, inRest, rest)
		}
	}
}

func TestDomainsOverlap(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want bool
	}{
		{"a.com", "a.com", true},
		{"a.com", "b.com", false},
		{"x.a.com", "*.a.com", true},
		{"a.com", "*.a.com", false},
		{"*.a.com", "x.a.com", true},
		{"*.x.a.com", "*.a.com", true},
		{"*.a.com", "*.b.com", false},
		{"A.com.", "a.com", true},
	} {
		if got := domainsOverlap(tt.a, tt.b); got != tt.want {
			t.Errorf("domainsOverlap(%q, %q) = %v", tt.a, tt.b, got)
		}
	}
}

func TestNetworkOf(t *testing.T) {
	for _, tt := range []struct {
		in       *corral.NetworkPolicy
		internet bool
		cfg      string
	}{
		{nil, false, "<nil>"},
		{&corral.NetworkPolicy{Mode: corral.NetworkNone}, false, "<nil>"},
		{&corral.NetworkPolicy{Mode: corral.NetworkOpen}, true, "<nil>"},
		{&corral.NetworkPolicy{Mode: corral.NetworkOpen, Deny: []string{"1.2.3.4"}}, true, `{"denyOut":["1.2.3.4"]}`},
		{&corral.NetworkPolicy{Mode: corral.NetworkAllowlist, Allow: []string{"a.com"}}, false, `{"allowOut":["a.com"],"denyOut":["0.0.0.0/0"]}`},
	} {
		internet, cfg := networkOf(tt.in)
		got := "<nil>"
		if cfg != nil {
			b, _ := json.Marshal(cfg)
			got = string(b)
		}
		if internet != tt.internet || got != tt.cfg {
			t.Errorf("networkOf(%+v) = %v %s, want %v %s", tt.in, internet, got, tt.internet, tt.cfg)
		}
	}
}

// FuzzCreateBody feeds create bodies through decoding and translation: no panic, and what is
// accepted is something Corral's validation can take (labels and env as Corral checks them).
func FuzzCreateBody(f *testing.F) {
	f.Add([]byte(`{"templateID":"base","metadata":{"k":"v"},"envVars":{"A":"1"},"timeout":120,"allow_internet_access":false,"network":{"allowOut":["1.1.1.1"],"denyOut":["0.0.0.0/0"]}}`))
	f.Add([]byte(`{"templateID":"x:1","network":{"allowOut":["1.0.0.1"],"denyOut":["1.0.0.0/8"]}}`))
	f.Add([]byte(`{"templateID":"base","autoPause":true}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var in newSandbox
		if decodeJSON(body, &in) != nil {
			return
		}
		req, _, err := translateCreate(in)
		if err != nil {
			if _, ok := err.(*apiError); !ok {
				t.Fatalf("error %T %v is not an E2B error", err, err)
			}
			return
		}
		if len(req.Labels) > maxLabels {
			t.Errorf("%d labels", len(req.Labels))
		}
		for k, v := range req.Labels {
			if !labelKeyRE.MatchString(k) || len(v) > maxLabelValue || strings.ContainsAny(v, "\x00\n") {
				t.Errorf("label %q=%q would be refused by Corral", k, v)
			}
		}
		for _, kv := range req.Env {
			if k, _, _ := strings.Cut(kv, "="); !envKeyRE.MatchString(k) {
				t.Errorf("env %q would be refused by Corral", kv)
			}
		}
		if req.Network == nil {
			t.Error("no network policy")
		}
	})
}

func FuzzParseCursor(f *testing.F) {
	f.Add(cursor{id: "sb-1"}.String())
	f.Add("zz")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := parseCursor(s)
		if err == nil && parseCursorMust(t, c.String()).id != c.id {
			t.Errorf("cursor %q does not round-trip", s)
		}
	})
}

func parseCursorMust(t *testing.T, s string) *cursor {
	c, err := parseCursor(s)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return c
}
