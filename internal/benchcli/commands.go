package benchcli

import (
	"context"
	"fmt"
	corral "github.com/corral-dev/corral/sdk/go"
	"log/slog"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/bench"
	"github.com/spf13/cobra"
)

// jsonBench is a bench subcommand that runs one measurement against the configured server and
// prints its result as JSON.
func (a *app) jsonBench(use, short string, run func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := run(cmd.Context(), c, slog.New(slog.NewTextHandler(a.stderr, nil)))
			if err != nil {
				return err
			}
			return a.printJSON(res)
		},
	}
}

// addBenchCmds adds the measurements to root (corral-bench's command tree).
func (a *app) addBenchCmds(cmd *cobra.Command) {
	var cfg bench.Config
	var jsonOut bool
	container := &cobra.Command{
		Use:   "container",
		Short: "Container tier: time to interactive vs runc run, exec vs runc exec, throughput, idle memory",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(a.stderr, nil))
			res, err := bench.Container(cmd.Context(), c, cfg, log)
			if err != nil {
				return err
			}
			if jsonOut || a.jsonOut() {
				return a.printJSON(res)
			}
			t := newTable(a.stdout)
			t.row("MEASURE", "CORRAL p50/p99", "BASELINE p50/p99", "RATIO p50")
			t.row("create→first exec (ms)", fmt.Sprintf("%.1f / %.1f", res.TTI.P50, res.TTI.P99),
				fmt.Sprintf("%.1f / %.1f (runc run true)", res.TTIBaseline.P50, res.TTIBaseline.P99), fmt.Sprintf("%.2fx", res.TTIRatioP50))
			if res.TTIAlone.N > 0 {
				t.row("create→first exec, no other sandbox (ms)", fmt.Sprintf("%.1f / %.1f", res.TTIAlone.P50, res.TTIAlone.P99),
					fmt.Sprintf("%.1f / %.1f (runc run true)", res.TTIBaseline.P50, res.TTIBaseline.P99), fmt.Sprintf("%.2fx", res.TTIAloneRatioP50))
			}
			t.row("exec true (ms)", fmt.Sprintf("%.2f / %.2f", res.Exec.P50, res.Exec.P99),
				fmt.Sprintf("%.1f / %.1f (runc exec true)", res.ExecBaseline.P50, res.ExecBaseline.P99), fmt.Sprintf("%.2fx", res.ExecRatioP50))
			t.row(fmt.Sprintf("creates/s at concurrency %d", res.Concurrency), fmt.Sprintf("%.1f", res.ThroughputPerSec),
				fmt.Sprintf("%.1f (runc run --detach)", res.ThroughputBaselinePerSec), fmt.Sprintf("%.2fx", res.ThroughputRatio))
			if res.Idle > 0 {
				t.row(fmt.Sprintf("host MiB per idle sandbox (%d)", res.Idle), fmt.Sprintf("%.2f", res.IdleHostMiBPerSbx),
					fmt.Sprintf("agent PSS %.2f, edge %.2f, kernel %.2f", res.IdleAgentPSSMiB, res.IdleEdgeMiBPerSbx, res.IdleKernelMiBPerSbx), "-")
			}
			return t.flush()
		},
	}
	f := container.Flags()
	f.StringVar(&cfg.Base, "base", "base:default", "base layer NAME:VERSION to create sandboxes from")
	f.IntVar(&cfg.TTIRounds, "tti", 50, "create→first exec samples (and as many runc run samples)")
	f.DurationVar(&cfg.Settle, "settle", 250*time.Millisecond, "pause after each create→first exec and each runc run sample, so neither side's background work lands in the other's sample (0: back to back)")
	f.DurationVar(&cfg.ExecGap, "exec-gap", 0, "pause between each TTI sample's create and its first exec, left out of the figures (a client that thinks first)")
	f.IntVar(&cfg.Alone, "alone", 10, "create→first exec samples taken first, with no other sandbox on the node and a pause after each delete (0 skips them)")
	f.IntVar(&cfg.ExecRounds, "execs", 200, "exec round trips")
	f.IntVar(&cfg.Throughput, "throughput", 64, "sandboxes created in the throughput test")
	f.IntVar(&cfg.Concurrency, "concurrency", 8, "concurrent creators in the throughput test")
	f.IntVar(&cfg.Idle, "idle", 200, "idle sandboxes for the memory measure (0 skips it)")
	f.BoolVar(&jsonOut, "json", false, "print the result as JSON (same as -o json)")
	cmd.AddCommand(container)

	var hc bench.HostFactsConfig
	var withoutURL, withoutToken string
	hostFacts := a.jsonBench("lxcfs", "Create→first exec and /proc reads with LXCFS (this server) against a corral up --no-lxcfs (--without-url), sampled alternately; LXCFS's memory with idle sandboxes",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			without, err := bench.NewClientFromTokenFile(withoutURL, withoutToken)
			if err != nil {
				return nil, err
			}
			return bench.HostFacts(ctx, c, without, hc, log)
		})
	hf := hostFacts.Flags()
	hf.StringVar(&hc.Base, "base", "base:default", "base layer NAME:VERSION (on both servers)")
	hf.IntVar(&hc.TTIRounds, "tti", 50, "create→first exec samples per server")
	hf.IntVar(&hc.Idle, "idle", 50, "idle sandboxes for LXCFS's memory (0 skips it)")
	hf.StringVar(&withoutURL, "without-url", "", "URL of a corral up --no-lxcfs on this host")
	hf.StringVar(&withoutToken, "without-token-file", "", "its admin token file (DATA-DIR/admin.token)")
	cmd.AddCommand(hostFacts)

	var uc bench.UserNSConfig
	var noUsernsURL, noUsernsToken string
	userns := a.jsonBench("userns", "Create→first exec and exec round trip with user namespaces and idmapped mounts (this server) against a corral up --no-userns (--without-url), sampled alternately",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			without, err := bench.NewClientFromTokenFile(noUsernsURL, noUsernsToken)
			if err != nil {
				return nil, err
			}
			return bench.UserNS(ctx, c, without, uc, log)
		})
	uf := userns.Flags()
	uf.StringVar(&uc.Base, "base", "base:default", "base layer NAME:VERSION (on both servers)")
	uf.IntVar(&uc.TTIRounds, "tti", 50, "create→first exec samples per server")
	uf.IntVar(&uc.ExecRounds, "exec", 200, "exec round trips per server")
	uf.StringVar(&noUsernsURL, "without-url", "", "URL of a corral up --no-userns on this host")
	uf.StringVar(&noUsernsToken, "without-token-file", "", "its admin token file (DATA-DIR/admin.token)")
	cmd.AddCommand(userns)
	var dc bench.DiskConfig
	var sparseURL, sparseToken string
	disk := a.jsonBench("disk", "Create→first exec with writable disks allocated when made (this server) against a corral up --sparse-disks (--sparse-url), sampled alternately; the node's disk account after many creates",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			sparse, err := bench.NewClientFromTokenFile(sparseURL, sparseToken)
			if err != nil {
				return nil, err
			}
			return bench.Disk(ctx, c, sparse, dc, log)
		})
	df := disk.Flags()
	df.StringVar(&dc.Base, "base", "base:default", "base layer NAME:VERSION (on both servers)")
	df.IntVar(&dc.TTIRounds, "tti", 30, "create→first exec samples per server")
	df.Var(sizeFlag(&dc.DiskBytes), "disk", "disk of the measured sandboxes (default: the servers' default, from their pools)")
	df.IntVar(&dc.Creates, "creates", 200, "sandboxes created for the disk account (0 skips it)")
	df.Var(sizeFlag(&dc.AccountDiskBytes), "account-disk", "disk of each of them (default: the server's default)")
	df.StringVar(&sparseURL, "sparse-url", "", "URL of a corral up --sparse-disks on this host")
	df.StringVar(&sparseToken, "sparse-token-file", "", "its admin token file (DATA-DIR/admin.token)")
	cmd.AddCommand(disk)
	var oc bench.ObserveConfig
	observe := a.jsonBench("observe", "The sampler's cost with idle sandboxes (extrapolated to 1000) against the edge's whole CPU, and the event stream's latency against a GET",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.Observe(ctx, c, oc, log)
		})
	of := observe.Flags()
	of.StringVar(&oc.Base, "base", "base:default", "base layer NAME:VERSION")
	of.IntVar(&oc.Sandboxes, "sandboxes", 200, "idle sandboxes sampled")
	of.DurationVar(&oc.Window, "window", time.Minute, "how long the sampler is measured")
	of.IntVar(&oc.Events, "events", 100, "pause/resume rounds (two events each) for the stream's latency")
	cmd.AddCommand(observe)

	var lc bench.LifecycleConfig
	lifecycle := a.jsonBench("lifecycle", "Step replay vs execution, snapshots, create-from-snapshot vs create-from-base, pause/resume",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.Lifecycle(ctx, c, lc, log)
		})
	lf := lifecycle.Flags()
	lf.StringVar(&lc.Base, "base", "base:default", "base layer NAME:VERSION")
	lf.IntVar(&lc.Steps, "steps", 100, "executed and replayed steps")
	lf.IntVar(&lc.TTIRounds, "tti", 20, "create-from-snapshot and create-from-base samples")
	lf.IntVar(&lc.SnapshotMiB, "snapshot-mib", 100, "MiB of changes in the snapshotted sandbox")
	lf.IntVar(&lc.PauseRounds, "pauses", 5, "pause/resume rounds")
	lf.IntVar(&lc.PauseMiB, "pause-mib", 256, "anonymous memory held while paused")
	cmd.AddCommand(lifecycle)

	var mc bench.MicroVMConfig
	microvm := a.jsonBench("microvm", "The microvm tier against the container tier: create→first exec, exec round trip, pause/resume, idle memory",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.MicroVM(ctx, c, mc, log)
		})
	mf := microvm.Flags()
	mf.StringVar(&mc.Base, "base", "base:default", "base layer NAME:VERSION")
	mf.IntVar(&mc.TTIRounds, "tti", 10, "create→first exec samples per tier")
	mf.IntVar(&mc.ExecRounds, "execs", 100, "exec round trips per tier")
	mf.IntVar(&mc.PauseRounds, "pauses", 5, "pause/resume rounds per tier")
	mf.IntVar(&mc.Idle, "idle", 4, "idle microVMs for the memory measure (0 skips it)")
	mf.Int64Var(&mc.MemoryMiB, "memory-mib", 256, "memory of every sandbox (a VM's RAM), MiB")
	mf.BoolVar(&mc.Templates, "templates", false, "measure only VMs restored from a template (against a corral up --microvm-templates)")
	mf.BoolVar(&mc.Warm, "warm", false, "measure only create→first exec of VMs claimed from a warm pool (an environment of tier microvm, warm 1) against booted VMs of the same shape")
	cmd.AddCommand(microvm)

	var xc bench.ExclusiveConfig
	exclusive := a.jsonBench("exclusive", "Exec round trip with --exclusive (every other process stopped, then continued) vs a plain exec, with idle processes in the sandbox",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.Exclusive(ctx, c, xc, log)
		})
	xf := exclusive.Flags()
	xf.StringVar(&xc.Base, "base", "base:default", "base layer NAME:VERSION")
	xf.StringSliceVar(&xc.Runtimes, "runtimes", []string{"runc", "gvisor", "microvm"}, "runtimes to measure (runc, gvisor, microvm)")
	xf.IntVar(&xc.Rounds, "rounds", 200, "exec round trips each way, per runtime")
	xf.IntVar(&xc.Idle, "idle", 20, "idle background processes in the sandbox")
	cmd.AddCommand(exclusive)

	var codeCfg bench.CodeConfig
	codeb := a.jsonBench("code", "A code-interpreter environment: create→first runCode result vs create→first python3 exec, runCode('1+1') vs an exec of python3 -c 1+1",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.Code(ctx, c, codeCfg, log)
		})
	codeFlags := codeb.Flags()
	codeFlags.StringVar(&codeCfg.Env, "env", "code-interpreter", "the environment (corral env install code-interpreter)")
	codeFlags.IntVar(&codeCfg.Creates, "creates", 10, "sandboxes created for each way of getting a first result")
	codeFlags.IntVar(&codeCfg.Rounds, "rounds", 100, "round trips each way")
	codeFlags.IntVar(&codeCfg.Warm, "warm", 0, "also measure create→first runCode from a warm pool of this many sandboxes (0: not measured)")
	cmd.AddCommand(codeb)
	var volc bench.VolumesConfig
	volumes := a.jsonBench("volumes", "Sequential and random I/O (fio) in a volume against the sandbox's writable layer, same sandbox",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.Volumes(ctx, c, volc, log)
		})
	volf := volumes.Flags()
	volf.StringVar(&volc.Base, "base", "base:default", "base layer NAME:VERSION")
	volf.StringVar(&volc.FIO, "fio", "fio:host", "toolkit layer holding fio at /opt/fio (scripts/fio-toolkit.sh)")
	volf.StringSliceVar(&volc.Runtimes, "runtimes", []string{"runc", "gvisor", "microvm"}, "runtimes to measure (runc, gvisor, microvm)")
	volf.IntVar(&volc.SizeMiB, "size-mib", 256, "the file each job writes and reads, MiB")
	volf.IntVar(&volc.Seconds, "seconds", 10, "the random-write job's run time")
	cmd.AddCommand(volumes)

	var vc bench.VMConfig
	vmb := a.jsonBench("vm", "The vm tier: boot to first screenshot and exec, screenshot latency, input round trip, exec, pause/resume, idle memory (baselines: microvm and container)",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.VM(ctx, c, vc, log)
		})
	vf := vmb.Flags()
	vf.StringVar(&vc.Image, "image", "debian-vm:bench", "vm-image layer NAME:VERSION (corral vm-image build)")
	vf.StringVar(&vc.Base, "base", "base:default", "base layer of the microvm and container baselines")
	vf.IntVar(&vc.Boots, "boots", 3, "boots measured (and baseline creates per tier)")
	vf.IntVar(&vc.Screens, "screens", 50, "screenshots timed")
	vf.IntVar(&vc.Inputs, "inputs", 10, "key press → visible change samples")
	vf.IntVar(&vc.ExecRounds, "execs", 50, "exec round trips")
	vf.IntVar(&vc.PauseRounds, "pauses", 3, "pause/resume rounds")
	vf.Int64Var(&vc.MemoryMiB, "memory-mib", 1024, "a VM's RAM, MiB")
	vf.Float64Var(&vc.CPUs, "cpus", 2, "a VM's CPUs")
	cmd.AddCommand(vmb)

	var cc bench.ComposeConfig
	compose := a.jsonBench("compose", "Creation from base + workspace + 3 toolkits vs from the base alone",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.Compose(ctx, c, cc, log)
		})
	cf := compose.Flags()
	cf.StringVar(&cc.Base, "base", "base:default", "base layer NAME:VERSION")
	cf.IntVar(&cc.Rounds, "tti", 20, "create→first exec samples each way")
	cf.IntVar(&cc.Files, "files", 1000, "files in the workspace and in each toolkit")
	cmd.AddCommand(compose)

	var fc bench.FncallConfig
	fn := a.jsonBench("fncall", "Call of true vs API exec, runc exec and a fresh sandbox; calls per second",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.Fncall(ctx, c, fc, log)
		})
	ff := fn.Flags()
	ff.StringVar(&fc.Base, "base", "base:default", "base layer NAME:VERSION")
	ff.IntVar(&fc.Calls, "calls", 200, "latency samples of each kind")
	ff.IntVar(&fc.Throughput, "throughput", 1000, "calls in the throughput test")
	ff.IntVar(&fc.Concurrency, "concurrency", 16, "concurrent callers in the throughput test")
	ff.IntVar(&fc.PoolMax, "pool", 4, "warm containers in the pool")
	ff.StringVar(&fc.PyToolkit, "python-toolkit", "", "toolkit NAME:VERSION with python3: also measure Python calls with and without warm interpreters")
	ff.IntVar(&fc.PyCalls, "python-calls", 30, "Python call samples each way")
	ff.StringSliceVar(&fc.CPUCgroups, "cpu-cgroups", nil, "cgroup directories (v2, or v1 cpuacct) of the Corral under test (corral up's, its sandboxes' parent): report their CPU time per call")
	cmd.AddCommand(fn)

	var ec bench.E2BConfig
	e2bCmd := a.jsonBench("e2b --e2b-url URL --sdk-dir DIR --script FILE", "The real e2b SDK through Corral's E2B gateway vs Corral's own API: create to first command, run('true') round trip, template builds",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			ec.APIKey = a.token
			return bench.E2B(ctx, c, ec, log)
		})
	ef := e2bCmd.Flags()
	ef.StringVar(&ec.Base, "base", "base:default", "the template: a base layer NAME:VERSION")
	ef.StringVar(&ec.E2BURL, "e2b-url", "", "the gateway (corral up --e2b-listen), http://HOST:PORT")
	ef.StringVar(&ec.SDKDir, "sdk-dir", "", "the directory holding node_modules/e2b (scripts/e2b-sdk.sh prints it)")
	ef.StringVar(&ec.Script, "script", "test/e2b/bench.mjs", "the SDK side's script")
	ef.IntVar(&ec.Creates, "creates", 10, "sandboxes created each way")
	ef.IntVar(&ec.Runs, "runs", 100, "run('true') round trips each way")
	ef.IntVar(&ec.Builds, "builds", 5, "template builds each way, cold and cached (0: none)")
	cmd.AddCommand(e2bCmd)

	var ic bench.ImportConfig
	imp := a.jsonBench("import", "Import speed of a random multi-layer image from a loopback registry, and disk bytes written per byte (root, same host)",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			return bench.Import(ctx, c, ic, log)
		})
	imp.Flags().IntVar(&ic.MiB, "mib", 1024, "image size in MiB")
	imp.Flags().IntVar(&ic.Layers, "layers", 8, "image layers")
	cmd.AddCommand(imp)

	var rc bench.RebuildConfig
	rebuild := a.jsonBench("rebuild --base N:V --rootfs DIR", "Cost of a toolkit change across N environments: one layer (Corral) vs N fused images rebuilt",
		func(ctx context.Context, c *corral.Client, log *slog.Logger) (any, error) {
			if rc.Rootfs == "" {
				return nil, usagef("--rootfs is required: the base layer's directory")
			}
			return bench.Rebuild(ctx, c, rc, log)
		})
	rf := rebuild.Flags()
	rf.StringVar(&rc.Base, "base", "base:default", "base layer NAME:VERSION (published from --rootfs)")
	rf.StringVar(&rc.Rootfs, "rootfs", "", "the base layer's directory, to build the fused images from")
	rf.IntVar(&rc.Workspaces, "workspaces", 50, "environments that use the toolkit")
	rf.IntVar(&rc.WSFiles, "ws-files", 200, "1 KiB files per workspace")
	rf.IntVar(&rc.TKFiles, "tk-files", 2000, "1 KiB files in the toolkit")
	cmd.AddCommand(rebuild)

	var nc bench.NetworkConfig
	network := &cobra.Command{
		Use:   "network --rootfs DIR",
		Short: "Networking costs: creation with a 3-service policy vs none, policy updates, download throughput vs the host (starts its own lab internet and corral up; root)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if nc.Rootfs == "" {
				return usagef("--rootfs is required (scripts/busybox-rootfs.sh makes one)")
			}
			self, err := corralBinary()
			if err != nil {
				return err
			}
			nc.Corral = self
			res, err := bench.Network(cmd.Context(), nc, slog.New(slog.NewTextHandler(a.stderr, nil)))
			if err != nil {
				return err
			}
			return a.printJSON(res)
		},
	}
	nf := network.Flags()
	nf.StringVar(&nc.Rootfs, "rootfs", "", "directory of the base layer")
	nf.IntVar(&nc.TTIRounds, "tti", 20, "create→first exec samples each way")
	nf.IntVar(&nc.Updates, "updates", 50, "policy replacements")
	nf.IntVar(&nc.DownloadMiB, "download-mib", 256, "size of each download")
	nf.IntVar(&nc.Downloads, "downloads", 5, "downloads each way")
	cmd.AddCommand(network)
	cmd.AddCommand(a.newBenchIAMCmd())
	cmd.AddCommand(a.newBenchPlacementCmd())
	cmd.AddCommand(a.newBenchClusterCmd())
	cmd.AddCommand(a.newBenchLazyCmd())
	cmd.AddCommand(a.newCLIStartCmd())
	a.addFeatureBenchCmds(cmd)
}

// newBenchLazyCmd returns `corral bench lazy`: lazy loading of layer data (eager, lazy,
// prefetch; cold and warm nodes) against an S3 blob store with added latency, all started on
// this machine for the run.
func (a *app) newBenchLazyCmd() *cobra.Command {
	var cfg bench.LazyConfig
	var fillRate int64
	cmd := &cobra.Command{
		Use:   "lazy --rootfs DIR",
		Short: "Lazy layer data: time to first output, completion time and disk bytes of eager, lazy and prefetch on cold and warm nodes, blob store behind a delaying proxy (starts versitygw and corral up nodes itself; root)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cfg.Rootfs == "" {
				return usagef("--rootfs is required (scripts/busybox-rootfs.sh makes one)")
			}
			if cfg.Corral == "" {
				self, err := corralBinary()
				if err != nil {
					return err
				}
				cfg.Corral = self
			}
			if cfg.Delay <= 0 {
				cfg.Delay = -1 // none (a zero Delay takes the default)
			}
			cfg.FillRate = fillRate
			res, err := bench.Lazy(cmd.Context(), cfg, slog.New(slog.NewTextHandler(a.stderr, nil)))
			if res == nil || len(res.Cells) == 0 {
				if res != nil && a.jsonOut() {
					a.printJSON(res)
				}
				return err
			}
			if a.jsonOut() {
				if perr := a.printJSON(res); perr != nil {
					return perr
				}
				res.WriteSummary(a.stderr)
				return err
			}
			if serr := res.WriteSummary(a.stdout); serr != nil {
				return serr
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Rootfs, "rootfs", "", "directory of the busybox base layer")
	f.StringVar(&cfg.Corral, "bin", "", "corral binary to start the nodes with (default: this executable)")
	f.StringVar(&cfg.Versitygw, "versitygw", "", "versitygw binary (default: $CORRAL_VERSITYGW, the cache of scripts/install-versitygw.sh, PATH)")
	f.IntVar(&cfg.ImageMiB, "image-mib", 1024, "size of the synthetic toolkit layer in MiB")
	f.DurationVar(&cfg.Delay, "delay", 10*time.Millisecond, "added to every request to the blob store (0: none)")
	f.Float64Var(&cfg.BandwidthMBps, "bandwidth", 0, "cap on the blob store's answers, MB/s over all connections (0: none)")
	f.IntSliceVar(&cfg.Concurrency, "concurrency", []int{1, 8, 32}, "sandboxes started at once in the first-output cells")
	f.IntVar(&cfg.Samples, "samples", 8, "least sandboxes per first-output cell: concurrency N runs ceil(samples/N) fresh nodes per mode")
	f.IntSliceVar(&cfg.Percents, "percents", []int{5, 30, 100}, "tasks: the share of the image's bytes each reads (the first is the first-output task)")
	f.IntVar(&cfg.CompletionRounds, "completion-rounds", 3, "fresh nodes per mode for each completion task (the first task's is the first-output cell at concurrency 1)")
	f.Float64Var(&cfg.CPUs, "cpus", 0.25, "CPU limit of each sandbox")
	f.Int64Var(&cfg.MemoryMiB, "memory-mib", 128, "memory limit of each sandbox in MiB")
	f.Var(sizeFlag(&fillRate), "fetch-fill-rate", "the nodes' --fetch-fill-rate: background fill after prefetch, bytes/s (default 0: off)")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the image's content and the tasks' files")
	f.StringVar(&cfg.Dir, "dir", "", "where to make the work directory (default: the system's temp dir)")
	f.BoolVar(&cfg.Prewarm, "prewarm", false, "cold rounds: start lazyd and fetch the chunk tables before the creates, its time added to each sandbox's")
	return cmd
}

// newBenchClusterCmd returns `corral bench cluster`: create throughput through 2 server
// replicas and 3 edges against one `corral up`, all started on this machine for the run.
func (a *app) newBenchClusterCmd() *cobra.Command {
	var cfg bench.ClusterConfig
	cmd := &cobra.Command{
		Use:   "cluster --rootfs DIR",
		Short: "Create throughput and latency through 2 servers + 3 edges vs one corral up on the same machine (starts PostgreSQL and every process itself; root)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cfg.Rootfs == "" {
				return usagef("--rootfs is required (scripts/busybox-rootfs.sh makes one)")
			}
			if cfg.Corral == "" {
				self, err := corralBinary()
				if err != nil {
					return err
				}
				cfg.Corral = self
			}
			res, err := bench.Cluster(cmd.Context(), cfg, slog.New(slog.NewTextHandler(a.stderr, nil)))
			if res == nil || len(res.Setups) == 0 {
				return err
			}
			if a.jsonOut() {
				if perr := a.printJSON(res); perr != nil {
					return perr
				}
				return err
			}
			t := newTable(a.stdout, "SETUP", "CREATES/S", "CREATE p50 / p99 ms", "DELETES/S", "DELETE p50 / p99 ms", "READ p50 / p99 ms", "EXEC p50 / p99 ms", "SANDBOXES PER NODE")
			for _, s := range res.Setups {
				var spread []string
				for _, n := range slices.Sorted(maps.Keys(s.ByNode)) {
					spread = append(spread, fmt.Sprintf("%s=%d", n, s.ByNode[n]))
				}
				t.row(s.Name+" ("+s.Description+")", fmt.Sprintf("%.2f", s.CreatesPerSec), fmt.Sprintf("%.1f / %.1f", s.Create.P50, s.Create.P99),
					fmt.Sprintf("%.2f", s.DeletesPerSec), fmt.Sprintf("%.1f / %.1f", s.Delete.P50, s.Delete.P99),
					fmt.Sprintf("%.2f / %.2f", s.Read.P50, s.Read.P99), fmt.Sprintf("%.2f / %.2f", s.Exec.P50, s.Exec.P99), strings.Join(spread, " "))
			}
			if len(res.Ratios) > 0 {
				t.row("")
				t.row(res.Setups[0].Name+" VS", "CREATES/S RATIO", "p50 RATIO", "p99 RATIO", "DELETE p50 / p99 RATIO", "READ p50 RATIO", "EXEC p50 / p99 RATIO")
				for _, r := range res.Ratios {
					t.row(r.Versus, fmt.Sprintf("%.2fx", r.Throughput), fmt.Sprintf("%.2fx", r.P50), fmt.Sprintf("%.2fx", r.P99),
						fmt.Sprintf("%.2fx / %.2fx", r.DeleteP50, r.DeleteP99), fmt.Sprintf("%.2fx", r.ReadP50), fmt.Sprintf("%.2fx / %.2fx", r.ExecP50, r.ExecP99))
				}
			}
			if ferr := t.flush(); ferr != nil {
				return ferr
			}
			fmt.Fprintf(a.stdout, "\n%d creates per setup in %d rounds at concurrency %d, %g CPU and %d MiB each; %d CPUs, %.1f GiB, load %.2f → %.2f; leftovers: %d\n",
				res.Creates, res.Rounds, res.Concurrency, res.SandboxCPUs, res.SandboxMiB, res.CPUs, res.MemoryGiB, res.LoadAvgStart, res.LoadAvgEnd, len(res.Leftovers))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Rootfs, "rootfs", "", "directory of the base layer")
	f.StringVar(&cfg.Corral, "bin", "", "corral binary to start the servers, edges and corral up with (default: this executable)")
	f.IntVarP(&cfg.Creates, "creates", "n", 60, "sandboxes created in each setup")
	f.IntVarP(&cfg.Concurrency, "concurrency", "c", 8, "concurrent creators (and deleters)")
	f.Float64Var(&cfg.CPUs, "cpus", 0.25, "CPU limit of each sandbox (all of them must fit the 3 edges: 4 CPU limits per CPU each)")
	f.Int64Var(&cfg.MemoryMiB, "memory-mib", 64, "memory limit of each sandbox in MiB")
	f.IntVar(&cfg.DiskPool, "disk-pool", 6, "formatted disks kept ready in all: corral up keeps this many, each edge a third")
	f.IntVar(&cfg.Rounds, "rounds", 4, "rounds the creates are split into, the setups taking turns")
	f.BoolVar(&cfg.SkipSQLite, "skip-sqlite", false, "leave out corral up on its default SQLite store")
	f.StringVar(&cfg.Baseline, "baseline-bin", "", "also measure this corral binary's cluster (cluster-baseline, unless --only-up) and corral up on SQLite (up-sqlite-baseline): before/after in one run")
	f.BoolVar(&cfg.OnlyUp, "only-up", false, "leave out the cluster and corral up on PostgreSQL (no PostgreSQL started)")
	return cmd
}

// newBenchPlacementCmd returns `corral bench placement`: the cluster placement engine on
// simulated edges (no server, no sandboxes): latency and load imbalance for K = 1, 2 and all.
func (a *app) newBenchPlacementCmd() *cobra.Command {
	var cfg bench.PlacementConfig
	cmd := &cobra.Command{
		Use:   "placement",
		Short: "Placement latency and load imbalance on simulated clusters for K = 1 (random), 2 and all (least loaded), one and two replicas (local, no server)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := bench.Placement(cmd.Context(), cfg, slog.New(slog.NewTextHandler(a.stderr, nil)))
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(res)
			}
			t := newTable(a.stdout, "NODES", "K", "VARIANT", "PLACED", "p50 µs", "p99 µs", "IMBALANCE", "MAX LOAD", "FAILURES", "REFUSALS")
			for _, r := range res.Runs {
				t.row(fmt.Sprint(r.Nodes), r.K, r.Variant, fmt.Sprint(r.Placements), fmt.Sprintf("%.2f", r.Latency.P50),
					fmt.Sprintf("%.2f", r.Latency.P99), fmt.Sprintf("%.3f", r.Imbalance), fmt.Sprintf("%.3f", r.MaxLoad),
					fmt.Sprint(r.Failures), fmt.Sprint(r.Refusals))
			}
			if err := t.flush(); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "\nfilled to mean load %.2f, edges report every %d placements, seed %d; imbalance = max load / mean load; %d CPUs\n",
				res.Fill, res.ReportEvery, res.Seed, res.CPUs)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntSliceVar(&cfg.Nodes, "nodes", []int{1000, 10_000}, "simulated cluster sizes, each run separately")
	f.Float64Var(&cfg.Fill, "fill", 0.5, "stop when the mean node load reaches this")
	f.IntVar(&cfg.ReportEvery, "report-every", 100, "edges report their usage every this many placements")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the sandbox sizes and the placers")
	f.IntVar(&cfg.MaxTries, "max-tries", 3, "nodes tried per sandbox when edges refuse")
	return cmd
}

// newBenchIAMCmd returns `corral bench iam`: what authorisation and quota admission add to a
// create, measured on a temporary SQLite store of its own (no server, no root).
func (a *app) newBenchIAMCmd() *cobra.Command {
	var cfg bench.IAMConfig
	var seconds float64
	cmd := &cobra.Command{
		Use:   "iam",
		Short: "Authorisation and quota admission per create at depth 1 and 10 vs a plain insert, and creations/s with checks on vs off (local store, no server)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if seconds <= 0 {
				return usagef("--seconds must be positive")
			}
			cfg.Duration = time.Duration(seconds * float64(time.Second))
			res, err := bench.IAM(cmd.Context(), cfg, slog.New(slog.NewTextHandler(a.stderr, nil)))
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(res)
			}
			ms := func(s bench.Stats) string { return fmt.Sprintf("%.3f / %.3f", s.P50, s.P99) }
			t := newTable(a.stdout)
			t.row("PER CREATE (ms, p50 / p99)", "DEPTH "+fmt.Sprint(res.Depths[0].Depth), "DEPTH "+fmt.Sprint(res.Depths[1].Depth))
			rows := []struct {
				name string
				get  func(bench.IAMDepth) bench.Stats
			}{
				{"baseline: PutSandbox", func(d bench.IAMDepth) bench.Stats { return d.Baseline }},
				{"auth (token, grants, decision)", func(d bench.IAMDepth) bench.Stats { return d.Auth }},
				{"AdmitSandbox", func(d bench.IAMDepth) bench.Stats { return d.Admit }},
				{"added: auth+admit − baseline", func(d bench.IAMDepth) bench.Stats { return d.Added }},
				{"project lookups ×2", func(d bench.IAMDepth) bench.Stats { return d.Resolve }},
				{"audit entry", func(d bench.IAMDepth) bench.Stats { return d.Audit }},
				{"added: all identity − baseline", func(d bench.IAMDepth) bench.Stats { return d.FullAdded }},
			}
			for _, r := range rows {
				t.row(r.name, ms(r.get(res.Depths[0])), ms(r.get(res.Depths[1])))
			}
			tp := res.Throughput
			t.row("")
			t.row(fmt.Sprintf("CREATES/S (%d goroutines, depth %d)", tp.Concurrency, res.Depths[1].Depth), "PER SECOND", "VS CHECKS OFF")
			t.row("checks off: PutSandbox", fmt.Sprintf("%.0f", tp.ChecksOff), "1.00x")
			t.row("checks on: AdmitSandbox", fmt.Sprintf("%.0f", tp.ChecksOn), fmt.Sprintf("%.2fx", tp.Ratio))
			t.row("all identity (auth, lookups, admit, audit)", fmt.Sprintf("%.0f", tp.Full), fmt.Sprintf("%.2fx", tp.FullRatio))
			if len(res.Sensitivity) > 0 {
				t.row("")
				t.row("ADMISSION AS THE STORE CHANGES (ms, p50 / p99)", "PUTSANDBOX", "ADMITSANDBOX")
				for _, v := range res.Sensitivity {
					t.row(fmt.Sprintf("depth %d, %s", v.Depth, v.Name), ms(v.Baseline), ms(v.Admit))
				}
			}
			if err := t.flush(); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "\n%d projects, %d principals, %d grants, %d live sandboxes; populated in %.1f s; %d CPUs\n",
				res.Projects, res.Principals, res.Grants, res.LiveSandboxes, res.PopulateTotal, res.CPUs)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Projects, "projects", 10_000, "projects in the store (a chain of depth 10 among them)")
	f.IntVar(&cfg.Grants, "grants", 100_000, "grants in the store")
	f.IntVar(&cfg.Principals, "principals", 5_000, "principals the grants are spread over")
	f.IntVar(&cfg.Sandboxes, "sandboxes", 3_000, "live sandbox records spread over the projects (as many stopped ones are added)")
	f.IntVar(&cfg.History, "history", 10_000, "stopped records of the last 24 h given to the deep project for the last measure (-1 skips it)")
	f.IntVarP(&cfg.N, "samples", "n", 2_000, "paired latency samples per depth")
	f.Float64Var(&seconds, "seconds", 5, "measured seconds of each throughput test")
	f.IntVar(&cfg.Concurrency, "concurrency", 8, "concurrent creators in the throughput test")
	f.StringVar(&cfg.Dir, "dir", "", "directory to make the temporary store in (default: the system's temp dir)")
	f.BoolVar(&cfg.Keep, "keep", false, "keep the store and print its path")
	return cmd
}

// newCLIStartCmd returns `corral-bench cli-start`: the corral CLI's start against runc's.
func (a *app) newCLIStartCmd() *cobra.Command {
	var cfg bench.CLIStartConfig
	cmd := &cobra.Command{
		Use:   "cli-start",
		Short: "Whole-process time of corral --version, --help and get (a stub server answers 404), vs runc --version (no server, no root)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cfg.Corral == "" {
				p, err := corralBinary()
				if err != nil {
					return err
				}
				cfg.Corral = p
			}
			if cfg.Runc == "" {
				p, err := exec.LookPath("runc")
				if err != nil {
					return usagef("--runc is required: no runc on PATH")
				}
				cfg.Runc = p
			}
			res, err := bench.CLIStart(cmd.Context(), cfg, slog.New(slog.NewTextHandler(a.stderr, nil)))
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(res)
			}
			ms := func(s bench.Stats) string { return fmt.Sprintf("%.2f / %.2f", s.P50, s.P99) }
			t := newTable(a.stdout, "COMMAND", "WALL p50 / p99 ms", "RATIO p50 (vs runc --version)", "CPU p50 / p99 ms", "CPU RATIO p50")
			row := func(name, label string, wall bench.Stats) {
				c := res.CPU[name]
				t.row(label, ms(wall), fmt.Sprintf("%.2fx", ratioOf(wall.P50, res.RuncVersion.P50)),
					ms(c), fmt.Sprintf("%.2fx", ratioOf(c.P50, res.CPU["runc --version"].P50)))
			}
			row("runc --version", "runc --version", res.RuncVersion)
			row("corral --version", "corral --version", res.Version)
			row("corral --help", "corral --help", res.Help)
			row("corral get", "corral get (404 from a stub server)", res.Get404)
			return t.flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Corral, "bin", "", "corral binary (default: the one beside corral-bench, else on PATH)")
	f.StringVar(&cfg.Runc, "runc", "", "runc binary of the baseline (default: on PATH)")
	f.IntVar(&cfg.Rounds, "rounds", 200, "samples of each command line")
	return cmd
}

func ratioOf(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
