package corral_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

func TestMove(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	id := newSandbox(t, srv, c)
	if _, err := c.WriteFile(ctx, id, "/work/a/f", strings.NewReader("x"), corral.WriteFileOptions{Parents: true}); err != nil {
		t.Fatal(err)
	}
	fi, err := c.Move(ctx, id, "/work/a", "/work/b")
	if err != nil {
		t.Fatalf("Move: %v", err)
	}
	if fi.Path != "/work/b" || !fi.IsDir {
		t.Errorf("Move = %+v", fi)
	}
	if got, ok := srv.File(id, "/work/b/f"); !ok || string(got) != "x" {
		t.Errorf("after the move /work/b/f = %q, %v", got, ok)
	}
	if _, err := c.Move(ctx, id, "/work/b/f", "/nope/f"); !corral.IsNotFound(err) {
		t.Errorf("Move into a missing directory: %v, want not found", err)
	}
	if _, err := c.Move(ctx, id, "/work/b/f", "../../etc/x"); !corral.IsInvalid(err) {
		t.Errorf("Move to a relative path: %v, want invalid", err)
	}
	if body := lastBody(t, srv); body["source"] != "/work/b/f" || body["destination"] != "../../etc/x" {
		t.Errorf("request body %v", body)
	}
}

func TestWatch(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	id := newSandbox(t, srv, c)
	if _, err := c.Mkdir(ctx, id, corral.MkdirRequest{Path: "/work/sub", Parents: true}); err != nil {
		t.Fatal(err)
	}
	ws, err := c.Watch(ctx, id, "/work", true)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer ws.Close()
	c.WriteFile(ctx, id, "/work/sub/f", strings.NewReader("x"), corral.WriteFileOptions{})
	c.Move(ctx, id, "/work/sub/f", "/work/g")
	c.Remove(ctx, id, "/work", true)
	var got []string
	for {
		ev, err := ws.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Next after %v: %v", got, err)
		}
		got = append(got, ev.Type+" "+ev.Name)
	}
	want := []string{"create sub/f", "write sub/f", "rename sub/f", "rename g", "remove sub", "remove g", "remove "}
	if !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if _, err := ws.Next(); err != io.EOF {
		t.Errorf("Next after the end: %v", err)
	}
	if _, err := c.Watch(ctx, id, "/nope", false); !corral.IsNotFound(err) {
		t.Errorf("Watch of a missing directory: %v, want not found", err)
	}
	if lines := srv.RequestLines(); !slices.Contains(lines, "GET /v1/sandboxes/"+id+"/files/watch?path=%2Fwork&recursive=true") {
		t.Errorf("no watch request in %q", lines)
	}
}

func TestWatchDecoding(t *testing.T) {
	for _, tt := range []struct {
		name  string
		body  string
		types []string
		check func(error) bool
	}{
		{
			name:  "events then the directory's removal",
			body:  `{"type":"start"}` + "\n" + `{"type":"create","name":"a","at":"2026-01-02T03:04:05.000000006Z"}` + "\n" + `{"type":"overflow"}` + "\n" + `{"type":"remove"}` + "\n",
			types: []string{"create", "overflow", "remove"},
			check: func(err error) bool { return err == io.EOF },
		},
		{
			name:  "an error from the server",
			body:  `{"type":"start"}` + "\n" + `{"type":"write","name":"a"}` + "\n" + `{"type":"error","code":"exhausted","message":"too many directories"}` + "\n",
			types: []string{"write"},
			check: func(err error) bool { return corral.IsExhausted(err) && strings.Contains(err.Error(), "too many") },
		},
		{
			name:  "cut short",
			body:  `{"type":"start"}` + "\n" + `{"type":"write","name":"a"}` + "\n",
			types: []string{"write"},
			check: func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) },
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/x-ndjson")
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			ws, err := corral.New(srv.URL, "t").Watch(testContext(t), "sb", "/d", false)
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			defer ws.Close()
			var types []string
			for {
				ev, err := ws.Next()
				if err != nil {
					if !tt.check(err) {
						t.Errorf("Next ended with %v", err)
					}
					break
				}
				if ev.Name == "a" && ev.Type == "create" && ev.At.Nanosecond() != 6 {
					t.Errorf("time %v", ev.At)
				}
				types = append(types, ev.Type)
			}
			if !slices.Equal(types, tt.types) {
				t.Errorf("events %v, want %v", types, tt.types)
			}
		})
	}
	// A stream that does not begin with start is refused.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"type":"create","name":"a"}`+"\n")
	}))
	defer srv.Close()
	if _, err := corral.New(srv.URL, "t").Watch(testContext(t), "sb", "/d", false); err == nil {
		t.Error("Watch accepted a stream without start")
	}
}
