//go:build !lean

package cli

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/daemon"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/store"
)

// newServerCmd returns `corral server`: a stateless replica in front of a cluster's edges.
func newServerCmd() *cobra.Command {
	var cfg cluster.Config
	var logFormat, logLevel string
	cmd := &cobra.Command{
		Use:   "server --store postgres://... [flags]",
		Short: "Run a cluster's API replica: placement, routing to edges, node watching",
		Long: `Run one replica of a cluster's API. Any number of replicas share one PostgreSQL store;
each host runs ` + "`corral edge`" + `, which joins with the join token.

The first replica to find an empty store writes <data-dir>/admin.token and <data-dir>/join.token
(mode 0600); later replicas just serve.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(cmd, logFormat, logLevel)
			if err != nil {
				return err
			}
			if cfg.Store == "" {
				// From the environment, the DSN's password stays out of the process list.
				cfg.Store = os.Getenv("CORRAL_STORE")
			}
			if cfg.Store == "" {
				return usagef("--store (or $CORRAL_STORE) is required: postgres://USER@HOST:PORT/DB?sslmode=disable")
			}
			if cfg.EdgeStore == "" {
				cfg.EdgeStore = os.Getenv("CORRAL_EDGE_STORE")
			}
			daemon.PrivateUmask()
			if cfg.DataDir != "" {
				if _, err := os.Stat(cfg.DataDir); err == nil {
					if _, err := daemon.SecureDataDir(cfg.DataDir, log); err != nil {
						return err
					}
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return cluster.Run(ctx, cfg, log, nil)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", "/var/lib/corral-server", "directory for admin.token and join.token (written by the replica that bootstraps the store)")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7070", "address of the API")
	f.StringVar(&cfg.NodeListen, "node-listen", "", "address of the node channel, where edges register, heartbeat and send events over mutual TLS (default: --listen's host, the next port)")
	f.StringVar(&cfg.NodeURL, "node-url", "", "URL edges reach the node channel at, https://HOST:PORT, the same for every replica (default: the host an edge joined through, --node-listen's port)")
	f.StringVar(&cfg.Store, "store", "", "the cluster's PostgreSQL: postgres://USER@HOST:PORT/DB?sslmode=disable (default $CORRAL_STORE, which keeps a password out of the process list; required)")
	f.StringVar(&cfg.EdgeStore, "edge-store", "", "a store DSN handed to joining edges of an older release, which open the store, while the cluster upgrades: a role of corral server edge-role (default $CORRAL_EDGE_STORE, else none; this release's edges open no store)")
	f.StringVar(&cfg.BlobStore, "blob-store", "", "the cluster's layer store, handed to joining edges: dir:/SHARED/PATH or s3://BUCKET[/PREFIX]?endpoint=URL")
	f.DurationVar(&cfg.LeaseGrace, "lease-grace", 0, "how long past its lease a node is declared lost and its sandboxes failed (default 10s)")
	f.IntVar(&cfg.K, "placement-k", 0, "nodes sampled per placement, the least loaded wins (default 2; 1 random; -1 all)")
	f.Float64Var(&cfg.Overcommit.CPU, "overcommit-cpu", 0, "CPU limits granted per CPU of a node (default 4)")
	f.Float64Var(&cfg.Overcommit.Memory, "overcommit-memory", 0, "memory limits granted per byte of a node's memory (default 1)")
	f.Float64Var(&cfg.Overcommit.Disk, "overcommit-disk", 0, "writable-disk limits granted per byte of a node's data-dir filesystem (default 1; disks are sparse)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&cfg.E2B.Listen, "e2b-listen", "", "also serve E2B's API on this address (every replica; default: off)")
	f.StringVar(&cfg.E2B.Domain, "e2b-domain", "", "the domain E2B sandbox views name (getHost(port) gives <port>-<id>.<domain>)")
	f.StringVar(&cfg.OTLPEndpoint, "otlp-endpoint", "", "send traces over OTLP/HTTP to this receiver, http(s)://HOST:PORT (/v1/traces is added unless the URL has a path; default $OTEL_EXPORTER_OTLP_ENDPOINT; none: no tracing)")
	addAPIFlags(f, &cfg.AuditRetention, &cfg.SandboxRetention, &cfg.Webhooks)
	cmd.AddCommand(newEdgeRoleCmd())
	return cmd
}

// newEdgeRoleCmd returns `corral server edge-role`: a PostgreSQL role with an older edge's
// privileges on the cluster's store, for --edge-store during an upgrade.
func newEdgeRoleCmd() *cobra.Command {
	var dsn, role, passwordFile string
	cmd := &cobra.Command{
		Use:   "edge-role --store postgres://OWNER@... [--role corral_edge] [--password-file F]",
		Short: "Create or update the PostgreSQL role edges of an older release use while a cluster upgrades",
		Long: `Give a PostgreSQL role what the cluster's edges of an older release (which opened the store)
need in it, read-only, creating it (LOGIN) when it does not exist. This release's edges open no
store: the role is for an upgrade only. Run it as the tables' owner (the servers' --store), start
the upgraded servers with --edge-store (or $CORRAL_EDGE_STORE) set to a DSN of this role, so an
old edge that restarts meanwhile can still join, and drop both once every edge is upgraded.

The role writes nothing, and reads no token, principal, grant, webhook, setting (not the
cluster CA's key, the join token or the E2B secrets), event, usage row, trajectory or audit
entry. It prints the statements it ran.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dsn == "" {
				dsn = os.Getenv("CORRAL_STORE")
			}
			if dsn == "" {
				return usagef("--store (or $CORRAL_STORE) is required: the owner's postgres://USER@HOST:PORT/DB?sslmode=disable")
			}
			var password string
			if passwordFile != "" {
				b, err := os.ReadFile(passwordFile)
				if err != nil {
					return err
				}
				password = strings.TrimSpace(string(b))
			}
			st, err := store.Open(cmd.Context(), dsn)
			if err != nil {
				return err
			}
			defer st.Close()
			done, err := st.ApplyEdgeRole(cmd.Context(), role, password)
			for _, s := range done {
				fmt.Fprintln(cmd.OutOrStdout(), s+";")
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&dsn, "store", "", "the cluster's PostgreSQL as its tables' owner (default $CORRAL_STORE)")
	f.StringVar(&role, "role", "corral_edge", "the role to create or update")
	f.StringVar(&passwordFile, "password-file", "", "file holding the password a new role logs in with (default: none; pg_hba then decides)")
	return cmd
}

// newEdgeCmd returns `corral edge`: one host of a cluster.
func newEdgeCmd() *cobra.Command {
	cfg := daemon.Config{Cluster: &daemon.ClusterConfig{}}
	var logFormat, logLevel, serverURL, joinFile, advertise string
	var labels []string
	cmd := &cobra.Command{
		Use:   "edge --server URL --join-token FILE --name NAME [flags]",
		Short: "Run a cluster's edge on this host: join, hold the node's lease, run its sandboxes",
		Long: `Run this host as an edge of a cluster: join through a server with the join token, register
the node in the cluster's store (a new incarnation with a higher epoch each start), heartbeat,
and run sandboxes exactly as ` + "`corral up`" + ` does. If the node's lease is lost (a newer
incarnation, or the servers declared it lost) the edge stops; start it again to re-register.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(cmd, logFormat, logLevel)
			if err != nil {
				return err
			}
			if cfg.Cluster.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if err := placement.ValidateLabels("--label", cfg.Cluster.Labels); err != nil {
				return usagef("%v", err)
			}
			cfg.Cluster.URL = advertise
			if cfg.Cluster.URL == "" {
				host, port, err := net.SplitHostPort(cfg.Listen)
				if err != nil || host == "" || host == "0.0.0.0" || host == "::" {
					return usagef("--advertise URL is needed when --listen (%q) names no single host", cfg.Listen)
				}
				cfg.Cluster.URL = "https://" + net.JoinHostPort(host, port)
			}
			if !strings.HasPrefix(cfg.Cluster.URL, "https://") {
				return usagef("--advertise %q: servers reach edges over https (mutual TLS under the cluster CA)", cfg.Cluster.URL)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			j, err := cluster.Join(ctx, serverURL, joinFile, cfg.Node)
			if err != nil {
				return err
			}
			go j.KeepFresh(ctx, log)
			cfg.Cluster.TLS, cfg.Cluster.Servers = j.TLS, j.Servers // no store: the servers are the edge's
			if cfg.BlobStore == "" {
				cfg.BlobStore = j.BlobStore
			}
			return daemon.Run(ctx, cfg, log, nil)
		},
	}
	addDaemonFlags(cmd.Flags(), &cfg, &logFormat, &logLevel)
	f := cmd.Flags()
	f.StringVar(&serverURL, "server", "", "a server of the cluster, http://HOST:PORT (required)")
	f.StringVar(&joinFile, "join-token", "", "file holding the cluster's join token (required)")
	f.StringVar(&cfg.Node, "name", "", "this node's name, also in its sandboxes' IDs (1-32 lowercase letters, digits or inner hyphens; required)")
	f.StringVar(&advertise, "advertise", "", "URL the servers reach this edge at (default https://LISTEN)")
	f.StringArrayVar(&labels, "label", nil, "node label KEY=VALUE for placement, e.g. kvm=true (repeatable)")
	f.DurationVar(&cfg.Cluster.LeaseTTL, "lease-ttl", 0, "how long one heartbeat holds the node's lease (default 15s)")
	f.IntVar(&cfg.Cluster.Sandboxes, "max-sandboxes", 0, "most sandboxes this node runs, fncall pool containers included (default 1000)")
	f.Float64Var(&cfg.Cluster.Overcommit.CPU, "overcommit-cpu", 0, "CPU limits admitted per CPU of this host (default 4); over it a create is refused with 409 node_full")
	f.Float64Var(&cfg.Cluster.Overcommit.Memory, "overcommit-memory", 0, "memory limits admitted per byte of this host's memory (default 1)")
	f.Float64Var(&cfg.Cluster.Overcommit.Disk, "overcommit-disk", 0, "writable-disk limits admitted per byte of the data dir's filesystem (default 1)")
	f.StringVar(&cfg.OTLPEndpoint, "otlp-endpoint", "", "send traces over OTLP/HTTP to this receiver, http(s)://HOST:PORT (/v1/traces is added unless the URL has a path; default $OTEL_EXPORTER_OTLP_ENDPOINT; none: no tracing)")
	f.MarkHidden("node")  // --name says it for an edge
	f.MarkHidden("store") // an edge opens none (refused if given)
	for _, req := range []string{"server", "join-token", "name"} {
		cmd.MarkFlagRequired(req)
	}
	return cmd
}
