package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"log/slog"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// VMConfig sets the sizes of a vm-tier benchmark run.
type VMConfig struct {
	Image       string // vm-image layer NAME:VERSION
	Base        string // base layer of the baseline microvms and containers
	Boots       int    // boots measured (create→first screenshot, →first exec)
	Screens     int    // screenshots timed on a booted VM
	Inputs      int    // key press → visible change samples
	ExecRounds  int    // exec round trips
	PauseRounds int    // pause/resume rounds
	MemoryMiB   int64  // a VM's RAM
	CPUs        float64
}

// VMResult is what one run measured, with the accelerator named and the microvm and container
// tiers' create→first exec from the same run as baselines.
type VMResult struct {
	Date        string  `json:"date"`
	Accelerator string  `json:"accelerator"`
	QEMU        string  `json:"qemu_version"`
	MemoryMiB   int64   `json:"memory_mib"`
	CPUs        float64 `json:"cpus"`

	// BootScreen is create→the first screenshot that is not blank (the firmware's or GRUB's
	// screen); BootExec create→the first exec answered by the guest's agent.
	BootScreen Stats `json:"boot_to_first_screenshot"`
	BootExec   Stats `json:"boot_to_first_exec"`
	// TTIMicroVM and TTIContainer are create→first exec of the other tiers, same run.
	TTIMicroVM          Stats   `json:"tti_microvm"`
	TTIContainer        Stats   `json:"tti_container"`
	BootExecRatioMicro  float64 `json:"boot_exec_ratio_p50_vs_microvm"`
	BootExecRatioContnr float64 `json:"boot_exec_ratio_p50_vs_container"`

	Screenshot     Stats   `json:"screenshot"`
	ScreenshotKiB  float64 `json:"screenshot_kib"`
	InputRoundTrip Stats   `json:"input_round_trip"`
	Exec           Stats   `json:"exec"`

	Pause       Stats   `json:"pause"`
	Resume      Stats   `json:"resume"`
	ReturnedMiB float64 `json:"pause_memory_returned_mib"`

	IdleQEMURSSMiB float64 `json:"idle_qemu_rss_mib"`
	IdleQEMUPSSMiB float64 `json:"idle_qemu_pss_mib"`
}

func (c VMConfig) withDefaults() VMConfig {
	if c.Image == "" {
		c.Image = "debian-vm:bench"
	}
	if c.Base == "" {
		c.Base = "base:default"
	}
	c.Boots = max(c.Boots, 1)
	c.Screens = max(c.Screens, 1)
	c.Inputs = max(c.Inputs, 1)
	c.ExecRounds = max(c.ExecRounds, 1)
	c.PauseRounds = max(c.PauseRounds, 1)
	if c.MemoryMiB <= 0 {
		c.MemoryMiB = 1024
	}
	if c.CPUs <= 0 {
		c.CPUs = 2
	}
	return c
}

// VM measures the vm tier: boots (to the first screenshot and the first exec), screenshot
// latency, input round trip (a key press until the screen changes), exec round trip,
// pause/resume and the memory of an idle VM; and, as baselines, the microvm and container
// tiers' create→first exec on the same server.
func VM(ctx context.Context, c *corral.Client, cfg VMConfig, log *slog.Logger) (*VMResult, error) {
	cfg = cfg.withDefaults()
	info, err := c.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.VMUnavailable != "" {
		return nil, errors.New("the vm tier is unavailable: " + info.VMUnavailable)
	}
	res := &VMResult{Date: time.Now().UTC().Format(time.RFC3339), Accelerator: info.MicroVMAccelerator,
		QEMU: info.QEMUVersion, MemoryMiB: cfg.MemoryMiB, CPUs: cfg.CPUs}
	req := corral.CreateRequest{Tier: "vm", Image: cfg.Image, Limits: corral.Limits{MemoryBytes: cfg.MemoryMiB << 20, CPUs: cfg.CPUs}}
	var screens, execs []time.Duration
	var id string
	defer func() {
		if id != "" {
			c.DeleteSandbox(context.WithoutCancel(ctx), id)
		}
	}()
	for i := range cfg.Boots {
		log.Info("vm boot", "round", i+1, "of", cfg.Boots)
		start := time.Now()
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		id = sb.ID
		for {
			png, _, _, err := c.Screenshot(ctx, id)
			if err == nil && !blank(png) {
				break
			}
			if time.Since(start) > 2*time.Minute {
				return nil, fmt.Errorf("no screen within 2 minutes: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		screens = append(screens, time.Since(start))
		if _, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}}); err != nil || exit.Code != 0 {
			return nil, fmt.Errorf("first exec: %v %+v", err, exit)
		}
		execs = append(execs, time.Since(start))
		if i < cfg.Boots-1 {
			c.DeleteSandbox(ctx, id)
			id = ""
		}
	}
	res.BootScreen, res.BootExec = summarise(screens), summarise(execs)

	// The last VM stays: the rest is measured on it, once its tty1 shell runs.
	if err := waitShell(ctx, c, id); err != nil {
		return nil, err
	}
	time.Sleep(5 * time.Second) // let the boot's last services settle
	if err := idleVM(id, res); err != nil {
		return nil, err
	}
	log.Info("screenshots", "n", cfg.Screens)
	var shots []time.Duration
	var size int
	for range cfg.Screens {
		start := time.Now()
		png, _, _, err := c.Screenshot(ctx, id)
		if err != nil {
			return nil, err
		}
		shots = append(shots, time.Since(start))
		size += len(png)
	}
	res.Screenshot, res.ScreenshotKiB = summarise(shots), float64(size)/float64(cfg.Screens)/1024
	log.Info("input round trips", "n", cfg.Inputs)
	var inputs []time.Duration
	for range cfg.Inputs {
		d, err := inputRoundTrip(ctx, c, id)
		if err != nil {
			return nil, err
		}
		inputs = append(inputs, d)
	}
	res.InputRoundTrip = summarise(inputs)
	log.Info("exec round trips", "n", cfg.ExecRounds)
	var ex []time.Duration
	for range cfg.ExecRounds {
		start := time.Now()
		if _, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}}); err != nil || exit.Code != 0 {
			return nil, fmt.Errorf("exec: %v %+v", err, exit)
		}
		ex = append(ex, time.Since(start))
	}
	res.Exec = summarise(ex)
	log.Info("pause/resume", "rounds", cfg.PauseRounds)
	var pauses, resumes []time.Duration
	var returned float64
	for range cfg.PauseRounds {
		start := time.Now()
		if _, err := c.PauseSandbox(ctx, id); err != nil {
			return nil, fmt.Errorf("pause: %w", err)
		}
		pauses = append(pauses, time.Since(start))
		if sb, err := c.GetSandbox(ctx, id); err == nil && sb.LastPause != nil {
			returned += float64(sb.LastPause.MemoryReturned) / (1 << 20)
		}
		start = time.Now()
		if _, err := c.ResumeSandbox(ctx, id); err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		if _, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}}); err != nil || exit.Code != 0 {
			return nil, fmt.Errorf("exec after resume: %v %+v", err, exit)
		}
		resumes = append(resumes, time.Since(start))
	}
	res.Pause, res.Resume, res.ReturnedMiB = summarise(pauses), summarise(resumes), returned/float64(cfg.PauseRounds)
	c.DeleteSandbox(ctx, id)
	id = ""

	// Baselines: create→first exec of the other tiers, same server, same run.
	for _, tier := range []string{"microvm", "container"} {
		tti, err := createToExec(ctx, c, corral.CreateRequest{Tier: tier, Base: cfg.Base, Limits: corral.Limits{MemoryBytes: 256 << 20}}, cfg.Boots)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tier, err)
		}
		if tier == "microvm" {
			res.TTIMicroVM = summarise(tti)
		} else {
			res.TTIContainer = summarise(tti)
		}
	}
	res.BootExecRatioMicro = ratio(res.BootExec.P50, res.TTIMicroVM.P50)
	res.BootExecRatioContnr = ratio(res.BootExec.P50, res.TTIContainer.P50)
	return res, nil
}

// blank reports whether a PNG screenshot is all one colour (or not a PNG): the screen answers
// as soon as QEMU runs, black until the firmware draws.
func blank(b []byte) bool {
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return true
	}
	r := img.Bounds()
	first := img.At(r.Min.X, r.Min.Y)
	for y := r.Min.Y; y < r.Max.Y; y += 2 {
		for x := r.Min.X; x < r.Max.X; x++ {
			if img.At(x, y) != first {
				return false
			}
		}
	}
	return true
}

// waitShell waits until tty1's root shell (the image's autologin) runs.
func waitShell(ctx context.Context, c *corral.Client, id string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		out, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"pgrep", "-t", "tty1", "-x", "bash"}})
		if err == nil && exit.Code == 0 && strings.TrimSpace(string(out)) != "" {
			time.Sleep(2 * time.Second) // the prompt is drawn after bash starts
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return errors.New("no shell on tty1 within 2 minutes")
}

// inputRoundTrip types one character into tty1's shell and times it until a screenshot shows a
// change, then erases it (not timed).
func inputRoundTrip(ctx context.Context, c *corral.Client, id string) (time.Duration, error) {
	before, _, _, err := c.Screenshot(ctx, id)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := c.Key(ctx, id, "x"); err != nil {
		return 0, err
	}
	for {
		now, _, _, err := c.Screenshot(ctx, id)
		if err != nil {
			return 0, err
		}
		if !bytes.Equal(now, before) {
			break
		}
		if time.Since(start) > 30*time.Second {
			return 0, errors.New("the screen did not change within 30s of a key press")
		}
	}
	d := time.Since(start)
	if err := c.Key(ctx, id, "backspace"); err != nil {
		return 0, err
	}
	time.Sleep(300 * time.Millisecond) // the erase is drawn before the next sample
	return d, nil
}

// idleVM measures the QEMU process of a booted, idle VM.
func idleVM(id string, res *VMResult) error {
	pid := qemuPid(id)
	if pid == 0 {
		return fmt.Errorf("no QEMU process for %s (run the benchmark on the node)", id)
	}
	res.IdleQEMURSSMiB = float64(rssOf(pid)) / (1 << 20)
	res.IdleQEMUPSSMiB = float64(pssOf(pid)) / (1 << 20)
	return nil
}
