package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamE2BTemplate speaks E2B's template-build protocol to the gateway directly, sending
// what the SDK never does: uploads whose tar leaves the file context (a ".." name, an absolute
// name, a device node), a forged upload URL, a COPY source leaving the context, and another
// caller's build. Each is a 4xx naming the problem and no build starts (Corral's build list
// stays empty). The gateway's checks do not depend on the runtime, so this runs once (builds
// run on runc).
func TestRedTeamE2BTemplate(t *testing.T) {
	needRoot(t)
	e2bAddr := freePort(t)
	p := withBase(t, "--e2b-listen", e2bAddr, "--e2b-domain", "e2b.test")
	api := "http://" + e2bAddr
	key := withE2BKey(t, p, "token", "e2b-key").Token
	if _, stderr, code := p.cli("", "project", "create", "other"); code != 0 {
		t.Fatalf("corral project create other: %s", stderr)
	}
	otherKey := withE2BKey(t, p, "token", "create", "--project", "other", "--role", "admin", "--e2b").Token

	type answer struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		BuildID string `json:"buildID"`
		URL     string `json:"url"`
		Present *bool  `json:"present"`
		Status  string `json:"status"`
	}
	call := func(t *testing.T, key, method, url string, body []byte, wantStatus int) answer {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, url, bytes.NewReader(body))
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s %s: status %d, want %d: %s", method, url, resp.StatusCode, wantStatus, b)
		}
		var out answer
		json.Unmarshal(b, &out)
		return out
	}
	tarOf := func(hdrs ...*tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hdrs {
			tw.WriteHeader(h)
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
		tw.Close()
		return b.Bytes()
	}

	const name = "redteam"
	build := call(t, key, "POST", api+"/v3/templates", []byte(`{"name":"`+name+`"}`), http.StatusAccepted).BuildID
	hash := strings.Repeat("ab", 32)
	link := call(t, key, "GET", api+"/templates/"+name+"/files/"+hash, nil, http.StatusOK)
	if link.Present == nil || *link.Present || link.URL == "" {
		t.Fatalf("upload link: %+v", link)
	}

	t.Run("upload-leaving-the-context", func(t *testing.T) {
		for what, h := range map[string]*tar.Header{
			`".."`:      {Name: "a/../../evil", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg},
			"absolute":  {Name: "/etc/evil", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg},
			"device":    {Name: "dev", Mode: 0o644, Typeflag: tar.TypeBlock},
			"hard link": {Name: "h", Linkname: "/etc/shadow", Typeflag: tar.TypeLink},
		} {
			out := call(t, "", "PUT", link.URL, tarOf(h), http.StatusBadRequest)
			if !strings.HasPrefix(out.Message, "upload: ") {
				t.Errorf("%s: %+v", what, out)
			}
		}
	})
	t.Run("forged-upload-url", func(t *testing.T) {
		good := tarOf(&tar.Header{Name: "f", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
		for _, u := range []string{
			strings.Replace(link.URL, "signature=", "signature=0", 1),
			strings.Replace(link.URL, "/templates/"+name+"/", "/templates/other/", 1), // another template
			strings.Replace(link.URL, "expires=", "expires=9", 1),                     // a later expiry
		} {
			if out := call(t, "", "PUT", u, good, http.StatusForbidden); !strings.Contains(out.Message, "signature") {
				t.Errorf("%s: %+v", u, out)
			}
		}
	})
	t.Run("copy-source-leaving-the-context", func(t *testing.T) {
		for _, src := range []string{"../../etc/passwd", "/etc/passwd", "a/../../b"} {
			body, _ := json.Marshal(map[string]any{"fromImage": "base:test", "steps": []map[string]any{
				{"type": "COPY", "args": []string{src, "/x"}, "filesHash": hash}}})
			if out := call(t, key, "POST", api+"/v2/templates/"+name+"/builds/"+build, body, http.StatusBadRequest); !strings.HasPrefix(out.Message, "steps[0].args[0]: ") {
				t.Errorf("%s: %+v", src, out)
			}
		}
	})
	t.Run("another-callers-build", func(t *testing.T) {
		call(t, otherKey, "GET", api+"/templates/"+name+"/builds/"+build+"/status", nil, http.StatusNotFound)
		call(t, otherKey, "POST", api+"/v2/templates/"+name+"/builds/"+build, []byte(`{"fromImage":"base:test"}`), http.StatusNotFound)
		call(t, otherKey, "GET", api+"/templates/"+name+"/files/"+hash, nil, http.StatusNotFound)
	})
	t.Run("a-template-of-another-project", func(t *testing.T) {
		// The other project cannot build over this project's environment: Corral refuses the
		// build (the name belongs to another project).
		if _, err := p.Client.SaveEnvironment(t.Context(), corral.Environment{Name: name + "-owned", Base: "base:test"}); err != nil {
			t.Fatal(err)
		}
		b := call(t, otherKey, "POST", api+"/v3/templates", []byte(`{"name":"`+name+`-owned"}`), http.StatusAccepted).BuildID
		out := call(t, otherKey, "POST", api+"/v2/templates/"+name+"-owned/builds/"+b, []byte(`{"fromImage":"base:test"}`), http.StatusConflict)
		if !strings.Contains(out.Message, "another project") {
			t.Errorf("building over another project's environment: %+v", out)
		}
	})

	// Nothing was built: the build still waits for its steps, and Corral ran no build.
	if out := call(t, key, "GET", api+"/templates/"+name+"/builds/"+build+"/status", nil, http.StatusOK); out.Status != "waiting" {
		t.Errorf("status after the refusals: %+v", out)
	}
	if builds, err := p.Client.Builds(t.Context()); err != nil || len(builds) != 0 {
		t.Errorf("Corral's builds after the refusals: %+v, %v", builds, err)
	}
}
