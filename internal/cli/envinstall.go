//go:build !lean

package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/envinstall"
)

// newEnvInstallCmd is `corral env install`: build a recipe's layer on this host (once, cached)
// and publish it with an environment.
func (a *app) newEnvInstallCmd() *cobra.Command {
	var name, baseTar string
	cmd := &cobra.Command{
		Use:   "install RECIPE [--name ENV]",
		Short: "Build (once per host, cached) and publish one of Corral's environments: " + strings.Join(envinstall.Names(), ", "),
		Long: `Build a recipe's toolkit layer from Debian packages on the Debian base (once per host, as root:
an overlay and a chroot; cached in /var/cache/corral/recipes/), publish the base and the layer,
and save an environment of the recipe's name (--name to choose another). Progress goes to stderr.

Recipes: ` + strings.Join(envinstall.Names(), ", ") + `
  code-interpreter  Python 3, a Jupyter kernel, numpy, pandas, matplotlib, scipy, and a
                    code-execution server on port 49999 (corral code; E2B's @e2b/code-interpreter)`,
		Example: `  corral env install code-interpreter
  corral create --env code-interpreter
  corral code ID -c 'import numpy as np; np.arange(3).sum()'`,
		Args: exactArgs(1, "a RECIPE: "+strings.Join(envinstall.Names(), ", ")),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := envinstall.Load(args[0])
			if err != nil {
				return usagef("%v", err)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := envinstall.Install(cmd.Context(), c, r, name, envinstall.Options{BaseTar: baseTar, Log: a.stderr})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(res)
			}
			_, err = fmt.Fprintln(a.stdout, res.Environment.Name)
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the environment's name (default: the recipe's)")
	cmd.Flags().StringVar(&baseTar, "base-tar", "", "build on this Debian base tarball instead of the one scripts/debian-base.sh caches")
	return cmd
}
