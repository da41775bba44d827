package netpolicy

// The package's policy and catalog types are the API's (sdk/go: NetworkPolicy, NetworkService
// and the modes) field for field and tag for tag, but it does not import the SDK (issue 29 item
// 5): the edge converts at its boundary with a plain struct conversion, which stops compiling if
// a field changes on one side only, and apiserver.TestNetworkConversion holds the JSON (which
// sandbox records keep) and the modes equal.

// Policy modes, the values of Policy.Mode.
const (
	// ModeNone gives the sandbox loopback only. It is the default when no policy is given.
	ModeNone = "none"
	// ModeAllowlist denies all egress except what the Allow rules name, minus the Deny rules.
	ModeAllowlist = "allowlist"
	// ModeOpen allows the internet; the Deny rules and the always-blocked addresses still apply.
	ModeOpen = "open"
)

// Policy is a sandbox's egress policy: a mode and two lists of rule strings (see the package
// documentation for the rules' syntax).
type Policy struct {
	// Mode is ModeNone, ModeAllowlist or ModeOpen. Empty means ModeAllowlist when Allow has
	// rules, and ModeNone when it has none.
	Mode string `json:"mode,omitempty"`
	// Allow lists what the sandbox may reach (in ModeOpen: private catalog services).
	Allow []string `json:"allow,omitempty"`
	// Deny lists what the sandbox may not reach; a Deny rule wins over an Allow rule.
	Deny []string `json:"deny,omitempty"`
}

// Service is one service of the catalog as the API lists it, its rules normalised.
type Service struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Domains are domain rules ("pypi.org", "*.pythonhosted.org:443"), normalised.
	Domains []string `json:"domains,omitempty"`
	// Addresses are IPv4 address rules ("10.0.0.5:8080/tcp"), normalised. They may lie in the
	// ranges that are otherwise always blocked: the operator allows them.
	Addresses []string `json:"addresses,omitempty"`
}
