//go:build lean

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"github.com/spf13/cobra"
)

// The lean build (bin/corral, -tags lean) links no daemon package: the commands that need one
// replace this process with corrald (bin/corrald, the full build, beside corral or on $PATH),
// same arguments, same pid, so signals and exit codes are corrald's own. See host_full.go.

// leanVersion is set by make (-ldflags -X) to what daemon.Version is in corrald.
var leanVersion = "dev"

// buildVersion is the version `corral --version` prints.
func buildVersion() string { return leanVersion }

func newUpCmd() *cobra.Command {
	return hostCmd("up", "Run Corral on this machine: API server, edge and embedded store in one process", false)
}

func newDownCmd() *cobra.Command {
	return hostCmd("down", "Remove everything of a data dir from this host: its corral, sandboxes, mounts, networks, cgroups", false)
}

func newServerCmd() *cobra.Command {
	return hostCmd("server", "Run a cluster's API replica: placement, routing to edges, node watching", false)
}

func newEdgeCmd() *cobra.Command {
	return hostCmd("edge", "Run a cluster's edge on this host: join, hold the node's lease, run its sandboxes", false)
}

func newLazydCmd() *cobra.Command {
	return hostCmd("lazyd", "Serve layer data blobs on demand through FUSE (started by corral up / edge)", true)
}

func newLazydKeeperCmd() *cobra.Command {
	return hostCmd("lazyd-keeper", "Hold lazyd's FUSE connection and restart lazyd when it dies (started by lazyd)", true)
}

func newLayerTarCmd() *cobra.Command {
	return hostCmd("layer-tar", "Write DIR as a layer archive to stdout (used by corral layer import DIR)", true)
}

func (a *app) newEnvInstallCmd() *cobra.Command {
	cmd := hostCmd("install", "Build (once per host, cached) and publish one of Corral's environments (runs corrald)", false)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return execCorrald(append([]string{"env", "install"}, args...))
	}
	return cmd
}

// layerTar writes dir as a layer archive to w through `corrald layer-tar DIR`.
func layerTar(ctx context.Context, dir string, w io.Writer) error {
	bin, err := corraldBinary()
	if err != nil {
		return err
	}
	c := exec.CommandContext(ctx, bin, "layer-tar", dir)
	c.Stdout, c.Stderr = w, os.Stderr
	if err := c.Run(); err != nil {
		return fmt.Errorf("write layer archive of %s: %w", dir, err)
	}
	return nil
}

// hostCmd returns a command that runs `corrald NAME ARGS...` in place of this process.
func hostCmd(name, short string, hidden bool) *cobra.Command {
	return &cobra.Command{
		Use:                name,
		Short:              short,
		Hidden:             hidden,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return execCorrald(append([]string{name}, args...))
		},
	}
}

// execCorrald replaces this process with corrald running args; it returns only on failure.
func execCorrald(args []string) error {
	bin, err := corraldBinary()
	if err != nil {
		return err
	}
	return fmt.Errorf("run %s: %w", bin, syscall.Exec(bin, append([]string{bin}, args...), os.Environ()))
}

// corraldBinary finds corrald.
func corraldBinary() (string, error) {
	if p, ok := SiblingBinary("corrald"); ok {
		return p, nil
	}
	return "", errors.New("this command runs corrald (the server build of corral), which is neither beside corral nor on PATH (make build builds bin/corrald)")
}
