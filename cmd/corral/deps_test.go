package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoTestCodeLinked keeps benchmark and test code out of the production binary: they live in
// cmd/corral-bench (issue 29 item 5), and the CLI starts faster without their packages' init.
func TestNoTestCodeLinked(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	banned := map[string]bool{
		"testing":           true,
		"net/http/httptest": true,
		"github.com/corral-dev/corral/internal/bench":               true,
		"github.com/corral-dev/corral/internal/store/pgtest":        true,
		"github.com/corral-dev/corral/internal/egress/netlab":       true,
		"github.com/corral-dev/corral/internal/blobstore/s3test":    true,
		"github.com/google/go-containerregistry/pkg/registry":       true,
		"github.com/corral-dev/corral/internal/blobstore/versitygw": true,
		"github.com/corral-dev/corral/sdk/go/corraltest":            true,
	}
	for _, p := range strings.Fields(string(out)) {
		if banned[p] {
			t.Errorf("bin/corral links %s (test or benchmark code belongs in cmd/corral-bench)", p)
		}
	}
}
