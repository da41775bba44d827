package cli

import (
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
