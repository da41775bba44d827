package nodeproto

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

func TestCallerRoundTrip(t *testing.T) {
	in := &Caller{TokenID: "tok-1", Principal: "alice", ProjectID: "p1", ProjectPath: "/team",
		Perms: iam.SandboxRead | iam.SandboxUse, Role: "user", Parent: "tok-0",
		CreatedAt: time.Date(2026, 12, 3, 1, 2, 3, 0, time.UTC), ExpiresAt: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		Held: map[string]iam.Perm{"/team": iam.SandboxRead | iam.SandboxUse, "/team/a": iam.SandboxAdmin}}
	r := httptest.NewRequest("GET", "/v1/whoami", nil)
	r.Header.Set(HeaderCaller, "stale")
	if err := SetCaller(r.Header, in); err != nil {
		t.Fatal(err)
	}
	if got := r.Header.Values(HeaderCaller); len(got) != 1 {
		t.Fatalf("%d caller headers, want the one set", len(got))
	}
	out, err := CallerOf(r)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%+v", *out) != fmt.Sprintf("%+v", *in) {
		t.Errorf("round trip:\n got %+v\nwant %+v", *out, *in)
	}
}

func TestCallerRefused(t *testing.T) {
	good := http.Header{}
	SetCaller(good, &Caller{TokenID: "t", Principal: "p", ProjectPath: "/"})
	cases := []struct {
		name string
		edit func(h http.Header)
		want error
	}{
		{"no version", func(h http.Header) { h.Del(HeaderVersion) }, ErrVersion},
		{"another version", func(h http.Header) { h.Set(HeaderVersion, strconv.Itoa(Version+1)) }, ErrVersion},
		{"no caller", func(h http.Header) { h.Del(HeaderCaller) }, errdefs.ErrUnauthorized},
		{"not base64url", func(h http.Header) { h.Set(HeaderCaller, "a b") }, errdefs.ErrUnauthorized},
		{"not JSON", func(h http.Header) { h.Set(HeaderCaller, "bm90IGpzb24") }, errdefs.ErrUnauthorized},
		{"no principal", func(h http.Header) { SetCaller(h, &Caller{TokenID: "t", ProjectPath: ""}) }, errdefs.ErrUnauthorized},
		{"too large", func(h http.Header) { h.Set(HeaderCaller, strings.Repeat("A", maxCaller+1)) }, errdefs.ErrUnauthorized},
	}
	for _, c := range cases {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header = good.Clone()
		c.edit(r.Header)
		if _, err := CallerOf(r); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

func TestRefusals(t *testing.T) {
	cases := []struct {
		err  error
		want Refusal
	}{
		{fmt.Errorf("node n has no room: %w", errdefs.ErrNodeFull), NodeFull},
		{fmt.Errorf("write: %w", errdefs.ErrStaleEpoch), StaleEpoch},
		{fmt.Errorf("speak: %w", ErrVersion), WrongVersion},
		{errdefs.UnknownSandbox("sb-x", ""), UnknownSandbox},
		{errdefs.NotFound("layer x"), None},
		{errdefs.Conflict("busy"), None},
		{nil, None},
	}
	for _, c := range cases {
		if got := RefusalOf(c.err); got != c.want {
			t.Errorf("RefusalOf(%v) = %q, want %q", c.err, got, c.want)
		}
		// Annotated on a request of the protocol, read back by the server as the same.
		r := httptest.NewRequest("POST", "/v1/sandboxes", nil)
		SetCaller(r.Header, &Caller{TokenID: "t", Principal: "p", ProjectPath: "/"})
		w := httptest.NewRecorder()
		Annotate(w, r, c.err)
		if got := Refused(w.Header()); got != c.want {
			t.Errorf("%v annotated and read back: %q, want %q", c.err, got, c.want)
		}
		// Not on a client's request.
		w = httptest.NewRecorder()
		Annotate(w, httptest.NewRequest("POST", "/v1/sandboxes", nil), c.err)
		if got := w.Header().Get(HeaderRefusal); got != "" {
			t.Errorf("%v: a client's request got refusal %q", c.err, got)
		}
	}
	if got := Refused(http.Header{HeaderRefusal: {"something_new"}}); got != None {
		t.Errorf("an unknown refusal reads as %q, want none", got)
	}
	if msg := errdefs.UnknownSandbox("sb-x", "(node y is not known here)").Error(); msg != "sandbox sb-x (node y is not known here): not found" {
		t.Errorf("unknown sandbox message %q", msg)
	}
	h := http.Header{}
	SetCaller(h, &Caller{TokenID: "t", Principal: "p", ProjectPath: "/"})
	h.Set(HeaderRefusal, string(NodeFull))
	h.Set("Content-Type", "application/json")
	Strip(h)
	if len(h) != 1 {
		t.Errorf("after Strip: %v", h)
	}
}
