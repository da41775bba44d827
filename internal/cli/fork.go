package cli

import (
	"fmt"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/spf13/cobra"
)

// newForkCmd returns `corral fork ID [--count N] [--label K=V]... [--disk-only]`.
func (a *app) newForkCmd() *cobra.Command {
	var count int
	var labels []string
	var diskOnly bool
	var ttl string
	cmd := &cobra.Command{
		Use:   "fork ID [--count N] [--label K=V]... [--disk-only] [--ttl D]",
		Short: "Copy a running sandbox into N sandboxes that go on from its state now",
		Long: `Fork makes N sandboxes that continue from the sandbox's state at this moment: on gVisor and
microvm its memory, running processes and disk (a microvm's copies get their own address and
hostname); with --disk-only (the only fork a runc sandbox has) its disk
alone, the copies' processes starting afresh. Each copy then diverges on its own; the source runs
on after a brief stop. Copies count against quotas like creates, all or nothing.`,
		Example: `  corral fork sb-local-0123456789abcdef --count 8 --label branch=search
  corral fork sb-local-0123456789abcdef --disk-only -o json`,
		Args: exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 1 || count > corral.MaxForkCount {
				return fmt.Errorf("--count %d: want 1 to %d copies", count, corral.MaxForkCount)
			}
			want, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Fork(cmd.Context(), args[0], corral.ForkRequest{Count: count, Labels: want, DiskOnly: diskOnly, TTL: ttl})
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(corral.ForkResult{Sandboxes: list})
			}
			for _, sb := range list {
				fmt.Fprintln(a.stdout, sb.ID+" "+sb.State)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&count, "count", 1, fmt.Sprintf("how many copies (1 to %d)", corral.MaxForkCount))
	cmd.Flags().StringArrayVar(&labels, "label", nil, "label KEY=VALUE set on every copy over the source's (repeatable)")
	cmd.Flags().BoolVar(&diskOnly, "disk-only", false, "copy the disk alone: the copies start their processes afresh (the only fork of a runc sandbox)")
	cmd.Flags().StringVar(&ttl, "ttl", "", "the copies' hard TTL from now, e.g. 30m (default: they expire when the source does)")
	return cmd
}
