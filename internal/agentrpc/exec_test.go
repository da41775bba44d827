package agentrpc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestExecSeparatesStdoutAndStderr(t *testing.T) {
	c, _ := startServer(t, nil)
	r := run(t, c, ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; printf more"}})
	if got := r.stdout.String(); got != "out\nmore" {
		t.Errorf("stdout = %q, want %q", got, "out\nmore")
	}
	if got := r.stderr.String(); got != "err\n" {
		t.Errorf("stderr = %q, want %q", got, "err\n")
	}
	if r.exit.Code != 0 || r.exit.Signal != "" {
		t.Errorf("exit = %+v, want code 0", r.exit)
	}
	// Offsets count both streams together, in order.
	var next int64
	for _, ev := range r.events {
		if ev.Offset != next {
			t.Errorf("event %s at offset %d, want %d", ev.Type, ev.Offset, next)
		}
		next += int64(len(ev.Data))
	}
	if next != int64(len("out\nerr\nmore")) {
		t.Errorf("exit at %d", next)
	}
}

func TestExecExitCodesAndSignals(t *testing.T) {
	c, _ := startServer(t, nil)
	tests := []struct {
		name string
		req  ExecRequest
		want Exit
	}{
		{"zero", ExecRequest{Argv: []string{"true"}}, Exit{Code: 0}},
		{"nonzero", ExecRequest{Argv: []string{"sh", "-c", "exit 3"}}, Exit{Code: 3}},
		{"killed by signal", ExecRequest{Argv: []string{"sh", "-c", "kill -TERM $$"}}, Exit{Code: -1, Signal: "SIGTERM"}},
		{"shell mode", ExecRequest{Argv: []string{"exit 7"}, Shell: true}, Exit{Code: 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, c, tt.req)
			got := *r.exit
			// Every command that ran reports its usage (checked in TestExecUsage).
			got.CPUTime, got.MaxRSS = 0, 0
			if got != tt.want {
				t.Errorf("exit = %+v, want %+v", *r.exit, tt.want)
			}
		})
	}
}

func TestExecStartFailuresAreExitEvents(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "script")
	os.WriteFile(notExec, []byte("#!/bin/sh\necho hi\n"), 0o644)
	noInterp := filepath.Join(dir, "nointerp")
	os.WriteFile(noInterp, []byte("#!/nonexistent/interp\n"), 0o755)
	c, _ := startServer(t, func(cfg *Config) { cfg.EtcDir = writeEtc(t, testPasswd, testGroup) })
	tests := []struct {
		name     string
		req      ExecRequest
		code     int
		contains string
	}{
		{"missing program", ExecRequest{Argv: []string{"no-such-program-xyz"}}, 127, "not found in $PATH"},
		{"missing path", ExecRequest{Argv: []string{"/no/such/program"}}, 127, "no such file"},
		{"not executable", ExecRequest{Argv: []string{notExec}}, 126, "permission denied"},
		{"directory", ExecRequest{Argv: []string{dir}}, 126, "is a directory"},
		{"missing interpreter", ExecRequest{Argv: []string{noInterp}}, 127, "no such file"},
		{"bad cwd", ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"}, 126, "cwd /no/such/dir"},
		{"cwd is a file", ExecRequest{Argv: []string{"true"}, Cwd: notExec}, 126, "not a directory"},
		{"bad user", ExecRequest{Argv: []string{"true"}, User: "mallory"}, 126, `user "mallory" not found`},
		{"bad group", ExecRequest{Argv: []string{"true"}, User: "alice:nogroup"}, 126, `group "nogroup" not found`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := c.Exec(testCtx(t), tt.req)
			if err != nil {
				t.Fatalf("Exec returned %v; a start failure must be an exit event", err)
			}
			defer s.Close()
			if s.Info().State != CommandExited || s.Info().Pid != 0 {
				t.Errorf("Info = %+v, want exited without pid", s.Info())
			}
			r := drain(t, s)
			if r.exit == nil || r.exit.Code != tt.code || !strings.Contains(r.exit.Error, tt.contains) {
				t.Errorf("exit = %+v, want code %d and error containing %q", r.exit, tt.code, tt.contains)
			}
			if len(r.events) != 1 {
				t.Errorf("got %d events, want only the exit", len(r.events))
			}
		})
	}
}

func TestExecRejectsInvalidRequests(t *testing.T) {
	c, _ := startServer(t, nil)
	tests := []struct {
		name  string
		req   ExecRequest
		field string
	}{
		{"empty argv", ExecRequest{}, "argv"},
		{"shell with two args", ExecRequest{Argv: []string{"echo", "x"}, Shell: true}, "argv"},
		{"bad env", ExecRequest{Argv: []string{"true"}, Env: []string{"NOEQUALS"}}, "env"},
		{"negative timeout", ExecRequest{Argv: []string{"true"}, Timeout: -1}, "timeout"},
		{"huge output limit", ExecRequest{Argv: []string{"true"}, OutputLimit: 1 << 40}, "output_limit"},
		{"rows without tty", ExecRequest{Argv: []string{"true"}, Rows: 10}, "rows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Exec(testCtx(t), tt.req)
			if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != tt.field {
				t.Errorf("got %v (field %q), want ErrInvalid on %q", err, errdefs.Field(err), tt.field)
			}
			_, err = c.Start(testCtx(t), tt.req)
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Start: got %v, want ErrInvalid", err)
			}
		})
	}
}

func TestExecEnvCwdAndPath(t *testing.T) {
	bin := t.TempDir()
	os.WriteFile(filepath.Join(bin, "hello-corral"), []byte("#!/bin/sh\necho found \"$FOO\"\n"), 0o755)
	work := t.TempDir()
	c, _ := startServer(t, func(cfg *Config) {
		cfg.Env = []string{"PATH=/usr/bin:/bin", "FOO=default", "KEEP=kept"}
		cfg.EtcDir = writeEtc(t, testPasswd, testGroup)
	})
	r := run(t, c, ExecRequest{
		Argv: []string{"sh", "-c", `echo "$FOO $KEEP $HOME"; pwd`},
		Env:  []string{"FOO=first", "FOO=override"}, Cwd: work,
	})
	if want := "override kept /root\n" + work + "\n"; r.stdout.String() != want {
		t.Errorf("stdout = %q, want %q", r.stdout.String(), want)
	}
	// argv[0] is looked up in the command's PATH, not the agent's.
	r = run(t, c, ExecRequest{Argv: []string{"hello-corral"}, Env: []string{"PATH=" + bin}})
	if r.stdout.String() != "found default\n" || r.exit.Code != 0 {
		t.Errorf("PATH lookup: stdout %q exit %+v", r.stdout.String(), r.exit)
	}
	// The default cwd is the user's home, or / when it does not exist.
	r = run(t, c, ExecRequest{Argv: []string{"pwd"}, User: "0"})
	if got := strings.TrimSpace(r.stdout.String()); got != "/root" && got != "/" {
		t.Errorf("default cwd = %q", got)
	}
}

func TestExecStdin(t *testing.T) {
	c, _ := startServer(t, nil)
	t.Run("request bytes then EOF", func(t *testing.T) {
		r := run(t, c, ExecRequest{Argv: []string{"cat"}, Stdin: []byte("from request\n")})
		if r.stdout.String() != "from request\n" || r.exit.Code != 0 {
			t.Errorf("stdout %q exit %+v", r.stdout.String(), r.exit)
		}
	})
	t.Run("no stdin is EOF", func(t *testing.T) {
		r := run(t, c, ExecRequest{Argv: []string{"cat"}})
		if r.stdout.Len() != 0 || r.exit.Code != 0 {
			t.Errorf("stdout %q exit %+v", r.stdout.String(), r.exit)
		}
	})
	t.Run("session writer", func(t *testing.T) {
		s, err := c.Exec(testCtx(t), ExecRequest{Argv: []string{"cat"}, Stdin: []byte("a"), KeepStdinOpen: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := io.WriteString(s.Stdin(), "b"); err != nil {
			t.Fatal(err)
		}
		if err := s.Stdin().Close(); err != nil {
			t.Fatal(err)
		}
		r := drain(t, s)
		if r.stdout.String() != "ab" || r.exit.Code != 0 {
			t.Errorf("stdout %q exit %+v", r.stdout.String(), r.exit)
		}
	})
	t.Run("large request stdin is streamed", func(t *testing.T) {
		big := strings.Repeat("0123456789abcdef", 200<<10) // 3.2 MiB, beyond one frame
		r := run(t, c, ExecRequest{Argv: []string{"wc", "-c"}, Stdin: []byte(big)})
		if got := strings.TrimSpace(r.stdout.String()); got != strconv.Itoa(len(big)) || r.exit.Code != 0 {
			t.Errorf("wc -c = %q, want %d (exit %+v)", got, len(big), r.exit)
		}
		_, err := c.Start(testCtx(t), ExecRequest{Argv: []string{"cat"}, Stdin: []byte(big)})
		if !errors.Is(err, errdefs.ErrTooLarge) {
			t.Errorf("Start with large stdin: %v, want ErrTooLarge", err)
		}
	})
	t.Run("WriteStdin by id", func(t *testing.T) {
		ctx := testCtx(t)
		info, err := c.Start(ctx, ExecRequest{Argv: []string{"cat"}, KeepStdinOpen: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.WriteStdin(ctx, info.ID, strings.NewReader("one "), false); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteStdin(ctx, info.ID, strings.NewReader(strings.Repeat("x", 200<<10)), true); err != nil {
			t.Fatal(err)
		}
		st, err := c.Attach(ctx, info.ID, 0, true)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		r := drain(t, st)
		if r.stdout.Len() != 4+200<<10 || !strings.HasPrefix(r.stdout.String(), "one x") || r.exit.Code != 0 {
			t.Errorf("stdout %d bytes %q..., exit %+v", r.stdout.Len(), r.stdout.String()[:8], r.exit)
		}
		err = c.WriteStdin(ctx, info.ID, strings.NewReader("late"), false)
		if !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("WriteStdin after close: %v, want ErrConflict", err)
		}
	})
}

func TestExecTimeoutKillsProcessGroup(t *testing.T) {
	c, _ := startServer(t, func(cfg *Config) { cfg.ExitGrace = 10 * time.Second })
	start := time.Now()
	// The background sleep is in the same process group and must die too (else the pipes stay
	// open until the exit grace).
	r := run(t, c, ExecRequest{Argv: []string{"sh", "-c", "sleep 30 & sleep 30"}, Timeout: 200 * time.Millisecond})
	if !r.exit.TimedOut || r.exit.Signal != "SIGKILL" || r.exit.Code != -1 {
		t.Errorf("exit = %+v, want timed out by SIGKILL", r.exit)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v: the background sleep was not killed (the 10s exit grace was used)", d)
	}
}

func TestExecSignal(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	s, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "trap 'echo got USR1; exit 4' USR1; echo ready; while :; do sleep 0.01; done"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ev, err := s.Next(); err != nil || string(ev.Data) != "ready\n" {
		t.Fatalf("first event %+v, %v", ev, err)
	}
	if err := c.Signal(ctx, s.Info().ID, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	r := drain(t, s)
	if r.stdout.String() != "got USR1\n" || r.exit.Code != 4 {
		t.Errorf("stdout %q exit %+v", r.stdout.String(), r.exit)
	}
	if err := c.Signal(ctx, s.Info().ID, syscall.SIGTERM); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Signal after exit: %v, want ErrConflict", err)
	}
	if err := c.Signal(ctx, "nope", syscall.SIGTERM); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Signal unknown id: %v, want ErrNotFound", err)
	}
	if err := c.Signal(ctx, s.Info().ID, 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Signal 0: %v, want ErrInvalid", err)
	}
}

func TestExecConcurrentSessions(t *testing.T) {
	c, _ := startServer(t, nil)
	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, n)
	// Readers of the command table run while commands start and end (for the race detector).
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			c.Commands(testCtx(t))
			c.Ping(testCtx(t))
		}
	})
	defer func() { close(stop); readers.Wait() }()
	for i := 0; i < n; i++ {
		wg.Go(func() {
			s, err := c.Exec(testCtx(t), ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("sleep 0.1; echo %d; echo e%d >&2; exit %d", i, i, i)}})
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			var out, errOut strings.Builder
			for {
				ev, err := s.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					errs <- err
					return
				}
				switch ev.Type {
				case EventStdout:
					out.Write(ev.Data)
				case EventStderr:
					errOut.Write(ev.Data)
				case EventExit:
					if ev.Exit.Code != i {
						errs <- fmt.Errorf("session %d: exit %d", i, ev.Exit.Code)
					}
				}
			}
			if out.String() != fmt.Sprintf("%d\n", i) || errOut.String() != fmt.Sprintf("e%d\n", i) {
				errs <- fmt.Errorf("session %d: stdout %q stderr %q", i, out.String(), errOut.String())
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestExecPTYAndResize(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	s, err := c.Exec(ctx, ExecRequest{
		Argv: []string{"sh", "-c", "stty size; test -t 0 && echo tty; read line; stty size; echo \"$TERM\""},
		TTY:  true, Rows: 30, Cols: 100, KeepStdinOpen: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out strings.Builder
	for !strings.Contains(out.String(), "tty") {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("before resize: %v (output %q)", err, out.String())
		}
		if ev.Type == EventStderr {
			t.Errorf("a TTY command produced a stderr event")
		}
		out.Write(ev.Data)
	}
	if !strings.HasPrefix(out.String(), "30 100\r\n") {
		t.Errorf("initial size output %q, want 30 100", out.String())
	}
	if err := c.Resize(ctx, s.Info().ID, 50, 132); err != nil {
		t.Fatal(err)
	}
	io.WriteString(s.Stdin(), "go\n")
	r := drain(t, s)
	if got := r.stdout.String(); !strings.Contains(got, "50 132\r\n") || !strings.Contains(got, "xterm-256color") {
		t.Errorf("after resize: %q", got)
	}
	if r.exit.Code != 0 {
		t.Errorf("exit %+v", r.exit)
	}
	if err := c.Resize(ctx, s.Info().ID, 10, 10); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Resize after exit: %v, want ErrConflict", err)
	}
	info, _ := c.Start(ctx, ExecRequest{Argv: []string{"true"}})
	if err := c.Resize(ctx, info.ID, 10, 10); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Resize without tty: %v, want ErrInvalid", err)
	}
}

// TestOutputCapWithYes runs yes with a 1 MiB limit until it has produced many times that: the
// agent keeps at most the limit, readers learn of the drop, and memory does not grow with the output.
func TestOutputCapWithYes(t *testing.T) {
	c, srv := startServer(t, nil)
	ctx := testCtx(t)
	const limit = 1 << 20
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	info, err := c.Start(ctx, ExecRequest{Argv: []string{"yes"}, OutputLimit: limit})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "yes to produce 32 MiB", 20*time.Second, func() bool {
		ci, err := c.Command(ctx, info.ID)
		return err == nil && ci.OutputEnd > 32<<20
	})
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	if grew := int64(during.HeapInuse) - int64(before.HeapInuse); grew > 8*limit {
		t.Errorf("heap grew by %d bytes while yes wrote 32 MiB with a %d byte cap", grew, limit)
	}
	cmd, _ := srv.lookup(info.ID)
	if mem := cmd.out.memory(); mem > limit+limit/16 {
		t.Errorf("output holds %d bytes, cap %d", mem, limit)
	}
	ci, _ := c.Command(ctx, info.ID)
	if ci.OutputStart == 0 || ci.OutputEnd-ci.OutputStart > limit {
		t.Errorf("kept [%d, %d), want a window of at most %d", ci.OutputStart, ci.OutputEnd, limit)
	}
	// A reader from 0 is told what was dropped, then gets what is kept.
	st, err := c.Attach(ctx, info.ID, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Next()
	if err != nil || ev.Type != EventTruncated || ev.Dropped != ev.Offset || ev.Offset < ci.OutputStart {
		t.Errorf("first event %+v, %v; want truncated with Dropped == Offset >= %d", ev, err, ci.OutputStart)
	}
	// yes keeps writing while the reader catches up, so the window may move on again before the
	// first bytes reach it: each further drop is announced the same way, further on.
	for last := ev.Offset; err == nil; last = ev.Offset {
		if ev, err = st.Next(); err != nil || ev.Type != EventTruncated {
			break
		}
		if ev.Offset <= last || ev.Dropped != ev.Offset-last {
			t.Errorf("later truncated event %+v after offset %d", ev, last)
		}
	}
	if err != nil || ev.Type != EventStdout || !strings.HasPrefix(string(ev.Data), "y\n") && !strings.HasPrefix(string(ev.Data), "\ny") {
		t.Errorf("first data event %+v, %v", ev.Type, err)
	}
	st.Close()
	if err := c.Signal(ctx, info.ID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "yes to exit", 5*time.Second, func() bool {
		ci, err := c.Command(ctx, info.ID)
		return err == nil && ci.State == CommandExited
	})
	if ci, _ := c.Command(ctx, info.ID); ci.Exit.Signal != "SIGKILL" || ci.Exit.OOMKilled {
		t.Errorf("exit %+v", ci.Exit)
	}
}

// TestSlowReaderDoesNotBlock attaches a reader that never reads while a command writes far more
// than the socket buffers: the command still finishes, and another reader gets the exit.
func TestSlowReaderDoesNotBlock(t *testing.T) {
	c, _ := startServer(t, func(cfg *Config) { cfg.OutputLimit = 256 << 10 })
	ctx := testCtx(t)
	info, err := c.Start(ctx, ExecRequest{Argv: []string{"sh", "-c", "read x; head -c 20000000 /dev/zero"}, KeepStdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	stuck, err := c.Attach(ctx, info.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close() // never read
	if err := c.WriteStdin(ctx, info.ID, strings.NewReader("go\n"), true); err != nil {
		t.Fatal(err)
	}
	st, err := c.Attach(ctx, info.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := drain(t, st)
	if r.exit.Code != 0 {
		t.Errorf("exit %+v", r.exit)
	}
	var total int64
	for _, ev := range r.events {
		total += int64(len(ev.Data)) + ev.Dropped
	}
	if total != 20000000 {
		t.Errorf("data + dropped = %d, want 20000000", total)
	}
}

// TestAttachAfterDisconnect hangs up an Exec session mid-command and reattaches by id.
func TestAttachAfterDisconnect(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	s, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "echo one; read x; echo two; echo three >&2"}, KeepStdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	id := s.Info().ID
	if s.Info().Pid == 0 || s.Info().State != CommandRunning {
		t.Errorf("Info = %+v", s.Info())
	}
	if ev, err := s.Next(); err != nil || string(ev.Data) != "one\n" {
		t.Fatalf("first event %+v, %v", ev, err)
	}
	s.Close() // hang up: the command keeps running, its stdin stays open

	ci, err := c.Command(ctx, id)
	if err != nil || ci.State != CommandRunning {
		t.Fatalf("after hang-up: %+v, %v", ci, err)
	}
	// Without follow, a running command's stream ends at the current end, without exit.
	st, err := c.Attach(ctx, id, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	r := drain(t, st)
	st.Close()
	if r.stdout.String() != "one\n" || r.exit != nil {
		t.Errorf("no-follow attach: stdout %q exit %+v", r.stdout.String(), r.exit)
	}
	if err := c.WriteStdin(ctx, id, strings.NewReader("\n"), true); err != nil {
		t.Fatal(err)
	}
	// Follow from an offset in the middle of the first line.
	st, err = c.Attach(ctx, id, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	r = drain(t, st)
	st.Close()
	if r.stdout.String() != "e\ntwo\n" || r.stderr.String() != "three\n" || r.exit == nil || r.exit.Code != 0 {
		t.Errorf("attach from 2: stdout %q stderr %q exit %+v", r.stdout.String(), r.stderr.String(), r.exit)
	}
	if r.events[0].Offset != 2 {
		t.Errorf("first event at %d, want 2", r.events[0].Offset)
	}
	// After the exit, attach replays everything and ends with the exit.
	st, err = c.Attach(ctx, id, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	r = drain(t, st)
	st.Close()
	if r.stdout.String() != "one\ntwo\n" || r.exit == nil || st.Info().State != CommandExited {
		t.Errorf("replay: %q %+v %+v", r.stdout.String(), r.exit, st.Info())
	}
	if _, err := c.Attach(ctx, id, 1000, true); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("offset past the end: %v, want ErrInvalid", err)
	}
	if _, err := c.Attach(ctx, "unknown", 0, true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown id: %v, want ErrNotFound", err)
	}
}

func TestStartAndCommands(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	info, err := c.Start(ctx, ExecRequest{Argv: []string{"sleep", "30"}, Tag: "step-1"})
	if err != nil {
		t.Fatal(err)
	}
	if info.ID == "" || info.Pid == 0 || info.State != CommandRunning || info.Tag != "step-1" {
		t.Errorf("Start = %+v", info)
	}
	failed, err := c.Start(ctx, ExecRequest{Argv: []string{"no-such-program-xyz"}})
	if err != nil || failed.State != CommandExited || failed.Exit == nil || failed.Exit.Code != 127 {
		t.Errorf("Start of a missing program = %+v, %v", failed, err)
	}
	list, err := c.Commands(ctx)
	if err != nil || len(list) != 2 || list[0].ID != info.ID || list[1].ID != failed.ID {
		t.Fatalf("Commands = %+v, %v", list, err)
	}
	in, err := c.Ping(ctx)
	if err != nil || in.Commands != 2 || in.Running != 1 || in.Pid != os.Getpid() {
		t.Errorf("Ping = %+v, %v", in, err)
	}
	if _, err := c.Command(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Command(unknown) = %v, want ErrNotFound", err)
	}
	c.Signal(ctx, info.ID, syscall.SIGKILL)
}

// TestExitWaitsForOutputButNotForeverForDescendants: output written before the exit is all
// delivered; a background descendant holding the pipes delays the exit only by the grace.
func TestExitWaitsForOutputButNotForeverForDescendants(t *testing.T) {
	c, _ := startServer(t, func(cfg *Config) { cfg.ExitGrace = 300 * time.Millisecond })
	r := run(t, c, ExecRequest{Argv: []string{"sh", "-c", "head -c 300000 /dev/zero; echo done"}})
	if r.stdout.Len() != 300005 {
		t.Errorf("got %d bytes, want 300005", r.stdout.Len())
	}
	start := time.Now()
	r = run(t, c, ExecRequest{Argv: []string{"sh", "-c", "sleep 5 & echo hi"}})
	d := time.Since(start)
	if r.stdout.String() != "hi\n" || r.exit.Code != 0 {
		t.Errorf("stdout %q exit %+v", r.stdout.String(), r.exit)
	}
	if d < 250*time.Millisecond || d > 4500*time.Millisecond {
		t.Errorf("exit after %v, want about the 300ms grace (not the 5s of the background sleep)", d)
	}
}

// TestReapsOrphans runs commands that leave orphans behind; they reparent to the test process
// (a subreaper, as the agent is PID 1) and must not stay zombies.
func TestReapsOrphans(t *testing.T) {
	c, _ := startServer(t, nil)
	for i := 0; i < 5; i++ {
		run(t, c, ExecRequest{Argv: []string{"sh", "-c", "(sleep 0.05 &) ; (true &) ; exit 0"}})
	}
	waitFor(t, "orphans to be reaped", 5*time.Second, func() bool { return len(zombieChildren(t)) == 0 })
}

// zombieChildren lists the pids of this process's children that are zombies.
func zombieChildren(t testing.TB) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
		var state string
		var ppid int
		fmt.Sscan(rest, &state, &ppid)
		if ppid == self && state == "Z" {
			out = append(out, pid)
		}
	}
	return out
}

func TestRetentionForgetsOldExitedCommands(t *testing.T) {
	c, _ := startServer(t, func(cfg *Config) { cfg.RetainExited = 2; cfg.RetainFor = 2 * time.Second })
	ctx := testCtx(t)
	var ids []string
	for i := 0; i < 3; i++ {
		s, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		drain(t, s)
		s.Close()
		ids = append(ids, s.Info().ID)
	}
	if _, err := c.Command(ctx, ids[0]); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("oldest of 3 exited with RetainExited 2: %v, want ErrNotFound", err)
	}
	if _, err := c.Command(ctx, ids[2]); err != nil {
		t.Errorf("newest: %v", err)
	}
	waitFor(t, "RetainFor to expire", 10*time.Second, func() bool {
		_, err := c.Command(ctx, ids[2])
		return errors.Is(err, errdefs.ErrNotFound)
	})
}

func TestUserSwitching(t *testing.T) {
	needRoot(t, "setuid/setgid/setgroups of commands")
	etc := writeEtc(t, testPasswd+"corraltest:x:12345:12345::/nonexistent:/bin/sh\n",
		testGroup+"corraltest:x:12345:\nextra:x:23456:corraltest\n")
	c, _ := startServer(t, func(cfg *Config) { cfg.EtcDir = etc })
	tests := []struct {
		user string
		want string
	}{
		{"corraltest", "12345 12345 12345 23456 /nonexistent /"},
		{"corraltest:2000", "12345 2000 2000 23456 /nonexistent /"},
		{"54321:54322", "54321 54322 54322 / /"},
		{"", "0 0 0 /root /root"},
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			r := run(t, c, ExecRequest{Argv: []string{"sh", "-c", `echo $(id -u) $(id -g) $(id -G) $HOME $(pwd)`}, User: tt.user})
			got := strings.TrimSpace(r.stdout.String())
			if tt.user == "" {
				// root's supplementary groups are the test process's own; check uid, gid and home.
				f := strings.Fields(got)
				if len(f) < 3 || f[0] != "0" || f[1] != "0" {
					t.Errorf("root: got %q", got)
				}
				return
			}
			if got != tt.want {
				t.Errorf("got %q, want %q (stderr %q)", got, tt.want, r.stderr.String())
			}
		})
	}
}

func TestChildrenDoNotInheritAgentDescriptors(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	info, err := c.Start(ctx, ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Signal(ctx, info.ID, syscall.SIGKILL)
	// The dynamic loader holds libraries open for a moment after exec; an inherited descriptor
	// would stay.
	var fds []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", info.Pid))
		if err != nil {
			t.Fatal(err)
		}
		fds = fds[:0]
		for _, e := range ents {
			target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", info.Pid, e.Name()))
			fds = append(fds, e.Name()+"="+target)
		}
		if len(fds) == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(fds) != 3 || !strings.HasPrefix(fds[0], "0=") || !strings.HasPrefix(fds[1], "1=") || !strings.HasPrefix(fds[2], "2=") {
		t.Errorf("command has fds %v, want only 0, 1 and 2", fds)
	}
}

func TestChildOOMScoreAdjIsReset(t *testing.T) {
	needRoot(t, "lowering oom_score_adj back to 0 needs CAP_SYS_RESOURCE")
	orig, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Skip("no /proc/self/oom_score_adj")
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-500"), 0); err != nil {
		t.Skipf("cannot set own oom_score_adj: %v", err)
	}
	defer os.WriteFile("/proc/self/oom_score_adj", orig, 0)
	c, _ := startServer(t, nil)
	r := run(t, c, ExecRequest{Argv: []string{"cat", "/proc/self/oom_score_adj"}})
	if got := strings.TrimSpace(r.stdout.String()); got != "0" {
		t.Errorf("command's oom_score_adj = %q, want 0 (agent at -500)", got)
	}
}

func TestOOMKillIsReportedFromMemoryEvents(t *testing.T) {
	events := filepath.Join(t.TempDir(), "memory.events")
	os.WriteFile(events, []byte("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"), 0o644)
	c, _ := startServer(t, func(cfg *Config) { cfg.MemoryEvents = events })
	// A SIGKILL from elsewhere while the cgroup's oom_kill count grows is reported as an OOM kill.
	r := run(t, c, ExecRequest{Argv: []string{"sh", "-c", "echo 'oom 1\noom_kill 1' > " + events + "; kill -KILL $$"}})
	if !r.exit.OOMKilled || r.exit.Signal != "SIGKILL" {
		t.Errorf("exit %+v, want OOMKilled", r.exit)
	}
	r = run(t, c, ExecRequest{Argv: []string{"sh", "-c", "kill -KILL $$"}})
	if r.exit.OOMKilled {
		t.Errorf("exit %+v: count did not grow, not an OOM kill", r.exit)
	}
}

// TestSetHostname: an agent without Config.SetHostname (every one but a claimable microvm's)
// refuses it; one with it passes the name through and returns its error.
func TestSetHostname(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	if err := c.SetHostname(ctx, "box"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("SetHostname on a plain agent: %v, want invalid", err)
	}
	var got []string
	c, _ = startServer(t, func(cfg *Config) {
		cfg.SetHostname = func(name string) error {
			got = append(got, name)
			if len(got) > 1 {
				return errdefs.Conflict("set once")
			}
			return nil
		}
	})
	if err := c.SetHostname(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetHostname(ctx, "again"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second SetHostname: %v, want the hook's conflict", err)
	}
	if !slices.Equal(got, []string{"box", "again"}) {
		t.Errorf("hook calls = %q", got)
	}
}
