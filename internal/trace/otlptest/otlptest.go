// Package otlptest is a test-only OTLP/HTTP trace receiver: a real HTTP server that decodes the
// protobuf export requests OpenTelemetry's exporters send (gzip or not) and keeps their spans for
// a test to inspect. Tests of internal/trace and the e2e suite use it; nothing in bin/corral does.
package otlptest

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened.
type Span struct {
	Name     string
	Service  string // the resource's service.name
	TraceID  string // hex
	SpanID   string // hex
	ParentID string // hex; "" for a root span
	Attrs    map[string]string
	Error    bool // status code error
	Start    time.Time
	End      time.Time
}

// Receiver is a running OTLP/HTTP receiver.
type Receiver struct {
	srv *httptest.Server

	mu    sync.Mutex
	spans []Span // protected by mu
	bad   int    // requests that did not decode; protected by mu
}

// Start starts a receiver on a loopback port; it stops when the test ends.
func Start(t testing.TB) *Receiver {
	r := &Receiver{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.export)
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	return r
}

// URL is the receiver's base URL (http://127.0.0.1:PORT), what --otlp-endpoint takes.
func (r *Receiver) URL() string { return r.srv.URL }

func (r *Receiver) export(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			r.fail(w)
			return
		}
		defer gz.Close()
		body = gz
	}
	raw, err := io.ReadAll(io.LimitReader(body, 64<<20))
	var msg collectortrace.ExportTraceServiceRequest
	if err != nil || req.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(raw, &msg) != nil {
		r.fail(w)
		return
	}
	var got []Span
	for _, rs := range msg.GetResourceSpans() {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Name: s.GetName(), Service: service, TraceID: hex.EncodeToString(s.GetTraceId()),
					SpanID: hex.EncodeToString(s.GetSpanId()), Attrs: attrs(s.GetAttributes()),
					Error: s.GetStatus().GetCode() == 2, // STATUS_CODE_ERROR
					Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano()))}
				if len(s.GetParentSpanId()) > 0 {
					sp.ParentID = hex.EncodeToString(s.GetParentSpanId())
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func (r *Receiver) fail(w http.ResponseWriter) {
	r.mu.Lock()
	r.bad++
	r.mu.Unlock()
	http.Error(w, "not an OTLP protobuf trace export", http.StatusBadRequest)
}

// attrs flattens string, int and bool attributes to strings.
func attrs(list []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range list {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		default:
			m[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return m
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Bad counts requests that were not OTLP protobuf trace exports.
func (r *Receiver) Bad() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bad
}

// Find returns the received spans named name whose attribute key is value (any, for key "").
func (r *Receiver) Find(name, key, value string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.Name == name && (key == "" || s.Attrs[key] == value) {
			out = append(out, s)
		}
	}
	return out
}

// Wait polls until ok holds for the spans received, or fails the test after d.
func (r *Receiver) Wait(t testing.TB, d time.Duration, what string, ok func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		spans := r.Spans()
		if ok(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			names := map[string]int{}
			for _, s := range spans {
				names[s.Name]++
			}
			t.Fatalf("after %s: no %s among %d spans received (%v; %d bad requests)", d, what, len(spans), names, r.Bad())
		}
		time.Sleep(50 * time.Millisecond) // polling the receiver, not waiting for a state blindly
	}
}
