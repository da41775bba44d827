package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	corral "github.com/corral-dev/corral/sdk/go"
)

func (a *app) newLayerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "layer",
		Short: "Publish and list layers (bases, workspaces, toolkits)",
		Args:  exactArgs(0, "a subcommand: import, ls, get or tag"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(a.newLayerImportCmd(), a.newLayerLsCmd(), a.newLayerGetCmd(), a.newLayerTagCmd())
	return cmd
}

// splitRef splits a NAME:VERSION argument.
func splitRef(ref string) (name, version string, err error) {
	if err := checkRef("layer", ref); err != nil {
		return "", "", usagef("%q: want NAME:VERSION", ref)
	}
	name, version, _ = strings.Cut(ref, ":")
	return name, version, nil
}

func (a *app) newLayerImportCmd() *cobra.Command {
	var kind, dir, tarFile string
	cmd := &cobra.Command{
		Use:   "import NAME:VERSION --kind base|workspace|toolkit (--dir PATH | --tar FILE)",
		Short: "Publish a directory or a tar stream as a layer version",
		Long: `Publish a directory (--dir) or a tar stream (--tar FILE, "-" for stdin; plain, gzip or
zstd) as an immutable layer version. Publishing the same content again under the same
NAME:VERSION succeeds; other content under an existing NAME:VERSION is refused.`,
		Example: `  corral layer import base:2025-01 --kind base --dir ./rootfs
  docker export $(docker create alpine) | corral layer import alpine:3 --kind base --tar -`,
		Args: exactArgs(1, "NAME:VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitRef(args[0])
			if err != nil {
				return err
			}
			switch kind {
			case corral.KindBase, corral.KindWorkspace, corral.KindToolkit:
			default:
				return usagef("--kind must be base, workspace or toolkit, not %q", kind)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			var l *corral.Layer
			if dir != "" {
				l, err = importDir(cmd.Context(), c, name, version, kind, dir)
			} else {
				var r io.Reader = a.stdin
				if tarFile != "-" {
					f, err := os.Open(tarFile)
					if err != nil {
						return err
					}
					defer f.Close()
					r = f
				}
				if r == nil {
					return usagef("--tar -: no stdin")
				}
				l, err = c.ImportLayer(cmd.Context(), name, version, kind, r)
			}
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(l)
			}
			_, err = fmt.Fprintf(a.stdout, "%s:%s %s %s %s files\n", l.Name, l.Version, l.Digest, formatBytes(l.Size), strconv.FormatInt(l.Files, 10))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&kind, "kind", "", "layer kind: base, workspace or toolkit")
	f.StringVar(&dir, "dir", "", "directory to publish")
	f.StringVar(&tarFile, "tar", "", `tar stream to publish ("-" for stdin)`)
	cmd.MarkFlagRequired("kind")
	cmd.MarkFlagsMutuallyExclusive("dir", "tar")
	cmd.MarkFlagsOneRequired("dir", "tar")
	return cmd
}

// importDir streams a tar of dir into ImportLayer.
func importDir(ctx context.Context, c *corral.Client, name, version, kind, dir string) (*corral.Layer, error) {
	if fi, err := os.Stat(dir); err != nil {
		return nil, err
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("--dir %s is not a directory", dir)
	}
	pr, pw := io.Pipe()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tarDone := make(chan error, 1)
	go func() {
		err := layerTar(wctx, dir, pw)
		pw.CloseWithError(err)
		tarDone <- err
	}()
	l, err := c.ImportLayer(ctx, name, version, kind, pr)
	// If the upload ended early, stop the tar writer blocked on the pipe.
	pr.CloseWithError(errors.New("upload ended"))
	cancel()
	if terr := <-tarDone; terr != nil && err == nil {
		return nil, fmt.Errorf("read %s: %w", dir, terr)
	}
	return l, err
}

func (a *app) newLayerLsCmd() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:     "ls [--name NAME]",
		Aliases: []string{"list"},
		Short:   "List published layers",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.Layers(cmd.Context(), name)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				if list == nil {
					list = []corral.Layer{}
				}
				return a.printJSON(list)
			}
			now := a.now()
			t := newTable(a.stdout, "NAME", "VERSION", "KIND", "SIZE", "FILES", "DIGEST", "CREATED", "TAGS")
			for _, l := range list {
				t.row(l.Name, l.Version, l.Kind, formatBytes(l.Size), strconv.FormatInt(l.Files, 10), shortDigest(l.Digest), relTime(l.CreatedAt, now),
					orDash(strings.Join(l.Tags, ",")))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "only versions of this layer")
	return cmd
}

func (a *app) newLayerGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME:VERSION",
		Short: "Show a layer version",
		Args:  exactArgs(1, "NAME:VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitRef(args[0])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.Layer(cmd.Context(), name, version)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(l)
			}
			t := newTable(a.stdout)
			for _, kv := range [][2]string{
				{"Name:", l.Name},
				{"Version:", l.Version},
				{"Kind:", l.Kind},
				{"Digest:", l.Digest},
				{"Size:", formatBytes(l.Size)},
				{"Files:", strconv.FormatInt(l.Files, 10)},
				{"Labels:", orDash(formatLabels(l.Labels))},
				{"Created:", formatTime(l.CreatedAt, a.now())},
			} {
				t.row(kv[0], kv[1])
			}
			return t.flush()
		},
	}
}

// shortDigest shortens "sha256:abcdef..." to "sha256:abcdef012345" for tables.
func shortDigest(d string) string {
	algo, hex, ok := strings.Cut(d, ":")
	if !ok || len(hex) <= 12 {
		return d
	}
	return algo + ":" + hex[:12]
}
