package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestTrajectoryStepReplay: a completed step is replayed from the log and never runs twice; a
// running step is attached to; a reused step ID with another request is a conflict; the log is
// ordered, durable across kill -9, and exported by the API and the CLI.
func TestTrajectoryStepReplay(t *testing.T) { forRuntimes(t, testTrajectoryStepReplay) }

func testTrajectoryStepReplay(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	sb := p.create(corral.CreateRequest{})
	appendLine := corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo ran >> /root/count; wc -l < /root/count"}, StepID: "step-1"}

	first, _, exit := p.runReq(sb.ID, appendLine)
	if first != "1\n" || exit.Code != 0 {
		t.Fatalf("first run: %q %+v", first, exit)
	}
	st, err := p.Client.Exec(ctx, sb.ID, appendLine)
	if err != nil {
		t.Fatal(err)
	}
	start, err := st.Next()
	if err != nil || start.Type != "start" || !start.Replayed {
		t.Fatalf("start event of a replay = %+v, %v; want replayed", start, err)
	}
	st.Close()
	again, _, exit := p.runReq(sb.ID, appendLine)
	if again != "1\n" || exit.Code != 0 {
		t.Fatalf("replayed output %q %+v, want the recorded 1", again, exit)
	}
	if got := p.sh(sb.ID, "wc -l < /root/count"); got != "1\n" {
		t.Fatalf("the step ran again: /root/count has %s lines", strings.TrimSpace(got))
	}
	other := appendLine
	other.Argv = []string{"true"}
	if _, _, _, err := p.Client.Run(ctx, sb.ID, other); !corral.IsConflict(err) {
		t.Fatalf("step_id reused for another request: err = %v, want conflict", err)
	}

	// A step still running when the client comes back is attached to, not started again.
	slow := corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo x >> /root/slow; sleep 1; echo finished"}, StepID: "step-2"}
	st, err = p.Client.Exec(ctx, sb.ID, slow)
	if err != nil {
		t.Fatal(err)
	}
	st.Next()
	st.Close()
	out, _, exit := p.runReq(sb.ID, slow)
	if out != "finished\n" || exit.Code != 0 {
		t.Fatalf("re-attached step: %q %+v", out, exit)
	}
	if got := p.sh(sb.ID, "wc -l < /root/slow"); got != "1\n" {
		t.Fatalf("running step started twice: %s lines", strings.TrimSpace(got))
	}

	// Durable across kill -9; a step running at that moment is completed after the restart.
	if _, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 1; echo late"}, StepID: "step-3"}); err != nil {
		t.Fatal(err)
	}
	p.Kill9()
	p.Restart()
	if out, _, _ := p.runReq(sb.ID, appendLine); out != "1\n" {
		t.Fatalf("replay after kill -9: %q", out)
	}
	var steps []corral.TrajectoryEntry
	eventually(t, 15*time.Second, "step-3 to be recorded as done after the restart", func() bool {
		steps, err = p.Client.Trajectory(ctx, sb.ID, 0)
		for _, s := range steps {
			if s.StepID == "step-3" {
				return s.State == corral.StepDone && len(s.Output) == 1 && string(s.Output[0].Data) == "late\n"
			}
		}
		return false
	})
	for i, s := range steps {
		if s.Seq != int64(i+1) {
			t.Fatalf("step %d has seq %d: the log is not ordered", i, s.Seq)
		}
	}
	if _, err := p.Client.WriteFile(ctx, sb.ID, "/root/f", strings.NewReader("abc"), corral.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	steps, _ = p.Client.Trajectory(ctx, sb.ID, int64(len(steps)))
	if len(steps) != 1 || steps[0].Kind != "write_file" || steps[0].State != corral.StepDone {
		t.Fatalf("file write in the trajectory: %+v", steps)
	}

	// The CLI: --step and `corral log -o json` (JSON lines).
	for range 2 {
		if _, errOut, code := p.cli("", "exec", sb.ID, "--step", "cli-1", "--", "sh", "-c", "echo c >> /root/cli"); code != 0 {
			t.Fatalf("exec --step: %d %s", code, errOut)
		}
	}
	if got := p.sh(sb.ID, "wc -l < /root/cli"); got != "1\n" {
		t.Fatalf("corral exec --step twice ran %s times", strings.TrimSpace(got))
	}
	out, _, code := p.cli("", "log", sb.ID, "-o", "json")
	if code != 0 {
		t.Fatalf("corral log: exit %d", code)
	}
	lines := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var e corral.TrajectoryEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("corral log line %q: %v", sc.Text(), err)
		}
		lines++
	}
	if lines < 8 {
		t.Fatalf("corral log printed %d entries, want every call", lines)
	}

	// corral replay re-runs the exec steps in a fresh sandbox: all match here, and a step whose
	// result depends on state the log cannot carry (a file written through the API) differs.
	logFile := t.TempDir() + "/trajectory.jsonl"
	if err := os.WriteFile(logFile, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	rout, rerr, code := p.cli("", "replay", logFile, "--base", "base:test")
	if code != 0 || !strings.Contains(rout, "same") || !strings.Contains(rout, "skipped") {
		t.Fatalf("corral replay: exit %d\n%s\n%s", code, rout, rerr)
	}
	p.sh(sb.ID, "cat /root/f")
	out, _, _ = p.cli("", "log", sb.ID, "-o", "json")
	os.WriteFile(logFile, []byte(out), 0o644)
	if rout, _, code = p.cli("", "replay", logFile, "--base", "base:test"); code != 1 || !strings.Contains(rout, "DIFFERS") {
		t.Fatalf("replay of a step that reads an API-written file: exit %d\n%s", code, rout)
	}
}
