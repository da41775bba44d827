package catalog

import (
	"errors"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

func TestValidateServices(t *testing.T) {
	good := []model.Service{{Name: "code-interpreter", Command: []string{"/usr/bin/python3", "s.py"}, Env: []string{"A=1"}, Port: 49999, Ready: "/ready?wait=10"}}
	if err := validateServices(good); err != nil {
		t.Error(err)
	}
	for _, s := range []model.Service{{Name: "Bad", Command: []string{"x"}}, {Name: "x"}, {Name: "x", Command: []string{"x"}, Port: 70000},
		{Name: "x", Command: []string{"x"}, Env: []string{"=x"}},
		{Name: "x", Command: []string{"x"}, Ready: "/ready"}, {Name: "x", Command: []string{"x"}, Port: 1, Ready: "ready"},
		{Name: "x", Command: []string{"x"}, Port: 1, Ready: "/a b"}, {Name: "x", Command: []string{"x"}, Port: 1, Ready: "/" + strings.Repeat("a", maxReadyPath)}} {
		if err := validateServices([]model.Service{s}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("validateServices(%+v): %v, want invalid", s, err)
		}
	}
	if err := validateServices(make([]model.Service, maxServices+1)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("too many services: %v", err)
	}
}
