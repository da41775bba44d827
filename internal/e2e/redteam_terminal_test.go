package e2e

import (
	"bytes"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/creack/pty"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamTerminal (issue 22 item 8): a sandbox's output tries to take over the operator's
// terminal (set its title, clear the screen, write the clipboard through OSC 52, hide text behind
// a bare CR, a C1 CSI). Run through the real CLI binary on a pseudo-terminal, every control comes
// out visibly escaped; on a pipe and with --raw the bytes pass unchanged.
func TestRedTeamTerminal(t *testing.T) { forRuntimes(t, testRedTeamTerminal) }

func testRedTeamTerminal(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	sb := p.create(corral.CreateRequest{})
	const script = `printf '\033]0;pwned\007\033[2J\033]52;c;cm0gLXJmIC8=\007rm -rf /\rok\302\233\n'`
	evil := "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cm0gLXJmIC8=\x07rm -rf /\rok\u009b\n"
	run := func(onPTY bool, extra ...string) string {
		t.Helper()
		args := append(append([]string{"exec"}, extra...), sb.ID, "--", "/bin/sh", "-c", script)
		cmd := exec.Command(filepath.Join(binDir, "corral"), args...)
		cmd.Env = append(cmd.Environ(), "CORRAL_URL="+p.URL, "CORRAL_TOKEN="+p.Token)
		if !onPTY {
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("corral %v: %v", args, err)
			}
			return string(out)
		}
		ptmx, tty, err := pty.Open()
		if err != nil {
			t.Fatal(err)
		}
		defer ptmx.Close()
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		tty.Close()
		var buf bytes.Buffer
		io.Copy(&buf, ptmx) // ends with EIO once the CLI exits and the last fd of the tty closes
		if err := cmd.Wait(); err != nil {
			t.Fatalf("corral %v on a terminal: %v\n%q", args, err, buf.String())
		}
		// The terminal's line discipline turns \n into \r\n.
		return strings.ReplaceAll(buf.String(), "\r\n", "\n")
	}
	got := run(true)
	if strings.ContainsAny(got, "\x1b\x07\r") || strings.Contains(got, "\u009b") {
		t.Fatalf("a control sequence reached the operator's terminal: %q", got)
	}
	for _, want := range []string{`\x1b]0;pwned\x07`, `\x1b[2J`, `\x1b]52;c;`, `\x0dok`, `\u009b`} {
		if !strings.Contains(got, want) {
			t.Fatalf("terminal output %q lacks the visible %s", got, want)
		}
	}
	if got := run(false); got != evil {
		t.Fatalf("on a pipe the bytes changed: %q, want %q", got, evil)
	}
	if got := run(true, "--raw"); got != evil {
		t.Fatalf("with --raw on a terminal the bytes changed: %q, want %q", got, evil)
	}
}
