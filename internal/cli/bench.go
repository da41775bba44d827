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

// benchBinary finds corral-bench: beside this executable, else on $PATH.
func benchBinary() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "corral-bench")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("corral-bench")
	if err != nil {
		return "", errors.New("corral bench runs corral-bench, which is neither beside corral nor on PATH (make build builds bin/corral-bench)")
	}
	return p, nil
}
