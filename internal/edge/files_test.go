package edge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/model"
)

// withAgent gives every sandbox of rt a real agent, served in this process on a unix socket.
// The agent's root is this machine's: tests use paths in temporary directories.
func withAgent(t *testing.T, rt *fakeRuntime) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := agentrpc.NewServer(agentrpc.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	rt.agent = sock
}

// TestMoveAndWatchOverHTTP drives the move and watch routes of the data plane against a real
// agent, and shows that an open watch does not keep a sandbox from idling out.
func TestMoveAndWatchOverHTTP(t *testing.T) {
	rt := newFakeRuntime()
	withAgent(t, rt)
	e, st := newTestEdge(t, rt)
	ctx := context.Background()
	rec, err := e.Create(ctx, model.CreateRequest{Base: "base:1", IdleTTL: "2s"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(e.Handler())
	defer hs.Close()
	base := hs.URL + "/v1/sandboxes/" + rec.ID
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644)

	post := func(req model.MoveRequest) (*http.Response, []byte) {
		b, _ := json.Marshal(req)
		resp, err := http.Post(base+"/files/move", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out bytes.Buffer
		out.ReadFrom(resp.Body)
		return resp, out.Bytes()
	}
	resp, body := post(model.MoveRequest{Source: filepath.Join(dir, "a"), Destination: filepath.Join(dir, "b")})
	var fi model.FileInfo
	if resp.StatusCode != 200 || json.Unmarshal(body, &fi) != nil || fi.Path != filepath.Join(dir, "b") || fi.Size != 1 {
		t.Fatalf("move: %d %s", resp.StatusCode, body)
	}
	for _, tt := range []struct {
		req    model.MoveRequest
		status int
		field  string
	}{
		{model.MoveRequest{Source: filepath.Join(dir, "b"), Destination: "../../etc/x"}, 400, "destination"},
		{model.MoveRequest{Source: "", Destination: filepath.Join(dir, "c")}, 400, "source"},
		{model.MoveRequest{Source: filepath.Join(dir, "nope"), Destination: filepath.Join(dir, "c")}, 404, ""},
		{model.MoveRequest{Source: filepath.Join(dir, "b"), Destination: filepath.Join(dir, "no/c")}, 404, ""},
	} {
		resp, body := post(tt.req)
		var e model.Error
		json.Unmarshal(body, &e)
		if resp.StatusCode != tt.status || e.Field != tt.field {
			t.Errorf("move %+v: %d %s, want %d (field %q)", tt.req, resp.StatusCode, body, tt.status, tt.field)
		}
	}
	steps, err := st.ListSteps(ctx, rec.ID, 0, 100, "")
	if err != nil || len(steps) == 0 || steps[0].Kind != "move" {
		t.Errorf("trajectory %+v, %v: want the move recorded", steps, err)
	}

	// Refusals before any stream.
	for _, q := range []string{"path=relative", "path=" + url.QueryEscape(filepath.Join(dir, "b")), "path=%2F&recursive=maybe"} {
		resp, err := http.Get(base + "/files/watch?" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("watch ?%s: %d, want 400", q, resp.StatusCode)
		}
	}

	// A watch: start once in place, then the changes, one flushed line each.
	opened := time.Now()
	resp, err = http.Get(base + "/files/watch?recursive=true&path=" + url.QueryEscape(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/x-ndjson" {
		t.Fatalf("watch: %d %s", resp.StatusCode, ct)
	}
	lines := bufio.NewScanner(resp.Body)
	next := func() model.WatchEvent {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("watch stream ended: %v", lines.Err())
		}
		var ev model.WatchEvent
		if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
			t.Fatalf("watch line %q: %v", lines.Text(), err)
		}
		return ev
	}
	if ev := next(); ev.Type != model.WatchStart {
		t.Fatalf("first line %+v, want start", ev)
	}
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	if ev := next(); ev.Type != model.WatchCreate || ev.Name != "sub" || ev.At.IsZero() {
		t.Fatalf("after mkdir: %+v", ev)
	}
	os.WriteFile(filepath.Join(dir, "sub", "f"), nil, 0o644)
	if ev := next(); ev.Type != model.WatchCreate || ev.Name != "sub/f" {
		t.Fatalf("after a create in the new directory: %+v", ev)
	}

	// The open watch is not activity: the sandbox idles out 2s after the watch was opened.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := e.Get(ctx, rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == model.StateStopped {
			if got.Reason != model.ReasonIdleExpired || time.Since(opened) < 2*time.Second {
				t.Errorf("stopped with %q after %s, want idle_expired after 2s", got.Reason, time.Since(opened))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s 10s after the watch opened (idle TTL 2s)", got.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
