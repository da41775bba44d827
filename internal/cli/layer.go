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
		Args:  exactArgs(0, "a subcommand: import, ls, get, tag, untag, publish, unpublish, set, stats, rm or gc"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(a.newLayerImportCmd(), a.newLayerLsCmd(), a.newLayerGetCmd(), a.newLayerTagCmd(),
		a.newLayerUntagCmd(), a.newLayerRmCmd(), a.newLayerGCCmd(), a.newLayerStatsCmd(), a.newLayerSetCmd(),
		a.newLayerPublishCmd(true), a.newLayerPublishCmd(false))
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
	var kind, dir, tarFile, image, layout, archive, ociArchive, platform, collapse string
	var insecure, split bool
	var pub corral.ImportOptions
	cmd := &cobra.Command{
		Use:   "import NAME:VERSION --kind base|workspace|toolkit (--dir PATH | --tar FILE | --image REF | --oci-layout DIR[:TAG] | --oci-archive FILE[:TAG] | --docker-archive FILE) [--project PATH] [--private|--public]",
		Short: "Publish a directory, a tar stream or a container image as a layer version",
		Long: `Publish a directory (--dir), a tar stream (--tar FILE, "-" for stdin; plain, gzip or
zstd) or a container image as an immutable layer version. An image comes from a registry
(--image REF, pulled by this command with the credentials of ~/.docker/config.json), an OCI image
layout directory (--oci-layout DIR, DIR:TAG to pick one), a tar of one (--oci-archive FILE, as
podman save --format oci-archive writes) or a docker save archive (--docker-archive FILE); its layers are flattened into one layer (whiteouts applied) and its
configuration (env, working directory, user) is kept for sandboxes built on it. With --split the
image becomes several layers instead: runs of consecutive image layers of at most
--collapse-below bytes together (default 3GB) are merged, each run but the last is published as
NAME.partK:VERSION, and NAME:VERSION stacks on them, so an image that shares its lower layers with
another stores them once. Publishing the same content again under the same NAME:VERSION succeeds;
other content under an existing NAME:VERSION is refused.

The layer belongs to a project (--project, default the token's) and is seen and usable in that
project's whole subtree (a root-project layer: in the root project only), unless --private keeps
it to the project itself or --public shows it to every project (corral layer publish and
unpublish change that later). Anyone else is told it does not exist.`,
		Example: `  corral layer import base:2025-01 --kind base --dir ./rootfs
  corral layer import python:3.12 --kind base --image registry.example.com/library/python:3.12-slim
  corral layer import app:v1 --kind base --oci-layout ./app-oci:v1
  podman save --format oci-archive -o app.tar app:v1 && corral layer import app:v1 --kind base --oci-archive app.tar
  corral layer import py:3.12 --kind base --image registry.example.com/python:3.12 --split --collapse-below 1GB
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
			threshold := int64(-1)
			if split {
				if threshold, err = parseSize(collapse); err != nil {
					return usagef("--collapse-below: %v", err)
				}
			} else if cmd.Flags().Changed("collapse-below") {
				return usagef("--collapse-below needs --split")
			}
			var l *corral.Layer
			if img := (imageFlags{image: image, layout: layout, dockerArchive: archive, ociArchive: ociArchive, platform: platform, insecure: insecure}); img != (imageFlags{platform: platform, insecure: insecure}) {
				l, err = a.importImageFlags(cmd.Context(), c, name, version, kind, img, threshold, pub)
			} else if split {
				return usagef("--split applies to images (--image, --oci-layout, --oci-archive, --docker-archive)")
			} else if dir != "" {
				l, err = importDir(cmd.Context(), c, name, version, kind, dir, pub)
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
				l, err = c.ImportLayerWith(cmd.Context(), name, version, kind, pub, r)
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
	f.StringVar(&image, "image", "", "container image in a registry, e.g. registry.example.com/repo:tag or repo@sha256:...")
	f.StringVar(&layout, "oci-layout", "", "OCI image layout directory, DIR or DIR:TAG")
	f.StringVar(&archive, "docker-archive", "", "docker save archive (a tar file)")
	f.StringVar(&ociArchive, "oci-archive", "", "OCI image layout in a tar file (podman save --format oci-archive), FILE or FILE:TAG")
	f.StringVar(&platform, "platform", "", "image platform, e.g. linux/amd64 (default: this host's)")
	f.BoolVar(&insecure, "insecure", false, "allow a plain-HTTP registry")
	f.BoolVar(&split, "split", false, "publish an image as several stacked layers instead of one")
	f.StringVar(&collapse, "collapse-below", "3GB", "with --split: merge consecutive image layers up to this many bytes in all (0: one layer per image layer)")
	f.StringVar(&pub.Project, "project", "", "publish the layer in this project (default: the token's)")
	f.BoolVar(&pub.Private, "private", false, "keep the layer from the project's subprojects")
	f.BoolVar(&pub.Public, "public", false, "show the layer (every part of it, with --split) to every project")
	cmd.MarkFlagRequired("kind")
	cmd.MarkFlagsMutuallyExclusive("private", "public")
	cmd.MarkFlagsMutuallyExclusive("dir", "tar", "image", "oci-layout", "oci-archive", "docker-archive")
	cmd.MarkFlagsOneRequired("dir", "tar", "image", "oci-layout", "oci-archive", "docker-archive")
	return cmd
}

// imageFlags are the image source flags of `corral layer import`.
type imageFlags struct {
	image, layout, dockerArchive, ociArchive, platform string
	insecure                                           bool
}

// uploadTar runs write into a pipe that upload reads. If the upload ends early, the writer is
// stopped; a failure of the writer is reported when the upload itself succeeded.
func uploadTar(what string, write func(io.Writer) error, upload func(io.Reader) (*corral.Layer, error)) (*corral.Layer, error) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := write(pw)
		pw.CloseWithError(err)
		done <- err
	}()
	l, err := upload(pr)
	pr.CloseWithError(errUploadEnded)
	// A writer that failed on its own (not because the upload ended) is the cause of an upload
	// that failed for want of its data.
	if werr := <-done; werr != nil && (err == nil || !errors.Is(werr, errUploadEnded)) {
		return nil, fmt.Errorf("read %s: %w", what, werr)
	}
	return l, err
}

// errUploadEnded is what a tar writer gets once its upload has ended.
var errUploadEnded = errors.New("upload ended")

// importDir streams a tar of dir into ImportLayerWith.
func importDir(ctx context.Context, c *corral.Client, name, version, kind, dir string, opt corral.ImportOptions) (*corral.Layer, error) {
	if fi, err := os.Stat(dir); err != nil {
		return nil, err
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("--dir %s is not a directory", dir)
	}
	return uploadTar(dir, func(w io.Writer) error { return layerTar(ctx, dir, w) }, func(r io.Reader) (*corral.Layer, error) {
		return c.ImportLayerWith(ctx, name, version, kind, opt, r)
	})
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

func (a *app) newLayerSetCmd() *cobra.Command {
	var fill string
	cmd := &cobra.Command{
		Use:   "set NAME:VERSION --fill-rate SIZE|default|never",
		Short: "Change a published version's settings: how fast nodes fetch the rest of it in the background after prefetch",
		Example: `  corral layer set python:3.12 --fill-rate 50M     # 50 MB/s per node once a sandbox's start-up set is in
  corral layer set python:3.12 --fill-rate never   # only what sandboxes read`,
		Args: exactArgs(1, "NAME:VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitRef(args[0])
			if err != nil {
				return err
			}
			var rate int64
			switch fill {
			case "":
				return usagef("--fill-rate is required (SIZE per second, default or never)")
			case "default":
			case "never":
				rate = -1
			default:
				if rate, err = parseSize(fill); err != nil || rate <= 0 {
					return usagef("--fill-rate %q: want a size per second (50M), default or never", fill)
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.SetLayerFillRate(cmd.Context(), name, version, rate)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(l)
			}
			fmt.Fprintf(a.stdout, "%s:%s fill rate %s\n", l.Name, l.Version, formatFillRate(l.FillRate))
			return nil
		},
	}
	cmd.Flags().StringVar(&fill, "fill-rate", "", "bytes per second each node fetches of the rest of the layer after prefetch (50M), default (the node's --fetch-fill-rate) or never")
	return cmd
}

// newLayerPublishCmd returns `corral layer publish NAME:VERSION` (public) or `corral layer
// unpublish NAME:VERSION`.
func (a *app) newLayerPublishCmd(public bool) *cobra.Command {
	use, short := "publish NAME:VERSION", "Show a layer version to every project (it stays its project's to change and delete)"
	if !public {
		use, short = "unpublish NAME:VERSION", "Take a public layer version back to its project's subtree (sandboxes already made keep it)"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Example: `  corral layer publish base:debian-12     # an operator's base image, for every tenant
  corral layer unpublish base:debian-12`,
		Args: exactArgs(1, "NAME:VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitRef(args[0])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.SetLayerPublic(cmd.Context(), name, version, public)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(l)
			}
			fmt.Fprintf(a.stdout, "%s:%s %s\n", l.Name, l.Version, visibility(*l))
			return nil
		},
	}
}

// visibility says who sees a layer.
func visibility(l corral.Layer) string {
	switch {
	case l.Public:
		return "public (every project)"
	case l.Private:
		return "private (project " + l.Project + " only)"
	case l.Project == corral.RootProject:
		return "the root project only"
	}
	return "project " + l.Project + " and its subprojects"
}

// formatFillRate shows a layer's fill rate setting.
func formatFillRate(rate int64) string {
	switch {
	case rate < 0:
		return "never"
	case rate == 0:
		return "default (the node's)"
	}
	return formatBytes(rate) + "/s"
}

func (a *app) newLayerStatsCmd() *cobra.Command {
	var node string
	cmd := &cobra.Command{
		Use:   "stats NAME:VERSION [--node NAME]",
		Short: "Show how a layer version's data reached the node: bytes fetched and cached, hits, misses, latency",
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
			st, err := c.LayerStats(cmd.Context(), name, version, node)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(st)
			}
			t := newTable(a.stdout)
			rows := [][2]string{
				{"Layer:", st.Name + ":" + st.Version},
				{"Node:", st.Node},
				{"Format:", st.Format},
				{"Metadata:", formatBytes(st.ImageBytes)},
				{"Data:", formatBytes(st.DataBytes)},
			}
			if f := st.Fetch; f != nil {
				rows = append(rows,
					[2]string{"Cached:", fmt.Sprintf("%s (%d of %d chunks)", formatBytes(f.CachedBytes), f.CachedChunks, f.Chunks)},
					[2]string{"Fetched:", fmt.Sprintf("%s in %d reads (%d failed), p50 %gms p99 %gms", formatBytes(f.BytesFetched), f.Fetches, f.FetchErrors, f.FetchLatency.P50Ms, f.FetchLatency.P99Ms)},
					[2]string{"Cache hits:", fmt.Sprintf("%d hits, %d misses", f.Hits, f.Misses)},
					[2]string{"Prefetch:", fmt.Sprintf("%s in %d chunks, %.0f%% then read", formatBytes(f.Prefetch.Bytes), f.Prefetch.Chunks, 100*f.Prefetch.Effectiveness)},
					[2]string{"Read errors:", strconv.FormatInt(f.ReadErrors, 10)},
					[2]string{"Last error:", orDash(f.LastError)})
			}
			for _, kv := range rows {
				t.row(kv[0], kv[1])
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "the node whose cache and fetches to show (a cluster's edge; default: any)")
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
				{"Project:", l.Project},
				{"Visible to:", visibility(*l)},
				{"Fill rate:", formatFillRate(l.FillRate)},
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

func (a *app) newLayerTagCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "tag NAME:TAG VERSION",
		Short:   "Point a movable tag (python:latest) at a published version",
		Example: `  corral layer tag python:latest 3.12`,
		Args:    exactArgs(2, "NAME:TAG and a VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, tag, err := splitRef(args[0])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.TagLayer(cmd.Context(), name, tag, args[1])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(l)
			}
			_, err = fmt.Fprintf(a.stdout, "%s:%s -> %s:%s\n", name, tag, l.Name, l.Version)
			return err
		},
	}
}

func (a *app) newLayerRmCmd() *cobra.Command {
	return a.layerRefCmd("rm NAME:VERSION", "Delete a layer version (refused while a tag, an environment or a snapshot refers to it)",
		func(c *corral.Client, ctx context.Context, name, version string) error {
			_, err := c.DeleteLayer(ctx, name, version)
			return err
		})
}

func (a *app) newLayerUntagCmd() *cobra.Command {
	return a.layerRefCmd("untag NAME:TAG", "Delete a tag (the version it pointed at stays)", (*corral.Client).DeleteTag)
}

// layerRefCmd is a command that takes one NAME:VERSION (or NAME:TAG) argument and prints
// nothing on success.
func (a *app) layerRefCmd(use, short string, do func(c *corral.Client, ctx context.Context, name, version string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
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
			return do(c, cmd.Context(), name, version)
		},
	}
}

func (a *app) newLayerGCCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "gc",
		Short: "Remove layer contents that no version and no sandbox uses",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.GCLayers(cmd.Context())
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(res)
			}
			_, err = fmt.Fprintf(a.stdout, "removed %d layer trees, %s\n", res.Removed, formatBytes(res.Bytes))
			return err
		},
	}
}
