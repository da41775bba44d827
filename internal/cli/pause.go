package cli

import (
	"context"
	"fmt"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/spf13/cobra"
)

// newPauseCmd returns `corral pause ID`; newResumeCmd `corral resume ID`.
func (a *app) newPauseCmd() *cobra.Command {
	return a.lifecycleCmd("pause", "Pause a sandbox: freeze its processes and return its memory to the host",
		func(c *corral.Client, ctx context.Context, id string) (*corral.Sandbox, error) {
			return c.PauseSandbox(ctx, id)
		})
}

func (a *app) newResumeCmd() *cobra.Command {
	return a.lifecycleCmd("resume", "Resume a paused sandbox (any exec or file call also resumes it)",
		func(c *corral.Client, ctx context.Context, id string) (*corral.Sandbox, error) {
			return c.ResumeSandbox(ctx, id)
		})
}

func (a *app) lifecycleCmd(verb, short string, do func(*corral.Client, context.Context, string) (*corral.Sandbox, error)) *cobra.Command {
	return &cobra.Command{
		Use:   verb + " ID",
		Short: short,
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := do(c, cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(sb)
			}
			msg := sb.ID + " " + sb.State
			if p := sb.LastPause; p != nil && verb == "pause" {
				msg += fmt.Sprintf(" (took %.0f ms, returned %s of %s)", p.TookMs, formatBytes(p.MemoryReturned), formatBytes(p.MemoryBefore))
			}
			if p := sb.LastPause; p != nil && verb == "resume" && p.ResumeTookMs > 0 {
				msg += fmt.Sprintf(" (took %.0f ms)", p.ResumeTookMs)
			}
			fmt.Fprintln(a.stdout, msg)
			return nil
		},
	}
}
