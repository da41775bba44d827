package oci

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/corral-dev/corral/internal/errdefs"
)

// maxLinkHops bounds the symlinks followed inside a docker archive (docker save links a layer
// that two images share).
const maxLinkHops = 8

// archiveSource reads an image from a `docker save` tarball: manifest.json lists each image's
// config and layer files; the layers are usually uncompressed tars.
type archiveSource struct {
	name  string   // the source as the user wrote it
	path  string   // the archive file
	files []string // the archive entry holding each layer
}

// archiveEntry is what the index of an archive keeps of an entry.
type archiveEntry struct {
	typ  byte
	size int64
	link string
}

// openArchive resolves "PATH" or "PATH:REPO:TAG".
func openArchive(ctx context.Context, spec string, _ Options, want v1.Platform) (*Reader, error) {
	file, tag, err := splitArchive(spec)
	if err != nil {
		return nil, err
	}
	as := &archiveSource{name: spec, path: file}
	entries, err := as.index(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := entries["manifest.json"]; !ok {
		return nil, errdefs.Invalid("docker_archive", "%s is not a docker save archive: it has no manifest.json", file)
	}
	raw, err := as.read(ctx, entries, "manifest.json", maxManifest)
	if err != nil {
		return nil, err
	}
	var m tarball.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, errdefs.Invalid("docker_archive", "%s: malformed manifest.json: %v", file, err)
	}
	d, err := pickArchiveImage(file, m, tag)
	if err != nil {
		return nil, err
	}
	rawCfg, err := as.read(ctx, entries, d.Config, maxConfig)
	if err != nil {
		return nil, err
	}
	layers := make([]layer, len(d.Layers))
	as.files = make([]string, len(d.Layers))
	var size int64
	for i, p := range d.Layers {
		name, e, err := resolveEntry(entries, p)
		if err != nil {
			return nil, errdefs.Invalid("docker_archive", "%s: layer %d: %v", file, i, err)
		}
		as.files[i] = name
		layers[i] = layer{index: i, mediaType: types.DockerUncompressedLayer, size: e.size}
		size += e.size
	}
	img, err := imageFromConfig("docker_archive", spec, rawCfg, layers, want)
	if err != nil {
		return nil, err
	}
	for i := range layers {
		if src, ok := d.LayerSources[layers[i].diffID]; ok && src.MediaType == types.DockerForeignLayer {
			return nil, errdefs.Invalid("docker_archive", "%s: layer %d is a foreign layer (a Windows base layer hosted elsewhere), which is not supported", file, i)
		}
	}
	sum := sha256.Sum256(rawCfg)
	img.Digest = "sha256:" + hex.EncodeToString(sum[:])
	img.Size = size
	return &Reader{name: spec, img: img, layers: layers, src: as}, nil
}

// splitArchive splits "PATH[:REPO:TAG]": the first ":" after which the path is a file starts the
// tag.
func splitArchive(spec string) (file, tag string, err error) {
	if isFile(spec) {
		return spec, "", nil
	}
	for i := range len(spec) {
		if spec[i] == ':' && i > 0 && i < len(spec)-1 && isFile(spec[:i]) {
			return spec[:i], spec[i+1:], nil
		}
	}
	if isDir(spec) {
		return "", "", errdefs.Invalid("docker_archive", "%s is a directory, not a docker save archive (an OCI layout?)", spec)
	}
	return "", "", errdefs.NotFound("docker archive %s not found", spec)
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// pickArchiveImage chooses the image tag names, or the only one.
func pickArchiveImage(file string, m tarball.Manifest, tag string) (tarball.Descriptor, error) {
	var tags []string
	for _, d := range m {
		tags = append(tags, d.RepoTags...)
	}
	list := strings.Join(tags, ", ")
	if list == "" {
		list = "no tags"
	}
	if tag == "" {
		if len(m) != 1 {
			return tarball.Descriptor{}, errdefs.Invalid("docker_archive", "%s holds %d images; choose one with PATH:REPO:TAG (it has %s)", file, len(m), list)
		}
		return m[0], nil
	}
	want, err := name.NewTag(tag)
	if err != nil {
		return tarball.Descriptor{}, errdefs.Invalid("docker_archive", "%q is not a tag: %v", tag, err)
	}
	for _, d := range m {
		for _, t := range d.RepoTags {
			if have, err := name.NewTag(t); err == nil && have.Name() == want.Name() {
				return d, nil
			}
		}
	}
	return tarball.Descriptor{}, errdefs.NotFound("tag %s not found in docker archive %s (it has %s)", tag, file, list)
}

// index lists the archive's entries by clean name. Reading an *os.File, tar skips the content
// with Seek, so this reads little more than the headers.
func (s *archiveSource) index(ctx context.Context) (map[string]archiveEntry, error) {
	f, err := os.Open(s.path)
	if err != nil {
		return nil, s.fail(ctx, "docker archive "+s.path, err)
	}
	defer f.Close()
	entries := map[string]archiveEntry{}
	tr := tar.NewReader(f)
	for n := 0; ; n++ {
		if n%1024 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if n > 1_000_000 {
			return nil, errdefs.Invalid("docker_archive", "%s has more than a million entries; it is not a docker save archive", s.path)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, errdefs.Invalid("docker_archive", "%s is not a readable tar archive: %v", s.path, err)
		}
		entries[cleanArchiveName(hdr.Name)] = archiveEntry{typ: hdr.Typeflag, size: hdr.Size, link: hdr.Linkname}
	}
	return entries, nil
}

func cleanArchiveName(n string) string {
	return strings.TrimPrefix(path.Clean("/"+n), "/")
}

// resolveEntry follows links from the entry p to a regular file.
func resolveEntry(entries map[string]archiveEntry, p string) (string, archiveEntry, error) {
	name := cleanArchiveName(p)
	for range maxLinkHops {
		e, ok := entries[name]
		switch {
		case !ok:
			return "", e, fmt.Errorf("%s is not in the archive", name)
		case e.typ == tar.TypeSymlink:
			name = cleanArchiveName(path.Join(path.Dir(name), e.link))
		case e.typ == tar.TypeLink:
			name = cleanArchiveName(e.link)
		case e.typ == tar.TypeReg || e.typ == tar.TypeGNUSparse:
			return name, e, nil
		default:
			return "", e, fmt.Errorf("%s is not a file", name)
		}
	}
	return "", archiveEntry{}, fmt.Errorf("%s: more than %d links", p, maxLinkHops)
}

// read returns the content of the (small) file p.
func (s *archiveSource) read(ctx context.Context, entries map[string]archiveEntry, p string, limit int64) ([]byte, error) {
	name, e, err := resolveEntry(entries, p)
	if err != nil {
		return nil, errdefs.Invalid("docker_archive", "%s: %v", s.path, err)
	}
	if e.size > limit {
		return nil, errdefs.Invalid("docker_archive", "%s: %s is %d bytes; the limit is %d", s.path, name, e.size, limit)
	}
	rc, err := s.openEntry(ctx, name)
	if err != nil {
		return nil, s.fail(ctx, name+" of docker archive "+s.path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, s.fail(ctx, name+" of docker archive "+s.path, err)
	}
	return b, nil
}

// openEntry opens the content of the entry called name.
func (s *archiveSource) openEntry(ctx context.Context, name string) (io.ReadCloser, error) {
	f, err := os.Open(s.path)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(f)
	for n := 0; ; n++ {
		if n%1024 == 0 && ctx.Err() != nil {
			f.Close()
			return nil, ctx.Err()
		}
		hdr, err := tr.Next()
		if err != nil {
			f.Close()
			if err == io.EOF {
				return nil, fmt.Errorf("%s is no longer in the archive", name)
			}
			return nil, err
		}
		if cleanArchiveName(hdr.Name) == name {
			return struct {
				io.Reader
				io.Closer
			}{tr, f}, nil
		}
	}
}

func (s *archiveSource) openLayer(ctx context.Context, l *layer) (io.ReadCloser, error) {
	return s.openEntry(ctx, s.files[l.index])
}

func (s *archiveSource) remote() bool { return false }

func (s *archiveSource) describe(l *layer) string {
	return fmt.Sprintf("layer %d (%s) of docker archive %s", l.index, s.files[l.index], s.name)
}

func (s *archiveSource) fail(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.NotFound("%s not found", what)
	}
	return errdefs.Invalid("docker_archive", "%s: %v", what, err)
}
