package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/runtime/backends"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestBadInput sends malformed and hostile requests; each gets a 4xx naming the problem, and no
// state changes.
func TestBadInput(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	sb := p.create(corral.CreateRequest{})
	before, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{})
	layersBefore, _ := p.Client.Layers(ctx, "")

	huge := strings.Repeat("a", 2<<20)
	cases := []struct {
		name, method, path, body string
		status                   int
		field                    string
	}{
		{"unknown layer", "POST", "/v1/sandboxes", `{"base":"nope:1"}`, 400, "base"},
		{"bad layer name", "POST", "/v1/sandboxes", `{"base":"Bad Name:1"}`, 400, "base"},
		{"layer without version", "POST", "/v1/sandboxes", `{"base":"base"}`, 400, "base"},
		{"wrong kind", "POST", "/v1/sandboxes", `{"base":"base:test","workspace":"base:test"}`, 400, "workspace"},
		{"negative memory", "POST", "/v1/sandboxes", `{"base":"base:test","limits":{"memory_bytes":-1}}`, 400, "limits.memory_bytes"},
		{"huge memory", "POST", "/v1/sandboxes", `{"base":"base:test","limits":{"memory_bytes":99999999999999999}}`, 400, "limits.memory_bytes"},
		{"negative cpus", "POST", "/v1/sandboxes", `{"base":"base:test","limits":{"cpus":-2}}`, 400, "limits.cpus"},
		{"huge pids", "POST", "/v1/sandboxes", `{"base":"base:test","limits":{"pids":1e12}}`, 400, "limits.pids"},
		{"memory as string", "POST", "/v1/sandboxes", `{"base":"base:test","limits":{"memory_bytes":"1G"}}`, 400, "limits.memory_bytes"},
		{"bad ttl", "POST", "/v1/sandboxes", `{"base":"base:test","ttl":"forever"}`, 400, "ttl"},
		{"ttl too long", "POST", "/v1/sandboxes", `{"base":"base:test","ttl":"100000h"}`, 400, "ttl"},
		{"bad env", "POST", "/v1/sandboxes", `{"base":"base:test","env":["NOEQUALS"]}`, 400, "env[0]"},
		{"bad hostname", "POST", "/v1/sandboxes", `{"base":"base:test","hostname":"-x-"}`, 400, "hostname"},
		{"unknown tier", "POST", "/v1/sandboxes", `{"base":"base:test","tier":"mainframe"}`, 400, "tier"},
		{"unknown runtime", "POST", "/v1/sandboxes", `{"base":"base:test","runtime":"kata"}`, 400, "runtime"},
		{"unknown field", "POST", "/v1/sandboxes", `{"base":"base:test","colour":"red"}`, 400, "colour"},
		{"malformed JSON", "POST", "/v1/sandboxes", `{"base":`, 400, ""},
		{"trailing data", "POST", "/v1/sandboxes", `{"base":"base:test"} {}`, 400, ""},
		{"oversized body", "POST", "/v1/sandboxes", `{"base":"` + huge + `"}`, 413, ""},
		{"empty argv", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"argv":[]}`, 400, "argv"},
		{"command not found", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"argv":["/no/such/program"]}`, 400, "argv"},
		{"relative cwd", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"argv":["true"],"cwd":"tmp"}`, 400, "cwd"},
		{"bad timeout", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"argv":["true"],"timeout":"-1s"}`, 400, "timeout"},
		{"bad user", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"argv":["true"],"user":"root; rm -rf /"}`, 400, "user"},
		{"ID of another format", "GET", "/v1/sandboxes/not-an-id", ``, 400, "id"},
		{"ID of another format, data plane", "POST", "/v1/sandboxes/sb-local-XYZ/exec", `{"argv":["true"]}`, 400, "id"},
		{"unknown sandbox", "GET", "/v1/sandboxes/sb-local-aaaaaaaaaaaaaaaa", ``, 404, ""},
		{"relative file path", "GET", "/v1/sandboxes/" + sb.ID + "/files?path=etc/passwd", ``, 400, "path"},
		{"bad ttl update", "POST", "/v1/sandboxes/" + sb.ID + "/ttl", `{"ttl":"0s"}`, 400, "ttl"},
		{"bad layer kind", "POST", "/v1/layers?name=x&version=1&kind=bogus", `x`, 400, "kind"},
		{"bad layer name on import", "POST", "/v1/layers?name=../x&version=1&kind=base", `x`, 400, "name"},
		{"malformed tar", "POST", "/v1/layers?name=junk&version=1&kind=base", `this is not a tar archive at all, not even close.........`, 400, ""},
		{"bad state filter", "GET", "/v1/sandboxes?state=zombie", ``, 400, "state"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, p.URL+c.path, strings.NewReader(c.body))
			req.Header.Set("Authorization", "Bearer "+p.Token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, c.status, body)
			}
			var e corral.Error
			if err := json.Unmarshal(body, &e); err != nil || e.Message == "" || e.Code == "" {
				t.Fatalf("error body %q is not {code, message}", body)
			}
			if c.field != "" && e.Field != c.field {
				t.Fatalf("field = %q, want %q (message %q)", e.Field, c.field, e.Message)
			}
		})
	}
	// Authentication.
	for _, tok := range []string{"", "wrong"} {
		req, _ := http.NewRequest("GET", p.URL+"/v1/sandboxes", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("token %q: status %d, want 401", tok, resp.StatusCode)
		}
	}
	after, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{})
	layersAfter, _ := p.Client.Layers(ctx, "")
	if len(after) != len(before) || len(layersAfter) != len(layersBefore) {
		t.Fatalf("bad input changed state: %d→%d sandboxes, %d→%d layers", len(before), len(after), len(layersBefore), len(layersAfter))
	}
	for _, sub := range []string{"layers/sha256", "images/sha256"} {
		entries, _ := os.ReadDir(filepath.Join(p.DataDir, "blobs", sub))
		if len(entries) != len(layersAfter) {
			t.Fatalf("%d objects in the blob store's %s for %d layers: a refused import left something", len(entries), sub, len(layersAfter))
		}
	}
	if staged, _ := os.ReadDir(filepath.Join(p.DataDir, "layers", "staging")); len(staged) != 0 {
		t.Fatalf("a refused import left %d entries in staging", len(staged))
	}
}

// TestCLI drives the corral binary the way the README does.
func TestCLI(t *testing.T) {
	p := withBase(t)
	out, errOut, code := p.cli("", "create", "--base", "base:test", "--memory", "128M", "--label", "k=v", "-o", "json")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	var sb corral.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.ID == "" || sb.Limits.MemoryBytes != 128<<20 {
		t.Fatalf("create -o json printed %q (%v)", out, err)
	}
	out, errOut, code = p.cli("", "exec", sb.ID, "--env", "A=1", "--cwd", "/tmp", "--", "sh", "-c", `echo "$A $(pwd)"; echo oops >&2; exit 5`)
	if code != 5 || out != "1 /tmp\n" || errOut != "oops\n" {
		t.Fatalf("exec: code %d, stdout %q, stderr %q; want 5, '1 /tmp', 'oops'", code, out, errOut)
	}
	if out, _, code = p.cli("hello\n", "exec", "-i", sb.ID, "--", "cat"); out != "hello\n" || code != 0 {
		t.Fatalf("exec -i with stdin: %q (exit %d)", out, code)
	}
	if _, errOut, code = p.cli("", "exec", sb.ID, "--", "/no/such"); code != 127 {
		t.Fatalf("exec of a missing program: exit %d (%s), want 127", code, errOut)
	}
	if out, _, code = p.cli("", "exec", "--tty", sb.ID, "--", "tty"); !strings.HasPrefix(out, "/dev/pts/") || code != 0 {
		t.Fatalf("exec --tty: %q (exit %d)", out, code)
	}
	// cp both ways, a file and a directory.
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "in.txt"), []byte("payload"), 0o644)
	os.MkdirAll(filepath.Join(local, "tree", "sub"), 0o755)
	os.WriteFile(filepath.Join(local, "tree", "sub", "f"), []byte("deep"), 0o644)
	for _, args := range [][]string{
		{"cp", filepath.Join(local, "in.txt"), sb.ID + ":/root/in.txt"},
		{"cp", filepath.Join(local, "tree"), sb.ID + ":/root/tree"},
		{"cp", sb.ID + ":/root/in.txt", filepath.Join(local, "out.txt")},
		{"cp", sb.ID + ":/root/tree", filepath.Join(local, "tree2")},
	} {
		if _, errOut, code := p.cli("", args...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(local, "out.txt")); string(b) != "payload" {
		t.Fatalf("cp out: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(local, "tree2", "sub", "f")); string(b) != "deep" {
		t.Fatalf("cp of a directory out: %q", b)
	}
	if got := p.sh(sb.ID, "cat /root/tree/sub/f"); got != "deep" {
		t.Fatalf("cp of a directory in: %q", got)
	}
	if _, errOut, code = p.cli("", "ttl", sb.ID, "2h"); code != 0 {
		t.Fatalf("ttl: %s", errOut)
	}
	out, _, _ = p.cli("", "get", sb.ID, "-o", "json")
	if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.State != "running" {
		t.Fatalf("get -o json: %q", out)
	}
	out, _, _ = p.cli("", "ls", "-o", "json")
	var list []corral.Sandbox
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 {
		t.Fatalf("ls -o json: %q (%v)", out, err)
	}
	if out, _, _ = p.cli("", "ls"); !strings.Contains(out, sb.ID) || !strings.Contains(out, "STATE") {
		t.Fatalf("ls table: %q", out)
	}
	if _, errOut, code = p.cli("", "rm", sb.ID); code != 0 {
		t.Fatalf("rm: %s", errOut)
	}
	// run: create, exec, delete; the exit code is the command's.
	out, _, code = p.cli("", "run", "--base", "base:test", "--", "sh", "-c", "echo ran; exit 3")
	if out != "ran\n" || code != 3 {
		t.Fatalf("run: %q exit %d", out, code)
	}
	out, _, _ = p.cli("", "ls", "--state", "running", "-o", "json")
	if strings.TrimSpace(out) != "[]" {
		t.Fatalf("after run, running sandboxes: %s", out)
	}
	out, _, code = p.cli("", "info", "-o", "json")
	var info corral.Info
	// The runc scripts/install-runc.sh builds (its version names its cache directory).
	wantRunc := "runc version "
	if runcPath() == backends.DefaultRunc {
		wantRunc += strings.TrimPrefix(filepath.Base(filepath.Dir(backends.DefaultRunc)), "v")
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || !strings.HasPrefix(info.RuntimeVersion, wantRunc) {
		t.Fatalf("info: %q (exit %d)", out, code)
	}
	out, _, _ = p.cli("", "layer", "ls", "-o", "json")
	if !strings.Contains(out, `"base"`) {
		t.Fatalf("layer ls: %q", out)
	}
}
