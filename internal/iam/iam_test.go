package iam

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestRolesNest(t *testing.T) {
	var prev Perm
	for _, r := range Roles {
		p, ok := RolePerms(r)
		if !ok {
			t.Fatalf("role %s unknown", r)
		}
		if !p.Has(prev) || p == prev {
			t.Errorf("role %s (%v) does not strictly include the role before it (%v)", r, p, prev)
		}
		if RoleOf(p) != r {
			t.Errorf("RoleOf(%s's permissions) = %q", r, RoleOf(p))
		}
		prev = p
	}
	if owner != All {
		t.Errorf("owner = %v, want every permission", owner)
	}
	// Migration 7 turns earlier tokens into tokens with every permission, written as a number.
	if All != 4095 {
		t.Errorf("All = %d; migration 7 of the store writes 4095", All)
	}
	if _, ok := RolePerms("superuser"); ok {
		t.Error("an unknown role was accepted")
	}
}

func TestPerms(t *testing.T) {
	p, err := ParsePerms([]string{"sandbox.use", "audit.read"})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Names(); !slices.Equal(got, []string{"sandbox.use", "audit.read"}) {
		t.Errorf("Names = %v", got)
	}
	if _, err := ParsePerms([]string{"sandbox.everything"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unknown permission: %v", err)
	}
	if RoleOf(p) != "" {
		t.Errorf("RoleOf(%v) = %q, want none", p, RoleOf(p))
	}
}

func TestParsePath(t *testing.T) {
	for in, want := range map[string]string{
		"": "", "/": "", "team-a": "team-a", "/team-a/rollout-17/": "team-a/rollout-17", "a.b/c_d": "a.b/c_d",
	} {
		got, err := ParsePath("p", in)
		if err != nil || got != want {
			t.Errorf("ParsePath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"A", "a//b", "a/../b", "..", "a/.", "-a", "a b", "a/\x00", strings.Repeat("a/", 33) + "a", strings.Repeat("x", 64), "é"} {
		if p, err := ParsePath("p", bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParsePath(%q) = %q, %v; want invalid", bad, p, err)
		}
	}
}

func TestTree(t *testing.T) {
	if got := Ancestors("a/b/c"); !slices.Equal(got, []string{"", "a", "a/b", "a/b/c"}) {
		t.Errorf("Ancestors = %q", got)
	}
	if got := Ancestors(""); !slices.Equal(got, []string{""}) {
		t.Errorf("Ancestors(root) = %q", got)
	}
	for _, c := range []struct {
		p, scope string
		want     bool
	}{
		{"a/b", "", true}, {"a/b", "a", true}, {"a", "a", true}, {"ab", "a", false}, {"a", "a/b", false}, {"", "a", false}, {"a-x/b", "a", false},
	} {
		if got := Within(c.p, c.scope); got != c.want {
			t.Errorf("Within(%q, %q) = %v", c.p, c.scope, got)
		}
	}
	if p, ok := Parent("a/b"); !ok || p != "a" {
		t.Errorf("Parent(a/b) = %q %v", p, ok)
	}
	if p, ok := Parent("a"); !ok || p != "" {
		t.Errorf("Parent(a) = %q %v", p, ok)
	}
	if _, ok := Parent(""); ok {
		t.Error("the root has a parent")
	}
	// The byte range of a subtree holds exactly its descendants, with siblings that share a
	// prefix ("a-x", "a.b", "a0") outside it.
	lo, hi := SubtreeRange("a")
	for p, in := range map[string]bool{"a/b": true, "a/b/c": true, "a/~": true, "a": false, "a-x": false, "a.b": false, "a0": false, "b": false, "a0/x": false} {
		if got := p > lo && p < hi; got != in {
			t.Errorf("%q in SubtreeRange(a) = %v, want %v", p, got, in)
		}
	}
}

func TestLayerVisible(t *testing.T) {
	for _, c := range []struct {
		owner           string
		private, public bool
		at              string
		want            bool
	}{
		{"a", false, false, "a", true},    // its own project
		{"a", false, false, "a/b", true},  // shared down the subtree
		{"a", true, false, "a/b", false},  // private: its project only
		{"a", true, false, "a", true},     //
		{"a/b", false, false, "a", false}, // never up
		{"x", false, false, "a", false},   // never beside
		{"x", false, true, "a", true},     // unless public
		{"a/b", false, true, "", true},    //
		{"", false, false, "", true},      // the root's own
		{"", false, false, "a", false},    // the root's layers reach no tenant...
		{"", false, false, "a/b", false},  //
		{"", false, true, "a/b", true},    // ...unless public
		{"", true, false, "a", false},     //
	} {
		if got := LayerVisible(c.owner, c.private, c.public, c.at); got != c.want {
			t.Errorf("LayerVisible(%q, private %v, public %v, %q) = %v, want %v", c.owner, c.private, c.public, c.at, got, c.want)
		}
	}
}

func TestTokens(t *testing.T) {
	a, ida := NewToken()
	b, idb := NewToken()
	if a == b || ida == idb || !strings.HasPrefix(a, TokenPrefix) || len(a) < 40 {
		t.Errorf("tokens %q %q ids %q %q", a, b, ida, idb)
	}
	if strings.Contains(a, ida[4:]) {
		t.Error("the token's ID is derived from its secret")
	}
	for h, want := range map[string]string{"Bearer x": "x", "bearer  x": "x", "BEARER crl_a-b": "crl_a-b"} {
		if got, err := ParseBearer(h); err != nil || got != want {
			t.Errorf("ParseBearer(%q) = %q, %v", h, got, err)
		}
	}
	for _, h := range []string{"", "Bearer", "Bearer ", "Basic eA==", "Bearer a b", "Bearer a\tb", "Bearer \x7f", "Bearer " + strings.Repeat("x", 513)} {
		if _, err := ParseBearer(h); !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("ParseBearer(%q): %v, want unauthorized", h, err)
		}
	}
}

// TestE2BKey: every token has an E2B alias of the shape E2B's SDKs demand, which stands for the
// token wherever a bearer token is read; strings of almost that shape stand for nothing.
func TestE2BKey(t *testing.T) {
	shape := regexp.MustCompile(`^e2b_[0-9a-f]+$`)
	for range 50 {
		secret, _ := NewToken()
		key, err := E2BKey(secret)
		if err != nil {
			t.Fatalf("E2BKey(%q): %v", secret, err)
		}
		if !shape.MatchString(key) || len(key) != len(E2BKeyPrefix)+64 {
			t.Fatalf("E2BKey(%q) = %q, want e2b_ and 64 lowercase hex digits", secret, key)
		}
		if again, err := E2BKey(key); err != nil || again != key {
			t.Errorf("E2BKey(its own alias) = %q, %v", again, err)
		}
		if got := CanonicalToken(key); got != secret {
			t.Fatalf("CanonicalToken(%q) = %q, want %q", key, got, secret)
		}
		if got, err := ParseBearer("Bearer " + key); err != nil || got != secret {
			t.Fatalf("ParseBearer(Bearer %s) = %q, %v; want the token %q", key, got, err, secret)
		}
	}
	secret, _ := NewToken()
	key, _ := E2BKey(secret)
	for _, s := range []string{
		strings.ToUpper(key[:4]) + key[4:], // prefix case
		key[:4] + strings.ToUpper(key[4:]), // uppercase hex
		key[:len(key)-2],                   // too short
		key + "00",                         // too long
		key[:len(key)-1] + "g",             // not hex
		"e2b_",                             // empty
		secret + "x",                       // not an alias at all
	} {
		if got := CanonicalToken(s); got != s {
			t.Errorf("CanonicalToken(%q) = %q, want it unchanged", s, got)
		}
	}
	for _, s := range []string{"", "crl_", "crl_short", secret[:len(secret)-1], "tok-123", "e2b_12"} {
		if k, err := E2BKey(s); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("E2BKey(%q) = %q, %v; want invalid", s, k, err)
		}
	}
}

// FuzzParseBearer checks that whatever a client sends, a token comes out only from a well-formed
// header, printable and bounded.
func FuzzParseBearer(f *testing.F) {
	for _, s := range []string{"Bearer crl_x", "bearer a", "Basic x", "Bearer  ", "Bearer a b", "\x00", "Bearer e2b_" + strings.Repeat("0a", 32)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		tok, err := ParseBearer(h)
		if err != nil {
			if !errors.Is(err, errdefs.ErrUnauthorized) {
				t.Fatalf("error of another kind: %v", err)
			}
			return
		}
		// The token is the header's end, or the token an alias at its end stands for.
		sent := tok
		if !strings.HasSuffix(h, tok) {
			sent, _ = E2BKey(tok)
		}
		if tok == "" || len(tok) > maxTokenLen || strings.ContainsAny(tok, " \t\r\n") || sent == "" || !strings.HasSuffix(h, sent) {
			t.Fatalf("ParseBearer(%q) = %q", h, tok)
		}
	})
}

// FuzzParsePath checks that an accepted path is canonical, stable, bounded, and cannot step out
// of the tree.
func FuzzParsePath(f *testing.F) {
	for _, s := range []string{"", "/", "a/b", "/a/b/", "a/../b", "a//b", strings.Repeat("a/", 40)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePath("p", s)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("error of another kind: %v", err)
			}
			return
		}
		again, err := ParsePath("p", p)
		if err != nil || again != p {
			t.Fatalf("canonical %q does not parse to itself: %q, %v", p, again, err)
		}
		if strings.Contains(p, "..") && slices.Contains(strings.Split(p, "/"), "..") || strings.HasPrefix(p, "/") || strings.Contains(p, "//") {
			t.Fatalf("ParsePath(%q) = %q", s, p)
		}
		if a := Ancestors(p); a[len(a)-1] != p || len(a) > MaxDepth+1 {
			t.Fatalf("Ancestors(%q) = %q", p, a)
		}
	})
}
