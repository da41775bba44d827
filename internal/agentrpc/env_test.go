package agentrpc

import (
	"slices"
	"testing"
)

func TestDefaultEnv(t *testing.T) {
	got := DefaultEnv([]string{"A=1"})
	if want := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "A=1"}; !slices.Equal(got, want) {
		t.Errorf("DefaultEnv = %q, want %q", got, want)
	}
	got = DefaultEnv([]string{"PATH=/x", "HOME=/h"})
	if want := []string{"PATH=/x", "HOME=/h"}; !slices.Equal(got, want) {
		t.Errorf("DefaultEnv = %q, want %q", got, want)
	}
}
