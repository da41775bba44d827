package bench

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
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

	SnapshotMiB      int          `json:"snapshot_changes_mib"`
	SnapshotMs       float64      `json:"snapshot_ms"`
	SnapshotBytes    int64        `json:"snapshot_stored_bytes"`
	TTIFromSnapshot  Stats        `json:"tti_from_snapshot"`
	TTIFromBase      Stats        `json:"tti_from_base"`
	SnapshotTTIRatio float64      `json:"tti_from_snapshot_ratio_p50"`
	PauseMiB         int          `json:"pause_held_mib"`
	Runc             PauseResult  `json:"pause_runc"`
	GVisor           *PauseResult `json:"pause_gvisor,omitempty"`
	// TTIGVisor is create-to-first-exec of a gVisor sandbox; GVisorTTIRatio its p50 against
	// TTIFromBase (runc) of the same run.
	TTIGVisor      Stats   `json:"tti_gvisor,omitzero"`
	GVisorTTIRatio float64 `json:"tti_gvisor_ratio_p50,omitempty"`
}

// Lifecycle measures step replay against execution, snapshots, create-from-snapshot against
// create-from-base, and pause/resume through the API.
func Lifecycle(ctx context.Context, c *corral.Client, cfg LifecycleConfig, log *slog.Logger) (*LifecycleResult, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return nil, err
	}
	gvisor := slices.Contains(info.Runtimes, "gvisor")
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

	log.Info("measuring pause and resume", "runtime", "runc", "rounds", cfg.PauseRounds, "held_mib", cfg.PauseMiB)
	res.Runc, err = pauseResume(ctx, c, sb.ID, cfg)
	if err != nil {
		return nil, err
	}
	if !gvisor {
		log.Warn("gVisor not available on the server: no gVisor rows")
		return res, nil
	}
	log.Info("measuring gVisor create-to-first-exec", "rounds", cfg.TTIRounds)
	var gvTTI []time.Duration
	for range cfg.TTIRounds {
		start := time.Now()
		s, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base, Runtime: "gvisor"})
		if err != nil {
			return nil, err
		}
		if _, _, _, err := c.Run(ctx, s.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
			return nil, err
		}
		gvTTI = append(gvTTI, time.Since(start))
		c.DeleteSandbox(ctx, s.ID)
	}
	res.TTIGVisor = summarise(gvTTI)
	res.GVisorTTIRatio = res.TTIGVisor.P50 / res.TTIFromBase.P50
	gv, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base, Runtime: "gvisor", Limits: corral.Limits{MemoryBytes: int64(cfg.PauseMiB)*3<<20 + 256<<20}})
	if err != nil {
		return nil, err
	}
	defer c.DeleteSandbox(ctx, gv.ID)
	log.Info("measuring pause and resume", "runtime", "gvisor", "rounds", cfg.PauseRounds, "held_mib", cfg.PauseMiB)
	gs, err := pauseResume(ctx, c, gv.ID, cfg)
	if err != nil {
		return nil, err
	}
	res.GVisor = &gs
	return res, nil
}

// PauseResult is one runtime's pause and resume figures.
type PauseResult struct {
	Pause  Stats `json:"pause"`
	Resume Stats `json:"resume"`
	// ResumeToExec is a resume call followed by an exec of true: until the first exec result.
	ResumeToExec  Stats   `json:"resume_to_first_exec"`
	ReturnedRatio float64 `json:"memory_returned_ratio_min"`
	NoSwap        bool    `json:"no_swap,omitempty"`
}

// pauseResume starts a process holding cfg.PauseMiB of anonymous memory in sandbox id, then
// pauses and resumes it cfg.PauseRounds times.
func pauseResume(ctx context.Context, c *corral.Client, id string, cfg LifecycleConfig) (PauseResult, error) {
	var res PauseResult
	hold := fmt.Sprintf(`BEGIN { s = "x"; while (length(s) < %d) s = s s; print "ready"; fflush(); system("sleep 100000") }`, cfg.PauseMiB<<20/2+1)
	cmd, err := c.StartCommand(ctx, id, corral.ExecRequest{Argv: []string{"awk", hold}})
	if err != nil {
		return res, err
	}
	st, err := c.Attach(ctx, id, cmd.ID, 0, true)
	if err != nil {
		return res, err
	}
	if ev, err := st.Next(); err != nil || string(ev.Data) != "ready\n" {
		st.Close()
		return res, fmt.Errorf("memory holder: %+v %v", ev, err)
	}
	st.Close()
	var pauses, resumes, toExec []time.Duration
	res.ReturnedRatio = 1
	for range cfg.PauseRounds {
		start := time.Now()
		p, err := c.PauseSandbox(ctx, id)
		if err != nil {
			return res, err
		}
		pauses = append(pauses, time.Since(start))
		if lp := p.LastPause; lp != nil && lp.MemoryBefore > 0 {
			res.ReturnedRatio = min(res.ReturnedRatio, float64(lp.MemoryReturned)/float64(lp.MemoryBefore))
			res.NoSwap = res.NoSwap || lp.NoSwap
		}
		start = time.Now()
		if _, err := c.ResumeSandbox(ctx, id); err != nil {
			return res, err
		}
		resumes = append(resumes, time.Since(start))
		if _, _, _, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
			return res, err
		}
		toExec = append(toExec, time.Since(start))
		time.Sleep(time.Second) // let the background prefetch bring the memory back
	}
	res.Pause, res.Resume, res.ResumeToExec = summarise(pauses), summarise(resumes), summarise(toExec)
	return res, nil
}
