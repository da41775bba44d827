package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/spf13/cobra"
)

// replayResult is one line of `corral replay -o json`.
type replayResult struct {
	Seq     int64        `json:"seq"`
	StepID  string       `json:"step_id,omitempty"`
	Argv    []string     `json:"argv"`
	Same    bool         `json:"same"`
	Diff    string       `json:"diff,omitempty"`
	Exit    *corral.Exit `json:"exit,omitempty"`
	Skipped string       `json:"skipped,omitempty"`
}

// newReplayCmd returns `corral replay FILE [create flags]`: re-run a trajectory (the JSON lines
// of `corral log -o json`) in a fresh sandbox and report where the results differ.
func (a *app) newReplayCmd() *cobra.Command {
	var cf createFlags
	var keep bool
	cmd := &cobra.Command{
		Use:   "replay FILE [create flags]",
		Short: "Re-run a trajectory (corral log -o json) in a fresh sandbox and report where outputs differ",
		Long: `Re-run a trajectory in a fresh sandbox and report, step by step, whether stdout, stderr
and the exit code match the recording. FILE is what 'corral log ID -o json' printed ('-' for
stdin). Exec steps are re-run in order; file writes cannot be replayed (their contents are not
in the log) and are reported as skipped. Exit code: 0 when every replayed step matched, 1
otherwise.`,
		Args: exactArgs(1, "a trajectory file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var in io.Reader = a.stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			var steps []corral.TrajectoryEntry
			sc := bufio.NewScanner(in)
			sc.Buffer(make([]byte, 1<<20), 64<<20)
			for sc.Scan() {
				if len(bytes.TrimSpace(sc.Bytes())) == 0 {
					continue
				}
				var e corral.TrajectoryEntry
				if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
					return fmt.Errorf("%s: line %d: %v", args[0], len(steps)+1, err)
				}
				steps = append(steps, e)
			}
			if err := sc.Err(); err != nil {
				return err
			}
			req, err := cf.request()
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			// As in `corral run`: creation and the final delete are not cut short by an interrupt,
			// so no sandbox is left running with an ID we never learnt.
			sb, err := c.CreateSandbox(context.WithoutCancel(ctx), req)
			if err != nil {
				return err
			}
			if !keep {
				defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
			}
			fmt.Fprintf(a.stderr, "replaying %d steps in %s\n", len(steps), sb.ID)
			differ := 0
			enc := json.NewEncoder(a.stdout)
			for _, s := range steps {
				res := replayResult{Seq: s.Seq, StepID: s.StepID}
				var er corral.ExecRequest
				raw, _ := json.Marshal(s.Request)
				json.Unmarshal(raw, &er)
				res.Argv = er.Argv
				switch {
				case s.Kind != "exec":
					res.Skipped = s.Kind + " steps cannot be replayed (contents are not in the log)"
				case s.State != corral.StepDone:
					res.Skipped = "the recorded step did not complete"
				default:
					er.StepID, er.Stdin = "", nil // a fresh run; recorded stdin is only a hash
					stdout, stderr, exit, err := c.Run(ctx, sb.ID, er)
					if err != nil {
						res.Diff = "error: " + a.describe(err)
						break
					}
					res.Exit = exit
					var wantOut, wantErr bytes.Buffer
					for _, ev := range s.Output {
						if ev.Type == corral.EventStdout {
							wantOut.Write(ev.Data)
						} else if ev.Type == corral.EventStderr {
							wantErr.Write(ev.Data)
						}
					}
					switch {
					case s.Exit != nil && exit.Code != s.Exit.Code:
						res.Diff = fmt.Sprintf("exit %d, recorded %d", exit.Code, s.Exit.Code)
					case !s.OutputTruncated && !bytes.Equal(stdout, wantOut.Bytes()):
						res.Diff = fmt.Sprintf("stdout differs (%d bytes, recorded %d)", len(stdout), wantOut.Len())
					case !s.OutputTruncated && !bytes.Equal(stderr, wantErr.Bytes()):
						res.Diff = fmt.Sprintf("stderr differs (%d bytes, recorded %d)", len(stderr), wantErr.Len())
					default:
						res.Same = true
					}
				}
				if res.Skipped == "" && !res.Same {
					differ++
				}
				if a.jsonOut() {
					enc.Encode(res)
					continue
				}
				verdict := "same"
				switch {
				case res.Skipped != "":
					verdict = "skipped: " + res.Skipped
				case !res.Same:
					verdict = "DIFFERS: " + res.Diff
				}
				fmt.Fprintf(a.stdout, "%4d %-12s %s\n", s.Seq, truncate(summarizeRequest(s), 40), verdict)
			}
			if differ > 0 {
				return exitError{code: 1}
			}
			return nil
		},
	}
	cf.add(cmd.Flags(), a.getenv)
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the sandbox after the replay")
	return cmd
}
