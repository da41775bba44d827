package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/trace"
	"github.com/corral-dev/corral/internal/trace/otlptest"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestTraces (issue 28 item 3): corral up --otlp-endpoint sends a create's spans (admission,
// layers, network, runtime) as one trace to a real OTLP/HTTP receiver, with parent/child links;
// an exec, a pause and a resume are spans carrying the sandbox; a client's traceparent makes the
// edge's span a child of the client's.
func TestTraces(t *testing.T) {
	needRoot(t)
	rcv := otlptest.Start(t)
	p := withBase(t, "--otlp-endpoint", rcv.URL())
	ctx := t.Context()
	sb := p.create(corral.CreateRequest{})
	if out := p.sh(sb.ID, "echo traced"); out != "traced\n" {
		t.Fatalf("exec: %q", out)
	}
	if _, err := p.Client.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.ResumeSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// A client's own trace: the edge's exec span continues it.
	const clientTrace, clientSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	body := []byte(`{"argv":["/bin/true"]}`)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/v1/sandboxes/%s/exec", p.URL, sb.ID), bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+p.Token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("exec with a traceparent: %s", resp.Status)
	}

	has := func(name string) func([]otlptest.Span) bool {
		return func([]otlptest.Span) bool { return len(rcv.Find(name, trace.KeySandbox, sb.ID)) > 0 }
	}
	rcv.Wait(t, 30*time.Second, "create span for "+sb.ID, has(trace.Create))
	rcv.Wait(t, 30*time.Second, "resume span for "+sb.ID, has(trace.Resume))
	spans := rcv.Spans()
	create := rcv.Find(trace.Create, trace.KeySandbox, sb.ID)[0]
	if create.ParentID != "" || create.Service != "corral-up" || create.Error {
		t.Errorf("create span: parent %q, service %q, error %v; want a root of corral-up that succeeded", create.ParentID, create.Service, create.Error)
	}
	for k, want := range map[string]string{trace.KeyNode: "local", trace.KeyProject: sb.Project, trace.KeyTier: "container"} {
		if create.Attrs[k] != want {
			t.Errorf("create span attribute %s = %q, want %q (all: %v)", k, create.Attrs[k], want, create.Attrs)
		}
	}
	// The create's steps are its children, in its trace (no network by default: no corral.net.attach).
	for _, name := range []string{trace.Admit, trace.LayerFetch, trace.RuntimeNew} {
		found := false
		for _, s := range spans {
			if s.Name == name && s.ParentID == create.SpanID && s.TraceID == create.TraceID {
				found = true
				if s.Start.Before(create.Start) || s.End.After(create.End) {
					t.Errorf("%s [%v, %v] is not within the create [%v, %v]", name, s.Start, s.End, create.Start, create.End)
				}
			}
		}
		if !found {
			t.Errorf("no %s span child of the create span %s", name, create.SpanID)
		}
	}
	execs := rcv.Find(trace.Exec, trace.KeySandbox, sb.ID)
	if len(execs) < 2 {
		t.Fatalf("%d exec spans for %s, want 2", len(execs), sb.ID)
	}
	var continued bool
	for _, x := range execs {
		if x.Attrs[trace.KeyProject] != sb.Project || x.Error {
			t.Errorf("exec span %v: project %q, error %v", x.SpanID, x.Attrs[trace.KeyProject], x.Error)
		}
		if x.TraceID == clientTrace {
			continued = x.ParentID == clientSpan
		} else if x.TraceID == create.TraceID {
			t.Errorf("an exec span is in the create's trace: each request is its own trace")
		}
	}
	if !continued {
		t.Errorf("no exec span continues the client's traceparent (trace %s, parent %s)", clientTrace, clientSpan)
	}
	if ps := rcv.Find(trace.Pause, trace.KeySandbox, sb.ID); len(ps) != 1 || ps[0].Attrs["corral.automatic"] != "bool_value:false" && ps[0].Attrs["corral.automatic"] != "false" {
		t.Errorf("pause spans: %+v", ps)
	}
	if rcv.Bad() != 0 {
		t.Errorf("%d export requests were not OTLP protobuf", rcv.Bad())
	}
}
