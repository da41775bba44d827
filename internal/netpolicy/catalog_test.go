package netpolicy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

const testCatalogJSON = `{"services": {
	"pypi":    {"domains": ["pypi.org", "*.pythonhosted.org", "PyPI.org."], "description": "Python packages"},
	"github":  {"domains": ["github.com", "*.github.com", "*.githubusercontent.com:443"],
	            "addresses": ["140.82.112.0/20"], "description": "GitHub"},
	"gateway": {"addresses": ["10.0.0.5:8080/tcp"], "description": "inference gateway"},
	"infra":   {"addresses": ["10.0.0.5:9000-9100", "10.0.0.53:53/udp", "169.254.169.254:80/tcp"]},
	"ntp":     {"domains": ["pool.ntp.org:123/udp"]}
}}`

func testCatalog(t *testing.T) *Catalog {
	t.Helper()
	c, err := ParseCatalog([]byte(testCatalogJSON))
	if err != nil {
		t.Fatalf("ParseCatalog: %v", err)
	}
	return c
}

func TestParseCatalog(t *testing.T) {
	c := testCatalog(t)
	var names []string
	for _, s := range c.Services() {
		names = append(names, s.Name)
	}
	if want := []string{"gateway", "github", "infra", "ntp", "pypi"}; !slices.Equal(names, want) {
		t.Errorf("Services() names = %v, want %v", names, want)
	}
	if got := c.Names(); !slices.Equal(got, names) {
		t.Errorf("Names() = %v, want %v", got, names)
	}

	got, err := c.Service("pypi")
	if err != nil {
		t.Fatalf("Service(pypi): %v", err)
	}
	want := Service{Name: "pypi", Description: "Python packages", Domains: []string{"pypi.org", "*.pythonhosted.org"}}
	if got.Name != want.Name || got.Description != want.Description || !slices.Equal(got.Domains, want.Domains) || got.Addresses != nil {
		t.Errorf("Service(pypi) = %+v, want %+v (normalised, de-duplicated)", got, want)
	}
	gw, _ := c.Service("gateway")
	if want := []string{"10.0.0.5:8080/tcp"}; !slices.Equal(gw.Addresses, want) {
		t.Errorf("gateway addresses = %v, want %v", gw.Addresses, want)
	}

	// The views are copies: changing one does not change the catalog.
	got.Domains[0] = "evil.example"
	if again, _ := c.Service("pypi"); again.Domains[0] != "pypi.org" {
		t.Errorf("changing a returned view changed the catalog: %v", again.Domains)
	}

	if _, err := c.Service("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Service(nope) error = %v, want ErrNotFound", err)
	}
	var nilCat *Catalog
	if nilCat.Services() != nil || nilCat.Names() != nil {
		t.Errorf("a nil catalog lists services")
	}
	if _, err := nilCat.Service("pypi"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("nil catalog Service error = %v, want ErrNotFound", err)
	}
}

func TestParseCatalogEmpty(t *testing.T) {
	for _, in := range []string{`{}`, `{"services": {}}`, `{"services": null}`} {
		c, err := ParseCatalog([]byte(in))
		if err != nil {
			t.Errorf("ParseCatalog(%s): %v", in, err)
			continue
		}
		if len(c.Services()) != 0 {
			t.Errorf("ParseCatalog(%s) has services", in)
		}
	}
}

func TestParseCatalogRejects(t *testing.T) {
	tests := []struct {
		name, in string
		field    string // errdefs.Field of the error
		msg      string // in the message
	}{
		{"unknown top-level field", `{"services": {}, "extra": 1}`, "catalog", `unknown field "extra"`},
		{"unknown service field", `{"services": {"pypi": {"domains": ["pypi.org"], "domain": "x"}}}`, "catalog", `unknown field "domain"`},
		{"not JSON", `services: {}`, "catalog", "invalid character"},
		{"trailing data", `{"services": {}} {}`, "catalog", "trailing data"},
		{"wrong type", `{"services": {"pypi": {"domains": "pypi.org"}}}`, "catalog", "cannot unmarshal"},
		{"bad name", `{"services": {"Py.Pi": {"domains": ["pypi.org"]}}}`, "services", `"Py.Pi"`},
		{"empty name", `{"services": {"": {"domains": ["pypi.org"]}}}`, "services", `""`},
		{"nothing", `{"services": {"pypi": {"description": "x"}}}`, "services.pypi", "neither domains nor addresses"},
		{"bad wildcard", `{"services": {"pypi": {"domains": ["pypi.org", "*.org"]}}}`, "services.pypi.domains[1]", `"*.org": a wildcard needs`},
		{"bad label", `{"services": {"pypi": {"domains": ["a..b"]}}}`, "services.pypi.domains[0]", `"a..b": empty label`},
		{"service as domain", `{"services": {"pypi": {"domains": ["github"]}}}`, "services.pypi.domains[0]", `"github" is not a domain`},
		{"address as domain", `{"services": {"pypi": {"domains": ["10.0.0.1"]}}}`, "services.pypi.domains[0]", `"10.0.0.1" is not a domain`},
		{"domain as address", `{"services": {"gw": {"addresses": ["10.0.0.5", "gw.example.com"]}}}`, "services.gw.addresses[1]", `"gw.example.com" is not an IPv4 address`},
		{"bad CIDR", `{"services": {"gw": {"addresses": ["1.2.3.4/33"]}}}`, "services.gw.addresses[0]", `"1.2.3.4/33"`},
		{"bad port", `{"services": {"gw": {"addresses": ["10.0.0.5:0"]}}}`, "services.gw.addresses[0]", "1-65535"},
		{"IPv6", `{"services": {"gw": {"addresses": ["[2001:db8::1]:443"]}}}`, "services.gw.addresses[0]", "IPv6 egress is blocked"},
	}
	for _, tt := range tests {
		_, err := ParseCatalog([]byte(tt.in))
		if err == nil {
			t.Errorf("%s: ParseCatalog succeeded, want an error", tt.name)
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v is not ErrInvalid", tt.name, err)
		}
		if got := errdefs.Field(err); got != tt.field {
			t.Errorf("%s: field = %q, want %q (%v)", tt.name, got, tt.field, err)
		}
		if !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: error = %q, want it to contain %q", tt.name, err, tt.msg)
		}
	}
}

func TestLoadCatalog(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "services.json")
	if err := os.WriteFile(good, []byte(testCatalogJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadCatalog(good)
	if err != nil {
		t.Fatalf("LoadCatalog: %v", err)
	}
	if _, err := c.Service("github"); err != nil {
		t.Errorf("Service(github): %v", err)
	}

	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"services": {"x": {"domains": ["*"]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadCatalog(bad)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), bad) || errdefs.Field(err) != "services.x.domains[0]" {
		t.Errorf("LoadCatalog(bad) error = %v, want ErrInvalid naming the file and services.x.domains[0]", err)
	}

	if _, err := LoadCatalog(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadCatalog(missing) error = %v, want os.ErrNotExist", err)
	}
}
