package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// e2bRun is the last line a test/e2b script prints.
type e2bRun struct {
	OK      bool   `json:"ok"`
	Sandbox string `json:"sandbox"`
	URL     string `json:"url"` // desktop.mjs: the stream's URL
	Network string `json:"network"`
}

// runE2BScript runs test/e2b/<script> with the real, unmodified e2b SDK (the version pinned in
// test/e2b, installed from the npm registry by scripts/e2b-sdk.sh) against the gateway at
// e2bAddr, and returns its last line.
func runE2BScript(t *testing.T, p *corralProc, e2bAddr, script, template, run string) e2bRun {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is missing: scripts/setup.sh installs nodejs and npm")
	}
	out, err := exec.Command(filepath.Join(repoRoot, "scripts", "e2b-sdk.sh")).Output()
	if err != nil {
		t.Fatalf("install the e2b SDK: %v", err)
	}
	dir := t.TempDir()
	scripts, _ := filepath.Glob(filepath.Join(repoRoot, "test", "e2b", "*.mjs"))
	for _, f := range scripts { // the script and what it imports (lib.mjs)
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// ES modules resolve bare imports from node_modules beside the script (not NODE_PATH).
	if err := os.Symlink(filepath.Join(strings.TrimSpace(string(out)), "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), node, script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+e2bAddr, "E2B_SANDBOX_URL=http://"+e2bAddr, "E2B_API_KEY="+p.Token,
		"E2B_TEMPLATE="+template, "E2B_RUN="+run, "E2B_DOMAIN=e2b.test")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("%s:\n%s%s", script, stdout.String(), stderr.String())
	if err != nil {
		t.Fatalf("the e2b SDK against Corral (%s): %v", script, err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var last e2bRun
	if json.Unmarshal([]byte(lines[len(lines)-1]), &last) != nil || !last.OK {
		t.Fatalf("%s did not finish: %s", script, lines[len(lines)-1])
	}
	return last
}

// TestE2BSDKControlPlane drives `corral up --e2b-listen` with the real e2b SDK
// (test/e2b/control.mjs): create, refusals of what Corral cannot honour, info, timeout, list by
// metadata, pause, resume through connect, metrics (the node's samples), kill, each answer
// checked as the SDK sees it; Corral's own view is checked here.
func TestE2BSDKControlPlane(t *testing.T) {
	needRoot(t)
	e2bAddr := freePort(t)
	p := withBase(t, "--e2b-listen", e2bAddr, "--e2b-domain", "e2b.test")
	run := randHex(4)
	// The key is the admin token's E2B alias, the only shape E2B's Python SDK accepts.
	last := runE2BScript(t, withE2BKey(t, p, "token", "e2b-key"), e2bAddr, "control.mjs", "base:test", run)
	// What the SDK did is what Corral did: the sandbox was created with its metadata as labels,
	// and killed.
	sb := waitEnded(t, p.Client, last.Sandbox)
	if sb.State != corral.StateStopped || sb.Labels["run"] != run || sb.Labels["role"] != "first" {
		t.Fatalf("the SDK's sandbox in Corral: %+v", sb)
	}
	assertRunEnded(t, p, run)
}

// TestE2BSDKSandbox drives the in-sandbox surface with the real e2b SDK
// (test/e2b/sandbox.mjs, E2B_SANDBOX_URL pointing at the gateway, the template a Corral
// environment): commands, background
// commands with stdin and kill, files and watches, pause and resume with state kept, network
// options, kill.
func TestE2BSDKSandbox(t *testing.T) {
	needRoot(t)
	e2bAddr := freePort(t)
	p := withBase(t, "--e2b-listen", e2bAddr, "--e2b-domain", "e2b.test")
	run := randHex(4)
	// The template is a Corral environment, as the acceptance shape of the issue has it.
	if _, err := p.Client.SaveEnvironment(t.Context(), corral.Environment{Name: "e2benv", Base: "base:test"}); err != nil {
		t.Fatal(err)
	}
	// The key is a token minted for it, printed as its E2B alias.
	key := withE2BKey(t, p, "token", "create", "--project", "/", "--role", "admin", "--e2b")
	last := runE2BScript(t, key, e2bAddr, "sandbox.mjs", "e2benv", run)
	// The network options became Corral's egress policy: internet off, one address allowed.
	sb, err := p.Client.GetSandbox(t.Context(), last.Network)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Network == nil || sb.Network.Mode != corral.NetworkAllowlist || !slices.ContainsFunc(sb.Network.Allow, func(r string) bool { return strings.HasPrefix(r, "198.51.100.7") }) {
		t.Fatalf("the SDK's network options in Corral: %+v", sb.Network)
	}
	assertRunEnded(t, p, run)
}

// e2bPythonKey is the check E2B's Python SDK (2.25 and later) makes of E2B_API_KEY before it
// sends anything (e2b/connection_config.py); Corral's aliases are lowercase on top of it.
var (
	e2bPythonKey = regexp.MustCompile(`(?i)^e2b_[0-9a-f]+$`)
	e2bKeyShape  = regexp.MustCompile(`^e2b_[0-9a-f]+$`)
)

// withE2BKey runs the CLI command args, which prints an E2B key, checks the key's shape, and
// returns a view of p whose Token is that key (what runE2BScript sends as E2B_API_KEY).
func withE2BKey(t *testing.T, p *corralProc, args ...string) *corralProc {
	t.Helper()
	stdout, stderr, code := p.cli("", args...)
	key := strings.TrimSpace(stdout)
	if code != 0 {
		t.Fatalf("corral %s: exit %d: %s", strings.Join(args, " "), code, stderr)
	}
	if !e2bPythonKey.MatchString(key) || !e2bKeyShape.MatchString(key) {
		t.Fatalf("corral %s printed %q, which E2B's Python SDK refuses", strings.Join(args, " "), key)
	}
	// The alias is the token: Corral's own API takes it too.
	c := corral.New(p.URL, key)
	if _, err := c.Whoami(t.Context()); err != nil {
		t.Fatalf("Corral refused the E2B alias %s: %v", key, err)
	}
	view := *p
	view.Token = key
	return &view
}

// assertRunEnded fails the test if a sandbox labelled run=RUN still runs or is paused.
func assertRunEnded(t *testing.T, p *corralProc, run string) {
	t.Helper()
	list, err := p.Client.ListSandboxes(t.Context(), corral.ListOptions{Labels: map[string]string{"run": run}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.State == corral.StateRunning || s.State == corral.StatePaused {
			t.Errorf("sandbox %s of the run is still %s", s.ID, s.State)
		}
	}
}
