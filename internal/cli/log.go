package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/spf13/cobra"
)

// newLogCmd returns `corral log ID`: the sandbox's trajectory log.
func (a *app) newLogCmd() *cobra.Command {
	var after int64
	cmd := &cobra.Command{
		Use:   "log ID",
		Short: "Show a sandbox's trajectory: every exec and file-changing call, in order (-o json: JSON lines)",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			steps, err := c.Trajectory(cmd.Context(), args[0], after)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				enc := json.NewEncoder(a.stdout)
				for i := range steps {
					if err := enc.Encode(&steps[i]); err != nil {
						return err
					}
				}
				return nil
			}
			t := newTable(a.stdout)
			t.row("SEQ", "STEP", "KIND", "STATE", "EXIT", "TOOK", "REQUEST")
			for _, s := range steps {
				exit := "-"
				if s.Exit != nil {
					exit = strconv.Itoa(s.Exit.Code)
					if s.Exit.Signal != "" {
						exit = s.Exit.Signal
					}
				}
				took := "-"
				if !s.EndedAt.IsZero() {
					took = s.EndedAt.Sub(s.StartedAt).Round(time.Millisecond).String()
				}
				kind := s.Kind
				if s.Exclusive {
					kind += " (exclusive)"
				}
				t.row(strconv.FormatInt(s.Seq, 10), orDash(s.StepID), kind, s.State, exit, took, summarizeRequest(s))
			}
			return t.flush()
		},
	}
	cmd.Flags().Int64Var(&after, "after", 0, "only steps with a sequence number above this")
	return cmd
}

// summarizeRequest renders a step's request in one short line.
func summarizeRequest(s corral.TrajectoryEntry) string {
	m, _ := s.Request.(map[string]any)
	if argv, ok := m["argv"].([]any); ok {
		parts := make([]string, 0, len(argv))
		for _, a := range argv {
			parts = append(parts, fmt.Sprint(a))
		}
		return truncate(strings.Join(parts, " "), 60)
	}
	if p, ok := m["path"].(string); ok {
		return p
	}
	return "-"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
