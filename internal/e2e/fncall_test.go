package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestFncall: an fncall environment keeps warm containers; calls run in them and nothing of a
// call survives it: not its files (in its working directory, /tmp or anywhere else), not its
// background processes, not its environment, also when calls run concurrently in one pool.
func TestFncall(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	if _, stderr, code := p.cli("", "fncall", "create", "judge", "--base", "base:test", "--pool-min", "1", "--pool-max", "2", "--timeout", "20s"); code != 0 {
		t.Fatalf("corral fncall create: %s", stderr)
	}
	eventually(t, 30*time.Second, "a ready container", func() bool {
		e, err := p.Client.FncallEnv(ctx, "judge")
		return err == nil && e.Pool.Ready >= 1
	})

	// CLI: files in, output through, exit status, files out.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "in.txt"), []byte("21\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := p.cliIn(dir, "", "call", "judge", "--file", "in.txt=in.txt", "--out", "out.txt",
		"--", "sh", "-c", "read n < in.txt; echo $((n*2)) | tee out.txt; echo to-stderr >&2; exit 3")
	if code != 3 || stdout != "42\n" || !strings.Contains(stderr, "to-stderr") {
		t.Fatalf("corral call: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "out.txt")); err != nil || string(got) != "42\n" {
		t.Errorf("--out file = %q, %v", got, err)
	}

	// A call that leaves state behind everywhere it can.
	dirty := corral.CallRequest{Script: `echo secret > /call/left; echo secret > /tmp/left; echo secret > /root/left;
		mkdir -p /opt/left && echo secret > /opt/left/f; export LEFT=1; echo "export LEFT=1" >> /etc/profile;
		(sleep 300 &) ; nohup sleep 301 >/dev/null 2>&1 & echo started`}
	if res, err := p.Client.Call(ctx, "judge", dirty); err != nil || res.Exit.Code != 0 || strings.TrimSpace(string(res.Stdout)) != "started" {
		t.Fatalf("dirty call: %+v, %v", res, err)
	}
	look := corral.CallRequest{Script: `for f in /call/left /tmp/left /root/left /opt/left/f; do [ -e $f ] && echo "file $f"; done
		grep -q LEFT=1 /etc/profile && echo profile; [ -n "$LEFT" ] && echo env
		for p in /proc/[0-9]*; do c=$(cat $p/cmdline 2>/dev/null | tr '\0' ' '); case "$c" in sleep*) echo "proc $c";; esac; done; true`}
	for i := range 4 {
		res, err := p.Client.Call(ctx, "judge", look)
		if err != nil || res.Exit.Code != 0 {
			t.Fatalf("look %d: %+v, %v", i, res, err)
		}
		if left := strings.TrimSpace(string(res.Stdout)); left != "" {
			t.Errorf("call %d (container %s) found what an earlier call left: %s", i, res.Container, left)
		}
	}

	// Concurrent calls each see only their own files.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := fmt.Sprint(i)
			res, err := p.Client.Call(ctx, "judge", corral.CallRequest{
				Files:  map[string][]byte{"mine": []byte(me)},
				Script: `echo $(cat mine) > /call/shared; sleep 0.2; cat /call/shared; ls /call | tr '\n' ' '`,
			})
			if err != nil {
				errs <- err
				return
			}
			if got := string(res.Stdout); got != me+"\nmine shared " {
				errs <- fmt.Errorf("call %s saw %q", me, got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Timeouts kill the call; a bad request is a 400; the data plane refuses pool containers.
	res, err := p.Client.Call(ctx, "judge", corral.CallRequest{Argv: []string{"sleep", "100"}, Timeout: "300ms"})
	if err != nil || !res.Exit.TimedOut {
		t.Errorf("timed-out call: %+v, %v", res, err)
	}
	if _, err := p.Client.Call(ctx, "judge", corral.CallRequest{Argv: []string{"true"}, Timeout: "1h"}); !corral.IsInvalid(err) {
		t.Errorf("a timeout over the environment's: %v; want invalid", err)
	}
	if _, err := p.Client.Call(ctx, "judge", corral.CallRequest{Argv: []string{"true"}, Files: map[string][]byte{"/proc/x": nil}}); !corral.IsInvalid(err) {
		t.Errorf("an input file under /proc: %v; want invalid", err)
	}
	if res, err := p.Client.Call(ctx, "judge", corral.CallRequest{Argv: []string{"cat", "/tmp/in"}, Files: map[string][]byte{"/tmp/in": []byte("staged")}}); err != nil || string(res.Stdout) != "staged" {
		t.Errorf("an input file under /tmp: %+v, %v", res, err)
	}
	if _, err := p.Client.Call(ctx, "nope", corral.CallRequest{Argv: []string{"true"}}); !corral.IsNotFound(err) {
		t.Errorf("call to an unknown environment: %v; want not found", err)
	}
	env, _ := p.Client.FncallEnv(ctx, "judge")
	if env.Pool.Replaced != 0 {
		t.Errorf("%d containers were replaced: a cleanup was not clean", env.Pool.Replaced)
	}
	if res, err := p.Client.Call(ctx, "judge", corral.CallRequest{Argv: []string{"true"}}); err == nil {
		if _, _, _, err := p.Client.Run(ctx, res.Container, corral.ExecRequest{Argv: []string{"true"}}); !corral.IsConflict(err) {
			t.Errorf("exec into a pool container: %v; want conflict", err)
		}
	}

	// Compile, then run elsewhere: a call keeps its product on the node; a call in another
	// environment takes it by reference, with its mode, without a trip through the client.
	// (The runner's containers also have a network policy, which their calls share.)
	if _, err := p.Client.CreateFncallEnv(ctx, corral.FncallEnv{Name: "runner", Base: "base:test", PoolMin: 1, PoolMax: 1,
		Network: &corral.NetworkPolicy{Allow: []string{"198.51.100.1:80/tcp"}}}); err != nil {
		t.Fatal(err)
	}
	for env, want := range map[string]string{"judge": "lo", "runner": "eth0 lo"} {
		res, err := p.Client.Call(ctx, env, corral.CallRequest{Script: "ls /sys/class/net | sort | tr '\\n' ' '"})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != want {
			t.Errorf("network interfaces of a call in %s: %+v, %v; want %q", env, res, err, want)
		}
	}
	built, err := p.Client.Call(ctx, "judge", corral.CallRequest{Script: `printf '#!/bin/sh\necho built-elsewhere $1\n' > prog; chmod 755 prog`, Keep: []string{"prog", "missing"}})
	if err != nil || built.Artifacts["prog"] == "" || built.OutputErrors["missing"] == "" {
		t.Fatalf("build call: %+v, %v", built, err)
	}
	ran, err := p.Client.Call(ctx, "runner", corral.CallRequest{Argv: []string{"./prog", "ok"}, FileRefs: map[string]string{"prog": built.Artifacts["prog"]}})
	if err != nil || string(ran.Stdout) != "built-elsewhere ok\n" {
		t.Fatalf("run call with the artifact: %+v, %v", ran, err)
	}
	if _, err := p.Client.Call(ctx, "runner", corral.CallRequest{Argv: []string{"true"}, FileRefs: map[string]string{"x": "sha256:" + strings.Repeat("0", 64)}}); !corral.IsNotFound(err) {
		t.Errorf("an unknown artifact: %v; want not found", err)
	}
	if err := p.Client.DeleteFncallEnv(ctx, "runner"); err != nil {
		t.Fatal(err)
	}

	// Streaming: output as it comes, the result at the end.
	s, err := p.Client.CallStream(ctx, "judge", corral.CallRequest{Script: "echo one; sleep 0.2; echo two"})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if _, err := s.Copy(&out, &out); err != nil || out.String() != "one\ntwo\n" || s.Result() == nil || s.Result().Container == "" {
		t.Errorf("streamed call: %q, %v, result %+v", out.String(), err, s.Result())
	}
	s.Close()

	if stdout, _, code := p.cli("", "fncall", "ls", "-o", "json"); code != 0 || !strings.Contains(stdout, `"name": "judge"`) {
		t.Errorf("fncall ls -o json: %d %s", code, stdout)
	}
	if _, stderr, code := p.cli("", "fncall", "rm", "judge"); code != 0 {
		t.Fatalf("fncall rm: %s", stderr)
	}
	eventually(t, 20*time.Second, "the pool's containers gone", func() bool {
		list, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{})
		for _, sb := range list {
			if sb.Tier == "fncall" && sb.State == corral.StateRunning {
				return false
			}
		}
		return true
	})
	p.Stop()
	assertNoLeftovers(t, p)
}
