//go:build !lean

package cli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/daemon"
)

// This file and up.go, cluster.go, lazyd.go, envinstall.go and layertar_*.go are the commands
// that link the daemon (store, runtimes, layer store, blob stores, OTel and gRPC): bin/corrald
// has them. bin/corral is built with -tags lean and runs them through corrald (host_lean.go), so
// a client command starts without initialising any of that.

// buildVersion is the version `corral --version` prints.
func buildVersion() string { return daemon.Version }

// newLayerTarCmd returns the hidden `corral layer-tar DIR`: DIR as a layer archive on stdout,
// for the lean binary's `corral layer import DIR`.
func newLayerTarCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "layer-tar DIR",
		Short:  "Write DIR as a layer archive to stdout (used by corral layer import DIR)",
		Hidden: true,
		Args:   exactArgs(1, "a DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return layerTar(cmd.Context(), args[0], os.Stdout)
		},
	}
}
