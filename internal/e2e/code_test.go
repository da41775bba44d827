package e2e

import (
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// installCodeInterpreter publishes the code-interpreter environment in p with the CLI (`corral
// env install code-interpreter`): the first run on a host builds its layer from Debian's
// packages (minutes), later ones find it in /var/cache/corral/recipes/.
func installCodeInterpreter(t *testing.T, p *corralProc) {
	t.Helper()
	out, stderr, code := p.cli("", "env", "install", "code-interpreter")
	if code != 0 {
		t.Fatalf("corral env install code-interpreter: exit %d\n%s", code, stderr)
	}
	if strings.TrimSpace(out) != "code-interpreter" || !strings.Contains(stderr, "environment code-interpreter: base:") {
		t.Fatalf("corral env install: stdout %q, stderr:\n%s", out, stderr)
	}
}

// runCode runs code in sandbox id and fails the test if the call fails.
func runCode(t *testing.T, p *corralProc, id string, req corral.CodeRequest) *corral.Execution {
	t.Helper()
	ex, err := p.Client.RunCode(context.Background(), id, req, nil)
	if err != nil {
		t.Fatalf("RunCode(%q): %v", req.Code, err)
	}
	return ex
}

// TestCodeInterpreter: `corral env install code-interpreter` publishes an environment whose
// sandboxes run a code-execution server with a Jupyter kernel started with the sandbox;
// Corral's API, CLI and E2B's unmodified @e2b/code-interpreter SDK run code in it (state kept,
// logs, errors by name, figures as PNG, separate contexts); code that never ends, floods
// output, forks or exhausts memory ends with a clear error and leaves a usable kernel; a
// sandbox without the server is a conflict naming why.
func TestCodeInterpreter(t *testing.T) {
	e2bAddr := freePort(t)
	p := withBase(t, "--e2b-listen", e2bAddr, "--e2b-domain", "e2b.test")
	installCodeInterpreter(t, p)
	ctx := context.Background()

	t.Run("api", func(t *testing.T) {
		sb := p.create(corral.CreateRequest{Environment: "code-interpreter"})
		ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: "x = 21\nprint('hello')\nx * 2"})
		if ex.Text() != "42" || strings.Join(ex.Stdout, "") != "hello\n" || ex.Error != nil || ex.ExecutionCount != 1 {
			t.Fatalf("first run: %+v", ex)
		}
		if ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "x + 1"}); ex.Text() != "22" {
			t.Errorf("state across runs: %+v", ex)
		}
		ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "import sys\nprint('e', file=sys.stderr)\n{}['k']"})
		if ex.Error == nil || ex.Error.Name != "KeyError" || !strings.Contains(ex.Error.Traceback, "KeyError") || strings.Join(ex.Stderr, "") != "e\n" {
			t.Errorf("an exception: %+v (error %+v)", ex, ex.Error)
		}
		ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"})
		if len(ex.Results) != 1 || ex.Results[0].PNG == "" {
			t.Fatalf("a figure: %+v", ex)
		}
		if png, err := base64.StdEncoding.DecodeString(ex.Results[0].PNG); err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
			t.Errorf("the figure is not a PNG (%v)", err)
		}
		ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "import pandas as pd\npd.DataFrame({'a': [1, 2]})"})
		if len(ex.Results) != 1 || !strings.Contains(ex.Results[0].HTML, "<table") || !ex.Results[0].IsMainResult {
			t.Errorf("a table: %+v", ex)
		}
		ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "import os\nos.environ['GREETING']", Env: map[string]string{"GREETING": "hi"}})
		if ex.Text() != "'hi'" {
			t.Errorf("env: %+v", ex)
		}

		// Contexts: separate kernels, listed, restarted (state gone), deleted (then unknown).
		c1, err := p.Client.CreateCodeContext(ctx, sb.ID, corral.CodeContextRequest{Cwd: "/tmp"})
		if err != nil {
			t.Fatal(err)
		}
		runCode(t, p, sb.ID, corral.CodeRequest{Code: "x = 'other'", Context: c1.ID})
		if ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: "import os\n(x, os.getcwd())", Context: c1.ID}); ex.Text() != "('other', '/tmp')" {
			t.Errorf("the new context: %+v", ex)
		}
		if ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: "x"}); ex.Text() != "21" {
			t.Errorf("the default context after another's run: %+v", ex)
		}
		list, err := p.Client.CodeContexts(ctx, sb.ID)
		if err != nil || len(list) != 2 {
			t.Errorf("contexts: %+v, %v", list, err)
		}
		if err := p.Client.RestartCodeContext(ctx, sb.ID, c1.ID); err != nil {
			t.Fatal(err)
		}
		if ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: "x", Context: c1.ID}); ex.Error == nil || ex.Error.Name != "NameError" {
			t.Errorf("x after a restart: %+v", ex)
		}
		if err := p.Client.DeleteCodeContext(ctx, sb.ID, c1.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Client.RunCode(ctx, sb.ID, corral.CodeRequest{Code: "1", Context: c1.ID}, nil); !corral.IsNotFound(err) {
			t.Errorf("a run in a deleted context: %v, want not found", err)
		}
		if err := p.Client.DeleteCodeContext(ctx, sb.ID, "nope"); !corral.IsNotFound(err) {
			t.Errorf("deleting an unknown context: %v, want not found", err)
		}
		for _, bad := range []corral.CodeRequest{{Code: "1", Language: "cobol"}, {Code: "1", Timeout: "forever"}, {Code: "1", Context: "../x"},
			{Code: "1", Context: c1.ID, Language: "python"}, {Code: "1", Env: map[string]string{"A=B": "c"}}} {
			if _, err := p.Client.RunCode(ctx, sb.ID, bad, nil); !corral.IsInvalid(err) {
				t.Errorf("RunCode(%+v): %v, want invalid", bad, err)
			}
		}
	})

	t.Run("cli", func(t *testing.T) {
		sb := p.create(corral.CreateRequest{Environment: "code-interpreter"})
		if out, stderr, code := p.cli("", "code", sb.ID, "-c", "y = 6\nprint('six')\ny * 7"); code != 0 || out != "six\n42\n" {
			t.Errorf("corral code: exit %d, stdout %q, stderr %q", code, out, stderr)
		}
		dir := t.TempDir()
		file := filepath.Join(dir, "plot.py")
		os.WriteFile(file, []byte("import matplotlib.pyplot as plt\nplt.bar([1, 2], [y, 1])\nplt.show()\n"), 0o644)
		imgs := filepath.Join(dir, "imgs")
		out, stderr, code := p.cli("", "code", sb.ID, file, "--save-images", imgs)
		if code != 0 || !strings.Contains(out, "[png image saved to "+imgs+"/result-1.png]") {
			t.Errorf("corral code FILE --save-images: exit %d, stdout %q, stderr %q", code, out, stderr)
		}
		if b, err := os.ReadFile(filepath.Join(imgs, "result-1.png")); err != nil || !strings.HasPrefix(string(b), "\x89PNG") {
			t.Errorf("the saved image: %v", err)
		}
		if _, stderr, code := p.cli("", "code", sb.ID, "-c", "1/0"); code != 1 || !strings.Contains(stderr, "ZeroDivisionError") || strings.Contains(stderr, "\x1b") {
			t.Errorf("corral code with an error: exit %d, stderr %q", code, stderr)
		}
		if _, stderr, code := p.cli("", "code", sb.ID); code != 2 {
			t.Errorf("corral code without code: exit %d (%s), want 2", code, stderr)
		}
	})

	t.Run("bad-input", func(t *testing.T) {
		sb := p.create(corral.CreateRequest{Environment: "code-interpreter", Limits: corral.Limits{MemoryBytes: 768 << 20}})
		runCode(t, p, sb.ID, corral.CodeRequest{Code: "kept = 'yes'"})
		usable := func(what string, stateKept bool) {
			t.Helper()
			ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: "1 + 1"})
			if ex.Text() != "2" {
				t.Errorf("after %s the kernel does not answer: %+v", what, ex)
			}
			ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "kept"})
			if stateKept != (ex.Text() == "'yes'") {
				t.Errorf("after %s, state kept = %v, want %v (%+v)", what, ex.Text() == "'yes'", stateKept, ex)
			}
			if !stateKept {
				runCode(t, p, sb.ID, corral.CodeRequest{Code: "kept = 'yes'"})
			}
		}
		// Code that never ends: the timeout interrupts the kernel, which keeps its variables.
		ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: "while True: pass", Timeout: "1s"})
		if ex.Error == nil || ex.Error.Name != "TimeoutError" || !strings.Contains(ex.Error.Value, "interrupted") {
			t.Errorf("an endless loop: %+v", ex.Error)
		}
		usable("a timeout", true)
		// A flood of output: bounded, with a marker.
		ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "for i in range(200000): print('x' * 100)"})
		out := strings.Join(ex.Stdout, "")
		if len(out) > 1<<20 || !strings.Contains(strings.Join(ex.Stderr, ""), "[output truncated") {
			t.Errorf("a flood: %d bytes of stdout, stderr %q", len(out), strings.Join(ex.Stderr, ""))
		}
		usable("a flood", true)
		// noZombies fails the test if processes the code forked are left unreaped in the
		// sandbox: the kernel's own children reaped by the kernel, the others by the
		// sandbox's init (their parents were killed too).
		noZombies := func(what string) {
			t.Helper()
			q := *p
			q.t = t
			var z string
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				out, _, _ := q.run(sb.ID, "python3", "-c", `import os
for d in os.listdir('/proc'):
    try:
        with open('/proc/%s/stat' % d) as f:
            comm, rest = f.read().rsplit(')', 1)
    except (OSError, ValueError):
        continue
    st = rest.split()
    if st[0] == 'Z':
        print(d, 'ppid', st[1], comm.split('(', 1)[1])`)
				if z = out; z == "" {
					return
				}
			}
			t.Errorf("zombies left in the sandbox 30 s %s (pid, parent, command):\n%s", what, z)
		}
		// Forks: children that never end, then a fork bomb. The timeout interrupts the kernel's
		// process group; one that does not stop is replaced. The kernel then reaps the
		// children the stop killed, and only those: a child started before in a session of
		// its own (the stop leaves it) that ends meanwhile, and a subprocess the stop killed
		// whose Popen has not collected it, keep their exit statuses for the code's wait.
		runCode(t, p, sb.ID, corral.CodeRequest{Code: "import subprocess, sys\n" +
			"waiter = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1); raise SystemExit(5)'], start_new_session=True)"})
		ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "import os, time\nvictim = subprocess.Popen(['sleep', '1000'])\n" +
			"for i in range(5):\n    if os.fork() == 0:\n        time.sleep(1000)\ntime.sleep(1000)", Timeout: "2s"})
		if ex.Error == nil || ex.Error.Name != "TimeoutError" {
			t.Errorf("forked sleepers: %+v", ex.Error)
		}
		usable("forked sleepers", true)
		if ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: "(waiter.wait(60), victim.wait(60))"}); ex.Text() != "(5, -9)" {
			t.Errorf("the exit statuses of a child that ended during a stopped run and of one the stop killed: %q (error %+v), want (5, -9)", ex.Text(), ex.Error)
		}
		noZombies("after forked sleepers were stopped")
		// The code's children report their exit statuses to it, before a fork bomb and after.
		children := func(what string) {
			t.Helper()
			code := "import os, subprocess\npid = os.fork()\nif pid == 0:\n    os._exit(9)\n" +
				"[subprocess.run(['sh', '-c', 'exit %d' % i]).returncode for i in (0, 3, 7)] + [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])]"
			if ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: code}); ex.Text() != "[0, 3, 7, 9]" || ex.Error != nil {
				t.Errorf("%s, the exit statuses of subprocess.run and os.waitpid: %q (error %+v), want [0, 3, 7, 9]", what, ex.Text(), ex.Error)
			}
		}
		children("before a fork bomb")
		ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", Timeout: "3s"})
		// Interrupted (TimeoutError), replaced when it did not stop (KernelRestarted), or killed
		// when its copies exhausted the sandbox's memory (KernelDied): each a clear error.
		if ex.Error == nil || (ex.Error.Name != "TimeoutError" && ex.Error.Name != "KernelRestarted" && ex.Error.Name != "KernelDied") {
			t.Errorf("a fork bomb: %+v", ex.Error)
		}
		if ex.Error != nil {
			t.Logf("a fork bomb ended with %s: %s", ex.Error.Name, ex.Error.Value)
		}
		if ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: "1 + 1"}); ex.Text() != "2" {
			t.Errorf("after a fork bomb: %+v", ex)
		}
		if ex.Error != nil {
			children("after a fork bomb (" + ex.Error.Name + ")")
		}
		noZombies("after a fork bomb")
		runCode(t, p, sb.ID, corral.CodeRequest{Code: "kept = 'yes'"})
		// Memory: the kernel is killed (it, not the server: its OOM score is the highest) and
		// replaced; the run says why.
		ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "hog = b'x' * (2 << 30)"})
		if ex.Error == nil || (ex.Error.Name != "KernelDied" && ex.Error.Name != "MemoryError") {
			t.Errorf("exhausting memory: %+v", ex.Error)
		} else if ex.Error.Name == "KernelDied" && !strings.Contains(ex.Error.Value, "memory") {
			t.Errorf("the kernel's death does not say why: %q", ex.Error.Value)
		}
		usable("exhausting memory", ex.Error != nil && ex.Error.Name == "MemoryError")
	})

	t.Run("no-server", func(t *testing.T) {
		sb := p.create(corral.CreateRequest{})
		_, err := p.Client.RunCode(ctx, sb.ID, corral.CodeRequest{Code: "1"}, nil)
		if !corral.IsConflict(err) || !strings.Contains(err.Error(), "no code-execution server") {
			t.Errorf("code on a sandbox without the server: %v, want a conflict naming why", err)
		}
		if _, err := p.Client.CodeContexts(ctx, sb.ID); !corral.IsConflict(err) {
			t.Errorf("contexts of a sandbox without the server: %v, want conflict", err)
		}
		if _, err := p.Client.RunCode(ctx, "sb-local-aaaaaaaaaaaaaaaa", corral.CodeRequest{Code: "1"}, nil); !corral.IsNotFound(err) {
			t.Errorf("code on an unknown sandbox: %v, want not found", err)
		}
	})

	t.Run("gvisor", func(t *testing.T) {
		// The server is reached through the agent inside (gVisor's network stack is its own).
		sb := p.create(corral.CreateRequest{Environment: "code-interpreter", Runtime: "gvisor"})
		ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: "import platform\nx = 20\nx + 22"})
		if ex.Text() != "42" || ex.Error != nil {
			t.Fatalf("code on gVisor: %+v (error %+v)", ex, ex.Error)
		}
		if ex = runCode(t, p, sb.ID, corral.CodeRequest{Code: "x"}); ex.Text() != "20" {
			t.Errorf("state across runs on gVisor: %+v", ex)
		}
	})

	t.Run("python-sdk", func(t *testing.T) {
		py, err := exec.LookPath("python3")
		if err != nil {
			t.Skip("needs python3")
		}
		sb := p.create(corral.CreateRequest{Environment: "code-interpreter"})
		script := `import corral, sys
c = corral.Corral()
sb = c.get(sys.argv[1])
ex = sb.run_code("import numpy as np\nprint('n')\nint(np.arange(5).sum())")
assert ex.text == "10" and ex.stdout == ["n\n"] and ex.error is None, ex
ex = sb.run_code("1/0")
assert ex.error.name == "ZeroDivisionError", ex
ctx = sb.create_code_context(cwd="/tmp")
sb.run_code("z = 1", context=ctx.id)
assert sb.run_code("z", context=ctx.id).text == "1"
assert sb.run_code("z").error.name == "NameError"
assert len(sb.code_contexts()) == 2
sb.delete_code_context(ctx.id)
try:
    sb.run_code("z", context=ctx.id)
    raise SystemExit("a deleted context ran code")
except corral.NotFound:
    pass
print("ok")
`
		cmd := exec.Command(py, "-c", script, sb.ID)
		cmd.Env = append(os.Environ(), "CORRAL_URL="+p.URL, "CORRAL_TOKEN="+p.Token, "PYTHONPATH="+filepath.Join(repoRoot, "sdk", "python"), "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Errorf("the Python SDK's run_code: %v\n%s", err, out)
		}
	})

	t.Run("e2b-sdk", func(t *testing.T) {
		runE2BScript(t, p, e2bAddr, "code.mjs", "code-interpreter", randHex(4))
	})

	t.Run("warm-pool", func(t *testing.T) {
		// A pooled sandbox counts as ready once its services' readiness checks pass (the
		// recipe's: GET /ready, once the default kernel answers), so a claimed sandbox's
		// kernel is up before any code asks for it.
		sub := *p
		sub.t = t
		p := &sub
		warm, none := 1, 0
		if _, err := p.Client.UpdateEnvironment(ctx, "code-interpreter", corral.EnvironmentPatch{Warm: &warm}); err != nil {
			t.Fatal(err)
		}
		defer p.Client.UpdateEnvironment(ctx, "code-interpreter", corral.EnvironmentPatch{Warm: &none})
		before := p.warmEnv("code-interpreter", "the pool to fill", func(e *corral.Environment) bool { return e.WarmReady == 1 })
		sb := p.create(corral.CreateRequest{Environment: "code-interpreter"})
		if env, err := p.Client.Environment(ctx, "code-interpreter"); err != nil || env.WarmHits != before.WarmHits+1 {
			t.Fatalf("the create was not a claim (%v): warm hits %d, then %+v", err, before.WarmHits, env)
		}
		health := p.sh(sb.ID, `python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:49999/health').read().decode())"`)
		if !strings.Contains(health, `"default_context": "ready"`) {
			t.Errorf("a claimed sandbox's code server, before any code ran: %s, want its default context ready", health)
		}
		if ex := runCode(t, p, sb.ID, corral.CodeRequest{Code: "1 + 1"}); ex.Text() != "2" {
			t.Errorf("code in a claimed sandbox: %+v", ex)
		}
	})
}
