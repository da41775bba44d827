package cluster

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
)

// TestBuildPlacement: a build goes to an edge with room for its steps' sandboxes (a container of
// the default limits), never to one too small for them, with its body (the request, then the
// context's bytes) as the client sent it.
func TestBuildPlacement(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, dsn, dir, token := bootstrapped(t, log)
	s := testServer(t, st, Config{DataDir: dir, Store: dsn}, log)
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
	// tiny holds less than one CPU: a step's sandbox never fits there.
	startStandIn(t, st, hs.URL, dir, "tiny", nodeproto.Version, store.Resources{CPUs: 0.5, MemoryBytes: 64 << 30, DiskBytes: 1 << 40, Sandboxes: 100}, answer("tiny"))
	startStandIn(t, st, hs.URL, dir, "roomy", nodeproto.Version, store.Resources{CPUs: 8, MemoryBytes: 8 << 30, DiskBytes: 1 << 40, Sandboxes: 10}, answer("roomy"))
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
