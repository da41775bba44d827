// Package benchcli is the corral-bench command line: Corral's measurements against baselines
// taken in the same run (package internal/bench), kept out of bin/corral so the production
// binary links no test or benchmark code (testing, httptest, a PostgreSQL launcher, a lab
// internet). `corral bench ARGS` runs `corral-bench ARGS` when it is installed beside corral.
//
// It follows the corral CLI's conventions: --url, --token-file and -o json as corral takes
// them; failures print "corral-bench: <message>" and exit 1, usage mistakes exit 2.
package benchcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/internal/cli"
	corral "github.com/corral-dev/corral/sdk/go"
)

// Defaults for reaching the server, as corral's.
const (
	defaultURL       = "http://127.0.0.1:7070"
	defaultTokenFile = "/var/lib/corral/admin.token"
)

// Run runs corral-bench with args (without the program name) and returns the exit status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, getenv: os.Getenv}
	root := &cobra.Command{
		Use:               "corral-bench",
		Short:             "Measure Corral against baselines taken in the same run (root, same host as corral up)",
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if a.output != "table" && a.output != "json" {
				return usagef("-o/--output must be table or json, not %q", a.output)
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.flagURL, "url", "", "server URL (default $CORRAL_URL or "+defaultURL+")")
	pf.StringVar(&a.flagTokenFile, "token-file", "", "read the API token from this file (default $CORRAL_TOKEN or "+defaultTokenFile+")")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	a.addBenchCmds(root)
	markRunErrors(root)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	_, isRun := errors.AsType[runError](err)
	if _, isUsage := errors.AsType[usageError](err); isUsage || !isRun {
		fmt.Fprintf(stderr, "corral-bench: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
		return 2
	}
	fmt.Fprintf(stderr, "corral-bench: %v\n", err)
	return 1
}

// app is one invocation: its streams, environment and global flags.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string

	flagURL, flagTokenFile, output string
	// token is what client() resolved (the E2B bench passes it on as the E2B API key).
	token string
}

// usageError is a mistake in the command line (exit status 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// runError marks an error returned by a command's RunE, as opposed to one cobra raised while
// parsing the command line.
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// markRunErrors wraps the RunE of c and its subcommands so their errors carry runError.
func markRunErrors(c *cobra.Command) {
	c.DisableFlagsInUseLine = true
	if f := c.RunE; f != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if err := f(cmd, args); err != nil {
				return runError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markRunErrors(sub)
	}
}

// client returns an SDK client for the configured server and token, resolved as corral does.
func (a *app) client() (*corral.Client, error) {
	url := a.flagURL
	if url == "" {
		url = a.getenv("CORRAL_URL")
	}
	if url == "" {
		url = defaultURL
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
		if b, err := os.ReadFile(defaultTokenFile); err == nil {
			a.token = strings.TrimSpace(string(b))
		}
	}
	return corral.New(url, a.token, corral.WithUserAgent("corral-bench")), nil
}

// corralBinary is the corral the benches that start their own servers run: the one beside
// this executable, else corral on $PATH.
func corralBinary() (string, error) {
	if p, ok := cli.SiblingBinary("corral"); ok {
		return p, nil
	}
	return "", fmt.Errorf("find corral: none beside corral-bench nor on PATH (or pass --bin)")
}

func (a *app) jsonOut() bool { return a.output == "json" }

// printJSON writes v as indented JSON and a newline.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes tab-separated rows as aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	if len(header) > 0 {
		t.row(header...)
	}
	return t
}

func (t *table) row(cells ...string) { fmt.Fprintln(t.tw, strings.Join(cells, "\t")) }

func (t *table) flush() error { return t.tw.Flush() }

// exactArgs is cobra.ExactArgs with a usage error naming the arguments wanted.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s wants %s, got %d argument(s)", cmd.CommandPath(), names, len(args))
		}
		return nil
	}
}

// sizeFlag parses a byte size as corral's flags do ("10G", "512M").
func sizeFlag(dst *int64) pflag.Value { return cli.SizeFlag(dst) }
