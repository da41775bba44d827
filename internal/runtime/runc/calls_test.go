package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// Tests of the fncall tier's isolation (internal/agentrpc/calls.go) with the real agent in real
// runc containers.

// callsSandbox creates a sandbox that runs calls, with the real agent.
func (e *testEnv) callsSandbox(id string) (*runtime.Sandbox, *agentrpc.Client) {
	e.t.Helper()
	s := e.spec(id)
	s.AgentPath = buildRealAgent(e.t)
	s.AgentArgs = []string{"serve", "--fd", "3", "--calls"}
	s.Calls = true
	sb := e.create(s)
	return sb, agentrpc.NewClient(sb.AgentSocket)
}

// callOut is what a call's command did.
type callOut struct {
	info           agentrpc.CommandInfo
	exit           *agentrpc.Exit
	stdout, stderr string
}

func (o callOut) String() string {
	return fmt.Sprintf("exit %+v, stdout %q, stderr %q", o.exit, o.stdout, o.stderr)
}

// execCall runs req in the prepared call dir and waits for its end.
func execCall(t testing.TB, c *agentrpc.Client, dir string, req agentrpc.ExecRequest) callOut {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req.Call = &agentrpc.CallSpec{Dir: dir}
	s, err := c.Exec(ctx, req)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", req.Argv, dir, err)
	}
	defer s.Close()
	return readCall(t, s, req.Argv)
}

// readCall reads a call's command's events to its exit.
func readCall(t testing.TB, s *agentrpc.Session, argv []string) callOut {
	t.Helper()
	out := callOut{info: s.Info()}
	var stdout, stderr bytes.Buffer
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("exec %q: %v", argv, err)
		}
		switch ev.Type {
		case agentrpc.EventStdout:
			stdout.Write(ev.Data)
		case agentrpc.EventStderr:
			stderr.Write(ev.Data)
		case agentrpc.EventExit:
			out.exit = ev.Exit
		}
	}
	out.stdout, out.stderr = stdout.String(), stderr.String()
	if out.exit == nil {
		t.Fatalf("exec %q: no exit", argv)
	}
	return out
}

// oneTripCall runs req as call id prepared, run and ended in one request (CallSpec.Prepare and
// End), with dirs made in its root, and returns what it did and what the end found.
func oneTripCall(t testing.TB, c *agentrpc.Client, id string, dirs []string, req agentrpc.ExecRequest) (callOut, agentrpc.CallEnd) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req.Call = &agentrpc.CallSpec{Prepare: &agentrpc.CallPrepare{ID: id, Size: 16 << 20, Dirs: dirs}, End: true}
	s, err := c.Exec(ctx, req)
	if err != nil {
		t.Fatalf("exec %q as call %s: %v", req.Argv, id, err)
	}
	defer s.Close()
	out := readCall(t, s, req.Argv)
	ce, err := s.CallEnd()
	if err != nil {
		t.Fatalf("the end of call %s: %v", id, err)
	}
	return out, ce
}

// prepCall prepares call id with a 16 MiB tmpfs and returns its directory.
func prepCall(t testing.TB, c *agentrpc.Client, id string) string {
	t.Helper()
	dir, err := c.CallPrep(context.Background(), id, 16<<20)
	if err != nil {
		t.Fatalf("CallPrep(%s): %v", id, err)
	}
	return dir
}

// endCall ends call id and fails the test unless it was clean.
func endCall(t testing.TB, c *agentrpc.Client, id string) {
	t.Helper()
	ce, err := c.CallEnd(context.Background(), id)
	if err != nil {
		t.Fatalf("CallEnd(%s): %v", id, err)
	}
	if !ce.Clean {
		t.Fatalf("CallEnd(%s) not clean: %q", id, ce.Problems)
	}
}

// shCall runs a shell command line as call id from prep to end and returns what it did; it fails
// the test unless the command exits 0 and the end is clean.
func shCall(t testing.TB, c *agentrpc.Client, id, cmdline string) callOut {
	t.Helper()
	dir := prepCall(t, c, id)
	out := execCall(t, c, dir, agentrpc.ExecRequest{Argv: []string{cmdline}, Shell: true})
	endCall(t, c, id)
	if out.exit.Code != 0 || out.exit.Error != "" {
		t.Fatalf("call %q: %s", cmdline, out)
	}
	return out
}

// waitCallLeftovers is callLeftovers once none is left, or after 5 s: a helper that ran a
// killed call may still be exiting when the call's exit is reported, beside its spare.
func waitCallLeftovers(e *testEnv, sb *runtime.Sandbox) []string {
	deadline := time.Now().Add(5 * time.Second)
	for len(callLeftovers(e, sb)) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return callLeftovers(e, sb)
}

// callLeftovers lists the live processes in sandbox id's cgroup, as seen from the host, other
// than the agent (pid) and one spare call helper.

func callLeftovers(e *testEnv, sb *runtime.Sandbox) []string {
	var left []string
	spare := false
	for _, p := range sandboxProcesses(e, sb.ID) {
		switch {
		case strings.HasPrefix(p, strconv.Itoa(sb.Pid)+" "):
		case !spare && (strings.HasSuffix(p, " (corral-call)") || strings.HasSuffix(p, " (exe)")):
			spare = true
		default:
			left = append(left, p)
		}
	}
	return left
}

// sandboxProcesses lists the live processes in sandbox id's cgroup, as seen from the host.
func sandboxProcesses(e *testEnv, id string) []string {
	var live []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if !strings.Contains(string(b), e.parent+"/"+id+"\n") {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(string(stat[i+1:])); len(f) > 0 && f[0] == "Z" {
			continue
		}
		live = append(live, strings.TrimSpace(string(stat[:i+1])))
	}
	return live
}

// treeOf lists every path under dir with its type, mode, size and modification time.
func treeOf(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, fmt.Sprintf("%s %v %d %d", strings.TrimPrefix(p, dir), fi.Mode(), fi.Size(), fi.ModTime().UnixNano()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCallLeavesNothing: a call that writes files in /root and /tmp, leaves a background process
// and exports a variable is followed by one that finds none of it; the container's own writable
// layer does not change across calls.
func TestCallLeavesNothing(t *testing.T) {
	e := newTestEnv(t, nil)
	sb, c := e.callsSandbox("calls-1")
	ctx := context.Background()
	upper := filepath.Join(sb.Dir, diskMount, "upper")

	// A first call makes /.corral-calls (once); from then on nothing of the container changes.
	shCall(t, c, "warm-up", "true")
	before := treeOf(t, upper)

	first := shCall(t, c, "first", `
		echo x > /root/x && echo y > /tmp/y && export LEAK=yes && echo "LEAK=$LEAK" > /root/env &&
		(sleep 1000 & echo $! > /root/bg) && mkfifo /dev/shm/fifo && echo ok`)
	if strings.TrimSpace(first.stdout) != "ok" {
		t.Fatalf("first call: %s", first)
	}
	out := shCall(t, c, "second", `
		for f in /root/x /tmp/y /root/env /root/bg /dev/shm/fifo; do [ -e $f ] && echo "found $f"; done
		echo "LEAK=$LEAK"
		cat /proc/[0-9]*/comm | grep -cx sleep || true
		ls -A /.corral-calls /tmp | tr '\n' ' '`)
	if got, want := strings.Fields(out.stdout), []string{"LEAK=", "0", "/.corral-calls:", "/tmp:"}; !slices.Equal(got, want) {
		t.Errorf("second call found %q, want %q", got, want)
	}
	// Both ran in the same helper (and so PID namespace), which cleaned up between them.
	if first.info.Pid != out.info.Pid {
		t.Errorf("the calls ran in helpers %d and %d, want one reused", first.info.Pid, out.info.Pid)
	}
	if after := treeOf(t, upper); !slices.Equal(before, after) {
		t.Errorf("the container's writable layer changed across calls:\nbefore %q\nafter  %q", before, after)
	}
	if _, err := c.Stat(ctx, "/root/x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat /root/x in the container: %v, want not found", err)
	}
	if procs := waitCallLeftovers(e, sb); len(procs) != 0 {
		t.Errorf("processes in the sandbox after the calls: %q, want the agent and a spare helper", procs)
	}
}

// TestCallOneTrip: a call prepared, run and ended in one request to the agent is isolated and
// cleaned up as one made of three (CallPrep, Exec, CallEnd), and leaves nothing for a CallEnd.
func TestCallOneTrip(t *testing.T) {
	e := newTestEnv(t, nil)
	sb, c := e.callsSandbox("calls-onetrip")
	ctx := context.Background()
	upper := filepath.Join(sb.Dir, diskMount, "upper")
	shCall(t, c, "warm-up", "true") // makes /.corral-calls, once
	before := treeOf(t, upper)

	out, ce := oneTripCall(t, c, "one", []string{"/work/deep"}, agentrpc.ExecRequest{Argv: []string{`
		pwd; echo x > /root/x; (sleep 1000 &); ls -A /.corral-calls`}, Shell: true, Cwd: "/work/deep"})
	if out.exit.Code != 0 || strings.Fields(out.stdout)[0] != "/work/deep" || len(strings.Fields(out.stdout)) != 1 {
		t.Errorf("one-trip call: %s, want its cwd made and nothing under /.corral-calls", out)
	}
	if !ce.Clean {
		t.Errorf("one-trip call's end not clean: %q", ce.Problems)
	}
	if _, err := c.CallEnd(ctx, "one"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("CallEnd after a one-trip call: %v, want not found (the agent ended it)", err)
	}
	// The id is free again, and a command that fails still ends its call.
	out, ce = oneTripCall(t, c, "one", nil, agentrpc.ExecRequest{Argv: []string{"/nonexistent"}})
	if out.exit.Code != 127 || !ce.Clean {
		t.Errorf("one-trip call of a missing program: %s, end %+v; want 127 and clean", out, ce)
	}
	if after := treeOf(t, upper); !slices.Equal(before, after) {
		t.Errorf("the container's writable layer changed:\nbefore %q\nafter  %q", before, after)
	}
	if procs := waitCallLeftovers(e, sb); len(procs) != 0 {
		t.Errorf("processes in the sandbox after the calls: %q", procs)
	}
	// Prepare and end are for exec only.
	req := agentrpc.ExecRequest{Argv: []string{"true"}, Call: &agentrpc.CallSpec{Prepare: &agentrpc.CallPrepare{ID: "bg", Size: 1 << 20}}}
	if _, err := c.Start(ctx, req); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Start with a call to prepare: %v, want invalid", err)
	}
	// A directory outside the call's root is refused before anything is prepared.
	req = agentrpc.ExecRequest{Argv: []string{"true"}, Call: &agentrpc.CallSpec{Prepare: &agentrpc.CallPrepare{ID: "up", Size: 1 << 20, Dirs: []string{"../../x"}}, End: true}}
	if _, err := c.Exec(ctx, req); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a call's directory ../../x: %v, want invalid", err)
	}
	if _, err := c.CallEnd(ctx, "up"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("CallEnd of the refused call: %v, want not found (never prepared)", err)
	}
}

// TestCallsConcurrent: two calls running at once in one container see only their own files and
// processes.
func TestCallsConcurrent(t *testing.T) {
	e := newTestEnv(t, nil)
	_, c := e.callsSandbox("calls-2")
	ctx := context.Background()
	ids := []string{"call-a", "call-b"}
	dirs := make([]string, len(ids))
	for i, id := range ids {
		dirs[i] = prepCall(t, c, id)
		// Staged input: the edge writes under upper/.
		if _, err := c.WriteFile(ctx, dirs[i]+"/upper/work/in", strings.NewReader(id), agentrpc.WriteOptions{Parents: true}); err != nil {
			t.Fatal(err)
		}
	}
	// Each call writes the same paths, waits until both have, then reads them back.
	script := `cat /work/in > /root/who && cat /work/in > /tmp/who && sleep 1000 &
		touch /root/ready-$(cat /work/in)
		sleep 0.5
		echo "$(cat /work/in) $(cat /root/who) $(cat /tmp/who) $(ls /root | tr '\n' ,) $(ls -A /.corral-calls)"
		cat /proc/[0-9]*/comm | grep -cx sleep`
	outs := make([]callOut, len(ids))
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			outs[i] = execCall(t, c, dirs[i], agentrpc.ExecRequest{Argv: []string{script}, Shell: true})
		})
	}
	wg.Wait()
	for i, id := range ids {
		want := fmt.Sprintf("%s %s %s ready-%s,who, \n1\n", id, id, id, id)
		if outs[i].stdout != want || outs[i].exit.Code != 0 {
			t.Errorf("call %s: %s; want stdout %q", id, outs[i], want)
		}
		// The call's writes are in its own layer, readable by the edge until the end.
		rc, _, err := c.ReadFile(ctx, dirs[i]+"/upper/root/who")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != id {
			t.Errorf("call %s's /root/who read by the edge = %q", id, b)
		}
	}
	for _, id := range ids {
		endCall(t, c, id)
	}
}

// TestCallPrivileges: a call's command has exactly the sandbox's capabilities and seccomp
// policy, not the agent's CAP_SYS_ADMIN, and reaches nothing of the agent or of other calls.
func TestCallPrivileges(t *testing.T) {
	e := newTestEnv(t, nil)
	_, c := e.callsSandbox("calls-3")
	wantCaps := uint64(0)
	for _, name := range agentrpc.SandboxCaps() {
		wantCaps |= 1 << capNumbers[name]
	}
	if wantCaps&(1<<21) != 0 {
		t.Fatal("the sandbox's capability set has CAP_SYS_ADMIN")
	}
	other := prepCall(t, c, "other")
	checks := []struct {
		name, cmd, want string
	}{
		{"effective capabilities", "grep ^CapEff: /proc/self/status | tr -d '\\t '", fmt.Sprintf("CapEff:%016x", wantCaps)},
		{"bounding set", "grep ^CapBnd: /proc/self/status | tr -d '\\t '", fmt.Sprintf("CapBnd:%016x", wantCaps)},
		{"permitted", "grep ^CapPrm: /proc/self/status | tr -d '\\t '", fmt.Sprintf("CapPrm:%016x", wantCaps)},
		{"no ambient", "grep ^CapAmb: /proc/self/status | tr -d '\\t '", "CapAmb:0000000000000000"},
		{"no_new_privs", "grep ^NoNewPrivs: /proc/self/status | tr -d '\\t '", "NoNewPrivs:1"},
		{"seccomp", "grep ^Seccomp: /proc/self/status | tr -d '\\t '", "Seccomp:2"},
		{"helper is pid 1 of the call", "cat /proc/1/comm", "corral-call"},
		{"mount refused", "mount -t tmpfs x /mnt 2>/dev/null || echo refused", "refused"},
		{"unshare -m refused", "unshare -m true 2>/dev/null || echo refused", "refused"},
		{"user namespace refused", "unshare -U true 2>/dev/null || echo refused", "refused"},
		{"pivot_root refused", "pivot_root /root /root/x 2>/dev/null || echo refused", "refused"},
		{"sethostname refused", "hostname other 2>/dev/null || echo refused", "refused"},
		{"helper's descriptors unopenable", "for f in /proc/1/fd/*; do cat $f >/dev/null 2>&1 </dev/null && echo open $f; done; echo end", "end"},
		{"helper's descriptor links hidden", "readlink /proc/1/fd/3 2>/dev/null || echo hidden", "hidden"},
		{"helper's binary hidden", "cat /proc/1/exe >/dev/null 2>&1 && echo readable || echo hidden", "hidden"},
		{"helper's memory hidden", "cat /proc/1/mem >/dev/null 2>&1 && echo readable || echo hidden", "hidden"},
		{"helper's environment hidden", "cat /proc/1/environ >/dev/null 2>&1 && echo readable || echo hidden", "hidden"},
		{"no other call's directory", "ls -A /.corral-calls", ""},
		{"no other call in mountinfo", "grep -c other /proc/self/mountinfo || true", "0"},
		{"only the call's processes", "set -- /proc/[0-9]*; echo $# $1", "2 /proc/1"}, // the helper and sh
		{"/proc/sys read-only", "echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || echo refused", "refused"},
		{"/proc/keys masked", "wc -c < /proc/keys", "0"},
		{"/proc/timer_list masked", "wc -c < /proc/timer_list", "0"},
		{"/proc/acpi masked", "ls -A /proc/acpi", ""},
		{"/sys read-only", "touch /sys/x 2>/dev/null || echo refused", "refused"},
		{"/sys/firmware masked", "ls -A /sys/firmware", ""},
		{"/dev read-only", "touch /dev/x 2>/dev/null || echo refused", "refused"},
		{"/dev/null works", "echo x > /dev/null && echo ok", "ok"},
		{"/dev/shm writable", "echo x > /dev/shm/x && cat /dev/shm/x", "x"},
		{"/tmp sticky and writable", "stat -c %a /tmp && touch /tmp/x && echo ok", "1777\nok"},
		{"root owned like the container's", "stat -c '%a %u' /", "755 0"},
	}
	for i, tt := range checks {
		t.Run(tt.name, func(t *testing.T) {
			out := shCall(t, c, "check-"+strconv.Itoa(i), tt.cmd)
			if got := strings.TrimSpace(out.stdout); got != tt.want {
				t.Errorf("%s: got %q, want %q (stderr %q)", tt.cmd, got, tt.want, out.stderr)
			}
		})
	}
	// As another user: the drop happens on the switch of uid anyway, and the command is that user.
	out := execCall(t, c, other, agentrpc.ExecRequest{Argv: []string{"id -u; grep ^CapEff: /proc/self/status"}, Shell: true, User: "1000:1000"})
	if out.exit.Code != 0 || !strings.HasPrefix(out.stdout, "1000\nCapEff:\t0000000000000000") {
		t.Errorf("call as uid 1000: %s", out)
	}
	endCall(t, c, "other")
}

// TestCallTimeout: a call that overruns its timeout is killed with all its background
// processes, and its exit says so as for any command.
func TestCallTimeout(t *testing.T) {
	e := newTestEnv(t, nil)
	sb, c := e.callsSandbox("calls-4")
	dir := prepCall(t, c, "slow")
	start := time.Now()
	out := execCall(t, c, dir, agentrpc.ExecRequest{Argv: []string{"sleep 1000 & sleep 1000 & echo started; sleep 1000"}, Shell: true,
		Timeout: 300 * time.Millisecond})
	// The helper kills the call's processes when told (killing the helper itself, the fallback,
	// would take 5 s more).
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the call took %v", took)
	}
	if x := out.exit; x.Code != -1 || x.Signal != "SIGKILL" || !x.TimedOut || x.OOMKilled || x.Error != "" || x.CPUTime <= 0 || x.MaxRSS <= 0 {
		t.Errorf("exit = %+v, want SIGKILL, timed out, with usage", x)
	}
	if out.stdout != "started\n" {
		t.Errorf("stdout %q", out.stdout)
	}
	if procs := waitCallLeftovers(e, sb); len(procs) != 0 {
		t.Errorf("processes in the sandbox after the timeout: %q, want the agent and a spare helper", procs)
	}
	endCall(t, c, "slow")

	// Signals reach the command through the helper, and the exit reads as for any command.
	dir = prepCall(t, c, "term")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sess, err := c.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"echo started; exec sleep 1000"}, Shell: true, Call: &agentrpc.CallSpec{Dir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var exit *agentrpc.Exit
	for exit == nil {
		ev, err := sess.Next()
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case agentrpc.EventStdout:
			// Started; the exec of sleep may still be under way, which a SIGTERM ends as well.
			if err := c.Signal(ctx, sess.Info().ID, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		case agentrpc.EventExit:
			exit = ev.Exit
		}
	}
	if exit.Code != -1 || exit.Signal != "SIGTERM" || exit.TimedOut {
		t.Errorf("exit after SIGTERM = %+v", exit)
	}
	endCall(t, c, "term")
	// A call's exit status and an unstartable program read as for any command.
	for _, tt := range []struct {
		cmd  []string
		want agentrpc.Exit
	}{
		{[]string{"sh", "-c", "exit 3"}, agentrpc.Exit{Code: 3}},
		{[]string{"sh", "-c", "kill -SEGV $$"}, agentrpc.Exit{Code: -1, Signal: "SIGSEGV"}},
		{[]string{"/no/such"}, agentrpc.Exit{Code: 127, Error: "start /no/such: no such file or directory"}},
		{[]string{"nosuch"}, agentrpc.Exit{Code: 127, Error: "start nosuch: executable file not found in $PATH"}},
	} {
		dir := prepCall(t, c, "status")
		out := execCall(t, c, dir, agentrpc.ExecRequest{Argv: tt.cmd})
		x := *out.exit
		x.CPUTime, x.MaxRSS = 0, 0
		if x != tt.want {
			t.Errorf("%q: exit %+v, want %+v", tt.cmd, x, tt.want)
		}
		endCall(t, c, "status")
	}
}

// TestCallResolvesInItsRoot: user, home, working directory, PATH lookup and environment are
// resolved as for any command, in the call's own root (files the edge staged count), and stdin
// reaches the command.
func TestCallResolvesInItsRoot(t *testing.T) {
	e := newTestEnv(t, nil)
	_, c := e.callsSandbox("calls-8")
	ctx := context.Background()
	dir := prepCall(t, c, "staged")
	for p, content := range map[string]string{
		"/etc/passwd":        "root:x:0:0:root:/root:/bin/sh\njudge:x:1234:1234::/home/judge:/bin/sh\n",
		"/home/judge/.keep":  "",
		"/opt/tools/greet":   "#!/bin/sh\necho hello from $0\n",
		"/work/input.txt":    "data\n",
		"/tmp/staged-in-tmp": "kept\n",
	} {
		opts := agentrpc.WriteOptions{Parents: true}
		if strings.HasPrefix(p, "/opt/") {
			opts.Mode = 0o755
		}
		if _, err := c.WriteFile(ctx, dir+"/upper"+p, strings.NewReader(content), opts); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Mkdir(ctx, dir+"/upper/home/judge", agentrpc.WriteOptions{Parents: true, User: "0"}); err != nil && !errors.Is(err, errdefs.ErrConflict) {
		t.Fatal(err)
	}
	out := execCall(t, c, dir, agentrpc.ExecRequest{
		Argv:  []string{`id -u; pwd; echo "$HOME $GREETING"; greet; cat /tmp/staged-in-tmp; cat`},
		Shell: true, User: "judge", Env: []string{"GREETING=hi", "PATH=/opt/tools:/bin"},
		Stdin: []byte("from stdin\n"),
	})
	endCall(t, c, "staged")
	want := "1234\n/home/judge\n/home/judge hi\nhello from /opt/tools/greet\nkept\nfrom stdin\n"
	if out.exit.Code != 0 || out.stdout != want {
		t.Errorf("call: %s; want stdout %q", out, want)
	}
	// A user the call's root does not know.
	dir = prepCall(t, c, "nouser")
	out = execCall(t, c, dir, agentrpc.ExecRequest{Argv: []string{"true"}, User: "judge"})
	endCall(t, c, "nouser")
	if out.exit.Code != 126 || !strings.Contains(out.exit.Error, "judge") {
		t.Errorf("unknown user: %s", out)
	}
}

// TestCallOutputsAreConfined: the edge reads what a call wrote through the agent, which follows
// none of the call's symbolic links (they could lead to another call's files), and opens a call's
// files only while its command is not running.
func TestCallOutputsAreConfined(t *testing.T) {
	e := newTestEnv(t, nil)
	_, c := e.callsSandbox("calls-9")
	ctx := context.Background()
	victim := prepCall(t, c, "victim")
	if _, err := c.WriteFile(ctx, victim+"/upper/secret", strings.NewReader("secret"), agentrpc.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := prepCall(t, c, "thief")
	out := execCall(t, c, dir, agentrpc.ExecRequest{Argv: []string{fmt.Sprintf(
		"echo mine > /out && ln -s %[1]s/upper/secret /link && ln -s %[1]s/upper /dir", victim)}, Shell: true})
	if out.exit.Code != 0 {
		t.Fatalf("call: %s", out)
	}
	read := func(p string) (string, error) {
		rc, _, err := c.ReadFile(ctx, p)
		if err != nil {
			return "", err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		return string(b), err
	}
	if got, err := read(dir + "/upper/out"); err != nil || got != "mine\n" {
		t.Errorf("output = %q, %v", got, err)
	}
	for _, p := range []string{"/upper/link", "/upper/dir/secret"} {
		if got, err := read(dir + p); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("read %s = %q, %v; want denied", p, got, err)
		}
	}
	endCall(t, c, "thief")

	dir = prepCall(t, c, "running")
	info, err := c.Start(ctx, agentrpc.ExecRequest{Argv: []string{"sleep", "1000"}, Call: &agentrpc.CallSpec{Dir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, dir+"/upper"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Stat in a running call: %v, want conflict", err)
	}
	endCall(t, c, "running")
	if ci, err := c.Command(ctx, info.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the ended call's command is still kept: %+v, %v", ci, err)
	}
	endCall(t, c, "victim")
}

// TestCallUsage: a call's exit reports its CPU time and peak memory.
func TestCallUsage(t *testing.T) {
	e := newTestEnv(t, nil)
	_, c := e.callsSandbox("calls-5")
	// A busy loop, and an awk that holds a 30 MB string (the shell waits for it, so its
	// peak is the command's).
	out := shCall(t, c, "busy", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; awk 'BEGIN { s = sprintf(\"%30000000s\", \"\"); print length(s) }' >/dev/null")
	if x := out.exit; x.CPUTime < 50*time.Millisecond || x.CPUTime > time.Minute {
		t.Errorf("CPUTime = %v, want a busy loop's", x.CPUTime)
	}
	if x := out.exit; x.MaxRSS < 30e6 || x.MaxRSS > 256<<20 {
		t.Errorf("MaxRSS = %d, want awk's 30 MB and a little", x.MaxRSS)
	}
	// Another call in the same helper reports its own usage, not the first one's.
	out = shCall(t, c, "idle", "true")
	if x := out.exit; x.CPUTime > 40*time.Millisecond || x.MaxRSS > 16<<20 {
		t.Errorf("second call's usage = %v, %d bytes; want a true's", x.CPUTime, x.MaxRSS)
	}
}

// TestCallsOnly: a calls agent refuses plain commands; a sandbox without Calls refuses calls and
// its commands still lack CAP_SYS_ADMIN.
func TestCallsOnly(t *testing.T) {
	e := newTestEnv(t, nil)
	_, c := e.callsSandbox("calls-6")
	ctx := context.Background()
	if _, err := c.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("plain Exec in a calls sandbox: %v, want invalid", err)
	}
	if _, err := c.Start(ctx, agentrpc.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("plain Start in a calls sandbox: %v, want invalid", err)
	}
	if _, err := c.CallEnd(ctx, "nosuch"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("CallEnd of an unknown call: %v, want not found", err)
	}
	dir := prepCall(t, c, "twice")
	if _, err := c.CallPrep(ctx, "twice", 1<<20); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second CallPrep: %v, want conflict", err)
	}
	execCall(t, c, dir, agentrpc.ExecRequest{Argv: []string{"true"}})
	if _, err := c.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"true"}, Call: &agentrpc.CallSpec{Dir: dir}}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second command in a call: %v, want conflict", err)
	}
	endCall(t, c, "twice")
	if _, err := c.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"true"}, Call: &agentrpc.CallSpec{Dir: dir}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("command in an ended call: %v, want not found", err)
	}
	if _, err := c.CallEnd(ctx, "twice"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second CallEnd: %v, want not found", err)
	}

	// A normal sandbox with the same agent.
	s := e.spec("normal-1")
	s.AgentPath = buildRealAgent(t)
	s.AgentArgs = []string{"serve", "--fd", "3"}
	sb := e.create(s)
	nc := agentrpc.NewClient(sb.AgentSocket)
	if got := agentRun(t, nc, "sh", "-c", "grep ^CapBnd: /proc/self/status"); strings.Contains(got, "CapBnd:\t00000000002") {
		t.Errorf("normal sandbox: %s", got)
	}
	if _, err := nc.CallPrep(ctx, "x", 1<<20); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("CallPrep in a normal sandbox: %v, want invalid", err)
	}
	if _, err := nc.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"true"}, Call: &agentrpc.CallSpec{Dir: "/.corral-calls/x"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("call in a normal sandbox: %v, want invalid", err)
	}
}

// TestCallEndFindsLeftovers: a process in the container's own PID namespace (here one started
// from the host with runc exec, as an escape would be) makes CallEnd unclean, and is killed.
func TestCallEndFindsLeftovers(t *testing.T) {
	e := newTestEnv(t, nil)
	sb, c := e.callsSandbox("calls-7")
	dir := prepCall(t, c, "victim")
	execCall(t, c, dir, agentrpc.ExecRequest{Argv: []string{"true"}})
	// No pipes: the detached process would hold them open.
	if err := e.r.runcCmd(context.Background(), "exec", "--detach", sb.ID, "/bin/sleep", "1000").Run(); err != nil {
		t.Fatalf("runc exec: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.ContainsFunc(sandboxProcesses(e, sb.ID), func(p string) bool { return strings.HasSuffix(p, "(sleep)") }) {
		if time.Now().After(deadline) {
			t.Fatalf("no sleep in the sandbox: %q", sandboxProcesses(e, sb.ID))
		}
		time.Sleep(5 * time.Millisecond)
	}
	ce, err := c.CallEnd(context.Background(), "victim")
	if err != nil {
		t.Fatal(err)
	}
	if ce.Clean || len(ce.Problems) != 1 || !strings.HasPrefix(ce.Problems[0], "leftover process ") || !strings.HasSuffix(ce.Problems[0], " sleep") {
		t.Errorf("CallEnd = %+v, want unclean with the leftover sleep", ce)
	}
	if procs := waitCallLeftovers(e, sb); len(procs) != 0 {
		t.Errorf("processes after CallEnd: %q, want the agent and a spare helper", procs)
	}
}

// BenchmarkCallTrue measures the fncall tier's overhead with the real agent: a call of /bin/true
// from CallPrep through Exec (to its exit event) to CallEnd, each a round trip through the client
// (call: p50-µs, p99-µs, and the median of each step), against the same Exec of /bin/true in a
// sandbox without calls (exec). call-parallel and exec-parallel run them from GOMAXPROCS
// goroutines at once in one container and report calls/s and execs/s. Run it with
//
//	go test ./internal/runtime/runc -run '^$' -bench CallTrue -benchtime 200x
func BenchmarkCallTrue(b *testing.B) {
	e := newTestEnv(b, nil)
	_, c := e.callsSandbox("bench-calls")
	ctx := context.Background()
	req := agentrpc.ExecRequest{Argv: []string{"/bin/true"}}
	b.Run("call", func(b *testing.B) {
		var total, prep, exec, end []time.Duration
		for i := 0; b.Loop(); i++ {
			id := "b" + strconv.Itoa(i)
			t0 := time.Now()
			dir := prepCall(b, c, id)
			t1 := time.Now()
			out := execCall(b, c, dir, req)
			t2 := time.Now()
			endCall(b, c, id)
			t3 := time.Now()
			if out.exit.Code != 0 {
				b.Fatalf("call: %s", out)
			}

			total, prep, exec, end = append(total, t3.Sub(t0)), append(prep, t1.Sub(t0)), append(exec, t2.Sub(t1)), append(end, t3.Sub(t2))
		}
		reportLatency(b, total, "")
		reportLatency(b, prep, "prep-")
		reportLatency(b, exec, "exec-")
		reportLatency(b, end, "end-")
	})
	b.Run("call-one-trip", func(b *testing.B) {
		var total []time.Duration
		for i := 0; b.Loop(); i++ {
			t0 := time.Now()
			out, ce := oneTripCall(b, c, "o"+strconv.Itoa(i), nil, req)
			if out.exit.Code != 0 || !ce.Clean {
				b.Fatalf("call: %s, end %+v", out, ce)
			}
			total = append(total, time.Since(t0))
		}
		reportLatency(b, total, "")
	})
	b.Run("call-parallel", func(b *testing.B) {
		var n sync.Mutex
		next := 0
		// One per GOMAXPROCS: as many as idle helpers are kept (maxIdleHelpers).
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				n.Lock()
				id := "p" + strconv.Itoa(next)
				next++
				n.Unlock()
				dir := prepCall(b, c, id)
				if out := execCall(b, c, dir, req); out.exit.Code != 0 {
					b.Errorf("call: %s", out)
				}
				endCall(b, c, id)
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
	})
	s := e.spec("bench-exec")
	s.AgentPath = buildRealAgent(b)
	s.AgentArgs = []string{"serve", "--fd", "3"}
	nc := agentrpc.NewClient(e.create(s).AgentSocket)
	b.Run("exec", func(b *testing.B) {
		var total []time.Duration
		for b.Loop() {
			t0 := time.Now()
			st, err := nc.Exec(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			for {
				ev, err := st.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
				if ev.Type == agentrpc.EventExit && ev.Exit.Code != 0 {
					b.Fatalf("exit %+v", ev.Exit)
				}
			}
			st.Close()
			total = append(total, time.Since(t0))
		}
		reportLatency(b, total, "")
	})
	b.Run("exec-parallel", func(b *testing.B) {
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if got := agentRun(b, nc, "/bin/true"); got != "" {
					b.Errorf("true said %q", got)
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "execs/s")
	})
}

// reportLatency reports the median and 99th percentile of lat, in µs, as <prefix>p50-µs and
// <prefix>p99-µs.
func reportLatency(b *testing.B, lat []time.Duration, prefix string) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), prefix+"p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), prefix+"p99-µs")
}
