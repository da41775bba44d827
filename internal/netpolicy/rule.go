package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// MaxRuleLen bounds the length of one rule string; the longest sensible rule (a 253-character
// domain with a port range and a protocol) is well below it.
const MaxRuleLen = 300

// Proto is the set of transport protocols a rule covers.
type Proto uint8

// The protocols. A rule without a "/tcp" or "/udp" suffix covers ProtoBoth.
const (
	ProtoTCP  Proto = 1 << iota // TCP only
	ProtoUDP                    // UDP only
	ProtoBoth = ProtoTCP | ProtoUDP
)

// String returns "tcp", "udp" or "tcp+udp" ("none" for the empty set).
func (p Proto) String() string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoBoth:
		return "tcp+udp"
	}
	return "none"
}

// Has reports whether p covers every protocol in q.
func (p Proto) Has(q Proto) bool { return q != 0 && p&q == q }

// ParseProto turns "tcp" or "udp" into a Proto; anything else reports false.
func ParseProto(s string) (Proto, bool) {
	switch s {
	case "tcp":
		return ProtoTCP, true
	case "udp":
		return ProtoUDP, true
	}
	return 0, false
}

// PortRange is an inclusive range of ports. AllPorts means the rule names no port.
type PortRange struct {
	First, Last uint16
}

// AllPorts is the range of a rule that names no port. It includes port 0, so that a rule without
// a port leaves no port of its addresses out.
var AllPorts = PortRange{0, 65535}

// Contains reports whether port lies in r.
func (r PortRange) Contains(port uint16) bool { return r.First <= port && port <= r.Last }

// String returns "443", "8000-8080", or "all" for AllPorts.
func (r PortRange) String() string {
	switch {
	case r == AllPorts:
		return "all"
	case r.First == r.Last:
		return strconv.Itoa(int(r.First))
	}
	return strconv.Itoa(int(r.First)) + "-" + strconv.Itoa(int(r.Last))
}

// covers reports whether r includes all of q.
func (r PortRange) covers(q PortRange) bool { return r.First <= q.First && q.Last <= r.Last }

// intersect returns the ports in both r and q; ok is false when there are none.
func (r PortRange) intersect(q PortRange) (PortRange, bool) {
	out := PortRange{max(r.First, q.First), min(r.Last, q.Last)}
	return out, out.First <= out.Last
}

// Kind says which of the three forms a Rule has.
type Kind uint8

// The rule forms.
const (
	KindService Kind = iota + 1 // a name from the operator's service catalog
	KindDomain                  // an exact domain or a "*." wildcard
	KindAddress                 // an IPv4 address or prefix
)

// Rule is one parsed policy rule. Exactly one of Service, Domain and Prefix is set. Rules made by
// ParseRule are normalised, so two rules that mean the same compare equal with ==.
type Rule struct {
	// Service is a catalog service name ("pypi").
	Service string
	// Domain is a lowercase domain without a trailing dot: "pypi.org", or "*.example.com" for any
	// name below example.com (but not example.com itself).
	Domain string
	// Prefix is an IPv4 prefix with its host bits cleared; a single address is a /32.
	Prefix netip.Prefix
	// Ports is the port range the rule covers; AllPorts when the rule names none.
	Ports PortRange
	// Proto is the protocols the rule covers; ProtoBoth when the rule names none.
	Proto Proto
}

// Kind returns the rule's form, or 0 for the zero Rule.
func (r Rule) Kind() Kind {
	switch {
	case r.Service != "":
		return KindService
	case r.Domain != "":
		return KindDomain
	case r.Prefix.IsValid():
		return KindAddress
	}
	return 0
}

// String returns the rule in the syntax ParseRule reads, normalised: ParseRule(r.String())
// returns r.
func (r Rule) String() string {
	var b strings.Builder
	switch r.Kind() {
	case KindService:
		b.WriteString(r.Service)
	case KindDomain:
		b.WriteString(r.Domain)
	case KindAddress:
		if r.Prefix.IsSingleIP() {
			b.WriteString(r.Prefix.Addr().String())
		} else {
			b.WriteString(r.Prefix.String())
		}
	}
	if r.Ports != AllPorts {
		b.WriteByte(':')
		b.WriteString(r.Ports.String())
	}
	if r.Proto != ProtoBoth {
		b.WriteByte('/')
		b.WriteString(r.Proto.String())
	}
	return b.String()
}

// ParseRule parses one policy rule:
//
//	NAME                      a catalog service: lowercase letters, digits, '-' and '_', 1-63
//	DOMAIN                    "pypi.org" (exactly) or "*.example.com" (any name below it)
//	ADDRESS or ADDRESS/BITS   an IPv4 address or prefix ("203.0.113.0/24")
//
// each followed by an optional ":PORT" or ":FIRST-LAST" (1-65535) and an optional "/tcp" or
// "/udp". Letters are lowercased and one trailing dot of a domain is dropped; a prefix's host
// bits are cleared. IPv6 rules are refused (IPv6 egress is blocked), and so are wildcards other
// than a whole first label over at least two labels ("*", "*.com", "a.*.com", "foo*.bar"), IP
// addresses written as domains, and brackets around anything. ParseRule checks syntax only:
// whether a service exists or an address may be opened is decided by Compile. Errors wrap
// errdefs.ErrInvalid and quote the rule.
func ParseRule(s string) (Rule, error) {
	r, err := parseRule(s)
	if err != nil {
		return Rule{}, errdefs.Invalid("rule", "%q: %v", s, err)
	}
	return r, nil
}

var errIPv6 = errors.New("IPv6 egress is blocked for every sandbox; only IPv4 addresses may be allowed or denied")

// parseRule is ParseRule with an error that does not yet name the rule, so callers can attach
// the field (network.allow[3]) the rule came from.
func parseRule(s string) (Rule, error) {
	if s == "" {
		return Rule{}, errors.New("empty rule")
	}
	if len(s) > MaxRuleLen {
		return Rule{}, fmt.Errorf("longer than %d characters", MaxRuleLen)
	}
	s = lowerASCII(s)
	if strings.ContainsAny(s, "[]") {
		return Rule{}, bracketError(s)
	}
	r := Rule{Ports: AllPorts, Proto: ProtoBoth}

	// The protocol comes last, after the port, and is the only part after a '/' made of letters:
	// that is what tells "203.0.113.0/24/tcp" (prefix, protocol) from "203.0.113.0/24" and
	// "203.0.113.0/24:443" (a prefix length, then perhaps a port).
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		suffix := s[i+1:]
		if p, ok := ParseProto(suffix); ok {
			r.Proto, s = p, s[:i]
		} else if isLetters(suffix) {
			return Rule{}, fmt.Errorf("unknown protocol %q: want tcp or udp", suffix)
		}
	}

	switch strings.Count(s, ":") {
	case 0:
	case 1:
		host, port, _ := strings.Cut(s, ":")
		ports, err := parsePorts(port)
		if err != nil {
			return Rule{}, err
		}
		r.Ports, s = ports, host
	default:
		if isIPv6(s) {
			return Rule{}, errIPv6
		}
		return Rule{}, errors.New("more than one ':' (a port is written once, as in \"pypi.org:443\")")
	}
	if s == "" {
		return Rule{}, errors.New("no service, domain or address before the port or protocol")
	}

	switch {
	case strings.ContainsRune(s, '/'):
		p, err := parsePrefix(s)
		if err != nil {
			return Rule{}, err
		}
		r.Prefix = p
	case isDigitsAndDots(s):
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return Rule{}, fmt.Errorf("%q is not a valid IPv4 address", s)
		}
		r.Prefix = netip.PrefixFrom(a, 32)
	case strings.ContainsAny(s, ".*"):
		d, err := normalizeDomain(s)
		if err != nil {
			return Rule{}, err
		}
		r.Domain = d
	default:
		if err := checkServiceName(s); err != nil {
			return Rule{}, err
		}
		r.Service = s
	}
	return r, nil
}

// bracketError explains a rule with brackets: they only ever mean an IPv6 address with a port,
// and IPv6 is blocked.
func bracketError(s string) error {
	if inner, _, ok := strings.Cut(strings.TrimPrefix(s, "["), "]"); ok && strings.HasPrefix(s, "[") && isIPv6(inner) {
		return errIPv6
	}
	return errors.New("brackets are only for IPv6 addresses, and IPv6 egress is blocked; write a domain or IPv4 address without them")
}

// isIPv6 reports whether s is an IPv6 address or prefix (IPv4-mapped ones included).
func isIPv6(s string) bool {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().Is6()
	}
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6()
}

// parsePrefix reads "A.B.C.D/BITS" and clears the host bits.
func parsePrefix(s string) (netip.Prefix, error) {
	addr, bits, _ := strings.Cut(s, "/")
	a, err := netip.ParseAddr(addr)
	if err != nil || !a.Is4() {
		return netip.Prefix{}, fmt.Errorf("%q is not a valid IPv4 prefix: %q is not an IPv4 address", s, addr)
	}
	n, err := strconv.Atoi(bits)
	if !isDigits(bits) || len(bits) > 2 || err != nil || n > 32 {
		return netip.Prefix{}, fmt.Errorf("%q is not a valid IPv4 prefix: the length must be 0-32", s)
	}
	return netip.PrefixFrom(a, n).Masked(), nil
}

// parsePorts reads "443" or "8000-8080".
func parsePorts(s string) (PortRange, error) {
	first, last, isRange := strings.Cut(s, "-")
	a, err := parsePort(first)
	if err != nil {
		return PortRange{}, err
	}
	if !isRange {
		return PortRange{a, a}, nil
	}
	b, err := parsePort(last)
	if err != nil {
		return PortRange{}, err
	}
	if a > b {
		return PortRange{}, fmt.Errorf("port range %q: the first port is above the last", s)
	}
	return PortRange{a, b}, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.Atoi(s)
	if !isDigits(s) || len(s) > 5 || err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q: want a number 1-65535 or a range such as 8000-8080", s)
	}
	return uint16(n), nil
}

// normalizeDomain checks a domain or "*." wildcard (already lowercase) and drops one trailing dot.
func normalizeDomain(s string) (string, error) {
	d := strings.TrimSuffix(s, ".")
	if d == "*" {
		return "", errors.New(`"*" would allow every domain; use mode "open" for the whole internet`)
	}
	wild := strings.HasPrefix(d, "*.")
	if wild {
		d = d[2:]
	}
	if strings.ContainsRune(d, '*') {
		return "", errors.New(`"*" may only be the whole first label, as in "*.example.com"`)
	}
	labels := strings.Split(d, ".")
	if len(labels) < 2 {
		if wild {
			return "", errors.New(`a wildcard needs at least two labels after "*." ("*.example.com"), not a top-level domain`)
		}
		return "", errors.New("a domain needs at least two labels")
	}
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return "", err
		}
	}
	if last := labels[len(labels)-1]; isDigits(last) {
		return "", fmt.Errorf("the last label %q is numeric: an IP address is not a domain", last)
	}
	if wild {
		d = "*." + d
	}
	if len(d) > 253 {
		return "", errors.New("a domain is at most 253 characters")
	}
	return d, nil
}

// checkLabel enforces the LDH rule: letters, digits and inner hyphens, 1-63 characters.
func checkLabel(l string) error {
	switch {
	case l == "":
		return errors.New("empty label (two dots in a row, or a leading dot)")
	case len(l) > 63:
		return fmt.Errorf("label %q is longer than 63 characters", l)
	case l[0] == '-' || l[len(l)-1] == '-':
		return fmt.Errorf("label %q starts or ends with '-'", l)
	}
	for i := 0; i < len(l); i++ {
		if c := l[i]; !isLower(c) && !isDigit(c) && c != '-' {
			return fmt.Errorf("label %q: character %q is not a letter, digit or '-'", l, c)
		}
	}
	return nil
}

// checkServiceName enforces the catalog's naming rule: 1-63 of [a-z0-9_-].
func checkServiceName(s string) error {
	if s == "" || len(s) > 63 {
		return fmt.Errorf("service name %q: want 1-63 characters", s)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isLower(c) && !isDigit(c) && c != '-' && c != '_' {
			return fmt.Errorf("%q is not a service name (letters, digits, '-' and '_'), domain or IPv4 address", s)
		}
	}
	return nil
}

// lowerASCII lowercases ASCII letters only: Unicode case folding could turn a non-ASCII rune
// into an ASCII letter (U+212A KELVIN SIGN lowercases to 'k').
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

func isLower(c byte) bool { return 'a' <= c && c <= 'z' }
func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return s != ""
}

func isLetters(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isLower(s[i]) {
			return false
		}
	}
	return s != ""
}

func isDigitsAndDots(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) && s[i] != '.' {
			return false
		}
	}
	return s != ""
}
