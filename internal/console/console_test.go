package console

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/evanw/esbuild/pkg/api"

	"github.com/corral-dev/corral/internal/console/bundle"
	"github.com/corral-dev/corral/internal/doccheck"
	corral "github.com/corral-dev/corral/sdk/go"
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
		{"GET", "/ui/", 200, `<script type="module" src="/ui/app.js">`},
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

// formCase is one case of testdata/create-form.json: the new-sandbox form's values and the
// request createRequest (web/src/pages/create.js) must build from them, or the error it must
// throw. The e2e suite posts each request to a real Corral (TestConsoleForms), so the form and
// the API are held to the same file.
type formCase struct {
	Name    string            `json:"name"`
	Values  map[string]string `json:"values"`
	Request map[string]any    `json:"request"`
	Error   string            `json:"error"`
}

// TestCreateRequest runs the console's createRequest on testdata/create-form.json, and its
// bearerProtocol on a few tokens, in Node (bundled by esbuild from their sources, as the console
// bundles them).
func TestCreateRequest(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("needs node to run the console's JavaScript")
	}
	src, err := filepath.Abs("web")
	if err != nil {
		t.Fatal(err)
	}
	res := api.Build(api.BuildOptions{
		Stdin: &api.StdinOptions{ResolveDir: src, Sourcefile: "create-form-test.js", Contents: `
import { createRequest } from './src/pages/create.js';
import { bearerProtocol } from './src/api.js';
import cases from '../testdata/create-form.json';
console.log(JSON.stringify(cases.map((c) => {
  try { return { name: c.name, request: createRequest(c.values) }; } catch (e) { return { name: c.name, error: e.message }; }
})));
console.log(JSON.stringify(` + "[`crl_abc`, `crl_a?b>c~`, `e2b_Zz-_09`]" + `.map(bearerProtocol)));
`},
		Bundle: true, Format: api.FormatESModule, Platform: api.PlatformNeutral, Write: false, LogLevel: api.LogLevelSilent,
	})
	if len(res.Errors) > 0 || len(res.OutputFiles) != 1 {
		t.Fatalf("bundle the test: %v", res.Errors)
	}
	cmd := exec.Command(node, "--input-type=module")
	cmd.Stdin = bytes.NewReader(res.OutputFiles[0].Contents)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	var got []formCase
	var protocols []string
	dec := json.NewDecoder(bytes.NewReader(out))
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("node printed %q: %v", out, err)
	}
	if err := dec.Decode(&protocols); err != nil {
		t.Fatalf("node printed %q: %v", out, err)
	}
	// The screen's token subprotocol is what the server decodes (apiserver's bearer).
	for i, tok := range []string{"crl_abc", "crl_a?b>c~", "e2b_Zz-_09"} {
		if want := corral.WebSocketBearerProtocol + base64.RawURLEncoding.EncodeToString([]byte(tok)); protocols[i] != want {
			t.Errorf("bearerProtocol(%q) = %q, want %q", tok, protocols[i], want)
		}
	}
	want := formCases(t)
	if len(got) != len(want) {
		t.Fatalf("%d results for %d cases", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if w.Error != "" {
			if g.Error != w.Error {
				t.Errorf("%s: got request %v, error %q; want error %q", w.Name, g.Request, g.Error, w.Error)
			}
			continue
		}
		if g.Error != "" || !reflect.DeepEqual(g.Request, w.Request) {
			gj, _ := json.Marshal(g.Request)
			wj, _ := json.Marshal(w.Request)
			t.Errorf("%s: got %s (error %q), want %s", w.Name, gj, g.Error, wj)
		}
	}
}

func formCases(t *testing.T) []formCase {
	b, err := os.ReadFile(filepath.Join("testdata", "create-form.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []formCase
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	return cases
}

// TestEventTypes keeps the webhooks page's event types those the API knows.
func TestEventTypes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("web", "src", "pages", "webhooks.js"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`export const eventTypes = \[([^\]]*)\]`).FindSubmatch(b)
	if m == nil {
		t.Fatal("webhooks.js declares no eventTypes")
	}
	var got []string
	if err := json.Unmarshal([]byte("["+string(m[1])+"]"), &got); err != nil {
		// The list is written with single quotes.
		if err := json.Unmarshal([]byte("["+strings.ReplaceAll(string(m[1]), "'", `"`)+"]"), &got); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, corral.EventTypes) {
		t.Errorf("webhooks.js lists %v, the API %v", got, corral.EventTypes)
	}
}
