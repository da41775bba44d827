package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

// newNodeCmd returns `corral node`: the cluster's nodes (through a server).
func (a *app) newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "List a cluster's nodes; cordon, drain or uncordon one",
		Args:  exactArgs(0, "a subcommand: ls, cordon, drain or uncordon"),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the nodes: state, incarnation, capacity and use",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(nonNil(list))
			}
			now := a.now()
			t := newTable(a.stdout, "NAME", "STATE", "EPOCH", "SANDBOXES", "CPUS", "MEMORY", "HEARTBEAT", "URL")
			for _, n := range list {
				t.row(n.Name, n.State, fmt.Sprint(n.Epoch), fmt.Sprintf("%d/%d", n.Used.Sandboxes, n.Capacity.Sandboxes),
					fmt.Sprintf("%g/%g", n.Used.CPUs, n.Capacity.CPUs), fmt.Sprintf("%s/%s", bytesOrZero(n.Used.MemoryBytes), bytesOrZero(n.Capacity.MemoryBytes)),
					relTime(n.HeartbeatAt, now), n.URL)
			}
			return t.flush()
		},
	}
	cmd.AddCommand(ls)
	for _, action := range []string{"cordon", "drain", "uncordon"} {
		short := map[string]string{
			"cordon":   "Keep new sandboxes off a node (its own keep running)",
			"drain":    "Keep new sandboxes off a node while its sandboxes end",
			"uncordon": "Let a cordoned or draining node take new sandboxes again",
		}[action]
		cmd.AddCommand(&cobra.Command{
			Use:   action + " NAME",
			Short: short,
			Args:  exactArgs(1, "a node name"),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := a.client()
				if err != nil {
					return err
				}
				n, err := c.NodeAction(cmd.Context(), args[0], action)
				if err != nil {
					return err
				}
				if a.jsonOut() {
					return a.printJSON(n)
				}
				_, err = fmt.Fprintf(a.stdout, "%s: %s\n", n.Name, n.State)
				return err
			},
		})
	}
	return cmd
}
