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
		Args:  exactArgs(0, "a subcommand: create, ls, get, set or rm"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	var base, workspace string
	var toolkits []string
	var template bool
	var warm int
	var runtime, tier string
	var nf netFlags
	create := &cobra.Command{
		Use:   "create NAME --base N:V [--workspace N:V] [--toolkit N:V]... [--microvm-template] [--tier T] [--warm N] [--runtime R] [--net MODE]",
		Short: "Save a composition of layers under NAME (then: corral create --env NAME)",
		Example: `  corral env create swe-task-17 --base debian:12 --workspace repo-17:v3 --toolkit python:latest
  corral create --env swe-task-17
  corral env create rollout --base debian:12 --warm 16 --net allowlist   # 16 started sandboxes ready per node
  corral env create vm-task --base debian:12 --tier microvm --warm 2       # 2 booted microvms ready per node`,
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
			if warm < 0 {
				return usagef("--warm: %d is negative", warm)
			}
			policy, err := nf.policy()
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			env, err := c.SaveEnvironment(cmd.Context(), corral.Environment{Name: args[0], Base: base, Workspace: workspace, Toolkits: toolkits, MicroVMTemplate: template,
				Tier: tier, Warm: warm, Runtime: runtime, Network: policy})
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
	f.IntVar(&warm, "warm", 0, "keep N started sandboxes of the environment ready on each node (booted VMs for --tier microvm): a create that matches claims one (corral env set NAME --warm N changes it)")
	f.StringVar(&tier, "tier", "", "the tier of its sandboxes when a create names none, and of its warm pool: container (default) or microvm")
	f.StringVar(&runtime, "runtime", "", "the runtime of its sandboxes when a create names none, and of its warm pool: runc (default) or gvisor")
	nf.add(f)
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
			t.row("NAME", "BASE", "WORKSPACE", "TOOLKITS", "WARM", "CREATED")
			for _, e := range list {
				warm := "-"
				if e.Warm > 0 {
					warm = fmt.Sprintf("%d (%d/%d ready)", e.Warm, e.WarmReady, e.WarmTarget)
				}
				t.row(e.Name, e.Base, orDash(e.Workspace), orDash(strings.Join(e.Toolkits, ",")), warm, formatTime(e.CreatedAt, a.now()))
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
			tier := e.Tier
			if tier == "" {
				tier = "container"
			}
			_, err = fmt.Fprintf(a.stdout, "Name:       %s\nTier:       %s\nBase:       %s\nWorkspace:  %s\nToolkits:   %s\nCreated:    %s\n",
				e.Name, tier, e.Base, orDash(e.Workspace), orDash(strings.Join(e.Toolkits, ", ")), formatTime(e.CreatedAt, a.now()))
			if err == nil && e.Warm > 0 {
				_, err = fmt.Fprintf(a.stdout, "Warm:       %d ready of %d (aiming at %d), %d hits of %d claims\n", e.WarmReady, e.Warm, e.WarmTarget, e.WarmHits, e.WarmClaims)
			}
			return err
		},
	}
	var setWarm int
	set := &cobra.Command{
		Use:     "set NAME --warm N",
		Short:   "Change a saved environment's warm pool size (0 drains it)",
		Example: `  corral env set rollout --warm 64`,
		Args:    exactArgs(1, "an environment NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("warm") {
				return usagef("--warm is required")
			}
			if setWarm < 0 {
				return usagef("--warm: %d is negative", setWarm)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			e, err := c.UpdateEnvironment(cmd.Context(), args[0], corral.EnvironmentPatch{Warm: &setWarm})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(e)
			}
			_, err = fmt.Fprintln(a.stdout, e.Name)
			return err
		},
	}
	set.Flags().IntVar(&setWarm, "warm", 0, "keep N started sandboxes ready on each node (0: none)")
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
	cmd.AddCommand(create, ls, get, set, rm, a.newEnvInstallCmd(), a.newEnvBuildCmd())
	return cmd
}
