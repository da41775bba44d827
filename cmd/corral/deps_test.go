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
	}
	for _, p := range strings.Fields(string(out)) {
		if banned[p] {
			t.Errorf("bin/corral links %s (test or benchmark code belongs in cmd/corral-bench)", p)
		}
	}
}

// TestLeanLinksNoDaemon keeps the daemon out of the lean bin/corral (-tags lean): the init of
// its packages (SQLite, the blob stores' S3 client, FUSE, OTel, gRPC) was most of the CLI's start
// (docs/BENCHMARKS.md, CLI start). The commands that need them run bin/corrald.
func TestLeanLinksNoDaemon(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "lean", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -tags lean -deps: %v", err)
	}
	banned := []string{
		"github.com/corral-dev/corral/internal/daemon",
		"github.com/corral-dev/corral/internal/edge",
		"github.com/corral-dev/corral/internal/store",
		"github.com/corral-dev/corral/internal/blobstore",
		"github.com/corral-dev/corral/internal/layers",
		"github.com/minio/minio-go/v7",
		"google.golang.org/grpc",
		"go.opentelemetry.io/otel",
		"modernc.org/sqlite",
		"github.com/hanwen/go-fuse/v2/fuse",
	}
	for _, p := range strings.Fields(string(out)) {
		for _, b := range banned {
			if p == b {
				t.Errorf("the lean bin/corral links %s (a daemon package: only bin/corrald may)", p)
			}
		}
	}
}
