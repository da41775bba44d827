// Package cli implements the corral command line: one cobra command tree over the Go SDK
// (sdk/go), testable in-process through [Run].
//
// Conventions every command follows: human output is an aligned table (or the bare ID where a
// script wants one), `-o json` prints the API objects as JSON (lists as arrays); failures print
// "corral: <message>" on stderr and exit 1, usage mistakes exit 2, and commands that run a
// program in a sandbox exit with that program's status. A terminal on stdout or stderr gets
// sandbox bytes with their control sequences escaped unless --raw (termsafe.go).
//
// Commands are wired in one place, newRootCmd. A command defined in another file of this
// package (up.go) is added to the list there.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	corral "github.com/corral-dev/corral/sdk/go"
)

// Defaults for reaching the server.
const (
	defaultURL       = "http://127.0.0.1:7070"
	defaultTokenFile = "/var/lib/corral/admin.token"
	defaultBase      = "base:default"
)

// Run runs the corral command line with args (without the program name) and returns the
// process exit status. The server comes from $CORRAL_URL and the token from $CORRAL_TOKEN or a
// token file; ctx ending (an interrupt) makes commands clean up and return.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{
		stdin:     stdin,
		stdout:    stdout,
		stderr:    stderr,
		getenv:    os.Getenv,
		tokenFile: defaultTokenFile,
		now:       time.Now,
	}
	return a.run(ctx, args)
}

// app is one invocation of the CLI: its streams, environment and global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// tokenFile is read when neither --token-file nor $CORRAL_TOKEN gives a token.
	tokenFile string
	now       func() time.Time

	// Global flags.
	flagURL       string
	flagTokenFile string
	output        string
	flagRaw       bool

	// rawStdout and rawStderr are the streams as given, before guardTerminal wrapped a
	// terminal in an escaper; flushers are those escapers, flushed when the command ends.
	rawStdout, rawStderr io.Writer
	flushers             []*termEscaper

	// url and token are what client() resolved, for error messages.
	url, token string
}

// exitError ends the CLI with a status and no message of its own (the command's output, or a
// message already printed, says what happened).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a mistake in the command line: a status of 2 and a pointer to --help.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// runError marks an error returned by a command's RunE, as opposed to one cobra raised while
// parsing the command line (which is a usage error).
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

func (a *app) run(ctx context.Context, args []string) int {
	a.rawStdout, a.rawStderr = a.stdout, a.stderr
	defer func() {
		for _, e := range a.flushers {
			e.Flush()
		}
	}()
	root := a.newRootCmd()
	prepare(root)
	root.SetArgs(args)
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	if ee, ok := errors.AsType[exitError](err); ok {
		return ee.code
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		fmt.Fprintln(a.stderr, "corral: interrupted")
		return 130
	}
	_, isRun := errors.AsType[runError](err)
	if _, isUsage := errors.AsType[usageError](err); isUsage || !isRun {
		fmt.Fprintf(a.stderr, "corral: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
		return 2
	}
	fmt.Fprintf(a.stderr, "corral: %s\n", a.describe(err))
	return 1
}

// describe turns an error into the message the user sees, with a hint where one helps.
func (a *app) describe(err error) string {
	if apiErr, ok := errors.AsType[*corral.APIError](err); ok {
		switch {
		case apiErr.Code == corral.CodeUnauthorized && a.token == "":
			return err.Error() + " (no token: set CORRAL_TOKEN or --token-file)"
		case apiErr.Quota != nil:
			return "quota exceeded: " + quotaLine(apiErr.Quota)
		case apiErr.Permission != "" && !strings.Contains(err.Error(), apiErr.Permission):
			return fmt.Sprintf("%v (missing permission %s)", err, apiErr.Permission)
		}
		return err.Error()
	}
	if cerr, ok := errors.AsType[contextError](err); ok {
		return cerr.Error()
	}
	if uerr, ok := errors.AsType[*url.Error](err); ok && !errors.Is(err, context.Canceled) {
		return fmt.Sprintf("cannot reach the Corral server at %s (set CORRAL_URL or --url): %v", a.url, uerr.Err)
	}
	return err.Error()
}

// prepare applies the package's conventions to c and its subcommands: RunE errors carry
// runError, and the usage lines are written out in full (no "[flags]" appended).
func prepare(c *cobra.Command) {
	c.DisableFlagsInUseLine = true
	if f := c.RunE; f != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if err := f(cmd, args); err != nil {
				if _, ok := errors.AsType[exitError](err); ok {
					return err
				}
				return runError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		prepare(sub)
	}
}

// newRootCmd builds the command tree. This is the one place commands are wired: a command
// written in another file of the package is added to the list below.
func (a *app) newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "corral",
		Short: "Create and drive Corral sandboxes",
		Long: `corral creates sandboxes, runs commands in them, copies files in and out, and
publishes the layers sandboxes are built from.

The server is $CORRAL_URL (default ` + defaultURL + `); the token is $CORRAL_TOKEN, else the
contents of ` + defaultTokenFile + ` when readable.

When stdout or stderr is a terminal, what sandboxes print there (command output, file
contents, consoles, names, error messages) is shown with control sequences escaped as
text (\x1b[31m), so no sandbox can drive the terminal; --raw passes them through, and a
command run with --tty is a terminal session and passes them. Pipes, files and -o json
are never changed.`,
		Version:           buildVersion(),
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			// corral screen takes -o as the PNG file it writes.
			if a.output != "table" && a.output != "json" && cmd.Name() != "screen" {
				return usagef("-o/--output must be table or json, not %q", a.output)
			}
			a.guardTerminal()
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.flagURL, "url", "", "server URL (default $CORRAL_URL or "+defaultURL+")")
	pf.StringVar(&a.flagTokenFile, "token-file", "", "read the API token from this file (default $CORRAL_TOKEN or "+defaultTokenFile+")")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	pf.BoolVar(&a.flagRaw, "raw", false, "write what sandboxes print to a terminal as it is, control sequences included (by default they are shown escaped, e.g. \\x1b[31m)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })

	root.AddCommand(
		a.newCreateCmd(),
		a.newRunCmd(),
		a.newExecCmd(),
		a.newGetCmd(),
		a.newLsCmd(),
		a.newRmCmd(),
		a.newTTLCmd(),
		a.newCpCmd(),
		a.newLayerCmd(),
		a.newInfoCmd(),
		// Commands owned outside this file set.
		newUpCmd(),
		newDownCmd(),
		newServerCmd(),
		newEdgeCmd(),
		newLazydCmd(),
		newLazydKeeperCmd(),
		newLayerTarCmd(),
		a.newNodeCmd(),
		a.newPortCmd(),
		a.newBenchCmd(),
		a.newLogCmd(),
		a.newPauseCmd(),
		a.newForkCmd(),
		a.newResumeCmd(),
		a.newSnapshotCmd(),
		a.newReplayCmd(),
		a.newNetCmd(),
		a.newEnvCmd(),
		a.newVolumeCmd(),
		a.newFncallCmd(),
		a.newCallCmd(),
		a.newWhoamiCmd(),
		a.newProjectCmd(),
		a.newGrantCmd(),
		a.newGrantsCmd(),
		a.newRevokeCmd(),
		a.newPrincipalCmd(),
		a.newQuotaCmd(),
		a.newTokenCmd(),
		a.newAuditCmd(),
		a.newMetricsCmd(),
		a.newEventsCmd(),
		a.newWebhookCmd(),
		a.newReportCmd(),
		a.newVMImageCmd(),
		a.newScreenCmd(),
		a.newTypeCmd(),
		a.newKeyCmd(),
		a.newClickCmd(),
		a.newPowerCmd(),
		a.newConsoleCmd(),
		a.newVNCCmd(),
		a.newCodeCmd(),
	)
	return root
}

// client returns an SDK client for the configured server and token.
func (a *app) client() (*corral.Client, error) {
	a.url = a.flagURL
	if a.url == "" {
		a.url = a.getenv("CORRAL_URL")
	}
	if a.url == "" {
		a.url = defaultURL
	}
	switch {
	case a.flagTokenFile != "":
		b, err := os.ReadFile(a.flagTokenFile)
		if err != nil {
			return nil, fmt.Errorf("read token: %w", err)
		}
		a.token = strings.TrimSpace(string(b))
	case a.getenv("CORRAL_TOKEN") != "":
		a.token = a.getenv("CORRAL_TOKEN")
	default:
		// Not readable (not root, no local server) is fine: the server then says a token is
		// missing, and describe adds how to give one.
		if b, err := os.ReadFile(a.tokenFile); err == nil {
			a.token = strings.TrimSpace(string(b))
		}
	}
	return corral.New(a.url, a.token, corral.WithUserAgent("corral-cli")), nil
}

// exactArgs is cobra.ExactArgs with a usage error naming the arguments wanted.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s wants %s, got %d argument(s)", cmd.CommandPath(), names, len(args))
		}
		return nil
	}
}

// contextError is a failure to read the build context: the upload of the context breaks off
// because of it, and the user must see it rather than the broken upload.
type contextError struct{ err error }

func (e contextError) Error() string { return e.err.Error() }
func (e contextError) Unwrap() error { return e.err }
