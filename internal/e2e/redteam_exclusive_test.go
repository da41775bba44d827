package e2e

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// exclusiveAttacker is a process an agent leaves running in its sandbox to forge the grader's
// result: every 2ms it looks for processes it has not seen (but PID 1, kernel threads and its own
// process group) and, to each, tries ptrace(PTRACE_ATTACH), writes "PWNED" into its stdout and
// stderr through /proc/PID/fd/1 and /fd/2, and sends SIGKILL. It logs what it did to
// /tmp/attacker.log ("PID write1 ok", "PID ptrace operation not permitted", ...) and counts its
// rounds in /tmp/attacker.ticks, so the test sees whether it runs.
const exclusiveAttacker = `package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	runtime.LockOSThread() // a tracee belongs to the thread that attached
	log, _ := os.OpenFile("/tmp/attacker.log", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	own := syscall.Getpgrp()
	seen := map[string]bool{}
	for round := 1; ; round++ {
		// Replaced whole (a reader through the files API must not see it truncated).
		os.WriteFile("/tmp/attacker.ticks.new", []byte(strconv.Itoa(round)), 0o644)
		os.Rename("/tmp/attacker.ticks.new", "/tmp/attacker.ticks")
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == 1 {
				continue
			}
			b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			pgrp, _ := strconv.Atoi(f[2])
			flags, _ := strconv.ParseUint(f[6], 10, 64)
			key := e.Name() + "/" + f[19]
			if pgrp == own || pgrp == 0 || flags&0x00200000 != 0 || seen[key] {
				continue
			}
			seen[key] = true
			if err := syscall.PtraceAttach(pid); err == nil {
				var ws syscall.WaitStatus
				syscall.Wait4(pid, &ws, 0x40000000, nil) // __WALL: until it stops
				fmt.Fprintf(log, "%d ptrace ok\n", pid)
				syscall.PtraceDetach(pid)
			} else {
				fmt.Fprintf(log, "%d ptrace %v\n", pid, err)
			}
			for _, fd := range []string{"1", "2"} {
				w, err := os.OpenFile("/proc/"+e.Name()+"/fd/"+fd, os.O_WRONLY, 0)
				if err == nil {
					_, err = w.Write([]byte("PWNED\n"))
					w.Close()
				}
				fmt.Fprintf(log, "%d write%s %v\n", pid, fd, err)
			}
			fmt.Fprintf(log, "%d kill %v\n", pid, syscall.Kill(pid, syscall.SIGKILL))
		}
		time.Sleep(2 * time.Millisecond)
	}
}
`

// TestRedTeamExclusive: a process left running in the sandbox attacks every new process (writes
// into its stdout and stderr, kills it, tries to ptrace it). A plain exec is forged or killed;
// an exclusive exec (`corral exec --exclusive`) is untouched, its trajectory step is marked
// exclusive, and the attacker runs again afterwards.
func TestRedTeamExclusive(t *testing.T) { forRuntimes(t, testRedTeamExclusive) }

func testRedTeamExclusive(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	bin := buildStatic(t, "attacker", exclusiveAttacker)
	sb := p.create(corral.CreateRequest{})
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := p.Client.WriteFile(ctx, sb.ID, "/root/attacker", f, corral.WriteFileOptions{Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	// From here on every exec is attacked, so the test reads the sandbox through the files API.
	attacker, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/root/attacker"}})
	if err != nil {
		t.Fatal(err)
	}
	ticks := func() int {
		n, _ := strconv.Atoi(readSandboxFile(t, p, sb.ID, "/tmp/attacker.ticks"))
		return n
	}
	eventually(t, 30*time.Second, "the attacker to run", func() bool { return ticks() > 0 })

	// The victim prints its pid and a known value over a while, and the state it sees the
	// attacker in.
	script := `echo $$; echo one; sleep 0.5; echo two; echo err >&2; cut -d' ' -f3 /proc/` + strconv.Itoa(attacker.Pid) + `/stat; exit 3`

	// The attack is real: a plain exec is forged or killed.
	out, errOut, exit, err := p.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, Timeout: "30s"})
	if err != nil {
		t.Fatal(err)
	}
	if exit.Signal != "SIGKILL" && !strings.Contains(string(out)+string(errOut), "PWNED") {
		t.Fatalf("plain exec under attack: stdout %q stderr %q exit %+v; the attack does not work, so this test proves nothing\nattacker log:\n%s",
			out, errOut, exit, readSandboxFile(t, p, sb.ID, "/tmp/attacker.log"))
	}
	t.Logf("plain exec under attack: stdout %q stderr %q exit %+v; attacker log:\n%s", out, errOut, exit, readSandboxFile(t, p, sb.ID, "/tmp/attacker.log"))

	// An exclusive exec (through the CLI) is its own.
	stdout, stderr, code := p.cli("", "exec", "--exclusive", "--timeout", "1m", sb.ID, "--", "/bin/sh", "-c", script)
	lines := strings.Split(stdout, "\n")
	if len(lines) != 5 || lines[1] != "one" || lines[2] != "two" || lines[3] != "T" || lines[4] != "" || stderr != "err\n" || code != 3 {
		t.Fatalf("exclusive exec under attack: stdout %q stderr %q exit %d; want its pid, one, two, T (the attacker stopped), err on stderr, exit 3\nattacker log:\n%s",
			stdout, stderr, code, readSandboxFile(t, p, sb.ID, "/tmp/attacker.log"))
	}
	victim := lines[0]

	// The attacker runs again afterwards, and never saw the exclusive command.
	n := ticks()
	eventually(t, 30*time.Second, "the attacker to run again", func() bool { return ticks() > n })
	for _, l := range strings.Split(readSandboxFile(t, p, sb.ID, "/tmp/attacker.log"), "\n") {
		if strings.HasPrefix(l, victim+" ") {
			t.Errorf("the attacker reached the exclusive command (pid %s): %q", victim, l)
		}
	}

	// A background command can be exclusive too; while one runs, other execs are refused.
	bg, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"sleep", "2"}, Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	if !bg.Exclusive {
		t.Errorf("background command %+v is not marked exclusive", bg)
	}
	if _, _, _, err := p.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); !corral.IsConflict(err) {
		t.Errorf("plain exec during an exclusive command: %v, want a conflict", err)
	}
	eventually(t, 30*time.Second, "the exclusive background command to end", func() bool {
		c, err := p.Client.Command(ctx, sb.ID, bg.ID)
		return err == nil && c.State == "exited"
	})

	// The trajectory marks those two steps exclusive, and only them.
	steps, err := p.Client.Trajectory(ctx, sb.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var marked []int64
	for _, s := range steps {
		if s.Exclusive {
			marked = append(marked, s.Seq)
			if s.CommandID == bg.ID {
				continue
			}
			if s.Exit == nil || s.Exit.Code != 3 {
				t.Errorf("exclusive step %d exit %+v, want 3", s.Seq, s.Exit)
			}
		}
	}
	if len(marked) != 2 {
		t.Errorf("steps marked exclusive: %v, want two (the exec and the background command)", marked)
	}
}

// readSandboxFile reads a file of the sandbox through the files API (no process runs).
func readSandboxFile(t *testing.T, p *corralProc, id, path string) string {
	t.Helper()
	rc, err := p.Client.ReadFile(context.Background(), id, path)
	if err != nil {
		if corral.IsNotFound(err) {
			return ""
		}
		t.Fatalf("read %s: %v", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

// buildStatic builds a one-file Go program as a static binary and returns its path.
func buildStatic(t *testing.T, name, src string) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+name+"\ngo 1.21\n"), 0o644)
	build := exec.Command("go", "build", "-o", name, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	return filepath.Join(dir, name)
}
