package httpjson

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

func TestDecode(t *testing.T) {
	tests := []struct {
		body  string
		kind  error
		field string
	}{
		{`{"base":"b:1"}`, nil, ""},
		{``, errdefs.ErrInvalid, ""},
		{`{"base":`, errdefs.ErrInvalid, ""},
		{`{"base":"b:1"} {}`, errdefs.ErrInvalid, ""},
		{`{"base":"b:1"} x`, errdefs.ErrInvalid, ""},
		{`{"nope":1}`, errdefs.ErrInvalid, "nope"},
		{`{"limits":{"pids":"many"}}`, errdefs.ErrInvalid, "limits.pids"},
		{`{"base":"` + strings.Repeat("x", MaxBody) + `"}`, errdefs.ErrTooLarge, ""},
	}
	for _, tt := range tests {
		var req model.CreateRequest
		err := Decode(httptest.NewRequest("POST", "/", strings.NewReader(tt.body)), &req)
		if tt.kind == nil {
			if err != nil {
				t.Errorf("Decode(%.40q) = %v, want ok", tt.body, err)
			}
			continue
		}
		if !errors.Is(err, tt.kind) || errdefs.Field(err) != tt.field {
			t.Errorf("Decode(%.40q) = %v (field %q), want %v field %q", tt.body, err, errdefs.Field(err), tt.kind, tt.field)
		}
	}
}

func TestDecodeStream(t *testing.T) {
	var req model.ExecRequest
	rest, err := DecodeStream(strings.NewReader("{\"argv\":[\"cat\"]}\nstdin bytes"), &req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rest)
	if string(b) != "stdin bytes" || req.Argv[0] != "cat" {
		t.Fatalf("rest = %q, argv = %v", b, req.Argv)
	}
	if _, err := DecodeStream(strings.NewReader(`{"argv":["cat"]}xstdin`), &req); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("no newline after the object: err = %v, want invalid", err)
	}
}

// FuzzDecode feeds arbitrary bodies to the API's JSON decoding: it must never panic, and must
// either fail with an invalid/too-large error or produce a value that encodes back.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"base":"b:1","limits":{"cpus":1}}`, `{"argv":["x"],"env":["A=B"]}`, `[`, `{"a":`, `null`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var c model.CreateRequest
		if err := Decode(httptest.NewRequest("POST", "/", strings.NewReader(body)), &c); err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("Decode(%q) = %v: not a client error", body, err)
			}
		}
		var e model.ExecRequest
		if _, err := DecodeStream(strings.NewReader(body), &e); err != nil && !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrTooLarge) {
			t.Fatalf("DecodeStream(%q) = %v: not a client error", body, err)
		}
	})
}

func TestErrorStatusAndRetryAfter(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		err        error
		status     int
		retryAfter string
	}{
		{errdefs.NotFound("sandbox x"), http.StatusNotFound, ""},
		{errdefs.Unavailable("gVisor is not installed here"), http.StatusServiceUnavailable, ""},
		{errdefs.Retryable(errdefs.Unavailable("the database is unreachable"), time.Second), http.StatusServiceUnavailable, "1"},
		{fmt.Errorf("look up token: %w", errdefs.Retryable(errdefs.Unavailable("x"), 1500*time.Millisecond)), http.StatusServiceUnavailable, "2"},
		{errors.New("boom"), http.StatusInternalServerError, ""},
	} {
		w := httptest.NewRecorder()
		Error(w, httptest.NewRequest("GET", "/v1/x", nil), log, c.err)
		if w.Code != c.status || w.Header().Get("Retry-After") != c.retryAfter {
			t.Errorf("%v: status %d Retry-After %q, want %d %q", c.err, w.Code, w.Header().Get("Retry-After"), c.status, c.retryAfter)
		}
	}
	// A handler's own Retry-After is kept.
	w := httptest.NewRecorder()
	w.Header().Set("Retry-After", "7")
	Error(w, httptest.NewRequest("GET", "/v1/x", nil), log, errdefs.Retryable(errdefs.Unavailable("draining"), time.Second))
	if got := w.Header().Get("Retry-After"); got != "7" {
		t.Fatalf("Retry-After = %q, want the handler's 7", got)
	}
}
