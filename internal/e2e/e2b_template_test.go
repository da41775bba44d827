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

// TestE2BSDKTemplateBuild drives E2B template builds through the gateway with the real e2b
// SDK's template builder (test/e2b/template.mjs): build, a sandbox of the template, a cached
// rebuild, a template on a template, and the refusals; then E2B's CLI, `e2b template create`
// of an e2b.Dockerfile (test/e2b/template-cli.mjs). Corral's view is checked here: the
// template is an environment, the builds are Corral builds and the rebuild reused every
// layer; and the gateway refuses, with the raw protocol, what the SDK never sends (an upload
// or a COPY source leaving the file context, a forged upload URL).
func TestE2BSDKTemplateBuild(t *testing.T) {
	needRoot(t)
	e2bAddr := freePort(t)
	p := withBase(t, "--e2b-listen", e2bAddr, "--e2b-domain", "e2b.test")
	run := randHex(4)
	key := withE2BKey(t, p, "token", "e2b-key")
	last := runE2BScript(t, key, e2bAddr, "template.mjs", "base:test", run)
	if last.Sandbox == "" {
		t.Fatal("the script reported no sandbox")
	}

	name := "tpl-" + run
	env, err := p.Client.Environment(t.Context(), name)
	if err != nil {
		t.Fatalf("the template's environment: %v", err)
	}
	builds, err := p.Client.Builds(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ours []corral.Build
	for _, b := range builds {
		if b.Name == name {
			ours = append(ours, b)
		}
	}
	if len(ours) != 2 || ours[0].State != corral.BuildSucceeded || ours[1].State != corral.BuildSucceeded {
		t.Fatalf("want two succeeded Corral builds of %s, got %+v", name, ours)
	}
	if env.Base != ours[1].Layer {
		t.Fatalf("environment base %s, want the last build's layer %s", env.Base, ours[1].Layer)
	}
	for i, b := range ours {
		for _, s := range b.Steps {
			if s.Kind == "config" {
				continue
			}
			if want := map[int]string{0: "done", 1: "cached"}[i]; s.State != want {
				t.Errorf("build %d step %d (%s): %s, want %s", i+1, s.N, s.Text, s.State, want)
			}
		}
	}

	// E2B's CLI: `e2b template create` builds e2b.Dockerfile through the same calls.
	t.Run("cli", func(t *testing.T) {
		runE2BScript(t, key, e2bAddr, "template-cli.mjs", "base:test", run)
		if _, err := p.Client.Environment(t.Context(), "tpl-cli-"+run); err != nil {
			t.Fatalf("the CLI's template: %v", err)
		}
	})

	t.Run("raw-protocol-refusals", func(t *testing.T) {
		e2bRefusals(t, "http://"+e2bAddr, key.Token, run)
	})
}

// e2bRefusals checks, with E2B's template protocol spoken directly, what the SDK never sends:
// an upload whose tar leaves the file context, a COPY step whose source does, and a forged
// upload URL; each a 4xx naming the problem, and no build started.
func e2bRefusals(t *testing.T, api, key, run string) {
	call := func(method, url string, body []byte, wantStatus int) map[string]any {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, url, bytes.NewReader(body))
		req.Header.Set("X-API-Key", key)
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
		var out map[string]any
		json.Unmarshal(b, &out)
		return out
	}
	name := "raw-" + run
	req := call("POST", api+"/v3/templates", []byte(`{"name":"`+name+`"}`), http.StatusAccepted)
	buildID, _ := req["buildID"].(string)
	hash := strings.Repeat("ab", 32)
	link := call("GET", api+"/templates/"+name+"/files/"+hash, nil, http.StatusOK)
	if link["present"] != false {
		t.Fatalf("upload link: %v", link)
	}
	url, _ := link["url"].(string)

	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "../evil.txt", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	if out := call("PUT", url, tb.Bytes(), http.StatusBadRequest); !strings.Contains(out["message"].(string), `".."`) {
		t.Errorf("upload leaving the context: %v", out)
	}
	if out := call("PUT", url+"0", tb.Bytes(), http.StatusForbidden); !strings.Contains(out["message"].(string), "signature") {
		t.Errorf("forged upload URL: %v", out)
	}
	body := `{"fromImage":"base:test","steps":[{"type":"COPY","args":["../../etc/passwd","/x"],"filesHash":"` + hash + `"}]}`
	if out := call("POST", api+"/v2/templates/"+name+"/builds/"+buildID, []byte(body), http.StatusBadRequest); !strings.Contains(out["message"].(string), "steps[0].args[0]") {
		t.Errorf("COPY source leaving the context: %v", out)
	}
	// Nothing was started: the build still waits for its steps.
	if out := call("GET", api+"/templates/"+name+"/builds/"+buildID+"/status", nil, http.StatusOK); out["status"] != "waiting" {
		t.Errorf("status after refusals: %v", out)
	}
}
