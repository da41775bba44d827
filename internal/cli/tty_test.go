//go:build linux

package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

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
