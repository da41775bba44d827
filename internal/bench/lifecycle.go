package bench

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// LifecycleConfig sizes a lifecycle benchmark run.
type LifecycleConfig struct {
	Base        string
	Steps       int // executed and replayed steps
	TTIRounds   int // create-from-snapshot vs create-from-base samples
	SnapshotMiB int // changes in the snapshotted sandbox
	PauseRounds int
	PauseMiB    int // anonymous memory held while paused
}

// LifecycleResult is what one lifecycle run measured.
type LifecycleResult struct {
	Date string `json:"date"`

	StepExecuted Stats   `json:"step_executed_true"`
	StepReplayed Stats   `json:"step_replayed_true"`
	ReplayRatio  float64 `json:"step_replay_ratio_p50"`

	SnapshotMiB        int     `json:"snapshot_changes_mib"`
	SnapshotMs         float64 `json:"snapshot_ms"`
	SnapshotBytes      int64   `json:"snapshot_stored_bytes"`
	TTIFromSnapshot    Stats   `json:"tti_from_snapshot"`
	TTIFromBase        Stats   `json:"tti_from_base"`
	SnapshotTTIRatio   float64 `json:"tti_from_snapshot_ratio_p50"`
	PauseMiB           int     `json:"pause_held_mib"`
	Pause              Stats   `json:"pause"`
	Resume             Stats   `json:"resume"`
	PauseReturnedRatio float64 `json:"pause_memory_returned_ratio_min"`
	PauseNoSwap        bool    `json:"pause_no_swap,omitempty"`
}

// Lifecycle measures step replay against execution, snapshots, create-from-snapshot against
// create-from-base, and pause/resume through the API.
func Lifecycle(ctx context.Context, c *corral.Client, cfg LifecycleConfig, log *slog.Logger) (*LifecycleResult, error) {
	res := &LifecycleResult{Date: time.Now().UTC().Format(time.RFC3339), SnapshotMiB: cfg.SnapshotMiB, PauseMiB: cfg.PauseMiB}
	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base, Limits: corral.Limits{MemoryBytes: int64(cfg.PauseMiB)*3<<20 + 256<<20}})
	if err != nil {
		return nil, err
	}
	defer c.DeleteSandbox(ctx, sb.ID)

	log.Info("measuring step replay", "steps", cfg.Steps)
	var executed, replayed []time.Duration
	for i := range cfg.Steps {
		req := corral.ExecRequest{Argv: []string{"true"}, StepID: fmt.Sprintf("bench-%d", i)}
		start := time.Now()
		if _, _, _, err := c.Run(ctx, sb.ID, req); err != nil {
			return nil, err
		}
		executed = append(executed, time.Since(start))
		start = time.Now()
		if _, _, _, err := c.Run(ctx, sb.ID, req); err != nil {
			return nil, err
		}
		replayed = append(replayed, time.Since(start))
	}
	res.StepExecuted, res.StepReplayed = summarise(executed), summarise(replayed)
	res.ReplayRatio = res.StepReplayed.P50 / res.StepExecuted.P50

	log.Info("measuring a snapshot", "changes_mib", cfg.SnapshotMiB)
	script := fmt.Sprintf("mkdir -p /data && head -c %d /dev/urandom > /data/blob && sync", cfg.SnapshotMiB<<20)
	if _, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", script}}); err != nil || exit.Code != 0 {
		return nil, fmt.Errorf("write changes: %v %+v", err, exit)
	}
	version := fmt.Sprintf("b%d", time.Now().UnixNano())
	start := time.Now()
	snap, err := c.Snapshot(ctx, sb.ID, corral.SnapshotRequest{Name: "bench-snapshot", Version: version})
	if err != nil {
		return nil, err
	}
	res.SnapshotMs = float64(time.Since(start).Microseconds()) / 1000
	res.SnapshotBytes = snap.Size

	log.Info("measuring create from snapshot vs from base", "rounds", cfg.TTIRounds)
	var fromSnap, fromBase []time.Duration
	for range cfg.TTIRounds {
		for _, req := range []corral.CreateRequest{{FromSnapshot: "bench-snapshot:" + version}, {Base: cfg.Base}} {
			start := time.Now()
			s, err := c.CreateSandbox(ctx, req)
			if err != nil {
				return nil, err
			}
			if _, _, _, err := c.Run(ctx, s.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
				return nil, err
			}
			d := time.Since(start)
			c.DeleteSandbox(ctx, s.ID)
			if req.FromSnapshot != "" {
				fromSnap = append(fromSnap, d)
			} else {
				fromBase = append(fromBase, d)
			}
		}
	}
	res.TTIFromSnapshot, res.TTIFromBase = summarise(fromSnap), summarise(fromBase)
	res.SnapshotTTIRatio = res.TTIFromSnapshot.P50 / res.TTIFromBase.P50

	log.Info("measuring pause and resume", "rounds", cfg.PauseRounds, "held_mib", cfg.PauseMiB)
	hold := fmt.Sprintf(`BEGIN { s = "x"; while (length(s) < %d) s = s s; print "ready"; fflush(); system("sleep 100000") }`, cfg.PauseMiB<<20/2+1)
	cmd, err := c.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"awk", hold}})
	if err != nil {
		return nil, err
	}
	st, err := c.Attach(ctx, sb.ID, cmd.ID, 0, true)
	if err != nil {
		return nil, err
	}
	if ev, err := st.Next(); err != nil || string(ev.Data) != "ready\n" {
		st.Close()
		return nil, fmt.Errorf("memory holder: %+v %v", ev, err)
	}
	st.Close()
	var pauses, resumes []time.Duration
	res.PauseReturnedRatio = 1
	for range cfg.PauseRounds {
		start := time.Now()
		p, err := c.PauseSandbox(ctx, sb.ID)
		if err != nil {
			return nil, err
		}
		pauses = append(pauses, time.Since(start))
		if lp := p.LastPause; lp != nil && lp.MemoryBefore > 0 {
			res.PauseReturnedRatio = min(res.PauseReturnedRatio, float64(lp.MemoryReturned)/float64(lp.MemoryBefore))
			res.PauseNoSwap = res.PauseNoSwap || lp.NoSwap
		}
		start = time.Now()
		if _, err := c.ResumeSandbox(ctx, sb.ID); err != nil {
			return nil, err
		}
		resumes = append(resumes, time.Since(start))
		time.Sleep(time.Second) // let the background prefetch bring the memory back
	}
	res.Pause, res.Resume = summarise(pauses), summarise(resumes)
	return res, nil
}
