package console

import (
	"bytes"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/console/bundle"
	"github.com/corral-dev/corral/internal/doccheck"
)

// TestBundleMatchesSources fails when web/ changed and dist/ was not rebuilt (make console):
// the committed bundle records the hash of the sources it was built from. Where the pinned npm
// packages are installed (web/node_modules), it also rebuilds the bundle and compares it byte
// for byte, so a bundle edited by hand cannot pass either.
func TestBundleMatchesSources(t *testing.T) {
	want, err := bundle.SourceHash(".")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("dist", bundle.HashFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != want {
		t.Fatalf("dist/ was built from other sources (dist says %s, web/ hashes to %s): run make console and commit dist/", strings.TrimSpace(string(got)), want)
	}
	if _, err := os.Stat(filepath.Join("web", "node_modules", "@xterm", "xterm")); err != nil {
		t.Log("web/node_modules is not installed (make console installs it): the bundle was checked by its sources' hash only")
		return
	}
	out := filepath.Join(t.TempDir(), "dist")
	if err := bundle.Build(".", out); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"index.html", "app.js", "app.css", bundle.HashFile} {
		a, err := os.ReadFile(filepath.Join("dist", name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("dist/%s differs from a fresh build of web/ (%d vs %d bytes): run make console and commit dist/", name, len(a), len(b))
		}
	}
}

// TestNoHTMLSinks keeps API strings from ever being parsed as HTML or code: the console's own
// sources use none of the DOM's HTML or eval sinks (the bundled libraries are not scanned).
func TestNoHTMLSinks(t *testing.T) {
	sink := regexp.MustCompile(`\.innerHTML|\.outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function\(|setTimeout\(\s*['"\x60]|createContextualFragment|DOMParser`)
	n := 0
	err := filepath.WalkDir(filepath.Join("web", "src"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".js") {
			return err
		}
		n++
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := sink.FindString(line); m != "" && !strings.HasPrefix(strings.TrimSpace(line), "//") {
				t.Errorf("%s:%d uses %s: put API strings in the page with h() or textContent", p, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 5 {
		t.Fatalf("scanned %d sources; web/src moved?", n)
	}
}

func TestHandler(t *testing.T) {
	h := Handler()
	for _, tc := range []struct {
		method, path string
		status       int
		body         string // a substring of the answer
	}{
		{"GET", "/ui/", 200, `<script src="/ui/app.js">`},
		{"GET", "/ui/app.js", 200, "xterm"},
		{"GET", "/ui/app.css", 200, ".xterm"},
		{"GET", "/ui/sandboxes/whatever", 200, `<div id="app">`},
		{"GET", "/ui/SOURCES.sha256", 200, `<div id="app">`},
		{"GET", "/ui/../etc/passwd", 400, "invalid URL path"},
		{"GET", "/ui", http.StatusMovedPermanently, ""},
		{"POST", "/ui/", 405, "read-only"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.body) {
			t.Errorf("%s %s: got %d %.80q, want %d with %q", tc.method, tc.path, rec.Code, rec.Body.String(), tc.status, tc.body)
		}
		hd := rec.Header()
		if hd.Get("Content-Security-Policy") != CSP || hd.Get("X-Frame-Options") != "DENY" || hd.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s %s: security headers missing: %v", tc.method, tc.path, hd)
		}
	}
	for _, part := range []string{"script-src 'self';", "frame-ancestors 'none'", "default-src 'none'", "connect-src 'self'"} {
		if !strings.Contains(CSP, part) {
			t.Errorf("CSP lacks %q", part)
		}
	}
	if strings.Contains(CSP, "unsafe-eval") || strings.Contains(strings.SplitN(strings.SplitN(CSP, "script-src", 2)[1], ";", 2)[0], "unsafe-inline") {
		t.Errorf("CSP allows inline or eval'd script: %s", CSP)
	}
}

func TestDocs(t *testing.T) { doccheck.Exported(t, ".") }
