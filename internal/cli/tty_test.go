//go:build linux

package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

// lockedBuffer is a bytes.Buffer safe to read while the CLI writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestExecTTY runs `exec --tty` with stdin on a real pseudo-terminal: the initial size is sent,
// a SIGWINCH becomes a resize, and the terminal's mode is restored afterwards.
func TestExecTTY(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer ptmx.Close()
	defer tty.Close()
	if err := pty.Setsize(tty, &pty.Winsize{Rows: 30, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	before, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}

	srv := corraltest.NewServer(t)
	id := mustCreate(t, srv)
	started := make(chan struct{})
	srv.Program("size", func(ctx context.Context, p *corraltest.Process) corral.Exit {
		fmt.Fprintf(p.Stdout, "%dx%d\r\n", p.Rows, p.Cols)
		close(started)
		select {
		case r := <-p.Resizes:
			fmt.Fprintf(p.Stdout, "%dx%d\r\n", r.Rows, r.Cols)
		case <-ctx.Done():
		}
		return corral.Exit{Code: 4}
	})

	var stdout, stderr lockedBuffer
	a := &app{
		stdin: tty, stdout: &stdout, stderr: &stderr,
		getenv:    func(k string) string { return map[string]string{"CORRAL_URL": srv.URL, "CORRAL_TOKEN": srv.Token}[k] },
		tokenFile: filepath.Join(t.TempDir(), "none"),
		now:       time.Now,
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- a.run(ctx, []string{"exec", "--tty", id, "--", "size"}) }()

	<-started
	if err := pty.Setsize(tty, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	// The CLI starts watching for SIGWINCH once it has the command's ID; signal until the
	// resize arrives.
	var code int
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case code = <-done:
			break wait
		case <-tick.C:
			syscall.Kill(os.Getpid(), syscall.SIGWINCH)
		case <-ctx.Done():
			t.Fatalf("exec --tty did not finish; stdout so far %q", stdout.String())
		}
	}
	if code != 4 || stdout.String() != "30x100\r\n40x120\r\n" || stderr.String() != "" {
		t.Errorf("exec --tty: exit %d, stdout %q, stderr %q; want 4, sizes 30x100 then 40x120", code, stdout.String(), stderr.String())
	}
	body := string(lastExec(t, srv).Query.Encode())
	if body != "stdin=stream" {
		t.Errorf("exec query = %s, want stdin=stream", body)
	}
	after, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if *after != *before {
		t.Errorf("terminal mode not restored: before %+v, after %+v", before, after)
	}
	if lines := strings.Join(srv.RequestLines(), "\n"); !strings.Contains(lines, "/resize") {
		t.Errorf("no resize request in\n%s", lines)
	}
}

// TestTerminalEscaping runs commands whose output carries control sequences with stdout and
// stderr on real pseudo-terminals, on pipes, and with --raw: on a terminal they arrive escaped
// as text, on a pipe, with --raw and for a --tty command they arrive as they were written.
func TestTerminalEscaping(t *testing.T) {
	srv := corraltest.NewServer(t)
	id := mustCreate(t, srv)
	const evilOut, evilErr = "\x1b]0;pwned\x07\x1b[31mred\u009b\n", "\x1b[2Jcleared\rover\n"
	const safeOut, safeErr = `\x1b]0;pwned\x07\x1b[31mred\u009b` + "\n", `\x1b[2Jcleared\x0dover` + "\n"
	srv.Program("evil", func(ctx context.Context, p *corraltest.Process) corral.Exit {
		// Split mid-sequence and mid-rune: the escaping holds across writes.
		fmt.Fprint(p.Stdout, evilOut[:1])
		fmt.Fprint(p.Stdout, evilOut[1:17])
		fmt.Fprint(p.Stdout, evilOut[17:])
		fmt.Fprint(p.Stderr, evilErr)
		return corral.Exit{Code: 0}
	})
	srv.StartFailure("broken", corral.Exit{Code: 126, Error: "cannot run \x1b]52;c;cm0gLXJm\x07"})
	if _, err := srv.Client().WriteFile(t.Context(), id, "/evil.txt", strings.NewReader(evilOut), corral.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name             string
		stdoutTTY        bool
		stderrTTY        bool
		args             []string
		wantOut, wantErr string
	}{
		{"terminal", true, true, []string{"exec", id, "--", "evil"}, safeOut, safeErr},
		{"pipe", false, false, []string{"exec", id, "--", "evil"}, evilOut, evilErr},
		{"stdout pipe, stderr terminal", false, true, []string{"exec", id, "--", "evil"}, evilOut, safeErr},
		{"raw", true, true, []string{"exec", "--raw", id, "--", "evil"}, evilOut, evilErr},
		{"json", true, true, []string{"exec", "-o", "json", id, "--", "evil"}, evilOut, evilErr},
		// A PTY merges stderr into stdout.
		{"tty command", true, true, []string{"exec", "--tty", id, "--", "evil"}, evilOut + evilErr, ""},
		{"cp to terminal", true, true, []string{"cp", id + ":/evil.txt", "-"}, safeOut, ""},
		{"cp to pipe", false, false, []string{"cp", id + ":/evil.txt", "-"}, evilOut, ""},
		{"error message", true, true, []string{"exec", id, "--", "broken"}, "", `corral: cannot run \x1b]52;c;cm0gLXJm\x07` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, readOut := outputEnd(t, tc.stdoutTTY)
			stderr, readErr := outputEnd(t, tc.stderrTTY)
			a := &app{
				stdout: stdout, stderr: stderr,
				getenv:    func(k string) string { return map[string]string{"CORRAL_URL": srv.URL, "CORRAL_TOKEN": srv.Token}[k] },
				tokenFile: filepath.Join(t.TempDir(), "none"),
				now:       time.Now,
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			a.run(ctx, tc.args)
			if got := readOut(); got != tc.wantOut {
				t.Errorf("stdout = %q, want %q", got, tc.wantOut)
			}
			if got := readErr(); got != tc.wantErr {
				t.Errorf("stderr = %q, want %q", got, tc.wantErr)
			}
		})
	}
}

// outputEnd returns a file for the CLI to write, a pseudo-terminal in raw mode (so the line
// discipline adds no CR) or a pipe, and a function that closes it and returns what was written.
func outputEnd(t *testing.T, tty bool) (*os.File, func() string) {
	t.Helper()
	var r, w *os.File
	var err error
	if tty {
		r, w, err = pty.Open()
		if err != nil {
			t.Skipf("no pseudo-terminal: %v", err)
		}
		if _, err := term.MakeRaw(int(w.Fd())); err != nil {
			t.Fatal(err)
		}
	} else if r, w, err = os.Pipe(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	got := make(chan string, 1)
	go func() {
		// A pty master reads EIO once the terminal side is closed and drained.
		b, _ := io.ReadAll(r)
		got <- string(b)
	}()
	return w, func() string {
		w.Close()
		return <-got
	}
}
