package nodeproto

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// TestSeal: a caller sealed for a node opens for that node only, until it lapses (at the
// latest when its token expires), and a seal over another caller, or by another key, opens
// for nobody.
func TestSeal(t *testing.T) {
	if _, err := NewSealer([]byte("short")); err == nil {
		t.Error("a 5-byte seal key was taken")
	}
	s, err := NewSealer([]byte(strings.Repeat("a", 32)))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	expires := now.Add(time.Hour)
	h := http.Header{}
	c := &Caller{TokenID: "t1", Principal: "alice", Perms: iam.SandboxCreate, ExpiresAt: expires, CreatedAt: now}
	if err := SetSealedCaller(h, c, "edge1", s, VoucherTTL); err != nil {
		t.Fatal(err)
	}
	if got, err := CallerOf(&http.Request{Header: h}); err != nil || got.Principal != "alice" || got.Node != "edge1" {
		t.Fatalf("the sealed caller as an edge reads it: %+v, %v", got, err)
	}
	v := VoucherOf(h)
	if got, err := s.Open(v, "edge1", now); err != nil || got.Principal != "alice" || !got.Until.Equal(expires.UTC()) {
		t.Errorf("open for its node: %+v, %v; want alice until the token's expiry", got, err)
	}
	for name, try := range map[string]func() error{
		"another node": func() error { _, err := s.Open(v, "edge2", now); return err },
		"lapsed":       func() error { _, err := s.Open(v, "edge1", expires); return err },
		"no voucher":   func() error { _, err := s.Open(nil, "edge1", now); return err },
		"another caller under the seal": func() error {
			h2 := http.Header{}
			SetSealedCaller(h2, &Caller{TokenID: "t2", Principal: "mallory", Perms: iam.SandboxCreate}, "edge1", nil, VoucherTTL)
			_, err := s.Open(&Voucher{Caller: h2.Get(HeaderCaller), Seal: v.Seal}, "edge1", now)
			return err
		},
		"another key": func() error {
			k, _ := NewSealer([]byte(strings.Repeat("b", 32)))
			_, err := k.Open(v, "edge1", now)
			return err
		},
	} {
		if err := try(); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("%s: %v, want ErrDenied", name, err)
		}
	}
	// Without a token expiry, a seal holds what the request's work needs: a build's or an
	// import's VoucherTTL, any other request's RequestVoucherTTL.
	for _, tc := range []struct {
		method, path string
		ttl          time.Duration
	}{
		{"POST", "/v1/builds", VoucherTTL}, {"POST", "/v1/layers", VoucherTTL},
		{"POST", "/v1/sandboxes", RequestVoucherTTL}, {"POST", "/v1/sandboxes/sb-edge1-aaaaaaaaaaaaaaaa/snapshot", VoucherTTL},
		{"POST", "/v1/sandboxes/sb-edge1-aaaaaaaaaaaaaaaa/files/snapshot", RequestVoucherTTL},
		{"GET", "/v1/builds", RequestVoucherTTL},
	} {
		ttl := VoucherTTLFor(tc.method, tc.path)
		if ttl != tc.ttl {
			t.Errorf("%s %s: a voucher of %s, want %s", tc.method, tc.path, ttl, tc.ttl)
		}
		h3 := http.Header{}
		if err := SetSealedCaller(h3, &Caller{TokenID: "t3", Principal: "bob"}, "edge1", s, ttl); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Open(VoucherOf(h3), "edge1", time.Now().Add(ttl-time.Minute)); err != nil {
			t.Errorf("%s %s: a seal within its %s: %v", tc.method, tc.path, ttl, err)
		}
		if _, err := s.Open(VoucherOf(h3), "edge1", time.Now().Add(ttl+time.Minute)); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("%s %s: a seal past its %s: %v, want ErrDenied", tc.method, tc.path, ttl, err)
		}
	}
	if VoucherOf(http.Header{}) != nil {
		t.Error("a voucher from a header without a seal")
	}
}
