// Package trace owns Corral's OpenTelemetry traces: the tracer of the process, exported over
// OTLP/HTTP when an endpoint is configured (Setup), the span names and attributes every call site
// shares, and W3C trace context across HTTP hops (a cluster server's request to an edge).
//
// Off (no endpoint), Start returns its context unchanged and a Span whose methods do nothing: the
// cost on a hot path is one atomic load. Call sites are two lines:
//
//	ctx, span := trace.Start(ctx, trace.Exec, trace.Sandbox(id))
//	defer span.End(&err)
package trace

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Span names. A span's name says the operation; which sandbox, node, project and tier it was
// about are attributes.
const (
	Create     = "corral.create"         // a sandbox's create on its edge: admission to running
	Admit      = "corral.admit"          // validation, quotas and the record (inside Create)
	LayerFetch = "corral.layer.fetch"    // a sandbox's layers fetched as its fetch mode says, and mounted
	BlobFetch  = "corral.blob.fetch"     // one layer image downloaded from the blob store to the node
	NetAttach  = "corral.net.attach"     // the sandbox's network slot and policy
	RuntimeNew = "corral.runtime.create" // the runtime's create and start (runc, gVisor, QEMU)
	Placement  = "corral.placement"      // a cluster server choosing a node and forwarding the create
	Route      = "corral.route"          // a cluster server forwarding a sandbox's request to its edge
	Claim      = "corral.claim"          // a warm-pool sandbox claimed for a create
	Exec       = "corral.exec"           // one exec, start to exit (or to the client leaving)
	CommandNew = "corral.command.start"  // a background command started
	Pause      = "corral.pause"          // a sandbox paused (asked, or idle)
	Resume     = "corral.resume"         // a sandbox resumed (asked, or by a request)
	Fork       = "corral.fork"           // a sandbox forked
)

// Attribute keys.
const (
	KeySandbox = "corral.sandbox.id"
	KeyNode    = "corral.node.id"
	KeyProject = "corral.project"
	KeyTier    = "corral.tier"
)

// Sandbox is the attribute naming the sandbox a span is about.
func Sandbox(id string) attribute.KeyValue { return attribute.String(KeySandbox, id) }

// Node is the attribute naming the node (edge) a span ran on or was placed on.
func Node(name string) attribute.KeyValue { return attribute.String(KeyNode, name) }

// Project is the attribute naming the sandbox's project.
func Project(path string) attribute.KeyValue { return attribute.String(KeyProject, path) }

// Tier is the attribute naming the sandbox's tier (container, microvm, vm, fncall).
func Tier(tier string) attribute.KeyValue { return attribute.String(KeyTier, tier) }

// String is any other string attribute (a fetch mode, a layer digest).
func String(k, v string) attribute.KeyValue { return attribute.String(k, v) }

// Int is any other integer attribute (a count of layers, bytes).
func Int(k string, v int) attribute.KeyValue { return attribute.Int(k, v) }

// Config says where traces go.
type Config struct {
	// Endpoint is an OTLP/HTTP receiver: a base URL (http://HOST:4318, to which /v1/traces is
	// added) or the full URL of its traces path. Empty: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
	// $OTEL_EXPORTER_OTLP_ENDPOINT as OpenTelemetry's SDKs read them, else tracing is off.
	Endpoint string
	// Service names the process in its traces: corral-up, corral-server, corral-edge.
	Service string
	// Node is the node the process serves (an attribute of its resource); empty for a server.
	Node string
}

// Validate checks the endpoint's form.
func (c Config) Validate() error {
	if c.Endpoint == "" {
		return nil
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errdefs.Invalid("otlp-endpoint", "%q is not an http(s) URL of an OTLP/HTTP receiver (http://HOST:4318)", c.Endpoint)
	}
	return nil
}

// endpointURL is the traces URL Endpoint names.
func (c Config) endpointURL() string {
	u, _ := url.Parse(c.Endpoint)
	if strings.Trim(u.Path, "/") == "" {
		u.Path = "/v1/traces"
	}
	return u.String()
}

// enabled reports whether cfg turns tracing on.
func (c Config) enabled() bool {
	return c.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// tracer is the process's tracer while tracing is on; nil while off.
var tracer atomic.Pointer[oteltrace.Tracer]

// propagator reads and writes W3C traceparent/tracestate headers.
var propagator = propagation.TraceContext{}

// batchTimeout bounds how long a finished span waits before it is sent.
const batchTimeout = time.Second

// Setup turns tracing on for this process when cfg (or the environment) names an endpoint, and
// returns the function that flushes what is pending and turns it off again; with no endpoint it
// does nothing and returns a no-op. Spans are batched and sent in the background: a receiver
// that is slow or down costs dropped spans (logged by the exporter), never a slower request.
func Setup(ctx context.Context, cfg Config, log *slog.Logger) (shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	if err := cfg.Validate(); err != nil {
		return noop, err
	}
	if !cfg.enabled() {
		return noop, nil
	}
	var opts []otlptracehttp.Option
	where := "the OTEL_EXPORTER_OTLP_* environment"
	if cfg.Endpoint != "" {
		where = cfg.endpointURL()
		opts = append(opts, otlptracehttp.WithEndpointURL(where))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return noop, fmt.Errorf("start the OTLP trace exporter: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.Service)}
	if cfg.Node != "" {
		attrs = append(attrs, Node(cfg.Node))
	}
	if host, err := os.Hostname(); err == nil {
		attrs = append(attrs, attribute.String("host.name", host))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(batchTimeout)),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		// Every operation is traced: a caller's traceparent places our spans in its trace but
		// does not decide whether they are recorded.
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
	)
	t := tp.Tracer("github.com/corral-dev/corral")
	tracer.Store(&t)
	log.Info("tracing on", "otlp", where, "service", cfg.Service)
	return func(ctx context.Context) error {
		tracer.CompareAndSwap(&t, nil)
		return tp.Shutdown(ctx)
	}, nil
}

// Enabled reports whether spans are being recorded.
func Enabled() bool { return tracer.Load() != nil }

// Span is one operation's span. The zero Span (tracing off) does nothing.
type Span struct{ s oteltrace.Span }

// Start begins a span named name as a child of ctx's span (or of the trace ctx carries from a
// traceparent header), with attrs, and returns the context that carries it.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, Span{}
	}
	// A copy, so that attrs does not escape and costs callers no allocation while tracing is off.
	ctx, s := (*t).Start(ctx, name, oteltrace.WithAttributes(slices.Clone(attrs)...))
	return ctx, Span{s}
}

// Set adds attributes learned after Start (the sandbox ID a create made, the node chosen).
func (s Span) Set(attrs ...attribute.KeyValue) {
	if s.s != nil {
		s.s.SetAttributes(slices.Clone(attrs)...)
	}
}

// End ends the span; errp, when not nil and pointing at an error, marks it failed with it.
func (s Span) End(errp *error) {
	if s.s == nil {
		return
	}
	if errp != nil && *errp != nil {
		s.s.RecordError(*errp)
		s.s.SetStatus(codes.Error, (*errp).Error())
	}
	s.s.End()
}

// Extract returns h reading W3C trace context from each request's headers into its context, so
// that spans of the request continue the caller's trace (a cluster server's, or a client's).
func Extract(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tracer.Load() != nil && r.Header.Get("traceparent") != "" {
			r = r.WithContext(propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
		}
		h.ServeHTTP(w, r)
	})
}

// Inject writes ctx's span as W3C trace context into h, for a request to another process.
func Inject(ctx context.Context, h http.Header) {
	if tracer.Load() != nil {
		propagator.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// StartRequest is Start for an HTTP handler: the span's context goes into the request it returns
// (r itself while tracing is off), so that Fail through the request marks it.
func StartRequest(r *http.Request, name string, attrs ...attribute.KeyValue) (*http.Request, Span) {
	if tracer.Load() == nil {
		return r, Span{}
	}
	ctx, s := Start(r.Context(), name, attrs...)
	return r.WithContext(ctx), s
}

// Fail marks the span ctx carries failed with err (an HTTP error answer: see httpjson).
func Fail(ctx context.Context, err error) {
	if err == nil || tracer.Load() == nil {
		return
	}
	if s := oteltrace.SpanFromContext(ctx); s.IsRecording() {
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
}

// Bool is a boolean attribute (a pause the reaper made).
func Bool(k string, v bool) attribute.KeyValue { return attribute.Bool(k, v) }
