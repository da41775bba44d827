//go:build !lean

package cli

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/daemon"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime/backends"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// newUpCmd returns `corral up`: the API server and this host's edge in one process.
func newUpCmd() *cobra.Command {
	var cfg daemon.Config
	var logFormat, logLevel string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run Corral on this machine: API server, edge and embedded store in one process",
		Long: `Run Corral on this machine: the API server, this host's edge and the embedded SQLite store.

On first start it creates an admin API token in <data-dir>/admin.token (mode 0600).
SIGTERM or SIGINT shut it down cleanly; running sandboxes keep running and are
re-adopted at the next start, as they are after a crash.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(cmd, logFormat, logLevel)
			if err != nil {
				return err
			}
			if err := budgetFlagsValid(cfg.SandboxBudgets); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return daemon.Run(ctx, cfg, log, nil)
		},
	}
	addDaemonFlags(cmd.Flags(), &cfg, &logFormat, &logLevel)
	addAPIFlags(cmd.Flags(), &cfg.AuditRetention, &cfg.SandboxRetention, &cfg.Observe.Webhooks)
	cmd.Flags().Float64Var(&cfg.OvercommitDisk, "overcommit-disk", 0, "writable-disk limits admitted per byte the data dir's filesystem can hold (its free space plus what sandbox disks took; default 1); over it a create is refused with 409 node_full")
	cmd.Flags().StringVar(&cfg.E2B.Listen, "e2b-listen", "", "also serve E2B's API (the e2b SDKs' E2B_API_URL) on this address (default: off)")
	cmd.Flags().StringVar(&cfg.E2B.Domain, "e2b-domain", "", "the domain E2B sandbox views name (getHost(port) gives <port>-<id>.<domain>; default: the host a request came to)")
	cmd.Flags().StringVar(&cfg.OTLPEndpoint, "otlp-endpoint", "", "send traces over OTLP/HTTP to this receiver, http(s)://HOST:PORT (/v1/traces is added unless the URL has a path; default $OTEL_EXPORTER_OTLP_ENDPOINT; none: no tracing)")
	return cmd
}

// newDownCmd returns `corral down`: everything of a data dir off the host.
func newDownCmd() *cobra.Command {
	var cfg daemon.Config
	var logFormat, logLevel string
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Remove everything of a data dir from this host: its corral, sandboxes, mounts, networks, cgroups",
		Long: `Remove everything of a data dir from this host.

A corral up serving the data dir is stopped (SIGTERM). Then every sandbox of the data dir is
ended as by a delete, and with them their processes, mounts, loop devices, cgroups, network
namespaces, veths and nftables tables; lazyd stops, the disk pool is emptied, and the data
dir's claim in the host registry (network tag, pool, cgroup parent, VM uids) is given back.
The store, layers and tokens stay: corral up on the same data dir starts again from them.
Pass the same runtime flags as to corral up (--runc, --cgroup-parent, ...) when they differ
from the defaults.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(cmd, logFormat, logLevel)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return daemon.Down(ctx, cfg, log)
		},
	}
	addDaemonFlags(cmd.Flags(), &cfg, &logFormat, &logLevel)
	return cmd
}

// newLogger makes the daemons' logger from --log-format and --log-level.
func newLogger(cmd *cobra.Command, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	hopts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), hopts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), hopts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, not %q", format)
}

// addAPIFlags adds the flags of what runs where the API is served (`corral up`, `corral
// server`): the retention of the audit log and of ended sandboxes' records, and the webhook
// dispatcher.
func addAPIFlags(f *pflag.FlagSet, auditRetention, sandboxRetention *time.Duration, hooks *webhook.Config) {
	f.DurationVar(auditRetention, "audit-retention", 0, "how long audit log entries are kept (default 90 days)")
	f.DurationVar(sandboxRetention, "sandbox-retention", 0, "how long records of ended (stopped, failed) sandboxes are kept, and their trajectories (default 24h)")
	f.DurationVar(&hooks.Timeout, "webhook-timeout", 0, "how long one webhook delivery attempt may take (default 10s)")
	f.IntVar(&hooks.Attempts, "webhook-attempts", 0, "attempts of one webhook delivery before it is given up (default 5)")
	f.BoolVar(&hooks.AllowPrivate, "webhook-allow-private", false, "let webhooks deliver to loopback, private and link-local addresses (off: only public ones, so a webhook cannot reach this host or its network)")
	f.DurationVar(&hooks.Backoff, "webhook-backoff", 0, "pause after a failed webhook delivery attempt, doubling after each (default 1s)")
}

// addDaemonFlags adds the flags of a host's daemon (`corral up`, `corral edge`) to f.
func addDaemonFlags(f *pflag.FlagSet, cfg *daemon.Config, logFormat, logLevel *string) {
	f.StringVar(&cfg.DataDir, "data-dir", "/var/lib/corral", "directory for the store, layers, sandbox state and admin.token")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7070", "address of the API")
	f.StringVar(&cfg.Node, "node", "local", "this host's name in sandbox IDs (1-32 lowercase letters, digits or inner hyphens)")
	f.StringVar(&cfg.Runc, "runc", "", "runc binary (default: $CORRAL_RUNC, the build cached in /var/cache/corral/runc, or runc on PATH)")
	f.StringVar(&cfg.Runsc, "runsc", "", "gVisor's runsc binary (default: $CORRAL_RUNSC or the build cached in /var/cache/corral/runsc)")
	f.StringVar(&cfg.Agent, "agent", "", "static corral-agent binary (default: beside this executable)")
	f.StringVar(&cfg.Runcd, "runcd", "", "corral-runcd, which starts runc sandboxes with runc's libcontainer in one long-lived process (default: beside this executable, when there; used only when its libcontainer is the runc binary's version); off: a runc run --detach per sandbox")
	f.BoolVar(&cfg.MicroVM.Off, "no-microvm", false, "turn the microvm and vm tiers off (both run on QEMU)")
	f.StringVar(&cfg.MicroVM.QEMU, "qemu", "", "qemu-system-x86_64 binary for the microvm tier (default: on PATH)")
	f.StringVar(&cfg.MicroVM.KernelDir, "guest-kernel", "", "guest kernel directory of the microvm tier (default /var/cache/corral/guest-kernel/current, made by scripts/setup.sh)")
	f.StringVar(&cfg.MicroVM.Accel, "microvm-accel", "", "accelerator of microvm sandboxes: kvm, tcg, or empty (KVM when it boots the guest, else TCG)")
	f.BoolVar(&cfg.MicroVM.Templates, "microvm-templates", false, "start microVMs from a snapshot of a booted template VM of their shape (memory, vCPUs, disks, network) instead of booting each; the first VM of a shape boots and builds its template")
	f.BoolVar(&cfg.MicroVM.Debug, "microvm-debug", false, "guests log their boot to the console log in their state directory")
	f.StringVar(&cfg.CgroupParent, "cgroup-parent", "", "cgroup under which sandbox cgroups are created (default: chosen per data dir by the host registry in /run/corral; /corral for /var/lib/corral)")
	f.DurationVar(&cfg.DefaultTTL, "default-ttl", 0, "TTL of a sandbox whose create call names none (default 1h)")
	f.DurationVar(&cfg.MaxTTL, "max-ttl", 0, "largest TTL a create call may ask for (default 168h)")
	f.Int64Var(&cfg.MaxLayerBytes, "max-layer-bytes", 0, "largest expanded size of an imported layer (default 16 GiB)")
	f.DurationVar(&cfg.LayerLinger, "layer-linger", 5*time.Minute, "how long a layer no sandbox uses stays mounted, its page cache warm for the next sandbox (0: unmounted with its last sandbox)")
	f.StringVar(&cfg.Store, "store", "", "the database: postgres://USER@HOST:PORT/DB?sslmode=disable, or a SQLite file (default DATA-DIR/corral.db)")
	f.StringVar(&cfg.BlobStore, "blob-store", "", "where layer images live, shared by every Corral given the same one: dir:/PATH or s3://BUCKET[/PREFIX]?endpoint=URL[&region=R] with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (default dir:DATA-DIR/blobs)")
	f.StringVar(&cfg.Fetch.Mode, "fetch", "prefetch", "how sandboxes' layer data reaches this node unless a create says: eager (all of it before start), lazy (chunks as read) or prefetch (lazy, with the environment's recorded start-up set fetched at once)")
	f.Var(&byteSize{&cfg.ReserveMemory}, "reserve-memory", "host memory the sandboxes together may not use, kept for corral and the host (default max(512M, 5% of the host)); corral's own cgroup also outweighs the sandboxes' CPU 8 to 1")
	f.BoolVar(&cfg.NoReserve, "no-reserve", false, "reserve no share of the host for corral (its process stays in its cgroup; the sandboxes' parent has no memory limit)")
	f.Var(&byteSize{&cfg.Fetch.CacheSize}, "cache-size", "bound of the node's layer chunk cache under DATA-DIR/layers/lazy/cache (default 10G)")
	f.DurationVar(&cfg.Fetch.Timeout, "fetch-timeout", 0, "how long a sandbox's read waits on the blob store before it fails with EIO (default 30s)")
	f.Var(&byteSize{&cfg.Fetch.FillRate}, "fetch-fill-rate", "after prefetch, fetch the rest of a sandbox's layers in the background at this many bytes per second (default 0: not at all)")
	f.IntVar(&cfg.DiskPool, "disk-pool", 4, "writable disks of the default size kept formatted ahead")
	f.Var(&byteSize{&cfg.SandboxDisk}, "sandbox-disk", "writable disk of a sandbox whose create names none (default 1G)")
	f.Var(&byteSize{&cfg.MaxSandboxDisk}, "max-sandbox-disk", "most writable disk one sandbox may ask for, whatever its project's quota (default 64G)")
	f.Var(&byteSize{&cfg.TrajectoryMax}, "trajectory-max", "stored trajectory per sandbox, charged to its project's disk while it runs; past it the outputs of its oldest finished steps are dropped, the steps kept (default 64M)")
	f.BoolVar(&cfg.SparseDisks, "sparse-disks", false, "make writable disks sparse instead of allocating them when made: denser with --overcommit-disk above 1, but a full host disk can then lose writes a sandbox was told succeeded")
	f.IntVar(&cfg.KeepExitedCommands, "keep-exited-commands", 0, "exited commands each sandbox keeps for re-attach (default 64)")
	f.DurationVar(&cfg.KeepExitedFor, "keep-exited-for", 0, "how long an exited command's output stays re-attachable (default 10m)")
	f.DurationVar(&cfg.Observe.SampleInterval, "sample-interval", 0, "how often every running sandbox's resource use is sampled for its metrics (default 5s; negative: never)")
	f.DurationVar(&cfg.Observe.MetricsKeep, "metrics-keep", 0, "how long a sandbox's samples are kept after it ends (default 1h)")
	f.BoolVar(&cfg.Observe.PerSandbox, "metrics-per-sandbox", false, "add each sandbox's latest sample to /v1/metrics (one Prometheus series per sandbox and resource; off: the node's sums only)")
	f.BoolVar(&cfg.Net.Disabled, "no-net", false, "no sandbox networking: every sandbox has loopback only")
	f.BoolVar(&cfg.NoFavorDynMods, "no-favordynmods", false, "leave cgroup v2's favordynmods option as the host has it (by default it is turned on, and stays on until reboot: a sandbox's start then joins its cgroups in microseconds instead of waiting ~6 ms for an RCU grace period)")
	f.BoolVar(&cfg.NoUserNS, "no-userns", false, "run container sandboxes without user namespaces: their root is the host's root (for hosts without user namespaces or idmapped mounts)")
	b := &cfg.SandboxBudgets
	f.Int64Var(&b.InotifyInstances, "sandbox-inotify-instances", backends.DefaultInotifyInstances, "inotify instances each container sandbox may hold (per user, with user namespaces)")
	f.Int64Var(&b.InotifyWatches, "sandbox-inotify-watches", backends.DefaultInotifyWatches, "inotify watches each container sandbox may hold (per user, with user namespaces)")
	f.Int64Var(&b.MsgQueueBytes, "sandbox-mqueue-bytes", backends.DefaultMsgQueueBytes, "POSIX message queue bytes of each container sandbox user (RLIMIT_MSGQUEUE, with user namespaces)")
	f.Int64Var(&b.Procs, "sandbox-nproc", 0, "processes of each container sandbox user (RLIMIT_NPROC, with user namespaces; 0: twice the sandbox's pids limit)")
	f.BoolVar(&cfg.NoLXCFS, "no-lxcfs", false, "run container sandboxes without LXCFS: they read the host's /proc/meminfo, cpuinfo, stat, uptime, loadavg and diskstats")
	f.StringVar(&cfg.Net.Pool, "net-pool", "", "IPv4 prefix sandbox addresses come from, a /30 each (default: a free /16 of 10.200-10.249 chosen per data dir; 10.200.0.0/16 for /var/lib/corral)")
	f.StringVar(&cfg.Net.Tag, "net-tag", "", "1-4 of [a-z0-9] naming this instance's interfaces and nftables tables (default: chosen per data dir; 0 for /var/lib/corral)")
	f.StringVar(&cfg.Net.Services, "services", "", `service catalog file: {"services": {"NAME": {"domains": [...], "addresses": [...]}}}`)
	f.StringArrayVar(&cfg.Net.DNSUpstreams, "dns-upstream", nil, "resolver that allowed names are forwarded to, ADDR[:PORT] (repeatable; default: /etc/resolv.conf)")
	f.IntVar(&cfg.Net.MaxRules, "net-max-rules", 0, "most allow and deny rules one policy may have (default 256)")
	f.StringVar(logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(logLevel, "log-level", "info", "log level: debug, info, warn, error")
}

// budgetFlagsValid checks the sandbox budget flags, naming the flag at fault.
func budgetFlagsValid(b backends.Budgets) error {
	err := b.Validate()
	if err == nil {
		return nil
	}
	flag := map[string]string{"InotifyInstances": "sandbox-inotify-instances", "InotifyWatches": "sandbox-inotify-watches",
		"MsgQueueBytes": "sandbox-mqueue-bytes", "Procs": "sandbox-nproc"}[errdefs.Field(err)]
	msg := err.Error()
	if _, m, ok := strings.Cut(msg, ": "); ok {
		msg = m
	}
	return usagef("--%s: %s", flag, msg)
}
