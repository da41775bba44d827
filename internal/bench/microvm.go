package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// MicroVMConfig sets the sizes of a microvm benchmark run.
type MicroVMConfig struct {
	Base        string // layer NAME:VERSION to create sandboxes from
	TTIRounds   int    // create→first exec samples, per tier
	ExecRounds  int    // exec round trips, per tier
	PauseRounds int    // pause/resume rounds, per tier
	Idle        int    // idle microVMs for the memory measure
	MemoryMiB   int64  // memory limit of every sandbox (a VM's RAM)
	// Templates measures only create→first exec of VMs restored from a template, against a
	// corral up started with --microvm-templates (and boot TTI on it, for the ratio).
	Templates bool
	// Warm measures only create→first exec of VMs claimed from a warm pool (an environment of
	// tier microvm with warm 1, the pool full before each sample) against booted VMs of the
	// same shape (the tier's default limits, so MemoryMiB does not apply), sampled in turn.
	Warm bool
}

// MicroVMResult is what one run measured. Every figure of the microvm tier has its container
// counterpart from the same run, and the accelerator is named.
type MicroVMResult struct {
	Date        string `json:"date"`
	Accelerator string `json:"accelerator"`
	QEMU        string `json:"qemu_version"`
	MemoryMiB   int64  `json:"memory_mib"`

	TTI           Stats   `json:"tti_microvm"`
	TTIContainer  Stats   `json:"tti_container"`
	TTIRatioP50   float64 `json:"tti_ratio_p50"`
	Exec          Stats   `json:"exec_microvm"`
	ExecContainer Stats   `json:"exec_container"`
	ExecRatioP50  float64 `json:"exec_ratio_p50"`

	Pause                     Stats   `json:"pause_microvm"`
	Resume                    Stats   `json:"resume_microvm"`
	PauseContainer            Stats   `json:"pause_container"`
	ResumeContainer           Stats   `json:"resume_container"`
	PauseReturnedMiB          float64 `json:"pause_memory_returned_mib_microvm"`
	PauseReturnedContainerMiB float64 `json:"pause_memory_returned_mib_container"`

	// TTITemplate is create→first exec of VMs restored from their shape's template (Templates
	// mode), TTIBoot that of the booted VM that built it, TTITemplateRatioP50 against TTIContainer.
	TTITemplate         Stats   `json:"tti_microvm_template,omitzero"`
	TTIBoot             Stats   `json:"tti_microvm_boot,omitzero"`
	TTITemplateRatioP50 float64 `json:"tti_template_ratio_p50,omitempty"`

	// TTIWarm is create→first exec of VMs claimed from a warm pool (Warm mode), TTICold that of
	// booted VMs of the same shape sampled in turn; the ratios are warm/cold.
	TTIWarm         Stats   `json:"tti_microvm_warm,omitzero"`
	TTICold         Stats   `json:"tti_microvm_cold,omitzero"`
	TTIWarmRatioP50 float64 `json:"tti_warm_ratio_p50,omitempty"`
	TTIWarmRatioP99 float64 `json:"tti_warm_ratio_p99,omitempty"`

	Idle             int     `json:"idle_microvms"`
	IdleQEMURSSMiB   float64 `json:"idle_qemu_rss_mib_per_vm"`
	IdleQEMUPSSMiB   float64 `json:"idle_qemu_pss_mib_per_vm"`
	IdleHostMiBPerVM float64 `json:"idle_host_mib_per_vm"`
}

func (c MicroVMConfig) withDefaults() MicroVMConfig {
	if c.Base == "" {
		c.Base = "base:default"
	}
	if c.TTIRounds <= 0 {
		c.TTIRounds = 10
	}
	if c.ExecRounds <= 0 {
		c.ExecRounds = 100
	}
	if c.PauseRounds <= 0 {
		c.PauseRounds = 5
	}
	if c.Idle < 0 {
		c.Idle = 0
	}
	if c.MemoryMiB <= 0 {
		c.MemoryMiB = 256
	}
	return c
}

// MicroVM measures the microvm tier against the container tier on the same corral up and base:
// create→first exec, exec round trip, pause and resume (and the memory a pause returns), and the
// host memory of idle VMs.
func MicroVM(ctx context.Context, c *corral.Client, cfg MicroVMConfig, log *slog.Logger) (*MicroVMResult, error) {
	cfg = cfg.withDefaults()
	info, err := c.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.MicroVMUnavailable != "" {
		return nil, errors.New("the microvm tier is unavailable: " + info.MicroVMUnavailable)
	}
	res := &MicroVMResult{Date: time.Now().UTC().Format(time.RFC3339), Accelerator: info.MicroVMAccelerator,
		QEMU: info.QEMUVersion, MemoryMiB: cfg.MemoryMiB}
	req := func(tier string) corral.CreateRequest {
		return corral.CreateRequest{Base: cfg.Base, Tier: tier, Limits: corral.Limits{MemoryBytes: cfg.MemoryMiB << 20, DiskBytes: 1 << 30}}
	}
	if cfg.Templates {
		return res, templateTTI(ctx, c, cfg, req, res, log)
	}
	if cfg.Warm {
		return res, warmTTI(ctx, c, cfg, res, log)
	}
	for _, tier := range []string{"container", "microvm"} {
		log.Info("create→first exec", "tier", tier, "rounds", cfg.TTIRounds)
		tti, err := createToExec(ctx, c, req(tier), cfg.TTIRounds)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tier, err)
		}
		sb, err := c.CreateSandbox(ctx, req(tier))
		if err != nil {
			return nil, fmt.Errorf("%s: create: %w", tier, err)
		}
		execs, pauses, resumes, returned, err := microRounds(ctx, c, sb.ID, cfg)
		c.DeleteSandbox(ctx, sb.ID)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tier, err)
		}
		if tier == "microvm" {
			res.TTI, res.Exec, res.Pause, res.Resume = summarise(tti), summarise(execs), summarise(pauses), summarise(resumes)
			res.PauseReturnedMiB = returned
		} else {
			res.TTIContainer, res.ExecContainer = summarise(tti), summarise(execs)
			res.PauseContainer, res.ResumeContainer = summarise(pauses), summarise(resumes)
			res.PauseReturnedContainerMiB = returned
		}
	}
	res.TTIRatioP50 = ratio(res.TTI.P50, res.TTIContainer.P50)
	res.ExecRatioP50 = ratio(res.Exec.P50, res.ExecContainer.P50)
	if cfg.Idle > 0 {
		if err := idleVMs(ctx, c, cfg, req("microvm"), res, log); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// createToExec times rounds creates of req until their first exec answers, deleting each.
func createToExec(ctx context.Context, c *corral.Client, req corral.CreateRequest, rounds int) ([]time.Duration, error) {
	var tti []time.Duration
	for range rounds {
		start := time.Now()
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		_, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}})
		tti = append(tti, time.Since(start))
		c.DeleteSandbox(ctx, sb.ID)
		if err != nil || exit == nil || exit.Code != 0 {
			return nil, fmt.Errorf("first exec: %v %+v", err, exit)
		}
	}
	return tti, nil
}

// warmTTI is the Warm mode: it saves an environment of tier microvm with warm 1 on cfg.Base,
// then takes cfg.TTIRounds samples each of a create naming it (a claim, the pool full) and of a
// create of a booted VM of the same shape (with the pool full again, so that its refill does not
// compete), and deletes the environment.
func warmTTI(ctx context.Context, c *corral.Client, cfg MicroVMConfig, res *MicroVMResult, log *slog.Logger) error {
	env := fmt.Sprintf("bench-warm-vm-%d", os.Getpid())
	if _, err := c.SaveEnvironment(ctx, corral.Environment{Name: env, Base: cfg.Base, Tier: "microvm", Warm: 1}); err != nil {
		return err
	}
	defer c.DeleteEnvironment(context.WithoutCancel(ctx), env)
	once := func(req corral.CreateRequest, want string) (time.Duration, error) {
		if err := waitReady(ctx, c, env, 1, 5*time.Minute); err != nil {
			return 0, err
		}
		start := time.Now()
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			return 0, err
		}
		defer c.DeleteSandbox(ctx, sb.ID)
		_, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}})
		if err != nil || exit == nil || exit.Code != 0 {
			return 0, fmt.Errorf("first exec: %v %+v", err, exit)
		}
		d := time.Since(start)
		if sb.Boot != want {
			return 0, fmt.Errorf("a VM that should have been %q was %q", want, sb.Boot)
		}
		return d, nil
	}
	warm := corral.CreateRequest{Environment: env}
	cold := corral.CreateRequest{Base: cfg.Base, Tier: "microvm"}
	log.Info("filling the pool", "environment", env)
	// One of each first: the layers' files and QEMU's binary in the page cache for both.
	if _, err := once(warm, "warm"); err != nil {
		return err
	}
	if _, err := once(cold, "boot"); err != nil {
		return err
	}
	log.Info("create→first exec, warm and cold in turn", "rounds", cfg.TTIRounds)
	var w, b []time.Duration
	for range cfg.TTIRounds {
		d, err := once(warm, "warm")
		if err != nil {
			return err
		}
		w = append(w, d)
		if d, err = once(cold, "boot"); err != nil {
			return err
		}
		b = append(b, d)
	}
	res.TTIWarm, res.TTICold = summarise(w), summarise(b)
	res.TTIWarmRatioP50 = ratio(res.TTIWarm.P50, res.TTICold.P50)
	res.TTIWarmRatioP99 = ratio(res.TTIWarm.P99, res.TTICold.P99)
	return nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// microRounds measures exec round trips, then pause/resume rounds with 64 MiB of the sandbox's
// memory in use (a process holding it in /dev/shm).
func microRounds(ctx context.Context, c *corral.Client, id string, cfg MicroVMConfig) (execs, pauses, resumes []time.Duration, returnedMiB float64, err error) {
	for range cfg.ExecRounds {
		start := time.Now()
		_, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}})
		if err != nil || exit == nil || exit.Code != 0 {
			return nil, nil, nil, 0, fmt.Errorf("exec: %v %+v", err, exit)
		}
		execs = append(execs, time.Since(start))
	}
	if _, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"sh", "-c", "head -c 64m /dev/zero | tr '\\0' x > /dev/shm/hold"}}); err != nil || exit.Code != 0 {
		return nil, nil, nil, 0, fmt.Errorf("fill memory: %v %+v", err, exit)
	}
	var sum float64
	for range cfg.PauseRounds {
		start := time.Now()
		if _, err := c.PauseSandbox(ctx, id); err != nil {
			return nil, nil, nil, 0, fmt.Errorf("pause: %w", err)
		}
		pauses = append(pauses, time.Since(start))
		sb, err := c.GetSandbox(ctx, id)
		if err == nil && sb.LastPause != nil {
			sum += float64(sb.LastPause.MemoryReturned) / (1 << 20)
		}
		start = time.Now()
		if _, err := c.ResumeSandbox(ctx, id); err != nil {
			return nil, nil, nil, 0, fmt.Errorf("resume: %w", err)
		}
		// Resumed means usable: the first exec after it is part of the figure.
		if _, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}}); err != nil || exit.Code != 0 {
			return nil, nil, nil, 0, fmt.Errorf("exec after resume: %v %+v", err, exit)
		}
		resumes = append(resumes, time.Since(start))
	}
	return execs, pauses, resumes, sum / float64(cfg.PauseRounds), nil
}

// idleVMs creates cfg.Idle microVMs, runs one exec in each and measures their QEMU processes.
func idleVMs(ctx context.Context, c *corral.Client, cfg MicroVMConfig, req corral.CreateRequest, res *MicroVMResult, log *slog.Logger) error {
	log.Info("measuring idle microVM memory", "vms", cfg.Idle)
	dropCaches()
	before := memAvailable()
	var ids []string
	defer func() { deleteAll(ctx, c, ids) }()
	for range cfg.Idle {
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			return fmt.Errorf("idle VM %d: %w", len(ids), err)
		}
		ids = append(ids, sb.ID)
		if _, _, _, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
			return err
		}
	}
	time.Sleep(3 * time.Second)
	dropCaches()
	after := memAvailable()
	var rss, pss float64
	for _, id := range ids {
		pid := qemuPid(id)
		rss += float64(rssOf(pid))
		pss += float64(pssOf(pid))
	}
	n := float64(len(ids))
	res.Idle = len(ids)
	res.IdleQEMURSSMiB = rss / n / (1 << 20)
	res.IdleQEMUPSSMiB = pss / n / (1 << 20)
	res.IdleHostMiBPerVM = float64(before-after) / n / (1 << 20)
	return nil
}

// qemuPid finds the QEMU process of sandbox id (its -name is corral-<id>).
func qemuPid(id string) int64 {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.ParseInt(e.Name(), 10, 64)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "\x00corral-"+id+"\x00") {
			return pid
		}
	}
	return 0
}

// templateTTI measures create→first exec of VMs restored from a template: the first VM of the
// shape boots and builds it; once a create comes back restored, TTIRounds more are timed (every
// one must be a restore), then as many containers.
func templateTTI(ctx context.Context, c *corral.Client, cfg MicroVMConfig, req func(string) corral.CreateRequest, res *MicroVMResult, log *slog.Logger) error {
	once := func(tier string) (time.Duration, string, error) {
		start := time.Now()
		sb, err := c.CreateSandbox(ctx, req(tier))
		if err != nil {
			return 0, "", err
		}
		defer c.DeleteSandbox(ctx, sb.ID)
		_, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}})
		if err != nil || exit == nil || exit.Code != 0 {
			return 0, "", fmt.Errorf("%s: first exec: %v %+v", tier, err, exit)
		}
		return time.Since(start), sb.Boot, nil
	}
	d, boot, err := once("microvm")
	if err != nil {
		return err
	}
	if boot != "boot" {
		return fmt.Errorf("the first VM of its shape was %q, not booted: is a template left from before?", boot)
	}
	res.TTIBoot = summarise([]time.Duration{d})
	log.Info("waiting for the template")
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, boot, err := once("microvm")
		if err != nil {
			return err
		}
		if boot == "template" {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("no VM was restored from a template within 3 minutes")
		}
		time.Sleep(time.Second)
	}
	log.Info("create→first exec from the template", "rounds", cfg.TTIRounds)
	var tpl, ct []time.Duration
	for range cfg.TTIRounds {
		d, boot, err := once("microvm")
		if err != nil {
			return err
		}
		if boot != "template" {
			return fmt.Errorf("a VM of the template's shape booted (%q)", boot)
		}
		tpl = append(tpl, d)
		if d, _, err = once("container"); err != nil {
			return err
		}
		ct = append(ct, d)
	}
	res.TTITemplate, res.TTIContainer = summarise(tpl), summarise(ct)
	res.TTITemplateRatioP50 = ratio(res.TTITemplate.P50, res.TTIContainer.P50)
	return nil
}
