package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

func TestLifecycleAndExec(t *testing.T) { forRuntimes(t, testLifecycleAndExec) }

func testLifecycleAndExec(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	sb := p.create(corral.CreateRequest{Labels: map[string]string{"team": "a"}, Env: []string{"GREETING=hi"}})
	other := p.create(corral.CreateRequest{Labels: map[string]string{"team": "b"}})
	if want := map[string]string{"microvm": "qemu"}[rt]; sb.Runtime != rt && sb.Runtime != want {
		t.Fatalf("sandbox runtime = %q, want %q", sb.Runtime, rt)
	}
	// Under gVisor the sandbox's kernel is gVisor's.
	if dmesg := p.sh(sb.ID, "dmesg 2>/dev/null | head -3"); (rt == "gvisor") != strings.Contains(dmesg, "gVisor") {
		t.Fatalf("runtime %s: dmesg says %q", rt, dmesg)
	}

	got, err := p.Client.GetSandbox(ctx, sb.ID)
	if err != nil || got.ID != sb.ID || got.State != corral.StateRunning || got.Node != "local" {
		t.Fatalf("GetSandbox = %+v, %v", got, err)
	}
	list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{Labels: map[string]string{"team": "a"}})
	if err != nil || len(list) != 1 || list[0].ID != sb.ID {
		t.Fatalf("list by label team=a = %v, %v; want only %s", list, err, sb.ID)
	}

	// stdout and stderr stay separate; the exit code comes through.
	out, errOut, exit := p.run(sb.ID, "/bin/sh", "-c", "echo out; echo err >&2; exit 7")
	if out != "out\n" || errOut != "err\n" || exit.Code != 7 {
		t.Fatalf("got stdout %q stderr %q exit %+v; want out, err, 7", out, errOut, exit)
	}
	// env from the sandbox and the call, cwd, user, hostname.
	out, _, exit = p.runReq(sb.ID, corral.ExecRequest{
		Argv: []string{"/bin/sh", "-c", `echo "$GREETING $EXTRA $(pwd) $(id -u):$(id -g) $(hostname)"`},
		Env:  []string{"EXTRA=there"}, Cwd: "/tmp", User: "agent",
	})
	if want := "hi there /tmp 1000:1000 " + sb.ID + "\n"; out != want || exit.Code != 0 {
		t.Fatalf("got %q (exit %+v), want %q", out, exit, want)
	}
	// stdin, shell mode.
	out, _, _ = p.runReq(sb.ID, corral.ExecRequest{Argv: []string{"tr a-z A-Z"}, Shell: true, Stdin: []byte("shout\n")})
	if out != "SHOUT\n" {
		t.Fatalf("stdin through tr = %q", out)
	}
	// a signal and a timeout.
	_, _, exit = p.runReq(sb.ID, corral.ExecRequest{Argv: []string{"sleep", "30"}, Timeout: "300ms"})
	if !exit.TimedOut || exit.Signal != "SIGKILL" {
		t.Fatalf("timeout: exit = %+v, want timed_out by SIGKILL", exit)
	}
	// concurrent sessions.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stdout, _, exit, err := p.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 0.2; echo $0", string(rune('a' + i))}})
			if err != nil || exit.Code != 0 || string(stdout) != string(rune('a'+i))+"\n" {
				t.Errorf("concurrent exec %d: %q %+v %v", i, stdout, exit, err)
			}
		}()
	}
	wg.Wait()

	// Delete, then the sandbox is stopped and refuses work; the other one is untouched.
	del, err := p.Client.DeleteSandbox(ctx, sb.ID)
	if err != nil || (del.State != corral.StateDeleting && del.State != corral.StateStopped) || del.Reason != corral.ReasonDeleted {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	if _, _, _, err := p.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); !corral.IsConflict(err) {
		t.Fatalf("exec in a deleted sandbox: err = %v, want conflict", err)
	}
	if again, err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil || again.Reason != corral.ReasonDeleted {
		t.Fatalf("second delete = %+v, %v; want the same stopped record", again, err)
	}
	if got := waitEnded(t, p.Client, sb.ID); got.State != corral.StateStopped || got.Reason != corral.ReasonDeleted {
		t.Fatalf("deleted sandbox after its cleanup = %+v", got)
	}
	running, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{State: corral.StateRunning})
	if len(running) != 1 || running[0].ID != other.ID {
		t.Fatalf("running sandboxes = %v, want only %s", running, other.ID)
	}
}

func TestLayerComposition(t *testing.T) { forRuntimes(t, testLayerComposition) }

func testLayerComposition(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	mk := func(files map[string]string) string {
		dir := t.TempDir()
		for name, content := range files {
			path := filepath.Join(dir, name)
			os.MkdirAll(filepath.Dir(path), 0o755)
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	p.importDir("repo", "v1", corral.KindWorkspace, mk(map[string]string{"workspace/who": "workspace", "workspace/only-ws": "ws"}))
	p.importDir("tool-a", "1", corral.KindToolkit, mk(map[string]string{"workspace/who": "tool-a", "opt/a": "a"}))
	p.importDir("tool-b", "1", corral.KindToolkit, mk(map[string]string{"workspace/who": "tool-b", "opt/b": "b"}))

	sb := p.create(corral.CreateRequest{Workspace: "repo:v1", Toolkits: []string{"tool-a:1", "tool-b:1"}})
	if got := p.sh(sb.ID, "cat /workspace/who /workspace/only-ws /opt/a /opt/b"); got != "tool-bwsab" {
		t.Fatalf("composed view = %q, want tool-b (last toolkit wins) + ws + a + b", got)
	}
	sb2 := p.create(corral.CreateRequest{Workspace: "repo:v1", Toolkits: []string{"tool-b:1", "tool-a:1"}})
	if got := p.sh(sb2.ID, "cat /workspace/who"); got != "tool-a" {
		t.Fatalf("reversed toolkits: /workspace/who = %q, want tool-a", got)
	}
	// Writes are private to each sandbox and never reach the layers.
	p.sh(sb.ID, "echo mine > /workspace/who; rm /opt/a")
	if got := p.sh(sb2.ID, "cat /workspace/who; ls /opt"); got != "tool-aa\nb\n" {
		t.Fatalf("other sandbox sees %q after the first one wrote", got)
	}
	// Same content again is a no-op; other content under a published version is refused.
	p.importDir("tool-a", "1", corral.KindToolkit, mk(map[string]string{"workspace/who": "tool-a", "opt/a": "a"}))
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		tw.WriteHeader(&tar.Header{Name: "other", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
		tw.Write([]byte("x"))
		tw.Close()
		pw.Close()
	}()
	if _, err := p.Client.ImportLayer(context.Background(), "tool-a", "1", corral.KindToolkit, pr); !corral.IsConflict(err) {
		t.Fatalf("re-import with other content: err = %v, want conflict", err)
	}
}

func TestFiles(t *testing.T) { forRuntimes(t, testFiles) }

func testFiles(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	sb := p.create(corral.CreateRequest{})
	c := p.Client

	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	fi, err := c.WriteFile(ctx, sb.ID, "/root/data.bin", bytes.NewReader(data), corral.WriteFileOptions{Mode: 0o600})
	if err != nil || fi.Size != int64(len(data)) || fi.Mode.Perm() != 0o600 {
		t.Fatalf("WriteFile = %+v, %v", fi, err)
	}
	rc, err := c.ReadFile(ctx, sb.ID, "/root/data.bin")
	if err != nil {
		t.Fatal(err)
	}
	back, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(back, data) {
		t.Fatalf("read back %d bytes, differs from the %d written", len(back), len(data))
	}
	if got := p.sh(sb.ID, "sha1sum /root/data.bin | cut -c1-8; stat -c %a /root/data.bin"); !strings.HasSuffix(got, "600\n") {
		t.Fatalf("inside view: %q", got)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/home/agent/deep/x.txt", strings.NewReader("x"), corral.WriteFileOptions{Parents: true, User: "agent"}); err != nil {
		t.Fatal(err)
	}
	if got := p.sh(sb.ID, "stat -c '%u %a' /home/agent/deep/x.txt"); got != "1000 644\n" {
		t.Fatalf("owner and mode of a file written as agent: %q", got)
	}
	if _, err := c.Mkdir(ctx, sb.ID, corral.MkdirRequest{Path: "/srv/a/b", Parents: true}); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stat(ctx, sb.ID, "/srv/a/b")
	if err != nil || !st.IsDir {
		t.Fatalf("Stat = %+v, %v", st, err)
	}
	list, err := c.List(ctx, sb.ID, "/srv/a")
	if err != nil || len(list) != 1 || list[0].Name != "b" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if err := c.Remove(ctx, sb.ID, "/srv/a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, sb.ID, "/srv/a"); !corral.IsNotFound(err) {
		t.Fatalf("Stat after remove: %v, want not found", err)
	}
	if _, err := c.ReadFile(ctx, sb.ID, "/no/such/file"); !corral.IsNotFound(err) {
		t.Fatalf("ReadFile of a missing file: %v, want not found", err)
	}

	// tar out and back in elsewhere.
	p.sh(sb.ID, "mkdir -p /proj/sub && echo one > /proj/a && echo two > /proj/sub/b && ln -s a /proj/link")
	tr, err := c.TarOut(ctx, sb.ID, "/proj")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	io.Copy(&buf, tr)
	tr.Close()
	if err := c.TarIn(ctx, sb.ID, "/copy", bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if got := p.sh(sb.ID, "cat /copy/a /copy/sub/b; readlink /copy/link"); got != "one\ntwo\na\n" {
		t.Fatalf("tar round trip: %q", got)
	}
	// A tar that climbs out of its directory is refused and writes nothing.
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "../escaped", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	if err := c.TarIn(ctx, sb.ID, "/copy", &evil); !corral.IsInvalid(err) {
		t.Fatalf("tar with ../: err = %v, want invalid", err)
	}
	if _, err := c.Stat(ctx, sb.ID, "/escaped"); !corral.IsNotFound(err) {
		t.Fatalf("/escaped exists after a refused tar: %v", err)
	}
}

func TestReattachAndOutputCap(t *testing.T) { forRuntimes(t, testReattachAndOutputCap) }

func testReattachAndOutputCap(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	sb := p.create(corral.CreateRequest{Limits: corral.Limits{OutputBytes: 64 << 10}})

	cmd, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "for i in 1 2 3 4 5; do echo line$i; sleep 0.1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	// Attach, read one event, hang up; the command goes on.
	st, err := p.Client.Attach(ctx, sb.ID, cmd.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.Next()
	if err != nil || first.Type != "stdout" {
		t.Fatalf("first event = %+v, %v", first, err)
	}
	st.Close()
	eventually(t, 10*time.Second, "the command to exit", func() bool {
		c, err := p.Client.Command(ctx, sb.ID, cmd.ID)
		return err == nil && c.State == "exited"
	})
	// Attach again from the offset after the first event: the rest, then the exit.
	st, err = p.Client.Attach(ctx, sb.ID, cmd.ID, first.Offset+int64(len(first.Data)), true)
	if err != nil {
		t.Fatal(err)
	}
	var rest bytes.Buffer
	exit, err := st.Copy(&rest, &rest)
	if err != nil || exit == nil || exit.Code != 0 {
		t.Fatalf("re-attach: exit %+v, %v", exit, err)
	}
	if got := string(first.Data) + rest.String(); got != "line1\nline2\nline3\nline4\nline5\n" {
		t.Fatalf("output pieced together = %q", got)
	}

	// `yes` against a 64 KiB cap: the command is not blocked, the kept output stays bounded and the
	// loss is reported.
	stream, err := p.Client.Exec(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "yes | head -c 50000000; echo done >&2"}})
	if err != nil {
		t.Fatal(err)
	}
	stream.Close() // nobody reads: the agent must keep draining
	var id string
	eventually(t, 60*time.Second, "yes | head to finish", func() bool {
		cmds, _ := p.Client.Commands(ctx, sb.ID)
		for _, c := range cmds {
			if len(c.Argv) == 3 && strings.Contains(c.Argv[2], "yes") && c.State == "exited" {
				id = c.ID
				return true
			}
		}
		return false
	})
	c, _ := p.Client.Command(ctx, sb.ID, id)
	if c.OutputEnd < 50_000_000 || c.OutputEnd-c.OutputStart > 64<<10 {
		t.Fatalf("kept output [%d, %d): want end ≥ 50e6 and at most 64 KiB kept", c.OutputStart, c.OutputEnd)
	}
	st, err = p.Client.Attach(ctx, sb.ID, id, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Next()
	st.Close()
	if err != nil || ev.Type != "truncated" || ev.Dropped == 0 {
		t.Fatalf("attach from 0 after truncation: first event %+v, %v; want truncated", ev, err)
	}
}

func TestTTLAndIdle(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	short := p.create(corral.CreateRequest{TTL: "2s"})
	extended := p.create(corral.CreateRequest{TTL: "2s"})
	idle := p.create(corral.CreateRequest{IdleTTL: "2s"})
	busy := p.create(corral.CreateRequest{IdleTTL: "2s"})
	if _, err := p.Client.SetTTL(ctx, extended.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.StartCommand(ctx, busy.ID, corral.ExecRequest{Argv: []string{"sleep", "5"}}); err != nil {
		t.Fatal(err)
	}
	state := func(id string) (string, string) {
		sb, err := p.Client.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return sb.State, sb.Reason
	}
	eventually(t, 10*time.Second, "the 2s TTL to expire", func() bool {
		s, r := state(short.ID)
		return s == corral.StateStopped && r == corral.ReasonTTLExpired
	})
	eventually(t, 10*time.Second, "the idle sandbox to expire", func() bool {
		s, r := state(idle.ID)
		return s == corral.StateStopped && r == corral.ReasonIdleExpired
	})
	if s, _ := state(busy.ID); s != corral.StateRunning {
		t.Fatalf("sandbox with a running command: %s, want running (a running command is activity)", s)
	}
	if s, _ := state(extended.ID); s != corral.StateRunning {
		t.Fatalf("sandbox whose TTL was extended: %s, want running", s)
	}
	eventually(t, 15*time.Second, "the busy sandbox to idle out after its command", func() bool {
		s, r := state(busy.ID)
		return s == corral.StateStopped && r == corral.ReasonIdleExpired
	})
}

// TestExitedCommandRetention: `corral up --keep-exited-for` bounds how long a finished command's
// output stays re-attachable.
func TestExitedCommandRetention(t *testing.T) {
	p := withBase(t, "--keep-exited-for", "1s", "--keep-exited-commands", "8")
	ctx := context.Background()
	sb := p.create(corral.CreateRequest{})
	cmd, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"echo", "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.Command(ctx, sb.ID, cmd.ID); err != nil {
		t.Fatalf("just-finished command: %v", err)
	}
	eventually(t, 10*time.Second, "the exited command to be forgotten", func() bool {
		_, err := p.Client.Command(ctx, sb.ID, cmd.ID)
		return corral.IsNotFound(err)
	})
}
