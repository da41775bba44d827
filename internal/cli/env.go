package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	corral "github.com/corral-dev/corral/sdk/go"
)

func (a *app) newEnvCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "env",
		Short: "Saved environments: a base, a workspace and toolkits, composed by name",
		Args:  exactArgs(0, "a subcommand: create, ls, get or rm"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	var base, workspace string
	var toolkits []string
	var template bool
	create := &cobra.Command{
		Use:   "create NAME --base N:V [--workspace N:V] [--toolkit N:V]... [--microvm-template]",
		Short: "Save a composition of layers under NAME (then: corral create --env NAME)",
		Example: `  corral env create swe-task-17 --base debian:12 --workspace repo-17:v3 --toolkit python:latest
  corral create --env swe-task-17`,
		Args: exactArgs(1, "an environment NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if base == "" {
				return usagef("--base is required")
			}
			for _, r := range append([]string{base, workspace}, toolkits...) {
				if r != "" {
					if err := checkRef("layer", r); err != nil {
						return err
					}
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			env, err := c.SaveEnvironment(cmd.Context(), corral.Environment{Name: args[0], Base: base, Workspace: workspace, Toolkits: toolkits, MicroVMTemplate: template})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(env)
			}
			_, err = fmt.Fprintln(a.stdout, env.Name)
			return err
		},
	}
	f := create.Flags()
	f.StringVar(&base, "base", "", "base layer NAME:VERSION (or NAME:TAG)")
	f.StringVar(&workspace, "workspace", "", "workspace layer NAME:VERSION")
	f.StringArrayVar(&toolkits, "toolkit", nil, "toolkit layer NAME:VERSION, stacked in the order given (repeatable)")
	f.BoolVar(&template, "microvm-template", false, "start the environment's microvm sandboxes from a snapshot of a template VM of their shape (built by the first one on each node) instead of booting each")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List saved environments",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Environments(cmd.Context())
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(list)
			}
			t := newTable(a.stdout)
			t.row("NAME", "BASE", "WORKSPACE", "TOOLKITS", "CREATED")
			for _, e := range list {
				t.row(e.Name, e.Base, orDash(e.Workspace), orDash(strings.Join(e.Toolkits, ",")), formatTime(e.CreatedAt, a.now()))
			}
			return t.flush()
		},
	}
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a saved environment",
		Args:  exactArgs(1, "an environment NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			e, err := c.Environment(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(e)
			}
			_, err = fmt.Fprintf(a.stdout, "Name:       %s\nBase:       %s\nWorkspace:  %s\nToolkits:   %s\nCreated:    %s\n",
				e.Name, e.Base, orDash(e.Workspace), orDash(strings.Join(e.Toolkits, ", ")), formatTime(e.CreatedAt, a.now()))
			return err
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Delete a saved environment (sandboxes made from it are not affected)",
		Args:  exactArgs(1, "an environment NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.DeleteEnvironment(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(create, ls, get, rm, a.newEnvInstallCmd(), a.newEnvBuildCmd())
	return cmd
}
