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

// TestSDKImporters keeps the Go SDK (a module of its own, sdk/go) at the edges of the server
// (issue 29 item 5): packages that serve or call the HTTP API may import it; the others listed in
// debt still use its wire types as their domain model and are to convert at the boundary. The
// list may only shrink: a package that starts importing the SDK fails here.
func TestSDKImporters(t *testing.T) {
	const sdk = "github.com/corral-dev/corral/sdk/go"
	boundary := map[string]bool{
		"internal/apiserver":     true, // the HTTP API
		"internal/httpjson":      true, // the error body on the wire
		"internal/cluster":       true, // corral server: the API in front of edges
		"internal/clusterauth":   true, // refusals between server and edge, on the wire
		"internal/nodeproto":     true, // the node channel: what edges and servers say on the wire
		"internal/cli":           true, // a client
		"internal/e2b":           true, // a client: E2B's API over Corral's
		"internal/envinstall":    true, // a client: publishes recipes through the API
		"internal/bench":         true, // a client
		"internal/benchcli":      true, // a client
		"sdk/python/bench/gosdk": true, // a client
		"internal/edge":          false,
		"internal/store":         false,
		// Split out of internal/edge with the create's resolution (the debt moved, it did not
		// grow): it takes the request and reads the store's catalogue, both in the SDK's types.
		"internal/catalog": false,
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
			if _, ok := boundary[pkg]; !ok {
				t.Errorf("%s imports the SDK: convert to internal types at the HTTP boundary instead (issue 29 item 5)", pkg)
			}
			importers[pkg] = true
		}
	}
	for pkg, ok := range boundary {
		if !ok && !importers[pkg] {
			t.Errorf("%s no longer imports the SDK: take it off the debt list", pkg)
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
