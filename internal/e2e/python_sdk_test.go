package e2e

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPythonSDK runs the Python SDK's unittest suite (sdk/python/tests) against a real corral
// up: CORRAL_URL, CORRAL_TOKEN (the admin token) and CORRAL_TEST_BASE (busybox) tell it where.
// Two pipes let the suite ask for a restart: it writes "restart" and, once this test has killed
// corral with SIGKILL and started it again on the same data dir, reads "ok". It skips when
// python3 is not installed.
func TestPythonSDK(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3 for the Python SDK's tests (scripts/setup.sh installs it)")
	}
	p := withBase(t)
	t.Run("install", testPythonSDKInstall)

	// ctlR/ctlW: the suite's requests; ackR/ackW: this test's answers.
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-W", "ignore::ResourceWarning", "-m", "unittest", "discover", "-v",
		"-s", filepath.Join(repoRoot, "sdk", "python", "tests"), "-t", filepath.Join(repoRoot, "sdk", "python", "tests"))
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(),
		"CORRAL_URL="+p.URL, "CORRAL_TOKEN="+p.Token, "CORRAL_TEST_BASE=base:test",
		"PYTHONPATH="+filepath.Join(repoRoot, "sdk", "python"), "PYTHONDONTWRITEBYTECODE=1",
		// The child's fds 3 and 4 are ExtraFiles[0] and [1].
		"CORRAL_TEST_CONTROL=4,3")
	cmd.ExtraFiles = []*os.File{ctlW, ackR}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Only the child holds these ends now: its exit closes ctlW, which ends the loop below.
	ctlW.Close()
	ackR.Close()
	defer ackW.Close()

	start := time.Now()
	restarts := 0
	sc := bufio.NewScanner(ctlR)
	for sc.Scan() {
		switch line := strings.TrimSpace(sc.Text()); line {
		case "restart":
			p.Kill9()
			p.Restart()
			restarts++
			if _, err := ackW.Write([]byte("ok\n")); err != nil {
				t.Fatalf("answer the suite: %v", err)
			}
		default:
			t.Errorf("unknown request from the Python suite: %q", line)
		}
	}
	err = cmd.Wait()
	t.Logf("python3 -m unittest (%s, %d restart(s)):\n%s", time.Since(start).Round(time.Millisecond), restarts, out.String())
	if err != nil {
		t.Fatalf("the Python SDK's tests failed: %v", err)
	}
	if restarts == 0 {
		t.Errorf("the restart test never asked for a restart")
	}
	// Here every test has what it needs: one that skipped would pass without testing anything.
	if strings.Contains(out.String(), "... skipped") {
		t.Errorf("some of the Python SDK's tests skipped")
	}
}

// testPythonSDKInstall installs sdk/python into a fresh venv offline, as README says, with
// Debian's python3, setuptools and wheel, and imports it from there.
func testPythonSDKInstall(t *testing.T) {
	if _, err := os.Stat("/usr/share/doc/python3-venv"); err != nil {
		t.Skip("needs Debian's python3-venv (scripts/setup.sh installs it)")
	}
	dir := t.TempDir()
	// pip builds in the source tree (build/, *.egg-info): give it a copy.
	src := filepath.Join(dir, "src")
	if out, err := exec.Command("cp", "-r", filepath.Join(repoRoot, "sdk", "python"), src).CombinedOutput(); err != nil {
		t.Fatalf("copy sdk/python: %v\n%s", err, out)
	}
	venv := filepath.Join(dir, "venv")
	for _, args := range [][]string{
		{"/usr/bin/python3", "-m", "venv", "--system-site-packages", venv},
		{filepath.Join(venv, "bin", "pip"), "install", "-q", "--no-build-isolation", "--no-index", src},
		{filepath.Join(venv, "bin", "python"), "-c", "import corral, os, sys; assert corral.__file__.startswith(sys.prefix), corral.__file__; assert os.path.exists(os.path.join(os.path.dirname(corral.__file__), 'py.typed'))"},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = dir // not the repository, whose sdk/python would shadow the installed package
		cmd.Env = append(os.Environ(), "PYTHONPATH=", "PIP_DISABLE_PIP_VERSION_CHECK=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
