//go:build !lean

package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/oci"
	corral "github.com/corral-dev/corral/sdk/go"
)

// The image paths of `corral layer import` and `corral env build` (OCI images, registries,
// Dockerfiles) live in corrald only: their packages' initialisation (go-digest's patterns,
// go-containerregistry, klauspost's compressors) would cost every start of bin/corral half a
// millisecond. bin/corral runs those commands through corrald (image_lean.go).

// importImageFlags publishes the image that the flags of `corral layer import` name.
func (a *app) importImageFlags(ctx context.Context, c *corral.Client, name, version, kind string, f imageFlags, threshold int64, pub corral.ImportOptions) (*corral.Layer, error) {
	layout := f.layout
	if f.ociArchive != "" {
		file, tag, _ := strings.Cut(f.ociArchive, ":")
		dir, err := extractOCIArchive(file)
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		layout = dir
		if tag != "" {
			layout += ":" + tag
		}
	}
	src := oci.Source{Image: f.image, Layout: layout, DockerArchive: f.dockerArchive}
	return a.importImage(ctx, c, name, version, kind, src, oci.Options{Platform: f.platform, Insecure: f.insecure}, threshold, pub)
}

// importImage publishes a container image with its configuration, showing progress on a
// terminal: flattened into one layer, or, with a threshold of 0 or more (--split), as a stack of
// layers, one per run of consecutive image layers of at most threshold bytes. Every layer is
// published with pub's project and privacy.
func (a *app) importImage(ctx context.Context, c *corral.Client, name, version, kind string, src oci.Source, opt oci.Options, threshold int64, pub corral.ImportOptions) (*corral.Layer, error) {
	if _, tty := terminalFd(a.stderr); tty {
		var last time.Time
		opt.Progress = func(done, total int64, layer, layers int) {
			if now := time.Now(); now.Sub(last) > 200*time.Millisecond || done == total {
				last = now
				fmt.Fprintf(a.stderr, "\rlayer %d/%d  %s / %s   ", layer, layers, formatBytes(done), formatBytes(total))
			}
		}
		defer fmt.Fprintln(a.stderr)
	}
	img, err := oci.Open(ctx, src, opt)
	if err != nil {
		return nil, err
	}
	info := img.Image()
	cfg := &corral.ImageConfig{Env: info.Config.Env, WorkingDir: info.Config.WorkingDir, User: info.Config.User,
		Entrypoint: info.Config.Entrypoint, Cmd: info.Config.Cmd, Labels: info.Config.Labels}
	if threshold < 0 {
		return uploadTar("image", func(w io.Writer) error { return img.Flatten(ctx, w) }, func(r io.Reader) (*corral.Layer, error) {
			return c.ImportLayerWith(ctx, name, version, kind, corral.ImportOptions{ImageConfig: cfg, Project: pub.Project, Private: pub.Private, Public: pub.Public}, r)
		})
	}
	groups := img.Groups(threshold)
	var below []string
	for k, g := range groups[:len(groups)-1] {
		part := fmt.Sprintf("%s.part%d", name, k+1)
		l, err := uploadTar("image", func(w io.Writer) error { return img.WriteGroup(ctx, g, w) }, func(r io.Reader) (*corral.Layer, error) {
			return c.ImportLayerWith(ctx, part, version, kind, corral.ImportOptions{Project: pub.Project, Private: pub.Private, Public: pub.Public}, r)
		})
		if err != nil {
			return nil, fmt.Errorf("part %d of %d (image layers %d-%d): %w", k+1, len(groups), g[0]+1, g[len(g)-1]+1, err)
		}
		below = append(below, l.Name+":"+l.Version)
	}
	top := groups[len(groups)-1]
	return uploadTar("image", func(w io.Writer) error { return img.WriteGroup(ctx, top, w) }, func(r io.Reader) (*corral.Layer, error) {
		return c.ImportLayerWith(ctx, name, version, kind, corral.ImportOptions{ImageConfig: cfg, Below: below, Project: pub.Project, Private: pub.Private, Public: pub.Public}, r)
	})
}
