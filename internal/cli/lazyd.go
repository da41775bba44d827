//go:build !lean

package cli

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/daemon"
	"github.com/corral-dev/corral/internal/lazy"
)

// newLazydCmd returns the hidden `corral lazyd`: the node's layer data server, started by
// `corral up` and `corral edge` in a session of its own so that it outlives their restarts.
func newLazydCmd() *cobra.Command {
	var cfg lazy.Config
	var spec, logFormat, logLevel string
	cmd := &cobra.Command{
		Use:    "lazyd",
		Short:  "Serve layer data blobs on demand through FUSE (started by corral up / edge)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(cmd, logFormat, logLevel)
			if err != nil {
				return err
			}
			// Its sockets, log and chunk cache are root's alone, as the rest of the data dir.
			daemon.PrivateUmask()
			cfg.Log = log.With("component", "lazyd")
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if cfg.Blobs, err = blobstore.Open(ctx, spec); err != nil {
				return err
			}
			// A keeper holds the FUSE connection so that it outlives this process, and starts
			// this same command again if it dies.
			cfg.KeeperCommand = []string{os.Args[0], "lazyd-keeper", "--dir", cfg.Dir, "--log-format", logFormat}
			cfg.RestartCommand = os.Args
			return lazy.Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Dir, "dir", "", "state directory (DATA-DIR/layers/lazy)")
	f.StringVar(&spec, "blob-store", "", "the blob store data blobs are read from")
	f.Var(&byteSize{&cfg.CacheMax}, "cache-size", "bound of the chunk cache (default 10G)")
	f.DurationVar(&cfg.ReadTimeout, "read-timeout", 0, "how long a read waits on the blob store before EIO (default 30s)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level")
	cmd.MarkFlagRequired("dir")
	cmd.MarkFlagRequired("blob-store")
	return cmd
}

// newLazydKeeperCmd returns the hidden `corral lazyd-keeper`: it holds lazyd's FUSE connection
// (fd 3) so that a lazyd that dies is replaced without breaking the reads through it, and
// restarts lazyd (the command after --) when it dies. lazyd starts it.
func newLazydKeeperCmd() *cobra.Command {
	var cfg lazy.KeeperConfig
	var logFormat string
	cmd := &cobra.Command{
		Use:    "lazyd-keeper --dir DIR --conn ID -- LAZYD-COMMAND...",
		Short:  "Hold lazyd's FUSE connection and restart lazyd when it dies (started by lazyd)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(cmd, logFormat, "info")
			if err != nil {
				return err
			}
			daemon.PrivateUmask()
			signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
			cfg.Log = log.With("component", "lazyd-keeper")
			cfg.Restart = args
			var st syscall.Stat_t
			if err := syscall.Fstat(3, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR {
				return fmt.Errorf("fd 3 is not lazyd's /dev/fuse descriptor (%v)", err)
			}
			cfg.Dev = os.NewFile(3, "/dev/fuse")
			return lazy.RunKeeper(cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Dir, "dir", "", "lazyd's state directory")
	f.StringVar(&cfg.Conn, "conn", "", "the FUSE connection's name")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	cmd.MarkFlagRequired("dir")
	cmd.MarkFlagRequired("conn")
	return cmd
}
