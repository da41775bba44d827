//go:build lean

package cli

import (
	"context"
	"os"

	"github.com/spf13/cobra"

	corral "github.com/corral-dev/corral/sdk/go"
)

// bin/corral links neither the OCI image code nor the Dockerfile parser (see image_full.go):
// `corral layer import` of an image and `corral env build` replace this process with corrald,
// the same command line.

// importImageFlags runs this command line in corrald; it returns only on failure.
func (a *app) importImageFlags(context.Context, *corral.Client, string, string, string, imageFlags, int64, corral.ImportOptions) (*corral.Layer, error) {
	return nil, execCorrald(os.Args[1:])
}

func (a *app) newEnvBuildCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "build NAME [--file Dockerfile] [--context DIR] [--build-arg K=V]... [--net-allow RULE]... [--runtime runc|gvisor]",
		Short:              "Build an environment from a Dockerfile (runs corrald)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return execCorrald(os.Args[1:])
		},
	}
}
