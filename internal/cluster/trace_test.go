package cluster

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/clusterauth"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/trace"
	"github.com/corral-dev/corral/internal/trace/otlptest"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestTraceAcrossServer: a create through a replica is a placement span whose forward carries a
// W3C traceparent, so the edge's create span is its child in one trace; a request routed to a
// sandbox's edge is a route span the edge's span continues. The edge is a stand-in serving the
// real mutual TLS with the real trace.Extract; the receiver is a real OTLP/HTTP server.
func TestTraceAcrossServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the throwaway PostgreSQL cluster runs as the postgres user")
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rcv := otlptest.Start(t)
	stopTracing, err := trace.Setup(ctx, trace.Config{Endpoint: rcv.URL(), Service: "corral-server"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer stopTracing(ctx)
	st, dsn, dir, admin := bootstrapped(t, log)
	s := testServer(t, st, Config{DataDir: dir, Store: dsn}, log)
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	j, err := Join(ctx, hs.URL, filepath.Join(dir, "join.token"), "edge1")
	if err != nil {
		t.Fatal(err)
	}
	const id = "sb-edge1-aaaaaaaaaaaaaaaa"
	edge := httptest.NewUnstartedServer(clusterauth.RequireServer(trace.Extract(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := trace.Exec
		if r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes" {
			name = trace.Create
		}
		_, span := trace.Start(r.Context(), name, trace.Sandbox(id), trace.Node("edge1"))
		span.End(nil)
		w.Header().Set("Content-Type", "application/json")
		if name == trace.Create {
			w.WriteHeader(http.StatusCreated)
		}
		json.NewEncoder(w).Encode(model.Sandbox{ID: id, State: model.StateRunning})
	})), "/healthz"))
	edge.TLS = j.TLS
	edge.StartTLS()
	defer edge.Close()
	room := store.Resources{CPUs: 64, MemoryBytes: 64 << 30, DiskBytes: 1 << 40, Sandboxes: 100}
	if _, err := st.Register(ctx, store.Node{Name: "edge1", URL: "https://" + edge.Listener.Addr().String(),
		Tiers: []string{"container"}, Runtimes: []string{"runc"}, Capacity: room}, time.Minute); err != nil {
		t.Fatal(err)
	}
	s.refresh(ctx, true)

	c := corral.New(hs.URL, admin)
	if sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:x"}); err != nil || sb.ID != id {
		t.Fatalf("create through the server: %+v, %v", sb, err)
	}
	if _, err := c.GetSandbox(ctx, id); err != nil {
		t.Fatalf("get through the server: %v", err)
	}
	// The server ends its route span after the answer is written, so the client may have it
	// first: wait for the spans to be exported (every second) before tracing stops.
	rcv.Wait(t, 10*time.Second, "four spans", func(s []otlptest.Span) bool { return len(s) >= 4 })
	if err := stopTracing(ctx); err != nil {
		t.Fatal(err)
	}
	one := func(name string) otlptest.Span {
		t.Helper()
		got := rcv.Find(name, "", "")
		if len(got) != 1 {
			t.Fatalf("%d %s spans, want 1", len(got), name)
		}
		return got[0]
	}
	place, create, route, exec := one(trace.Placement), one(trace.Create), one(trace.Route), one(trace.Exec)
	if place.ParentID != "" || place.Attrs[trace.KeyNode] != "edge1" || place.Attrs[trace.KeyProject] == "" || place.Error {
		t.Errorf("placement span: parent %q, attributes %v, error %v", place.ParentID, place.Attrs, place.Error)
	}
	if create.TraceID != place.TraceID || create.ParentID == "" {
		t.Errorf("the edge's create: trace %s parent %s; the placement: trace %s span %s", create.TraceID, create.ParentID, place.TraceID, place.SpanID)
	}
	if create.ParentID != place.SpanID {
		t.Errorf("the edge's create's parent %s is not the placement %s", create.ParentID, place.SpanID)
	}
	if route.Attrs[trace.KeySandbox] != id || route.Attrs[trace.KeyNode] != "edge1" || exec.TraceID != route.TraceID || exec.ParentID != route.SpanID {
		t.Errorf("route %+v, the edge's span under it %+v", route, exec)
	}
}
