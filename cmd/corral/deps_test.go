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

// TestSDKImporters keeps the Go SDK (a module of its own, sdk/go) out of the server (issue 29
// item 5): only the packages that call Corral's API as clients do import it. The server's packages
// (the API server, the cluster's servers, the edge, the catalogue, the store, the node protocol)
// speak internal/model's types, which internal/model's TestWireShape holds to the SDK's wire.
func TestSDKImporters(t *testing.T) {
	const sdk = "github.com/corral-dev/corral/sdk/go"
	clients := map[string]bool{
		"internal/cli":           true, // the CLI
		"internal/e2b":           true, // E2B's API over Corral's, through the SDK's client
		"internal/envinstall":    true, // publishes recipes through the API
		"internal/bench":         true, // benchmarks drive the API as users do
		"internal/benchcli":      true,
		"sdk/python/bench/gosdk": true, // the Go side of the SDKs' benchmark
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "github.com/corral-dev/corral/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	importers := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], "github.com/corral-dev/corral/")
		if pkg == "sdk/go" || strings.HasPrefix(pkg, "sdk/go/") {
			continue // the SDK module itself
		}
		for _, imp := range f[1:] {
			if imp == sdk+"/corraltest" || strings.HasPrefix(imp, sdk+"/corraltest/") {
				t.Errorf("%s imports %s: the SDK's fake is for tests only", pkg, imp)
			}
			if imp != sdk {
				continue
			}
			if !clients[pkg] {
				t.Errorf("%s imports the SDK: a server package speaks internal/model's types (the API server decodes and encodes the wire in them)", pkg)
			}
			importers[pkg] = true
		}
	}
	if len(importers) < 3 {
		t.Fatalf("found %d importers of the SDK (%v); want the CLI's and the gateway's at least: is go list's answer whole?", len(importers), importers)
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
		// The image and Dockerfile code (env build, layer import of an image: image_lean.go).
		"github.com/corral-dev/corral/internal/oci",
		"github.com/corral-dev/corral/internal/build",
		"github.com/opencontainers/go-digest",
		"github.com/google/go-containerregistry/pkg/name",
	}
	for _, p := range strings.Fields(string(out)) {
		for _, b := range banned {
			if p == b {
				t.Errorf("the lean bin/corral links %s (a daemon or image package: only bin/corrald may)", p)
			}
		}
	}
}
