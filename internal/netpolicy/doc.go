// Package netpolicy owns the model of a sandbox's egress policy: parsing and validating its rules,
// the operator's service catalog, the always-blocked address set, and compiling a policy into the
// prefix lists and domain patterns that enforcement (nftables in the sandbox's network namespace,
// and the DNS resolver) loads. It performs no I/O beyond reading a catalog file, and holds no
// state: every value it returns is read-only and safe for concurrent use.
//
// # Rules
//
// A policy (Policy, the API's NetworkPolicy) has a mode and two lists of rule strings, allow and
// deny. A rule is a catalog service name ("pypi"), a domain ("pypi.org", or "*.example.com" for
// any name below example.com but not example.com itself) or an IPv4 address or prefix
// ("203.0.113.0/24"), each with an optional port or port range and protocol:
// "203.0.113.0/24:443/tcp", "pypi.org:443".
// ParseRule documents the syntax; Rule.String writes it back in normal form.
//
// # What may be opened
//
// The always-blocked set (Blocked: the host, the control plane, the sandbox pool, private,
// loopback, link-local and other reserved ranges) is closed to every sandbox, in every mode. An
// address rule of a policy that touches it is refused at Compile with an error naming the range.
// Only the operator can open part of it, by listing the addresses in a catalog service: a policy
// that allows the service reaches exactly those addresses, ports and protocols. IPv6 egress is
// blocked outright, so IPv6 rules are refused.
//
// # Evaluation
//
// Deny wins over allow, and the always-blocked set wins over both. Compiled documents the order
// enforcement applies; Compiled.AllowsAddr and Compiled.AllowsName evaluate it for tests, proxies
// and the resolver.
//
// # Errors
//
// Every refusal of user or operator input wraps errdefs.ErrInvalid, names the field that holds the
// offending rule (network.allow[3], services.pypi.domains[1]) and quotes it.
package netpolicy
