package cli

import (
	"fmt"
	"strings"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/spf13/cobra"
)

// newSnapshotCmd returns `corral snapshot ID --name N:V [--exclude PATH ...]`.
func (a *app) newSnapshotCmd() *cobra.Command {
	var name string
	var exclude []string
	var public bool
	cmd := &cobra.Command{
		Use:   "snapshot ID --name NAME:VERSION [--exclude PATH ...] [--public]",
		Short: "Publish a sandbox's changes as a snapshot layer (create --from-snapshot starts sandboxes from it)",
		Long: `Publish a sandbox's changes as a snapshot layer of the sandbox's project. Only that project
and its subprojects see and use it (a root-project snapshot: the root project only), unless
--public shows it to every project; corral layer publish and unpublish change that later.`,
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, v, ok := strings.Cut(name, ":")
			if !ok || n == "" || v == "" {
				return usagef("--name must be NAME:VERSION, not %q", name)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.Snapshot(cmd.Context(), args[0], corral.SnapshotRequest{Name: n, Version: v, Exclude: exclude, Public: public})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(l)
			}
			fmt.Fprintf(a.stdout, "%s:%s %s %s %d files\n", l.Name, l.Version, l.Digest, formatBytes(l.Size), l.Files)
			if of := l.Snapshot; of != nil && of.SkippedCount > 0 {
				fmt.Fprintf(a.stderr, "skipped %d entries a layer cannot hold:\n", of.SkippedCount)
				for _, s := range of.Skipped {
					fmt.Fprintf(a.stderr, "  %s: %s\n", s.Path, s.Reason)
				}
				if n := of.SkippedCount - len(of.Skipped); n > 0 {
					fmt.Fprintf(a.stderr, "  ... and %d more\n", n)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "publish as NAME:VERSION (required)")
	cmd.Flags().StringArrayVar(&exclude, "exclude", nil, "leave out the changes under this absolute path (repeatable)")
	cmd.Flags().BoolVar(&public, "public", false, "show the snapshot to every project (default: the sandbox's project and its subprojects)")
	cmd.MarkFlagRequired("name")
	return cmd
}
