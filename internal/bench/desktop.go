package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// DesktopConfig sizes a desktop benchmark run.
type DesktopConfig struct {
	Env     string // the desktop environment (corral env install desktop)
	Creates int    // sandboxes created, each measured to its first screenshot
	Screens int    // screenshots timed on one sandbox
	Inputs  int    // pointer move → changed screenshot samples
	// VMImage, when set, measures the vm tier's screenshot and input round trip on a VM of
	// this vm-image layer in the same run (its boot is not timed here: corral bench vm).
	VMImage string
	VMWait  time.Duration // how long the vm's agent and shell are waited for (default 10m)
}

// DesktopResult compares computer use on a desktop container with an exec on the same sandbox
// and, when asked, with the vm tier's display in the same run.
type DesktopResult struct {
	Date string `json:"date"`
	// CreateToScreen: create → the first screenshot (PNG) of the sandbox's display;
	// CreateToExec: create → the first exec of `true` in a sandbox of the same environment.
	CreateToScreen Stats   `json:"create_to_first_screenshot"`
	CreateToExec   Stats   `json:"create_to_first_exec"`
	RatioFirst     float64 `json:"ratio_first_screenshot_vs_exec_p50"`
	// Screenshot: GET .../screen round trips on a running desktop; Exec: exec of `true`.
	Screenshot    Stats   `json:"screenshot"`
	ScreenshotKiB float64 `json:"screenshot_kib"`
	Exec          Stats   `json:"exec"`
	RatioScreen   float64 `json:"ratio_screenshot_vs_exec_p50"`
	// InputRoundTrip: a pointer move until a screenshot shows it (scrot draws the pointer).
	InputRoundTrip Stats `json:"input_round_trip"`
	// The vm tier, same run (VMImage): its screenshot and input (a key into tty1's shell until
	// the screen changes) round trips, and the container's over the vm's at p50.
	VMScreenshot     *Stats  `json:"vm_screenshot,omitempty"`
	VMInputRoundTrip *Stats  `json:"vm_input_round_trip,omitempty"`
	RatioScreenVsVM  float64 `json:"ratio_screenshot_container_vs_vm_p50,omitempty"`
	RatioInputVsVM   float64 `json:"ratio_input_container_vs_vm_p50,omitempty"`
}

// Desktop measures a desktop environment's container sandboxes: create→first screenshot against
// create→first exec, screenshot latency against an exec round trip, and the input round trip;
// with cfg.VMImage, the vm tier's screenshot and input round trip in the same run.
func Desktop(ctx context.Context, c *corral.Client, cfg DesktopConfig, log *slog.Logger) (*DesktopResult, error) {
	cfg.Creates, cfg.Screens, cfg.Inputs = max(cfg.Creates, 1), max(cfg.Screens, 1), max(cfg.Inputs, 1)
	if cfg.VMWait <= 0 {
		cfg.VMWait = 10 * time.Minute
	}
	res := &DesktopResult{Date: time.Now().UTC().Format(time.RFC3339)}
	var first, firstExec []time.Duration
	log.Info("measuring create → first screenshot and → first exec", "env", cfg.Env, "creates", cfg.Creates)
	for i := range cfg.Creates {
		for _, screen := range []bool{true, false} {
			start := time.Now()
			sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Environment: cfg.Env, TTL: "10m"})
			if err != nil {
				return nil, fmt.Errorf("create %d: %w", i, err)
			}
			if screen {
				_, _, _, err = c.Screenshot(ctx, sb.ID)
				first = append(first, time.Since(start))
			} else {
				var exit *corral.Exit
				if _, _, exit, err = c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); err == nil && exit.Code != 0 {
					err = fmt.Errorf("exit %+v", exit)
				}
				firstExec = append(firstExec, time.Since(start))
			}
			c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
			if err != nil {
				return nil, fmt.Errorf("first call in %s: %w", sb.ID, err)
			}
		}
	}
	res.CreateToScreen, res.CreateToExec = summarise(first), summarise(firstExec)
	res.RatioFirst = ratio(res.CreateToScreen.P50, res.CreateToExec.P50)

	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Environment: cfg.Env, TTL: "30m"})
	if err != nil {
		return nil, err
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	// The desktop settles (XFCE drawn) before the steady-state samples.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"sh", "-c", "pgrep -x xfdesktop && pgrep -x xfce4-panel"}})
		if err == nil && exit.Code == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("XFCE did not start within 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // the panel and desktop finish drawing
	shots, size, err := screenshots(ctx, c, sb.ID, cfg.Screens)
	if err != nil {
		return nil, err
	}
	res.Screenshot, res.ScreenshotKiB = summarise(shots), size
	var execs []time.Duration
	for range cfg.Screens {
		start := time.Now()
		if _, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil || exit.Code != 0 {
			return nil, fmt.Errorf("exec: %v %+v", err, exit)
		}
		execs = append(execs, time.Since(start))
	}
	res.Exec = summarise(execs)
	res.RatioScreen = ratio(res.Screenshot.P50, res.Exec.P50)
	log.Info("input round trips", "n", cfg.Inputs)
	var inputs []time.Duration
	for i := range cfg.Inputs {
		d, err := pointerRoundTrip(ctx, c, sb.ID, 300+(i%2)*200, 300)
		if err != nil {
			return nil, err
		}
		inputs = append(inputs, d)
	}
	res.InputRoundTrip = summarise(inputs)

	if cfg.VMImage == "" {
		return res, nil
	}
	log.Info("the vm tier: boot, then screenshots and inputs", "image", cfg.VMImage)
	vm, err := c.CreateSandbox(ctx, corral.CreateRequest{Tier: "vm", Image: cfg.VMImage, TTL: "30m", Limits: corral.Limits{MemoryBytes: 1 << 30, CPUs: 2}})
	if err != nil {
		return nil, fmt.Errorf("create a vm: %w", err)
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), vm.ID)
	// The screen answers as soon as QEMU runs: screenshots once the firmware drew something.
	drawn := time.Now().Add(2 * time.Minute)
	for {
		png, _, _, err := c.Screenshot(ctx, vm.ID)
		if err == nil && !blank(png) {
			break
		}
		if time.Now().After(drawn) {
			return nil, fmt.Errorf("vm %s: no screen within 2 minutes: %v", vm.ID, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	vshots, _, err := screenshots(ctx, c, vm.ID, cfg.Screens)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	vs := summarise(vshots)
	res.VMScreenshot, res.RatioScreenVsVM = &vs, ratio(res.Screenshot.P50, vs.P50)
	// Input samples type into tty1's shell: its agent first (a boot under TCG takes minutes;
	// VMWait bounds it, and without a shell by then the vm's input is left unmeasured).
	booted := time.Now().Add(cfg.VMWait)
	for {
		_, _, exit, err := c.Run(ctx, vm.ID, corral.ExecRequest{Argv: []string{"true"}})
		if err == nil && exit.Code == 0 {
			break
		}
		if time.Now().After(booted) {
			log.Warn("the vm's input round trip is not measured: no agent", "vm", vm.ID, "waited", cfg.VMWait, "err", err)
			return res, nil
		}
		time.Sleep(time.Second)
	}
	if err := waitShell(ctx, c, vm.ID); err != nil {
		return nil, err
	}
	var vinputs []time.Duration
	for range cfg.Inputs {
		d, err := inputRoundTrip(ctx, c, vm.ID)
		if err != nil {
			return nil, fmt.Errorf("vm: %w", err)
		}
		vinputs = append(vinputs, d)
	}
	vi := summarise(vinputs)
	res.VMInputRoundTrip = &vi
	res.RatioInputVsVM = ratio(res.InputRoundTrip.P50, vi.P50)
	return res, nil
}

// screenshots times n screenshots of sandbox id and returns their mean size in KiB.
func screenshots(ctx context.Context, c *corral.Client, id string, n int) ([]time.Duration, float64, error) {
	var out []time.Duration
	size := 0
	for range n {
		start := time.Now()
		png, _, _, err := c.Screenshot(ctx, id)
		if err != nil {
			return nil, 0, fmt.Errorf("screenshot: %w", err)
		}
		out = append(out, time.Since(start))
		size += len(png)
	}
	return out, float64(size) / float64(n) / 1024, nil
}

// pointerRoundTrip moves the pointer to x, y and times it until a screenshot differs from the
// one before (scrot draws the pointer into it).
func pointerRoundTrip(ctx context.Context, c *corral.Client, id string, x, y int) (time.Duration, error) {
	before, _, _, err := c.Screenshot(ctx, id)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if _, err := c.Input(ctx, id, corral.InputEvent{Type: corral.InputMove, X: x, Y: y}); err != nil {
		return 0, err
	}
	for {
		now, _, _, err := c.Screenshot(ctx, id)
		if err != nil {
			return 0, err
		}
		if !bytes.Equal(now, before) {
			return time.Since(start), nil
		}
		if time.Since(start) > 30*time.Second {
			return 0, errors.New("the screen did not change within 30s of a pointer move")
		}
	}
}
