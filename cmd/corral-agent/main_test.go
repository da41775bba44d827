package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
)

func TestRunUsage(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		out, err string
	}{
		{nil, 2, "", "usage"},
		{[]string{"version"}, 0, "dev", ""},
		{[]string{"bogus"}, 2, "", "unknown command"},
		{[]string{"serve", "--fd", "x"}, 2, "", "invalid value"},
		{[]string{"serve", "--calls=x"}, 2, "", "invalid"},
		// A calls agent must be its sandbox's init: its leftover check owns the PID namespace.
		{[]string{"serve", "--calls"}, 2, "", "--calls needs the agent to be PID 1"},
		// Only a microvm's init keeps CAP_SYS_ADMIN for a claim's hostname.
		{[]string{"serve", "--claimable"}, 2, "", "--claimable is for a microvm's agent"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tt.args, &stdout, &stderr)
		if code != tt.code || !strings.Contains(stdout.String(), tt.out) || !strings.Contains(stderr.String(), tt.err) {
			t.Errorf("run %q = %d, stdout %q, stderr %q; want %d, %q, %q", tt.args, code, stdout.String(), stderr.String(), tt.code, tt.out, tt.err)
		}
	}
}

// buildAgent builds the agent as it ships (static, no cgo) into a directory any uid can read.
func buildAgent(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the agent binary")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	bin := filepath.Join(dir, "corral-agent")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startAgent starts bin as the edge does: listening socket on fd 3, the binary itself on fd 4.
func startAgent(t testing.TB, bin string, cred *syscall.Credential) (*agentrpc.Client, *exec.Cmd) {
	t.Helper()
	sockDir := t.TempDir()
	sock := filepath.Join(sockDir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	lf, err := ul.File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	defer lf.Close()
	bf, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer bf.Close()
	cmd := exec.Command(bin, "serve", "--fd", "3")
	cmd.ExtraFiles = []*os.File{lf, bf}
	cmd.Env = []string{"PATH=/usr/bin:/bin", "SECRET_OF_THE_AGENT=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if stderr.Len() > 0 {
			t.Logf("agent stderr: %s", stderr.String())
		}
	})
	c := agentrpc.NewClient(sock)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Ping(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not answering: %v (stderr %q)", err, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c, cmd
}

func TestAgentBinary(t *testing.T) {
	bin := buildAgent(t)
	t.Run("static", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("binary has a %v program header: not static", p.Type)
			}
		}
	})

	c, cmd := startAgent(t, bin, nil)
	pid := cmd.Process.Pid
	ctx := context.Background()

	t.Run("serves", func(t *testing.T) {
		in, err := c.Ping(ctx)
		if err != nil || in.Pid != pid {
			t.Fatalf("Ping = %+v, %v", in, err)
		}
		s, err := c.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"sh", "-c", "echo $SECRET_OF_THE_AGENT; ls /proc/self/fd"}})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		for {
			ev, err := s.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			out.Write(ev.Data)
		}
		// The agent's environment is the commands' default; only 0-2 (and ls's own) are open.
		if got := strings.Fields(out.String()); len(got) != 5 || got[0] != "1" || got[1] != "0" || got[3] != "2" {
			t.Errorf("command output %q", out.String())
		}
	})

	t.Run("descriptors", func(t *testing.T) {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			fd, _ := strconv.Atoi(e.Name())
			target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
			if err != nil {
				continue // closed since the listing (the agent opens files briefly, e.g. in /proc)
			}
			if target == bin {
				t.Errorf("fd %d still holds the agent binary", fd)
			}
			if fd <= 2 {
				continue
			}
			info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
			if err != nil {
				continue
			}
			var flags int64
			for _, line := range strings.Split(string(info), "\n") {
				if v, ok := strings.CutPrefix(line, "flags:"); ok {
					flags, _ = strconv.ParseInt(strings.TrimSpace(v), 8, 64)
				}
			}
			if flags&syscall.O_CLOEXEC == 0 {
				t.Errorf("fd %d (%s) is not close-on-exec", fd, target)
			}
		}
	})

	t.Run("moves and watches", func(t *testing.T) {
		// The shipped binary's inotify: a watch in place before Watch returns, events as files
		// change, the end when the directory goes; and a move.
		dir := t.TempDir()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		w, err := c.Watch(ctx, dir, true)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		var got []string
		until := func(want string) {
			t.Helper()
			for !slices.Contains(got, want) {
				ev, err := w.Next()
				if err == io.EOF && want == "" {
					return
				}
				if err != nil {
					t.Fatalf("Next after %q: %v", got, err)
				}
				got = append(got, ev.Type+" "+ev.Name)
			}
		}
		os.Mkdir(filepath.Join(dir, "sub"), 0o755)
		until("create sub") // from now on sub is watched too
		os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("x"), 0o644)
		if fi, err := c.Move(ctx, filepath.Join(dir, "sub", "f"), filepath.Join(dir, "g")); err != nil || fi.Size != 1 {
			t.Fatalf("Move = %+v, %v", fi, err)
		}
		os.RemoveAll(dir)
		until("") // the end
		for _, want := range []string{"create sub", "create sub/f", "rename sub/f", "rename g", "remove g", "remove "} {
			if !slices.Contains(got, want) {
				t.Errorf("no %q in %q", want, got)
			}
		}
	})

	t.Run("survives signals", func(t *testing.T) {
		// Every signal but the two no process can catch.
		for i := 1; i <= 64; i++ {
			sig := syscall.Signal(i)
			if sig == syscall.SIGKILL || sig == syscall.SIGSTOP {
				continue
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatalf("signal %v: %v", sig, err)
			}
		}
		// Wait until the kernel has delivered them all.
		deadline := time.Now().Add(5 * time.Second)
		for pendingSignals(t, pid) {
			if time.Now().After(deadline) {
				t.Fatal("signals still pending after 5s")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := c.Ping(ctx); err != nil {
			t.Fatalf("agent gone after signals: %v", err)
		}
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) == 0 || f[0] == "T" || f[0] == "Z" {
			t.Errorf("agent state %q after signals", f)
		}
	})

	t.Run("idle RSS", func(t *testing.T) {
		// Settle after the work above, as an idle sandbox would.
		time.Sleep(500 * time.Millisecond)
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.Atoi(strings.Fields(v)[0])
				t.Logf("idle RSS of the agent: %d KiB", kb)
				if kb > 16<<10 {
					t.Errorf("idle RSS %d KiB, want under 16 MiB", kb)
				}
			}
		}
	})
}

// BenchmarkAgentExecTrue runs /bin/true through the real agent binary, a separate process as in
// production: latency from dial to exit event (p50-µs, p99-µs), and the agent's own CPU time per
// Exec, fork and exec included (agent-cpu-µs/op, from /proc/<pid>/stat; insensitive to other load).
func BenchmarkAgentExecTrue(b *testing.B) {
	bin := buildAgent(b)
	c, cmd := startAgent(b, bin, nil)
	ctx := context.Background()
	exec1 := func() {
		s, err := c.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"/bin/true"}})
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := s.Next(); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
		}
		s.Close()
	}
	exec1() // warm up
	var lat []time.Duration
	cpu0 := procCPU(b, cmd.Process.Pid)
	for b.Loop() {
		t0 := time.Now()
		exec1()
		lat = append(lat, time.Since(t0))
	}
	cpu := procCPU(b, cmd.Process.Pid) - cpu0
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(lat)), "agent-cpu-µs/op")
}

// procCPU returns the user and system time pid has used (clock ticks of 10ms, so measure many runs).
func procCPU(t testing.TB, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// pendingSignals reports whether pid (or one of its threads) has signals not yet delivered.
func pendingSignals(t *testing.T, pid int) bool {
	dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			if (k == "SigPnd" || k == "ShdPnd") && strings.Trim(strings.TrimSpace(v), "0") != "" {
				return true
			}
		}
	}
	return false
}

// TestAgentIsNotDumpable runs the agent as an unprivileged uid and shows that another process of
// the same uid (as a sandbox process would be, lacking CAP_SYS_PTRACE) cannot read its /proc
// files, while it can read those of an ordinary process of that uid.
func TestAgentIsNotDumpable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs the agent and a reader as uid 65534")
	}
	bin := buildAgent(t)
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	_, agent := startAgent(t, bin, nobody)

	control := exec.Command("sleep", "30")
	control.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
	if err := control.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { control.Process.Kill(); control.Wait() }()

	read := func(pid int, file string) error {
		cmd := exec.Command("cat", fmt.Sprintf("/proc/%d/%s", pid, file))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := read(control.Process.Pid, "environ"); err != nil {
		t.Fatalf("control: same uid cannot read an ordinary process's environ: %v", err)
	}
	for _, f := range []string{"environ", "mem", "fd/0"} {
		if err := read(agent.Process.Pid, f); err == nil {
			t.Errorf("uid 65534 read the agent's /proc/%s", f)
		} else if !strings.Contains(err.Error(), "Permission denied") && !errors.Is(err, os.ErrPermission) {
			t.Logf("/proc/%s: %v", f, err)
		}
	}
}

// TestCallInitOnlyFromTheAgent: the call helper refuses to run other than as the init of a PID
// namespace the agent made for it.
func TestCallInitOnlyFromTheAgent(t *testing.T) {
	bin := buildAgent(t)
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "call-init")
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "only the agent starts this") {
		t.Errorf("call-init: %v, stderr %q; want exit 2 refusing", err, stderr.String())
	}
}
