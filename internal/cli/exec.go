package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	corral "github.com/corral-dev/corral/sdk/go"
)

// execFlags are the flags of a command run in a sandbox, shared by exec and run.
type execFlags struct {
	tty, interactive, shell bool
	exclusive               bool
	env                     []string
	cwd, user, timeout      string
	step                    string
}

// add registers the flags on fs; withEnv adds --env (run has the sandbox's --env instead).
func (f *execFlags) add(fs *pflag.FlagSet, withEnv bool) {
	fs.BoolVarP(&f.tty, "tty", "t", false, "run the command on a terminal; stdin is streamed and the local terminal is put in raw mode")
	fs.BoolVarP(&f.interactive, "interactive", "i", false, "stream stdin to the command (the default when stdin is not a terminal)")
	fs.BoolVar(&f.shell, "shell", false, "run the single argument CMD with /bin/sh -c")
	if withEnv {
		fs.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	}
	fs.StringVarP(&f.cwd, "cwd", "w", "", "working directory inside the sandbox")
	fs.StringVarP(&f.user, "user", "u", "", "user (name or uid) to run as")
	fs.StringVar(&f.timeout, "timeout", "", "kill the command after this long, e.g. 5m")
	fs.BoolVar(&f.exclusive, "exclusive", false, "stop every other process of the sandbox while the command runs, so none can signal, ptrace or write into it (for graders; other commands are refused meanwhile)")
	fs.StringVar(&f.step, "step", "", "step ID in the sandbox's trajectory: a completed step is replayed from the log, a running one attached to, never run twice")
}

// request validates the flags and builds the exec request for argv.
func (f *execFlags) request(argv []string) (corral.ExecRequest, error) {
	req := corral.ExecRequest{Argv: argv, Shell: f.shell, Env: f.env, Cwd: f.cwd, User: f.user, Timeout: f.timeout, TTY: f.tty, StepID: f.step, Exclusive: f.exclusive}
	if len(argv) == 0 {
		return req, usagef("no command given: put it after --, e.g. -- ls -l")
	}
	if f.shell && len(argv) != 1 {
		return req, usagef("--shell wants the command as one argument, e.g. --shell -- 'ls | wc -l'")
	}
	if err := checkEnv(f.env); err != nil {
		return req, err
	}
	if err := checkDuration("timeout", f.timeout); err != nil {
		return req, err
	}
	return req, nil
}

// splitCommand splits positional args into the leading ones (before "--", nLead of them) and
// the command after them.
func splitCommand(cmd *cobra.Command, args []string, nLead int, leadNames string) ([]string, []string, error) {
	dash := cmd.ArgsLenAtDash()
	if dash >= 0 && dash != nLead {
		return nil, nil, usagef("%s wants %s before --, got %d argument(s)", cmd.CommandPath(), leadNames, dash)
	}
	if len(args) < nLead {
		return nil, nil, usagef("%s wants %s", cmd.CommandPath(), leadNames)
	}
	return args[:nLead], args[nLead:], nil
}

func (a *app) newExecCmd() *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:   "exec ID [flags] -- CMD [ARG...]",
		Short: "Run a command in a sandbox; exit with its status",
		Long: `Run a command in a sandbox. Its stdout and stderr pass through, and corral exits with
its status (128+N when killed by signal N, 127 or 126 when it could not start).

Stdin is streamed to the command when -i or --tty is given, or when stdin is not a
terminal; end of file closes the command's stdin. An interrupt (Ctrl-C) is forwarded to
the command as SIGINT; a second one leaves it running.

--exclusive stops (SIGSTOP) every other process of the sandbox while the command runs and
continues them after, so nothing left running in the sandbox can signal it, ptrace it or
write into its output: a grader's result is its own. Other commands in the sandbox are
refused meanwhile; without --timeout it is killed after 10m. Prefer running a program you
uploaded over --shell, which runs the sandbox's own /bin/sh.`,
		Example: `  corral exec sb-local-0123456789abcdef -- ls -l /
  corral exec --cwd /work --env CI=1 ID -- make test
  echo hello | corral exec ID -- cat
  corral exec -it ID -- /bin/sh
  corral exec --exclusive --timeout 5m ID -- /grader/check`,
		Args: func(cmd *cobra.Command, args []string) error {
			_, _, err := splitCommand(cmd, args, 1, "a sandbox ID")
			return err
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			lead, argv, _ := splitCommand(cmd, args, 1, "a sandbox ID")
			req, err := f.request(argv)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.execute(cmd.Context(), c, lead[0], req, f)
		},
	}
	f.add(cmd.Flags(), true)
	return cmd
}

func (a *app) newRunCmd() *cobra.Command {
	var cf createFlags
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "run [create flags] [exec flags] -- CMD [ARG...]",
		Short: "Create a sandbox, run one command in it, delete it; exit with the command's status",
		Long: `Create a sandbox, run one command in it and delete the sandbox, also when the command
fails or corral is interrupted. corral exits with the command's status, as exec does.`,
		Example: `  corral run --memory 512M -- sh -c 'uname -a; id'
  corral run --base python:3.12 --timeout 1m -- python3 -c 'print(1)'`,
		Args: func(cmd *cobra.Command, args []string) error {
			_, _, err := splitCommand(cmd, args, 0, "no arguments")
			return err
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			_, argv, _ := splitCommand(cmd, args, 0, "no arguments")
			creq, err := cf.request()
			if err != nil {
				return err
			}
			ereq, err := ef.request(argv)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			// Creation is not interrupted: a sandbox created by a request we gave up on would
			// be left running with an ID we never learnt.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
			sb, err := c.CreateSandbox(cctx, creq)
			cancel()
			if err != nil {
				return err
			}
			defer func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				defer cancel()
				if _, err := c.DeleteSandbox(dctx, sb.ID); err != nil && !corral.IsNotFound(err) {
					fmt.Fprintf(a.stderr, "corral: delete sandbox %s: %s (it stops when its TTL ends)\n", sb.ID, a.describe(err))
				}
			}()
			if ctx.Err() != nil {
				return exitError{130}
			}
			return a.execute(ctx, c, sb.ID, ereq, ef)
		},
	}
	cf.add(cmd.Flags(), a.getenv)
	ef.add(cmd.Flags(), false)
	return cmd
}

// terminalFd returns the descriptor of v when it is a terminal.
func terminalFd(v any) (int, bool) {
	f, ok := v.(*os.File)
	if !ok || f == nil {
		return 0, false
	}
	fd := int(f.Fd())
	return fd, term.IsTerminal(fd)
}

// execute runs req in sandbox id, relaying its output, and returns exitError with the
// command's status (nil for status 0).
//
// The output stream is not tied to ctx: when ctx ends (an interrupt), the command gets SIGINT
// and execute keeps relaying until it exits, so the status is the command's.
func (a *app) execute(ctx context.Context, c *corral.Client, id string, req corral.ExecRequest, f execFlags) error {
	inFd, inTerm := terminalFd(a.stdin)
	stream := a.stdin != nil && (f.interactive || f.tty || !inTerm)
	raw := f.tty && inTerm
	if raw {
		if w, h, err := term.GetSize(inFd); err == nil && w > 0 && h > 0 {
			req.Rows, req.Cols = uint16(h), uint16(w)
		}
	}

	exit, err := func() (*corral.Exit, error) {
		sctx := context.WithoutCancel(ctx)
		var s *corral.Stream
		var err error
		if stream {
			if raw {
				old, err := term.MakeRaw(inFd)
				if err != nil {
					return nil, fmt.Errorf("put the terminal in raw mode: %w", err)
				}
				defer term.Restore(inFd, old)
			}
			s, err = c.ExecStream(sctx, id, req, a.stdin)
		} else {
			s, err = c.Exec(sctx, id, req)
		}
		if err != nil {
			return startRefusal(err)
		}
		defer s.Close()
		stopInterrupt := context.AfterFunc(ctx, func() {
			if cid := s.CommandID(); cid != "" {
				sigCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = c.Signal(sigCtx, id, cid, "SIGINT")
			}
		})
		defer stopInterrupt()
		if raw && s.CommandID() != "" {
			stop := watchResize(inFd, func(rows, cols uint16) {
				rctx, cancel := context.WithTimeout(sctx, 10*time.Second)
				defer cancel()
				_ = c.Resize(rctx, id, s.CommandID(), rows, cols)
			})
			defer stop()
		}
		// A command on a PTY is a terminal session the operator asked for: its control
		// sequences are its screen, so they pass. Without one they are shown escaped.
		stdout, stderr := a.stdout, a.stderr
		if req.TTY {
			stdout, stderr = a.rawStdout, a.rawStderr
		}
		return s.Copy(stdout, stderr)
	}()
	if err != nil {
		return err
	}
	if exit == nil {
		return errors.New("the output stream ended without the command's exit status")
	}
	code, msg := exitStatus(exit)
	if msg != "" {
		fmt.Fprintf(a.stderr, "corral: %s\n", msg)
	}
	if code != 0 {
		return exitError{code}
	}
	return nil
}

// startRefusal turns the server refusing to start a command into the exit a shell would
// give: no such program is 127, a bad working directory or user 126 (as docker exec). Other
// errors stay errors.
func startRefusal(err error) (*corral.Exit, error) {
	apiErr, ok := errors.AsType[*corral.APIError](err)
	if !ok || apiErr.Code != corral.CodeInvalid {
		return nil, err
	}
	switch apiErr.Field {
	case "argv":
		return &corral.Exit{Code: 127, Error: strings.TrimPrefix(apiErr.Message, "argv: ")}, nil
	case "cwd", "user":
		return &corral.Exit{Code: 126, Error: apiErr.Error()}, nil
	}
	return nil, err
}

// exitStatus maps how a command ended to the CLI's exit status, as a shell does: the exit
// code, 128+N for signal N, 127 (not found) or 126 (cannot run) for a start failure. msg, when
// not empty, says what the status alone does not.
func exitStatus(e *corral.Exit) (code int, msg string) {
	switch {
	case e.Error != "":
		msg = e.Error
		code = e.Code
		if code != 126 && code != 127 {
			code = 127
			l := strings.ToLower(e.Error)
			if strings.Contains(l, "permission denied") || strings.Contains(l, "not executable") ||
				strings.Contains(l, "exec format") || strings.Contains(l, "is a directory") {
				code = 126
			}
		}
		return code, msg
	case e.OOMKilled:
		msg = "command was killed: out of memory (create the sandbox with a larger --memory)"
	case e.TimedOut:
		msg = "command timed out (--timeout)"
	}
	switch {
	case e.Signal != "":
		if n, ok := signalNumber(e.Signal); ok {
			return 128 + n, msg
		}
		if e.Code > 128 {
			return e.Code, msg
		}
		return 128 + 9, msg
	case e.Code < 0:
		return 1, msg
	case e.Code > 255:
		return 255, msg
	}
	return e.Code, msg
}

// linuxSignals numbers the signals by name as Linux does (the sandbox is always Linux, whatever
// the client runs on).
var linuxSignals = map[string]int{
	"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8,
	"KILL": 9, "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15,
	"STKFLT": 16, "CHLD": 17, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22,
	"URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29,
	"PWR": 30, "SYS": 31,
}

// signalNumber returns the Linux number of a signal given as "SIGKILL", "KILL" or "9".
func signalNumber(s string) (int, bool) {
	if n, err := strconv.Atoi(s); err == nil {
		return n, n > 0 && n < 128
	}
	n, ok := linuxSignals[strings.TrimPrefix(strings.ToUpper(s), "SIG")]
	return n, ok
}
