package catalog

import (
	"errors"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	corral "github.com/corral-dev/corral/sdk/go"
)

func TestValidateServices(t *testing.T) {
	good := []corral.Service{{Name: "code-interpreter", Command: []string{"/usr/bin/python3", "s.py"}, Env: []string{"A=1"}, Port: 49999, Ready: "/ready?wait=10"}}
	if err := validateServices(good); err != nil {
		t.Error(err)
	}
	for _, s := range []corral.Service{{Name: "Bad", Command: []string{"x"}}, {Name: "x"}, {Name: "x", Command: []string{"x"}, Port: 70000},
		{Name: "x", Command: []string{"x"}, Env: []string{"=x"}},
		{Name: "x", Command: []string{"x"}, Ready: "/ready"}, {Name: "x", Command: []string{"x"}, Port: 1, Ready: "ready"},
		{Name: "x", Command: []string{"x"}, Port: 1, Ready: "/a b"}, {Name: "x", Command: []string{"x"}, Port: 1, Ready: "/" + strings.Repeat("a", maxReadyPath)}} {
		if err := validateServices([]corral.Service{s}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("validateServices(%+v): %v, want invalid", s, err)
		}
	}
	if err := validateServices(make([]corral.Service, maxServices+1)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("too many services: %v", err)
	}
}
