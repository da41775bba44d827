package deploycheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnits checks deploy/systemd's units with systemd's own verifier (the binary path
// pointed at one that exists, since corral is not installed where tests run).
func TestSystemdUnits(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	truePath, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true binary")
	}
	units, _ := filepath.Glob("../../deploy/systemd/*.service")
	if len(units) == 0 {
		t.Fatal("no units under deploy/systemd")
	}
	dir := t.TempDir()
	var paths []string
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "/usr/local/bin/corral ") {
			t.Errorf("%s does not run /usr/local/bin/corral", u)
		}
		p := filepath.Join(dir, filepath.Base(u))
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/corral ", truePath+" ")), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	// Complaints about a unit (unknown keys, values that do not parse) are warnings that name the
	// file; anything else the verifier says (no system bus in a container) is not about them.
	out, err := exec.Command(analyze, append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, dir) {
			t.Errorf("systemd-analyze verify: %s", line)
		}
	}
	if err != nil && !t.Failed() {
		t.Skipf("systemd-analyze verify cannot run here (%v): %s", err, out)
	}
}
