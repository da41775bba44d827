package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// hostPythonToolkit builds a toolkit tree from this host's Python 3 (scripts/host-python-toolkit.sh),
// for tests whose busybox base has no Python.
func hostPythonToolkit(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "py")
	out, err := exec.Command(filepath.Join(repoRoot, "scripts", "host-python-toolkit.sh"), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("host-python-toolkit.sh: %v: %s", err, out)
	}
	return dir
}

// TestWarmPython: an fncall environment with a warm interpreter runs Python calls in an
// interpreter that imported its modules before the call came, yet each call still gets a fresh
// process and root: what one call leaves in the interpreter or the files is gone for the next.
func TestWarmPython(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	p.importDir("py", "host", corral.KindToolkit, hostPythonToolkit(t))
	for _, env := range []corral.FncallEnv{
		{Name: "warm", Base: "base:test", Toolkits: []string{"py:host"}, PoolMin: 1, PoolMax: 1, Warm: &corral.WarmPython{Imports: []string{"json", "email.parser", "http.client"}}},
		{Name: "cold", Base: "base:test", Toolkits: []string{"py:host"}, PoolMin: 1, PoolMax: 1},
	} {
		if _, err := p.Client.CreateFncallEnv(ctx, env); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "ready containers", func() bool {
		w, _ := p.Client.FncallEnv(ctx, "warm")
		c, _ := p.Client.FncallEnv(ctx, "cold")
		return w != nil && c != nil && w.Pool.Ready == 1 && c.Pool.Ready == 1
	})
	code := `import sys, os, json
print(sys.argv[1:], json.dumps({"n": int(sys.stdin.read())}), open("in.txt").read(), os.environ["MODE"], os.getcwd())
print("email.parser" in sys.modules, hasattr(sys, "left_by_earlier_call"), os.path.exists("/call/left"))
sys.left_by_earlier_call = True
open("/call/left", "w").write("x")
open("out.txt", "w").write("py-out")
`
	want := "['a', 'b'] {\"n\": 7} hello test /call\n"
	for i, env := range []string{"warm", "warm", "warm", "cold"} {
		time.Sleep(300 * time.Millisecond) // as between real calls: the next interpreter starts
		res, err := p.Client.Call(ctx, env, corral.CallRequest{Python: code, Argv: []string{"a", "b"}, Stdin: []byte("7"),
			Files: map[string][]byte{"in.txt": []byte("hello")}, Env: []string{"MODE=test"}, Outputs: []string{"out.txt"}})
		if err != nil {
			t.Fatalf("call %d in %s: %v", i, env, err)
		}
		if res.Exit.Code != 0 {
			t.Fatalf("call %d in %s: %+v: %s", i, env, res.Exit, res.Stderr)
		}
		imported := "True" // the warm interpreter imported it ahead; a cold one did not
		if env == "cold" {
			imported = "False"
		}
		if got := string(res.Stdout); got != want+imported+" False False\n" {
			t.Errorf("call %d in %s printed %q", i, env, got)
		}
		if string(res.Outputs["out.txt"]) != "py-out" {
			t.Errorf("call %d in %s: output file %q", i, env, res.Outputs["out.txt"])
		}
		// The first call may come before the container's interpreter is started; later ones,
		// a moment after the previous call ended, must find one ready.
		if env == "warm" && i > 0 && !res.Warm {
			t.Errorf("call %d in %s ran in a fresh interpreter; want the warm one started after call %d", i, env, i-1)
		}
		if env == "cold" && res.Warm {
			t.Errorf("a call in an environment without warm interpreters says it was warm")
		}
	}
	// A warm call's timeout is enforced by the edge.
	res, err := p.Client.Call(ctx, "warm", corral.CallRequest{Python: "import time\ntime.sleep(100)", Timeout: "500ms"})
	if err != nil || !res.Exit.TimedOut {
		t.Errorf("a warm call over its timeout: %+v, %v", res, err)
	}
	if e, _ := p.Client.FncallEnv(ctx, "warm"); e.Pool.Replaced != 0 {
		t.Errorf("%d containers replaced: a warm call's cleanup was not clean", e.Pool.Replaced)
	}
}
