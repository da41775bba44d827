package model

// Network policy modes, the values of NetworkPolicy.Mode.
const (
	// NetworkNone gives the sandbox loopback only. It is the default when no policy is given.
	NetworkNone = "none"
	// NetworkAllowlist denies all egress except what the Allow rules name, minus the Deny rules.
	NetworkAllowlist = "allowlist"
	// NetworkOpen allows the internet; the Deny rules and the always-blocked addresses (private
	// ranges, link-local and cloud metadata, the host, other sandboxes) still apply.
	NetworkOpen = "open"
)

// NetworkPolicy is a sandbox's egress policy: the create request's "network" field, and the body
// of PUT /v1/sandboxes/{id}/network.
//
// Each rule is one string:
//
//	pypi                       a service from the operator's catalog (GET the catalog to list them)
//	pypi.org                   a domain, exactly
//	*.example.com              any subdomain of example.com (not example.com itself)
//	203.0.113.7, 203.0.113.0/24  an IPv4 address or prefix
//
// followed by an optional port or port range (":443", ":8000-8080") and an optional protocol
// ("/tcp" or "/udp"; both when absent), as in "203.0.113.0/24:443/tcp" or "pypi.org:443".
// IPv6 egress is blocked, so IPv6 rules are refused. Private, link-local and other reserved
// ranges may be opened only by a catalog service, never by an address rule.
type NetworkPolicy struct {
	// Mode is NetworkNone, NetworkAllowlist or NetworkOpen. Empty means NetworkAllowlist when
	// Allow has rules, and NetworkNone when it has none.
	Mode string `json:"mode,omitempty"`
	// Allow lists what the sandbox may reach (in NetworkOpen mode: private catalog services).
	Allow []string `json:"allow,omitempty"`
	// Deny lists what the sandbox may not reach; a Deny rule wins over an Allow rule.
	Deny []string `json:"deny,omitempty"`
}

// NetworkService is one service of the operator's catalog: a name a policy rule may use instead
// of listing the service's domains and addresses.
type NetworkService struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Domains are domain rules ("pypi.org", "*.pythonhosted.org:443"), normalised.
	Domains []string `json:"domains,omitempty"`
	// Addresses are IPv4 address rules ("10.0.0.5:8080/tcp"), normalised. They may lie in the
	// ranges that are otherwise always blocked: the operator allows them.
	Addresses []string `json:"addresses,omitempty"`
}
