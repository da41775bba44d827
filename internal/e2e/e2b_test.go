package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestE2BSDKControlPlane drives `corral up --e2b-listen` with the real, unmodified e2b SDK
// (the version pinned in test/e2b, installed from the npm registry by scripts/e2b-sdk.sh):
// test/e2b/control.mjs creates, refuses what Corral cannot honour, reads, extends, lists by
// metadata, pauses, resumes through connect and kills, checking every answer as the SDK sees it;
// Corral's own view is checked here.
func TestE2BSDKControlPlane(t *testing.T) {
	needRoot(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is missing: scripts/setup.sh installs nodejs and npm")
	}
	out, err := exec.Command(filepath.Join(repoRoot, "scripts", "e2b-sdk.sh")).Output()
	if err != nil {
		t.Fatalf("install the e2b SDK: %v", err)
	}
	sdk := strings.TrimSpace(string(out))
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join(repoRoot, "test", "e2b", "control.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "control.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(sdk, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}

	e2bAddr := freePort(t)
	p := withBase(t, "--e2b-listen", e2bAddr, "--e2b-domain", "e2b.test")
	run := randHex(4)
	cmd := exec.CommandContext(t.Context(), node, "control.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+e2bAddr, "E2B_API_KEY="+p.Token, "E2B_TEMPLATE=base:test", "E2B_RUN="+run,
		"E2B_DOMAIN=e2b.test")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("control.mjs:\n%s%s", stdout.String(), stderr.String())
	if err != nil {
		t.Fatalf("the e2b SDK against Corral: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var last struct {
		OK      bool   `json:"ok"`
		Sandbox string `json:"sandbox"`
	}
	if json.Unmarshal([]byte(lines[len(lines)-1]), &last) != nil || !last.OK {
		t.Fatalf("control.mjs did not finish: %s", lines[len(lines)-1])
	}
	// What the SDK did is what Corral did: the sandbox was created with its metadata as labels
	// and its envs, and killed.
	sb, err := p.Client.GetSandbox(t.Context(), last.Sandbox)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != corral.StateStopped || sb.Labels["run"] != run || sb.Labels["role"] != "first" {
		t.Fatalf("the SDK's sandbox in Corral: %+v", sb)
	}
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
