package trace_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/trace"
	"github.com/corral-dev/corral/internal/trace/otlptest"
)

func TestExportedDocs(t *testing.T) { doccheck.Exported(t, ".") }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestOffCostsNothing(t *testing.T) {
	if trace.Enabled() {
		t.Fatal("tracing on before any Setup")
	}
	stop, err := trace.Setup(context.Background(), trace.Config{Service: "test"}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer stop(context.Background())
	if trace.Enabled() {
		t.Fatal("Setup without an endpoint turned tracing on")
	}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		c, span := trace.Start(ctx, trace.Exec, trace.Sandbox("sb-local-x"), trace.Node("local"), trace.Project("/"))
		span.Set(trace.Tier("container"))
		var err error
		span.End(&err)
		if c != ctx {
			t.Fatal("Start while off returned another context")
		}
	})
	if allocs != 0 {
		t.Errorf("Start/Set/End while off: %v allocations per call, want 0", allocs)
	}
	h := http.Header{}
	trace.Inject(ctx, h)
	if len(h) != 0 {
		t.Errorf("Inject while off wrote %v", h)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		ok       bool
	}{
		{"", true},
		{"http://127.0.0.1:4318", true},
		{"https://collector.example:4318/v1/traces", true},
		{"127.0.0.1:4318", false},
		{"ftp://host", false},
		{"http://", false},
		{"grpc://host:4317", false},
	} {
		err := trace.Config{Endpoint: tc.endpoint}.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("Validate(%q) = %v, want ok=%v", tc.endpoint, err, tc.ok)
		}
	}
}

// TestExportAcrossHTTP starts spans in a "server", crosses an HTTP hop with a traceparent header
// to an "edge" handler, and checks what a real OTLP/HTTP receiver got.
func TestExportAcrossHTTP(t *testing.T) {
	rcv := otlptest.Start(t)
	stop, err := trace.Setup(context.Background(), trace.Config{Endpoint: rcv.URL(), Service: "corral-test", Node: "n1"}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer stop(context.Background())
	if !trace.Enabled() {
		t.Fatal("Setup with an endpoint left tracing off")
	}
	edge := httptest.NewServer(trace.Extract(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, span := trace.StartRequest(r, trace.Exec, trace.Sandbox("sb-n1-abc"))
		defer span.End(nil)
		trace.Fail(r.Context(), errors.New("exit 3"))
		_, child := trace.Start(r.Context(), trace.Resume, trace.Sandbox("sb-n1-abc"))
		child.End(nil)
	})))
	defer edge.Close()

	ctx, root := trace.Start(context.Background(), trace.Placement, trace.Project("/team"))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, edge.URL, nil)
	trace.Inject(ctx, req.Header)
	if req.Header.Get("traceparent") == "" {
		t.Fatal("Inject wrote no traceparent")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	root.End(nil)
	if err := stop(context.Background()); err != nil { // flushes the batch
		t.Fatal(err)
	}
	if trace.Enabled() {
		t.Error("tracing still on after its shutdown")
	}
	spans := rcv.Wait(t, 10*time.Second, "three spans", func(s []otlptest.Span) bool { return len(s) >= 3 })
	by := map[string]otlptest.Span{}
	for _, s := range spans {
		by[s.Name] = s
	}
	p, x, r := by[trace.Placement], by[trace.Exec], by[trace.Resume]
	if p.ParentID != "" || x.ParentID != p.SpanID || r.ParentID != x.SpanID {
		t.Errorf("parent links: placement %s (parent %q), exec %s (parent %s), resume parent %s; want a chain", p.SpanID, p.ParentID, x.SpanID, x.ParentID, r.ParentID)
	}
	if p.TraceID == "" || x.TraceID != p.TraceID || r.TraceID != p.TraceID {
		t.Errorf("trace IDs %q %q %q, want one trace across the HTTP hop", p.TraceID, x.TraceID, r.TraceID)
	}
	if x.Attrs[trace.KeySandbox] != "sb-n1-abc" || p.Attrs[trace.KeyProject] != "/team" {
		t.Errorf("attributes: exec %v, placement %v", x.Attrs, p.Attrs)
	}
	if !x.Error || p.Error || r.Error {
		t.Errorf("error status: exec %v (want true, Fail marked it), placement %v, resume %v", x.Error, p.Error, r.Error)
	}
	if p.Service != "corral-test" {
		t.Errorf("service.name %q, want corral-test", p.Service)
	}
}

// TestEnvironmentEndpoint: OTEL_EXPORTER_OTLP_ENDPOINT turns tracing on without the flag.
func TestEnvironmentEndpoint(t *testing.T) {
	rcv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL())
	stop, err := trace.Setup(context.Background(), trace.Config{Service: "corral-test"}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	_, span := trace.Start(context.Background(), trace.Create, trace.Sandbox("sb-local-env"))
	span.End(nil)
	stop(context.Background())
	rcv.Wait(t, 10*time.Second, "the create span", func([]otlptest.Span) bool {
		return len(rcv.Find(trace.Create, trace.KeySandbox, "sb-local-env")) == 1
	})
}

// BenchmarkSpan is one span's cost on a hot path, off and on (exported to a real receiver).
func BenchmarkSpan(b *testing.B) {
	run := func(b *testing.B) {
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			_, span := trace.Start(ctx, trace.Exec, trace.Sandbox("sb-local-x"), trace.Node("local"))
			span.Set(trace.Project("/"), trace.Tier("container"))
			span.End(nil)
		}
	}
	b.Run("off", run)
	rcv := otlptest.Start(b)
	stop, err := trace.Setup(context.Background(), trace.Config{Endpoint: rcv.URL(), Service: "bench"}, quiet)
	if err != nil {
		b.Fatal(err)
	}
	defer stop(context.Background())
	b.Run("on", run)
}
