package cli

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// newBenchCmd returns `corral bench`: it runs corral-bench (cmd/corral-bench, which `make build`
// puts beside corral) with the same arguments. The measurements live in that binary so that
// bin/corral links no benchmark or test code.
func (a *app) newBenchCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "bench SUBCOMMAND [flags]",
		Short:              "Measure Corral against baselines taken in the same run (runs corral-bench; root, same host as corral up)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			bin, err := benchBinary()
			if err != nil {
				return err
			}
			c := exec.CommandContext(cmd.Context(), bin, args...)
			c.Stdin, c.Stdout, c.Stderr = a.stdin, a.rawStdout, a.rawStderr
			// An interrupt reaches corral-bench as one, so it stops what it started.
			c.Cancel = func() error { return c.Process.Signal(os.Interrupt) }
			err = c.Run()
			if ee, ok := errors.AsType[*exec.ExitError](err); ok {
				code := ee.ExitCode()
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					code = 128 + int(ws.Signal())
				}
				return exitError{code}
			}
			return err
		},
	}
}

// SiblingBinary finds the program name of Corral's build (corral, corrald, corral-bench):
// beside this executable, else on $PATH; ok is false when it is in neither place.
func SiblingBinary(name string) (path string, ok bool) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
	}
	p, err := exec.LookPath(name)
	return p, err == nil
}

// benchBinary finds corral-bench.
func benchBinary() (string, error) {
	if p, ok := SiblingBinary("corral-bench"); ok {
		return p, nil
	}
	return "", errors.New("corral bench runs corral-bench, which is neither beside corral nor on PATH (make build builds bin/corral-bench)")
}
