package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
)

// TestBuildPlacement: a build goes to an edge with room for its steps' sandboxes (a container of
// the default limits), never to one too small for them, and away from one that refuses it for
// room (the edge's final say, before it reads the body), with its body (the request, then the
// context's bytes) as the client sent it.
func TestBuildPlacement(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, dsn, dir, token := bootstrapped(t, log)
	// K -1: the least loaded node is tried first, so "refuser" (the largest) always is.
	s := testServer(t, st, Config{DataDir: dir, Store: dsn, K: -1}, log)
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()

	var mu sync.Mutex
	got := map[string][]string{} // node → bodies
	answer := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			got[name] = append(got[name], string(b))
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":"bld-`+name+`-0123456789abcdef","state":"running"}`)
		}
	}
	// tiny holds less than a step's sandbox: it never fits there.
	startStandIn(t, st, hs.URL, dir, "tiny", nodeproto.Version, store.Resources{CPUs: 0.1, MemoryBytes: 64 << 20, DiskBytes: 1 << 40, Sandboxes: 100}, answer("tiny"))
	startStandIn(t, st, hs.URL, dir, "roomy", nodeproto.Version, store.Resources{CPUs: 32, MemoryBytes: 32 << 30, DiskBytes: 1 << 40, Sandboxes: 50}, answer("roomy"))
	var refused atomic.Int64
	startStandIn(t, st, hs.URL, dir, "refuser", nodeproto.Version, store.Resources{CPUs: 64, MemoryBytes: 64 << 30, DiskBytes: 1 << 40, Sandboxes: 100},
		func(w http.ResponseWriter, r *http.Request) {
			refused.Add(1)
			httpjson.Error(w, r, log, fmt.Errorf("node refuser has no room for a build's step: %w", errdefs.ErrNodeFull))
		})
	s.refresh(ctx, true)

	body := `{"name":"img","dockerfile":"FROM base:x\nRUN true\n"}` + "\n" + strings.Repeat("context bytes ", 10000)
	for i := range 8 {
		req, _ := http.NewRequest("POST", hs.URL+"/v1/builds", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || !strings.Contains(string(b), "bld-roomy-") {
			t.Fatalf("build %d: %s %s; want it started on roomy", i, resp.Status, b)
		}
	}
	if refused.Load() != 8 {
		t.Errorf("the refusing edge was asked %d times, want each of the 8 builds first", refused.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got["tiny"]) != 0 {
		t.Errorf("%d builds went to a node their steps cannot fit on", len(got["tiny"]))
	}
	for i, b := range got["roomy"] {
		if b != body {
			t.Fatalf("build %d reached its edge with %d bytes, want the %d the client sent", i, len(b), len(body))
		}
	}

	// A request the replica cannot read is the client's error, and reaches no edge.
	req, _ := http.NewRequest("POST", hs.URL+"/v1/builds", strings.NewReader(`{"name":`))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || len(got["roomy"]) != 8 {
		t.Errorf("a broken build request: %s, %d builds on roomy; want 400 and none sent", resp.Status, len(got["roomy"]))
	}
}
