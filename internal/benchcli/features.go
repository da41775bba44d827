package benchcli

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/bench"
	corral "github.com/corral-dev/corral/sdk/go"
)

// addFeatureBenchCmds adds the benchmarks of warm pools, fork, tracing, Dockerfile builds and the
// desktop.
func (a *app) addFeatureBenchCmds(cmd *cobra.Command) {
	var wc bench.WarmConfig
	warm := &cobra.Command{
		Use:   "warm",
		Short: "Warm pools: create→first exec from a warm environment vs runc run, and a burst from a full pool vs runc run --detach",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := bench.Warm(cmd.Context(), c, wc, slog.New(slog.NewTextHandler(a.stderr, nil)))
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(res)
			}
			t := newTable(a.stdout)
			t.row("MEASURE", "CORRAL p50/p99", "BASELINE p50/p99", "RATIO p50 (p99)")
			t.row("warm create→first exec (ms)", fmt.Sprintf("%.1f / %.1f", res.TTI.P50, res.TTI.P99),
				fmt.Sprintf("%.1f / %.1f (runc run true)", res.TTIBaseline.P50, res.TTIBaseline.P99), fmt.Sprintf("%.2fx (%.2fx)", res.TTIRatioP50, res.TTIRatioP99))
			t.row(fmt.Sprintf("burst of %d creates/s at concurrency %d", res.Burst, res.Concurrency), fmt.Sprintf("%.1f (hit rate %.2f)", res.BurstPerSec, res.BurstHitRate),
				fmt.Sprintf("%.1f (runc run --detach)", res.BurstBaselinePerSec), fmt.Sprintf("%.2fx", res.BurstRatio))
			if res.Sustained > 0 {
				t.row(fmt.Sprintf("sustained %d create+delete/s at concurrency %d", res.Sustained, res.Concurrency), fmt.Sprintf("%.1f (hit rate %.2f)", res.SustainedPerSec, res.SustainedHitRate),
					fmt.Sprintf("%.1f (runc run --detach + delete)", res.SustainedBaselinePerSec), fmt.Sprintf("%.2fx", res.SustainedRatio))
			}
			t.row(fmt.Sprintf("pool of %d: fill, MiB each", res.Burst), fmt.Sprintf("%.1fs; agent PSS %.2f, cgroup %.2f, host %.2f", res.PoolFillSeconds, res.PoolAgentPSSMiB, res.PoolCgroupMiB, res.PoolHostMiBPerSbx), "-", "-")
			return t.flush()
		},
	}
	wf := warm.Flags()
	wf.StringVar(&wc.Base, "base", "base:default", "base layer NAME:VERSION of the environment")
	wf.StringVar(&wc.Env, "env", "bench-warm", "the environment the run saves and deletes")
	wf.IntVar(&wc.TTIRounds, "tti", 50, "warm create→first exec samples (and as many runc run samples)")
	wf.IntVar(&wc.Burst, "burst", 64, "the pool's size and the creates of the burst")
	wf.IntVar(&wc.Concurrency, "concurrency", 8, "concurrent creators in the burst")
	wf.IntVar(&wc.Sustained, "sustained", 0, "then N create-then-delete steps at --concurrency with the pool refilling, against runc run --detach + delete (0 skips it)")
	cmd.AddCommand(warm)

	var fkc bench.ForkConfig
	fork := a.jsonBench("fork", "Time to N ready copies of a sandbox holding memory (corral fork) against N creates from scratch, p50/p99; host memory of the copies",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.Fork(ctx, c, fkc, log)
		})
	fkf := fork.Flags()
	fkf.StringVar(&fkc.Base, "base", "base:default", "base layer NAME:VERSION")
	fkf.StringVar(&fkc.Runtime, "runtime", "gvisor", "runtime of the source and the creates: gvisor or microvm (memory and processes), or runc (disk only)")
	fkf.IntVar(&fkc.HeldMiB, "held-mib", 256, "anonymous memory the source's process holds")
	fkf.IntSliceVar(&fkc.Counts, "counts", []int{1, 8}, "copies per fork, one measure each")
	fkf.IntVar(&fkc.Rounds, "rounds", 5, "forks (and batches of creates) per count")
	cmd.AddCommand(fork)

	var tc bench.TracingConfig
	var untracedURL, untracedToken string
	tracing := a.jsonBench("trace", "Create→first exec and exec round trip with traces exported over OTLP (this server, --otlp-endpoint) against a corral up without (--without-url), sampled alternately",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			without, err := bench.NewClientFromTokenFile(untracedURL, untracedToken)
			if err != nil {
				return nil, err
			}
			return bench.Tracing(ctx, c, without, tc, log)
		})
	tf := tracing.Flags()
	tf.StringVar(&tc.Base, "base", "base:default", "base layer NAME:VERSION (on both servers)")
	tf.IntVar(&tc.TTIRounds, "tti", 50, "create→first exec samples per server")
	tf.IntVar(&tc.ExecRounds, "exec", 200, "exec round trips per server")
	tf.StringVar(&untracedURL, "without-url", "", "URL of a corral up without --otlp-endpoint on this host")
	tf.StringVar(&untracedToken, "without-token-file", "", "its admin token file (DATA-DIR/admin.token)")
	cmd.AddCommand(tracing)

	var bc bench.BuildConfig
	buildBench := a.jsonBench("build --base N:V --rootfs DIR", "A 5-step Dockerfile built cold and after a change of its last step: corral env build against podman build of the same file, alternating",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			if bc.Rootfs == "" {
				return nil, usagef("--rootfs is required: the base layer's directory (imported into podman as the same base)")
			}
			return bench.Build(ctx, c, bc, log)
		})
	bf := buildBench.Flags()
	bf.StringVar(&bc.Base, "base", "base:default", "base layer NAME:VERSION (published from --rootfs)")
	bf.StringVar(&bc.Rootfs, "rootfs", "", "the base layer's directory")
	bf.IntVar(&bc.Rounds, "rounds", 5, "cold builds and last-step rebuilds per builder")
	bf.IntVar(&bc.Files, "files", 100, "4 KiB files in the context the COPY step copies")
	bf.StringVar(&bc.Podman, "podman", "", "podman binary for the baseline (default: on PATH; none skips it)")
	bf.StringVar(&bc.PodmanRuntime, "podman-runtime", "", "OCI runtime podman runs RUN steps with (default: Corral's runc)")
	cmd.AddCommand(buildBench)

	var dtc bench.DesktopConfig
	desktop := a.jsonBench("desktop", "A desktop environment's container sandboxes: create→first screenshot vs create→first exec, screenshot vs exec round trip, input round trip (--vm-image: the vm tier's screenshot and input, same run)",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.Desktop(ctx, c, dtc, log)
		})
	dtf := desktop.Flags()
	dtf.StringVar(&dtc.Env, "env", "desktop", "the environment (corral env install desktop)")
	dtf.IntVar(&dtc.Creates, "creates", 10, "sandboxes created for each way of getting a first answer")
	dtf.IntVar(&dtc.Screens, "screens", 50, "screenshots (and execs) timed")
	dtf.IntVar(&dtc.Inputs, "inputs", 10, "input → changed screenshot samples")
	dtf.StringVar(&dtc.VMImage, "vm-image", "", "also measure the vm tier's screen and input on a VM of this vm-image layer NAME:VERSION")
	dtf.DurationVar(&dtc.VMWait, "vm-wait", 10*time.Minute, "how long the VM's agent and shell are waited for before its input is left unmeasured")
	cmd.AddCommand(desktop)
}
