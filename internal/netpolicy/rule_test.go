package netpolicy

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestParseRule(t *testing.T) {
	tests := []struct {
		in    string
		want  Rule
		canon string // "" means the input is already canonical
	}{
		// Services.
		{"pypi", Rule{Service: "pypi", Ports: AllPorts, Proto: ProtoBoth}, ""},
		{"my_svc-2", Rule{Service: "my_svc-2", Ports: AllPorts, Proto: ProtoBoth}, ""},
		{"GitHub", Rule{Service: "github", Ports: AllPorts, Proto: ProtoBoth}, "github"},
		{"github:443", Rule{Service: "github", Ports: PortRange{443, 443}, Proto: ProtoBoth}, ""},
		{"github:443/tcp", Rule{Service: "github", Ports: PortRange{443, 443}, Proto: ProtoTCP}, ""},
		{strings.Repeat("s", 63), Rule{Service: strings.Repeat("s", 63), Ports: AllPorts, Proto: ProtoBoth}, ""},

		// Domains.
		{"pypi.org", Rule{Domain: "pypi.org", Ports: AllPorts, Proto: ProtoBoth}, ""},
		{"PyPI.Org.", Rule{Domain: "pypi.org", Ports: AllPorts, Proto: ProtoBoth}, "pypi.org"},
		{"*.example.com", Rule{Domain: "*.example.com", Ports: AllPorts, Proto: ProtoBoth}, ""},
		{"*.example.com.", Rule{Domain: "*.example.com", Ports: AllPorts, Proto: ProtoBoth}, "*.example.com"},
		{"pypi.org:443", Rule{Domain: "pypi.org", Ports: PortRange{443, 443}, Proto: ProtoBoth}, ""},
		{"pypi.org.:443", Rule{Domain: "pypi.org", Ports: PortRange{443, 443}, Proto: ProtoBoth}, "pypi.org:443"},
		{"*.x.y:443", Rule{Domain: "*.x.y", Ports: PortRange{443, 443}, Proto: ProtoBoth}, ""},
		{"dns.example.com:53/udp", Rule{Domain: "dns.example.com", Ports: PortRange{53, 53}, Proto: ProtoUDP}, ""},
		{"xn--bcher-kva.example", Rule{Domain: "xn--bcher-kva.example", Ports: AllPorts, Proto: ProtoBoth}, ""},
		{"1.2.3.example", Rule{Domain: "1.2.3.example", Ports: AllPorts, Proto: ProtoBoth}, ""},
		{"a-b.c-d.com", Rule{Domain: "a-b.c-d.com", Ports: AllPorts, Proto: ProtoBoth}, ""},
		{strings.Repeat("a", 63) + ".com", Rule{Domain: strings.Repeat("a", 63) + ".com", Ports: AllPorts, Proto: ProtoBoth}, ""},

		// Addresses.
		{"203.0.113.7", Rule{Prefix: pfx("203.0.113.7/32"), Ports: AllPorts, Proto: ProtoBoth}, ""},
		{"203.0.113.7/32", Rule{Prefix: pfx("203.0.113.7/32"), Ports: AllPorts, Proto: ProtoBoth}, "203.0.113.7"},
		{"203.0.113.0/24", Rule{Prefix: pfx("203.0.113.0/24"), Ports: AllPorts, Proto: ProtoBoth}, ""},
		{"203.0.113.77/24", Rule{Prefix: pfx("203.0.113.0/24"), Ports: AllPorts, Proto: ProtoBoth}, "203.0.113.0/24"},
		{"0.0.0.0/0", Rule{Prefix: pfx("0.0.0.0/0"), Ports: AllPorts, Proto: ProtoBoth}, ""},
		{"203.0.113.7:443", Rule{Prefix: pfx("203.0.113.7/32"), Ports: PortRange{443, 443}, Proto: ProtoBoth}, ""},
		{"203.0.113.7/tcp", Rule{Prefix: pfx("203.0.113.7/32"), Ports: AllPorts, Proto: ProtoTCP}, ""},
		{"203.0.113.7:53/UDP", Rule{Prefix: pfx("203.0.113.7/32"), Ports: PortRange{53, 53}, Proto: ProtoUDP}, "203.0.113.7:53/udp"},
		// The protocol suffix is not a prefix length, and the other way round.
		{"203.0.113.0/24/tcp", Rule{Prefix: pfx("203.0.113.0/24"), Ports: AllPorts, Proto: ProtoTCP}, ""},
		{"203.0.113.0/24:443/tcp", Rule{Prefix: pfx("203.0.113.0/24"), Ports: PortRange{443, 443}, Proto: ProtoTCP}, ""},
		{"203.0.113.0/24:443", Rule{Prefix: pfx("203.0.113.0/24"), Ports: PortRange{443, 443}, Proto: ProtoBoth}, ""},
		{"203.0.113.0/24:8000-8080/udp", Rule{Prefix: pfx("203.0.113.0/24"), Ports: PortRange{8000, 8080}, Proto: ProtoUDP}, ""},
		{"203.0.113.7:1-65535", Rule{Prefix: pfx("203.0.113.7/32"), Ports: PortRange{1, 65535}, Proto: ProtoBoth}, ""},
		{"203.0.113.7:65535", Rule{Prefix: pfx("203.0.113.7/32"), Ports: PortRange{65535, 65535}, Proto: ProtoBoth}, ""},
		{"203.0.113.7:443-443", Rule{Prefix: pfx("203.0.113.7/32"), Ports: PortRange{443, 443}, Proto: ProtoBoth}, "203.0.113.7:443"},
		{"203.0.113.7:0443", Rule{Prefix: pfx("203.0.113.7/32"), Ports: PortRange{443, 443}, Proto: ProtoBoth}, "203.0.113.7:443"},
		// Syntax only: whether an address may be opened is Compile's business.
		{"10.0.0.0/8", Rule{Prefix: pfx("10.0.0.0/8"), Ports: AllPorts, Proto: ProtoBoth}, ""},
	}
	for _, tt := range tests {
		got, err := ParseRule(tt.in)
		if err != nil {
			t.Errorf("ParseRule(%q): %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseRule(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		canon := tt.canon
		if canon == "" {
			canon = tt.in
		}
		if s := got.String(); s != canon {
			t.Errorf("ParseRule(%q).String() = %q, want %q", tt.in, s, canon)
		}
	}
}

func TestParseRuleRejects(t *testing.T) {
	tests := []struct {
		in   string
		want string // in the error message
	}{
		{"", "empty rule"},
		{strings.Repeat("a", MaxRuleLen+1), "longer than"},

		// Wildcard abuse.
		{"*", "every domain"},
		{"*.", "every domain"},
		{"*.com", "at least two labels"},
		{"*.com.", "at least two labels"},
		{"*.*.example.com", "whole first label"},
		{"a.*.example.com", "whole first label"},
		{"example.*", "whole first label"},
		{"foo*.bar", "whole first label"},
		{"*foo.bar.com", "whole first label"},
		{"**.example.com", "whole first label"},
		{"*:443", "every domain"},

		// Domains.
		{"a..b", "empty label"},
		{".example.com", "empty label"},
		{"example.com..", "empty label"},
		{strings.Repeat("a", 64) + ".com", "longer than 63"},
		{strings.Repeat(strings.Repeat("a", 63)+".", 4) + "com", "at most 253"},
		{"-a.com", "starts or ends with '-'"},
		{"a-.com", "starts or ends with '-'"},
		{"under_score.com", "not a letter"},
		{"sp ace.com", "not a letter"},
		{"bücher.de", "not a letter"},
		{"\u212Aelvin.com", "not a letter"},
		{"example.123", "numeric"},
		{"*.1.2.3.4", "numeric"},
		{"localhost.", "at least two labels"},
		{"[example.com]", "brackets"},
		{"[example.com]:443", "brackets"},
		{"[203.0.113.7]:443", "brackets"},
		{"example.com]", "brackets"},

		// Services.
		{strings.Repeat("s", 64), "1-63"},
		{"bad!name", "not a service name"},

		// Addresses.
		{"1.2.3.4/33", "0-32"},
		{"1.2.3.4/", "0-32"},
		{"1.2.3.4/-1", "0-32"},
		{"1.2.3.4/024x", "0-32"},
		{"1.2.3.4/24:443x", "1-65535"},
		{"1.2.3.4/sctp", "unknown protocol"},
		{"1.2.3/24", "not an IPv4 address"},
		{"1.2.3", "not a valid IPv4 address"},
		{"1.2.3.4.5", "not a valid IPv4 address"},
		{"256.1.1.1", "not a valid IPv4 address"},
		{"01.2.3.4", "not a valid IPv4 address"},
		{"/24", "not an IPv4 address"},
		{"pypi.org/24", "not an IPv4 address"},
		{"1.2.3.4/24/tcp/udp", "0-32"},
		{"203.0.113.0:443/24", "port"},

		// Ports.
		{"1.2.3.4:0", "1-65535"},
		{"1.2.3.4:65536", "1-65535"},
		{"1.2.3.4:99999999999999999999", "1-65535"},
		{"1.2.3.4:+443", "1-65535"},
		{"1.2.3.4:", "1-65535"},
		{"1.2.3.4:http", "1-65535"},
		{"1.2.3.4:8080-8000", "above the last"},
		{"1.2.3.4:0-80", "1-65535"},
		{"1.2.3.4:80-", "1-65535"},
		{"1.2.3.4:80-90-100", "1-65535"},
		{"pypi.org:0", "1-65535"},
		{":443", "before the port"},
		{"/tcp", "before the port"},

		// IPv6.
		{"2001:db8::/32", "IPv6 egress is blocked"},
		{"2001:db8::1", "IPv6 egress is blocked"},
		{"[2001:db8::1]:443", "IPv6 egress is blocked"},
		{"[2001:db8::1]:443/tcp", "IPv6 egress is blocked"},
		{"[2001:db8::/32]:443", "IPv6 egress is blocked"},
		{"::ffff:10.0.0.1", "IPv6 egress is blocked"},
		{"::/0", "IPv6 egress is blocked"},
		{"a:b:c", "more than one ':'"},
	}
	for _, tt := range tests {
		r, err := ParseRule(tt.in)
		if err == nil {
			t.Errorf("ParseRule(%q) = %+v, want an error containing %q", tt.in, r, tt.want)
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseRule(%q): %v is not ErrInvalid", tt.in, err)
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseRule(%q) error = %q, want it to contain %q", tt.in, err, tt.want)
		}
		if len(tt.in) <= MaxRuleLen && !strings.Contains(err.Error(), strconv.Quote(tt.in)) {
			t.Errorf("ParseRule(%q) error = %q does not quote the rule", tt.in, err)
		}
	}
}

// FuzzParseRule checks that parsing never panics, that whatever parses is normalised (its String
// parses back to the same rule and is a fixed point), and that refusals are ErrInvalid.
//
//	go test -run '^$' -fuzz FuzzParseRule -fuzztime 60s ./internal/netpolicy
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{
		"pypi", "pypi.org", "*.example.com", "*.x.y:443", "pypi.org.:443", "203.0.113.7",
		"203.0.113.0/24", "203.0.113.0/24/tcp", "203.0.113.0/24:443/tcp", "203.0.113.7:8000-8080/udp",
		"*", "*.com", "foo*.bar", "[example.com]", "10.0.0.0/8", "169.254.169.254", "1.2.3.4/33",
		"1.2.3/24", "1.2.3.4:0", "1.2.3.4:65536", "a..b", "[2001:db8::1]:443", "2001:db8::/32",
		"PYPI.ORG", "0.0.0.0/0", "1.2.3.4:0443",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("ParseRule(%q): %v is not ErrInvalid", s, err)
			}
			return
		}
		if r.Kind() == 0 {
			t.Fatalf("ParseRule(%q) = %+v: no kind", s, r)
		}
		out := r.String()
		r2, err := ParseRule(out)
		if err != nil {
			t.Fatalf("ParseRule(%q) = %q, which does not parse: %v", s, out, err)
		}
		if r2 != r {
			t.Fatalf("ParseRule(%q) = %+v, but its String %q parses as %+v", s, r, out, r2)
		}
		if out2 := r2.String(); out2 != out {
			t.Fatalf("String of %q is not a fixed point: %q then %q", s, out, out2)
		}
	})
}
