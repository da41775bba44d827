package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Annotations that name the manifests of a layout's index.json.
const (
	annotationRefName    = "org.opencontainers.image.ref.name" // a tag ("3.20") or a full reference
	annotationContainerd = "io.containerd.image.name"          // a full reference (nerdctl, ctr export)
)

// layoutSource reads an image from an OCI image layout directory.
type layoutSource struct {
	name string // the source as the user wrote it
	path layout.Path
}

// openLayout resolves "DIR", "DIR:TAG" or "DIR@sha256:...".
func openLayout(ctx context.Context, spec string, _ Options, want v1.Platform) (*Reader, error) {
	dir, tag, digest, err := splitLayout(spec)
	if err != nil {
		return nil, err
	}
	ls := &layoutSource{name: spec, path: layout.Path(dir)}
	raw, err := readFileLimit(filepath.Join(dir, "index.json"), maxManifest)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.Invalid("layout", "%s is not an OCI image layout: it has no index.json", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, errdefs.Invalid("layout", "%s: malformed index.json: %v", dir, err)
	}
	var d v1.Descriptor
	switch {
	case digest != "":
		i := slices.IndexFunc(idx.Manifests, func(d v1.Descriptor) bool { return d.Digest.String() == digest })
		if i < 0 {
			return nil, errdefs.NotFound("manifest %s not found in OCI layout %s", digest, dir)
		}
		d = idx.Manifests[i]
	case tag != "":
		var found []v1.Descriptor
		for _, m := range idx.Manifests {
			if refMatches(m.Annotations[annotationRefName], tag) || refMatches(m.Annotations[annotationContainerd], tag) {
				found = append(found, m)
			}
		}
		switch len(found) {
		case 0:
			return nil, errdefs.NotFound("tag %q not found in OCI layout %s (it has %s)", tag, dir, layoutTags(idx))
		case 1:
			d = found[0]
		default:
			return nil, errdefs.Invalid("layout", "tag %q names %d manifests in %s; select one by digest (DIR@sha256:...)", tag, len(found), dir)
		}
	case len(idx.Manifests) == 1:
		d = idx.Manifests[0]
	case len(idx.Manifests) == 0:
		return nil, errdefs.Invalid("layout", "OCI layout %s holds no image", dir)
	default:
		// Several manifests and no selector: index.json may be a multi-platform index itself.
		if !slices.ContainsFunc(idx.Manifests, func(d v1.Descriptor) bool { return d.Platform != nil }) {
			return nil, errdefs.Invalid("layout", "OCI layout %s holds %d manifests; select one with DIR:TAG or DIR@sha256:... (tags: %s)", dir, len(idx.Manifests), layoutTags(idx))
		}
		img, layers, err := resolve(ctx, ls, "layout", spec, raw, types.OCIImageIndex, v1.Hash{}, want)
		if err != nil {
			return nil, err
		}
		return &Reader{name: spec, img: img, layers: layers, src: ls}, nil
	}
	mraw, mt, err := ls.manifest(ctx, d)
	if err != nil {
		return nil, err
	}
	if mt == "" {
		mt = d.MediaType
	}
	img, layers, err := resolve(ctx, ls, "layout", spec, mraw, mt, d.Digest, want)
	if err != nil {
		return nil, err
	}
	return &Reader{name: spec, img: img, layers: layers, src: ls}, nil
}

// splitLayout splits "DIR[:TAG|@DIGEST]". A path that is a directory as a whole has no selector;
// otherwise the first ":" after which the path is a directory starts the tag.
func splitLayout(spec string) (dir, tag, digest string, err error) {
	if isDir(spec) {
		return spec, "", "", nil
	}
	if i := strings.LastIndexByte(spec, '@'); i > 0 && isDir(spec[:i]) {
		if _, err := v1.NewHash(spec[i+1:]); err != nil {
			return "", "", "", errdefs.Invalid("layout", "%q: %q is not a digest: %v", spec, spec[i+1:], err)
		}
		return spec[:i], "", spec[i+1:], nil
	}
	for i := range len(spec) {
		if spec[i] == ':' && i > 0 && i < len(spec)-1 && isDir(spec[:i]) {
			return spec[:i], spec[i+1:], "", nil
		}
	}
	if _, err := os.Stat(spec); err == nil {
		return "", "", "", errdefs.Invalid("layout", "%s is not a directory", spec)
	}
	return "", "", "", errdefs.NotFound("OCI layout %s not found", spec)
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// refMatches reports whether a manifest annotated with ref is the one sel selects: sel is ref
// itself, the tag of ref ("3.20" selects "docker.io/library/alpine:3.20"), or the same reference
// written another way ("alpine:3.20").
func refMatches(ref, sel string) bool {
	switch {
	case ref == "":
		return false
	case ref == sel:
		return true
	case !strings.Contains(sel, ":"):
		return strings.HasSuffix(ref, ":"+sel)
	}
	a, err1 := name.NewTag(ref)
	b, err2 := name.NewTag(sel)
	return err1 == nil && err2 == nil && a.Name() == b.Name()
}

// layoutTags lists the names of a layout's manifests, for messages.
func layoutTags(idx *v1.IndexManifest) string {
	var tags []string
	for _, m := range idx.Manifests {
		if t := m.Annotations[annotationRefName]; t != "" {
			tags = append(tags, t)
		} else if t := m.Annotations[annotationContainerd]; t != "" {
			tags = append(tags, t)
		}
	}
	if len(tags) == 0 {
		return "no tags"
	}
	return strings.Join(tags, ", ")
}

func (s *layoutSource) manifest(ctx context.Context, d v1.Descriptor) ([]byte, types.MediaType, error) {
	b, err := s.blob(d.Digest, maxManifest)
	if err != nil {
		return nil, "", s.fail(ctx, "manifest "+d.Digest.String(), err)
	}
	return b, "", nil
}

func (s *layoutSource) config(ctx context.Context, d v1.Descriptor) ([]byte, error) {
	b, err := s.blob(d.Digest, maxConfig)
	if err != nil {
		return nil, s.fail(ctx, "config "+d.Digest.String(), err)
	}
	return b, nil
}

// blob reads a small blob and checks its digest.
func (s *layoutSource) blob(h v1.Hash, limit int64) ([]byte, error) {
	rc, err := s.path.Blob(h)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return readVerified(rc, h, limit)
}

func (s *layoutSource) openLayer(_ context.Context, l *layer) (io.ReadCloser, error) {
	return s.path.Blob(l.digest)
}

func (s *layoutSource) remote() bool { return false }

func (s *layoutSource) describe(l *layer) string {
	return fmt.Sprintf("layer %d (%s) of OCI layout %s", l.index, l.digest, s.name)
}

func (s *layoutSource) fail(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.NotFound("%s: blob missing from OCI layout %s", what, s.name)
	}
	// A digest mismatch, a blob over the size limit, a symlink in blobs/.
	return errdefs.Invalid("layout", "%s of OCI layout %s: %v", what, s.name, err)
}

// readFileLimit reads a file of at most limit bytes.
func readFileLimit(p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes: %w", p, limit, errdefs.ErrTooLarge)
	}
	return b, nil
}
