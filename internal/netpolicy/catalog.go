package netpolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Catalog is the operator's service catalog: named sets of domains and addresses that policies
// refer to by name ("pypi"). It is read-only once made, and safe for concurrent use. A nil
// *Catalog is an empty catalog.
type Catalog struct {
	services map[string]*service
	names    []string // sorted
}

// service is one catalog entry with its rules parsed.
type service struct {
	view    Service
	domains []Rule
	addrs   []Rule
}

// catalogFile is the shape of a catalog file.
type catalogFile struct {
	Services map[string]catalogEntry `json:"services"`
}

type catalogEntry struct {
	Domains     []string `json:"domains"`
	Addresses   []string `json:"addresses"`
	Description string   `json:"description"`
}

// LoadCatalog reads a catalog file (see ParseCatalog for its shape).
func LoadCatalog(path string) (*Catalog, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load service catalog: %w", err)
	}
	c, err := ParseCatalog(data)
	if err != nil {
		return nil, fmt.Errorf("load service catalog %s: %w", path, err)
	}
	return c, nil
}

// ParseCatalog reads a catalog from JSON of this shape:
//
//	{"services": {
//	  "pypi":    {"domains": ["pypi.org", "*.pythonhosted.org:443"], "description": "Python packages"},
//	  "gateway": {"addresses": ["10.0.0.5:8080/tcp"], "description": "inference gateway"}
//	}}
//
// Service names follow the rule syntax (1-63 of lowercase letters, digits, '-' and '_').
// Domains are domain rules and addresses IPv4 address rules, each with an optional port or range
// and protocol, parsed as ParseRule does. Addresses may lie in the always-blocked set: a sandbox
// whose policy allows the service may reach exactly those addresses, ports and protocols. Unknown
// fields, trailing data, malformed entries and services that name nothing are errors wrapping
// errdefs.ErrInvalid whose field names the service and the entry (services.pypi.domains[1]).
func ParseCatalog(data []byte) (*Catalog, error) {
	var f catalogFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, errdefs.Invalid("catalog", "%v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errdefs.Invalid("catalog", "trailing data after the JSON object")
	}
	// Sorted first, so that of several bad entries the same one is reported every time.
	c := &Catalog{services: make(map[string]*service, len(f.Services)), names: slices.Sorted(maps.Keys(f.Services))}
	for _, name := range c.names {
		s, err := parseService(name, f.Services[name])
		if err != nil {
			return nil, err
		}
		c.services[name] = s
	}
	return c, nil
}

func parseService(name string, e catalogEntry) (*service, error) {
	field := "services." + name
	if err := checkServiceName(name); err != nil {
		return nil, errdefs.Invalid("services", "%q is not a valid service name: want 1-63 lowercase letters, digits, '-' and '_'", name)
	}
	if len(e.Domains) == 0 && len(e.Addresses) == 0 {
		return nil, errdefs.Invalid(field, "service %q has neither domains nor addresses", name)
	}
	s := &service{view: Service{Name: name, Description: e.Description}}
	for i, d := range e.Domains {
		f := fmt.Sprintf("%s.domains[%d]", field, i)
		r, err := parseRule(d)
		if err != nil {
			return nil, errdefs.Invalid(f, "%q: %v", d, err)
		}
		if r.Kind() != KindDomain {
			return nil, errdefs.Invalid(f, "%q is not a domain (\"pypi.org\" or \"*.example.com\")", d)
		}
		if !slices.Contains(s.domains, r) {
			s.domains = append(s.domains, r)
			s.view.Domains = append(s.view.Domains, r.String())
		}
	}
	for i, a := range e.Addresses {
		f := fmt.Sprintf("%s.addresses[%d]", field, i)
		r, err := parseRule(a)
		if err != nil {
			return nil, errdefs.Invalid(f, "%q: %v", a, err)
		}
		if r.Kind() != KindAddress {
			return nil, errdefs.Invalid(f, "%q is not an IPv4 address or prefix", a)
		}
		if !slices.Contains(s.addrs, r) {
			s.addrs = append(s.addrs, r)
			s.view.Addresses = append(s.view.Addresses, r.String())
		}
	}
	return s, nil
}

// Services returns every service, sorted by name, for the API's catalog listing.
func (c *Catalog) Services() []Service {
	if c == nil {
		return nil
	}
	out := make([]Service, 0, len(c.names))
	for _, n := range c.names {
		out = append(out, c.services[n].copyView())
	}
	return out
}

// Service returns the service called name, or an error wrapping errdefs.ErrNotFound.
func (c *Catalog) Service(name string) (Service, error) {
	s := c.lookup(name)
	if s == nil {
		return Service{}, errdefs.NotFound("network service %q", name)
	}
	return s.copyView(), nil
}

// Names returns the service names, sorted.
func (c *Catalog) Names() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.names)
}

func (c *Catalog) lookup(name string) *service {
	if c == nil {
		return nil
	}
	return c.services[name]
}

// copyView returns the API view with its own slices, so callers cannot change the catalog.
func (s *service) copyView() Service {
	v := s.view
	v.Domains = slices.Clone(v.Domains)
	v.Addresses = slices.Clone(v.Addresses)
	return v
}
