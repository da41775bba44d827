package e2b

import (
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/lazyregexp"
	corral "github.com/corral-dev/corral/sdk/go"
)

// labelPrefix starts the Corral labels the gateway keeps for itself; metadata keys may not use
// it, and it is hidden from the metadata the gateway reports.
const labelPrefix = "corral-e2b/"

// templateLabel records the template ID a sandbox was created from, as the caller wrote it.
const templateLabel = labelPrefix + "template"

// Corral's limits on labels and environment variables (internal/edge validates the same).
var (
	labelKeyRE = lazyregexp.New(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62}[A-Za-z0-9])?$`)
	envKeyRE   = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

const (
	maxLabels     = 64
	maxLabelValue = 256
	// maxMetadata leaves one label for the template.
	maxMetadata = maxLabels - 1
)

// allTraffic is E2B's ALL_TRAFFIC: a rule for every IPv4 address.
const allTraffic = "0.0.0.0/0"

// createOptions is what a create request asks for besides its template.
type createOptions struct {
	templateID string
	// timeout is zero when the request gave none.
	timeout time.Duration
}

// translateCreate checks an E2B create request and turns everything but the template into a
// Corral create request. Every field Corral cannot honour is refused with a 400 naming it.
func translateCreate(in newSandbox) (corral.CreateRequest, createOptions, error) {
	var out corral.CreateRequest
	var opt createOptions
	if in.TemplateID == nil || strings.TrimSpace(*in.TemplateID) == "" {
		return out, opt, invalid("templateID", "required: the name of a Corral environment, or a layer NAME:VERSION")
	}
	opt.templateID = strings.TrimSpace(*in.TemplateID)
	if in.Timeout != nil {
		d, err := seconds("timeout", *in.Timeout)
		if err != nil {
			return out, opt, err
		}
		opt.timeout = d
	}
	if in.AutoPause != nil && *in.AutoPause {
		return out, opt, invalid("autoPause", "Corral cannot pause a sandbox when its timeout passes (lifecycle.onTimeout \"pause\"); "+
			"it stops it. Leave onTimeout at \"kill\", or extend the timeout with setTimeout")
	}
	if in.AutoPauseMemory != nil && *in.AutoPauseMemory {
		return out, opt, invalid("autoPauseMemory", "Corral cannot pause a sandbox when its timeout passes")
	}
	if in.AutoResume != nil && in.AutoResume.Enabled != nil && !*in.AutoResume.Enabled {
		return out, opt, invalid("autoResume.enabled", "Corral always resumes a paused sandbox when it is used; it cannot be turned off")
	}
	if present(in.MCP) {
		return out, opt, invalid("mcp", "Corral has no MCP gateway")
	}
	if present(in.IAM) {
		return out, opt, invalid("iam", "Corral has no workload identity tokens; pass credentials as envVars")
	}
	if len(in.VolumeMounts) > 0 {
		return out, opt, invalid("volumeMounts", "Corral has no volumes; compose layers into a Corral environment instead")
	}
	labels, err := metadataLabels(in.Metadata)
	if err != nil {
		return out, opt, err
	}
	if len(opt.templateID) <= maxLabelValue && !strings.ContainsAny(opt.templateID, "\x00\n") {
		if labels == nil {
			labels = map[string]string{}
		}
		labels[templateLabel] = opt.templateID
	}
	out.Labels = labels
	if out.Env, err = envList(in.EnvVars); err != nil {
		return out, opt, err
	}
	if in.Network != nil {
		if in.Network.AllowPublicTraffic != nil && !*in.Network.AllowPublicTraffic {
			return out, opt, invalid("network.allowPublicTraffic", "Corral does not serve sandbox ports with traffic access tokens yet")
		}
		if err := refuseNetworkExtras("network", in.Network.MaskRequestHost != nil, len(in.Network.HTTPSPorts) > 0,
			len(in.Network.Rules) > 0, present(in.Network.EgressProxy)); err != nil {
			return out, opt, err
		}
	}
	var allow, deny []string
	if in.Network != nil {
		allow, deny = in.Network.AllowOut, in.Network.DenyOut
	}
	pol, err := networkPolicy(in.AllowInternetAccess, allow, deny)
	if err != nil {
		return out, opt, err
	}
	out.Network = &pol
	return out, opt, nil
}

// refuseNetworkExtras refuses the network options Corral has no counterpart for.
func refuseNetworkExtras(prefix string, mask, https, rules, proxy bool) error {
	switch {
	case mask:
		return invalid(prefix+".maskRequestHost", "Corral does not rewrite the Host of requests to sandbox ports")
	case https:
		return invalid(prefix+".httpsPorts", "Corral does not serve sandbox ports over HTTPS by port number")
	case rules:
		return invalid(prefix+".rules", "Corral does not transform egress requests (headers per host)")
	case proxy:
		return invalid(prefix+".egressProxy", "Corral does not chain sandbox egress through another proxy")
	}
	return nil
}

// present reports whether a raw JSON field was given a value other than null.
func present(raw []byte) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null"
}

// seconds turns an E2B duration in seconds into a Duration, refusing what no TTL can be.
func seconds(field string, n int64) (time.Duration, error) {
	if n <= 0 {
		return 0, invalid(field, "%d: want a positive number of seconds", n)
	}
	if n > math.MaxInt64/int64(time.Second) {
		return 0, invalid(field, "%d seconds is too long", n)
	}
	return time.Duration(n) * time.Second, nil
}

// metadataLabels checks E2B metadata against Corral's label rules and returns it as labels,
// unchanged: metadata is not encoded, so `corral ls --label k=v` finds what Sandbox.list's
// metadata filter finds. What does not fit is refused, never dropped.
func metadataLabels(md map[string]string) (map[string]string, error) {
	if len(md) == 0 {
		return nil, nil
	}
	if len(md) > maxMetadata {
		return nil, invalid("metadata", "at most %d entries, got %d", maxMetadata, len(md))
	}
	for _, k := range slices.Sorted(maps.Keys(md)) {
		if strings.HasPrefix(k, labelPrefix) {
			return nil, invalid("metadata", "key %q: keys starting with %q are reserved by Corral", k, labelPrefix)
		}
		if !labelKeyRE.MatchString(k) {
			return nil, invalid("metadata", "key %q: Corral keeps metadata as labels, whose keys are 1-64 letters, digits, '.', '_', '/' or '-', starting and ending with a letter or digit", k)
		}
		if v := md[k]; len(v) > maxLabelValue || strings.ContainsAny(v, "\x00\n") {
			return nil, invalid("metadata."+k, "value must be at most %d bytes without NUL or newline (Corral label values)", maxLabelValue)
		}
	}
	return maps.Clone(md), nil
}

// metadataOf returns a sandbox's labels as E2B metadata: all of them but the gateway's own.
func metadataOf(labels map[string]string) map[string]string {
	md := map[string]string{}
	for k, v := range labels {
		if !strings.HasPrefix(k, labelPrefix) {
			md[k] = v
		}
	}
	return md
}

// envList turns envVars into Corral's KEY=VALUE list, sorted by key.
func envList(vars map[string]string) ([]string, error) {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		v := vars[k]
		if !envKeyRE.MatchString(k) {
			return nil, invalid("envVars", "%q is not a variable name (letters, digits and '_', not starting with a digit)", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, invalid("envVars."+k, "contains a NUL byte")
		}
		out = append(out, k+"="+v)
	}
	return out, nil
}

// networkPolicy translates E2B's egress options into a Corral policy.
//
// E2B allows the internet unless allow_internet_access is false or denyOut holds 0.0.0.0/0,
// and an allowOut entry wins over a denyOut entry. Corral's deny rules win over its allow rules,
// so the translation resolves E2B's precedence first:
//   - allowOut holds 0.0.0.0/0: everything is allowed (mode open, no deny rules).
//   - the internet is off: mode allowlist with allowOut (every deny rule is then redundant:
//     what it names is either allowed by an allowOut entry, which wins, or not allowed at all),
//     or mode none when allowOut is empty.
//   - otherwise: mode open with denyOut, minus the addresses of allowOut entries (IPv4 ranges
//     are cut out of the deny ranges). An allowOut domain that a deny rule may cover cannot be
//     cut out (Corral would block it, E2B would not) and is refused.
func networkPolicy(internet *bool, allow, deny []string) (corral.NetworkPolicy, error) {
	if len(allow)+len(deny) > maxNetworkEntries {
		return corral.NetworkPolicy{}, invalid("network", "%d allowOut and denyOut entries; at most %d", len(allow)+len(deny), maxNetworkEntries)
	}
	allow, deny = trimAll(allow), trimAll(deny)
	for i, a := range allow {
		if a == "" {
			return corral.NetworkPolicy{}, invalid(fmt.Sprintf("network.allowOut[%d]", i), "empty entry")
		}
	}
	for i, d := range deny {
		if d == "" {
			return corral.NetworkPolicy{}, invalid(fmt.Sprintf("network.denyOut[%d]", i), "empty entry")
		}
	}
	if slices.Contains(allow, allTraffic) {
		return corral.NetworkPolicy{Mode: corral.NetworkOpen}, nil
	}
	if (internet != nil && !*internet) || slices.Contains(deny, allTraffic) {
		if len(allow) == 0 {
			return corral.NetworkPolicy{Mode: corral.NetworkNone}, nil
		}
		return corral.NetworkPolicy{Mode: corral.NetworkAllowlist, Allow: allow}, nil
	}
	if len(deny) == 0 {
		// Every allowOut entry is allowed anyway.
		return corral.NetworkPolicy{Mode: corral.NetworkOpen}, nil
	}
	var holes []netip.Prefix
	var denyNets []netip.Prefix
	var denyOther []string
	for _, d := range deny {
		if p, ok := ipv4Prefix(d); ok {
			denyNets = append(denyNets, p)
		} else {
			denyOther = append(denyOther, d)
		}
	}
	for _, a := range allow {
		if p, ok := ipv4Prefix(a); ok {
			holes = append(holes, p)
			continue
		}
		if len(denyNets) > 0 {
			return corral.NetworkPolicy{}, invalid("network.allowOut", "%q: Corral applies deny rules before allow rules, so a domain cannot be excepted from denyOut address ranges "+
				"(E2B would let it through if it resolved into them); list the domain's addresses instead, or deny all traffic (denyOut [\"0.0.0.0/0\"]) and allow what is needed", a)
		}
		for _, d := range denyOther {
			if domainsOverlap(a, d) {
				return corral.NetworkPolicy{}, invalid("network.allowOut", "%q overlaps denyOut entry %q: Corral applies deny rules before allow rules, so it cannot be excepted", a, d)
			}
		}
	}
	if len(holes) > 0 && len(denyOther) > 0 {
		return corral.NetworkPolicy{}, invalid("network.allowOut", "address entries cannot be excepted from denyOut domain entries: Corral applies deny rules before allow rules")
	}
	var out []string
	for _, d := range deny {
		p, ok := ipv4Prefix(d)
		if !ok {
			out = append(out, d)
			continue
		}
		rest := subtractPrefixes(p, holes)
		if len(rest) == 1 && rest[0] == p {
			out = append(out, d) // untouched: as the caller wrote it
			continue
		}
		for _, q := range rest {
			out = append(out, q.String())
		}
		if len(out) > maxDenyRules {
			return corral.NetworkPolicy{}, invalid("network.denyOut", "excepting the allowOut addresses from the deny ranges takes more than %d rules; deny all traffic and allow what is needed instead", maxDenyRules)
		}
	}
	if len(out) == 0 {
		// Every deny range was allowed back.
		return corral.NetworkPolicy{Mode: corral.NetworkOpen}, nil
	}
	return corral.NetworkPolicy{Mode: corral.NetworkOpen, Deny: out}, nil
}

// Bounds of a translation: the entries it reads, the deny rules it may produce. (Corral's own
// limit on a policy's rules, --net-max-rules, applies after.)
const (
	maxNetworkEntries = 1024
	maxDenyRules      = 256
)

func trimAll(in []string) []string {
	if in == nil {
		return nil
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = strings.TrimSpace(s)
	}
	return out
}

// ipv4Prefix parses an E2B address entry: an IPv4 address or CIDR.
func ipv4Prefix(s string) (netip.Prefix, bool) {
	if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
		return netip.PrefixFrom(a, 32), true
	}
	if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
		return p.Masked(), true
	}
	return netip.Prefix{}, false
}

// subtractPrefixes returns prefixes covering p except the addresses of holes.
func subtractPrefixes(p netip.Prefix, holes []netip.Prefix) []netip.Prefix {
	var overlapping []netip.Prefix
	for _, h := range holes {
		if h.Overlaps(p) {
			if h.Bits() <= p.Bits() {
				return nil // the hole covers all of p
			}
			overlapping = append(overlapping, h)
		}
	}
	if len(overlapping) == 0 {
		return []netip.Prefix{p}
	}
	lo, hi := splitPrefix(p)
	return append(subtractPrefixes(lo, overlapping), subtractPrefixes(hi, overlapping)...)
}

// splitPrefix returns the two halves of an IPv4 prefix shorter than /32.
func splitPrefix(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits() + 1
	a := p.Addr().As4()
	lo := netip.PrefixFrom(netip.AddrFrom4(a), bits)
	a[(bits-1)/8] |= 0x80 >> ((bits - 1) % 8)
	return lo, netip.PrefixFrom(netip.AddrFrom4(a), bits)
}

// domainsOverlap reports whether two domain rules ("example.com", "*.example.com") can match
// the same name.
func domainsOverlap(a, b string) bool {
	a, b = strings.ToLower(strings.TrimSuffix(a, ".")), strings.ToLower(strings.TrimSuffix(b, "."))
	aBase, aWild := strings.CutPrefix(a, "*.")
	bBase, bWild := strings.CutPrefix(b, "*.")
	switch {
	case !aWild && !bWild:
		return a == b
	case aWild && bWild:
		return aBase == bBase || strings.HasSuffix(aBase, "."+bBase) || strings.HasSuffix(bBase, "."+aBase)
	case aWild:
		return strings.HasSuffix(b, "."+aBase)
	default:
		return strings.HasSuffix(a, "."+bBase)
	}
}

// networkOf reports a Corral policy in E2B's terms.
func networkOf(p *corral.NetworkPolicy) (internet bool, cfg *networkConfig) {
	if p == nil {
		return false, nil
	}
	switch p.Mode {
	case corral.NetworkOpen:
		if len(p.Deny) == 0 {
			return true, nil
		}
		return true, &networkConfig{DenyOut: slices.Clone(p.Deny)}
	case corral.NetworkAllowlist:
		return false, &networkConfig{AllowOut: slices.Clone(p.Allow), DenyOut: append([]string{allTraffic}, p.Deny...)}
	}
	return false, nil
}

// state is a Corral state in E2B's terms; ok is false for sandboxes E2B would not show (stopped,
// failed).
func state(s string) (string, bool) {
	switch s {
	case corral.StateRunning, corral.StateCreating:
		return "running", true
	case corral.StatePaused:
		return "paused", true
	}
	return "", false
}

// templateOf is the template ID a sandbox reports: the one it was created from through the
// gateway, else its Corral environment, else its base layer.
func templateOf(sb *corral.Sandbox) string {
	if t := sb.Labels[templateLabel]; t != "" {
		return t
	}
	if sb.Environment != "" {
		return sb.Environment
	}
	return sb.Base
}

// detail is a Corral sandbox as ListedSandbox; full adds SandboxDetail's optional fields.
func (g *Gateway) detail(sb *corral.Sandbox, full bool) sandboxDetail {
	st, _ := state(sb.State)
	tpl := templateOf(sb)
	d := sandboxDetail{
		TemplateID:  tpl,
		Alias:       tpl,
		SandboxID:   sb.ID,
		ClientID:    clientID(sb),
		StartedAt:   sb.CreatedAt,
		EndAt:       sb.ExpiresAt,
		CPUCount:    int32(min(math.Ceil(sb.Limits.CPUs), math.MaxInt32)),
		MemoryMB:    int32(min(sb.Limits.MemoryBytes>>20, math.MaxInt32)),
		DiskSizeMB:  int32(min(sb.Limits.DiskBytes>>20, math.MaxInt32)),
		Metadata:    metadataOf(sb.Labels),
		State:       st,
		EnvdVersion: g.cfg.EnvdVersion,
	}
	if full {
		internet, nw := networkOf(sb.Network)
		d.AllowInternetAccess = &internet
		d.Network = nw
		d.Lifecycle = &lifecycle{OnTimeout: "kill", AutoResume: true}
	}
	return d
}

// clientID fills E2B's deprecated clientID with the sandbox's Corral node.
func clientID(sb *corral.Sandbox) string {
	if sb.Node != "" {
		return sb.Node
	}
	return "corral"
}
