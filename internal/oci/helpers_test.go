package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ent is one entry of a test layer. Zero fields get defaults: a regular file, mode 0644 (0755
// for directories), owner 0:0.
type ent struct {
	name string
	typ  byte
	body string
	link string
	mode int64
}

func dir(name string) ent              { return ent{name: name, typ: tar.TypeDir} }
func file(name, body string) ent       { return ent{name: name, typ: tar.TypeReg, body: body} }
func symlink(name, target string) ent  { return ent{name: name, typ: tar.TypeSymlink, link: target} }
func hardlink(name, target string) ent { return ent{name: name, typ: tar.TypeLink, link: target} }

// whiteout is the OCI whiteout of path: "dir/.wh.base".
func whiteout(path string) ent {
	d, b := splitPath(path)
	return file(joinPath(d, whiteoutPrefix+b), "")
}

// opaque is the OCI opaque marker of the directory d.
func opaque(d string) ent { return file(joinPath(d, opaqueMarker), "") }

var testTime = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// tarOf builds an uncompressed tar archive.
func tarOf(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, ModTime: testTime,
			Size: int64(len(e.body))}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layerOf is a gzip layer (OCI media type) holding ents.
func layerOf(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	b := tarOf(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testConfig is the config the test images carry.
var testConfig = v1.Config{
	Env:        []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
	WorkingDir: "/work",
	User:       "1000:1000",
	Entrypoint: []string{"/bin/sh", "-c"},
	Cmd:        []string{"echo hi"},
	Labels:     map[string]string{"org.example": "yes"},
}

// imageOf is an OCI image of the layers, for linux and this machine's architecture.
func imageOf(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	return imageFor(t, "linux", runtime.GOARCH, layers...)
}

func imageFor(t testing.TB, os, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = os, arch
	cf.Config = testConfig
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// The layers of the main test image. Together they cover a deleted file, an opaque directory, a
// directory replaced by a file and a file by a directory, a hardlink whose target a later layer
// replaces and one whose target it deletes, a symlink, and a file re-created after a whiteout.
func baseLayers(t testing.TB) []v1.Layer {
	return []v1.Layer{
		layerOf(t,
			dir("etc"), file("etc/passwd", "root:x:0:0"), file("etc/gone", "x"), file("etc/again", "old"),
			dir("opq"), file("opq/old", "1"), dir("opq/sub"), file("opq/sub/deep", "2"),
			dir("d2f"), file("d2f/child", "c"),
			file("f2d", "f"),
			dir("bin"), file("bin/busybox", "bb"), hardlink("bin/sh", "bin/busybox"),
			dir("usr"), dir("usr/lib"), file("usr/lib/libc.so", "libc1"), symlink("lib", "usr/lib"),
			dir("data"), file("data/a", "A"), hardlink("data/b", "data/a"),
			dir("same"), file("same/x", "X"), hardlink("same/y", "same/x"),
		),
		layerOf(t,
			whiteout("etc/gone"), whiteout("etc/again"),
			dir("opq"), opaque("opq"), file("opq/new", "n"),
			file("d2f", "now a file"),
			dir("f2d"), file("f2d/x", "x"),
			whiteout("bin/busybox"),
			file("data/a", "A2"),
		),
		layerOf(t,
			file("etc/again", "new"),
			file("usr/lib/libc.so", "libc2"),
		),
	}
}

// baseTree is what baseLayers flatten to (see treeOf for the notation).
var baseTree = []string{
	"bin/ dir 0755",
	"bin/sh file bb",
	"d2f file now a file",
	"data/ dir 0755",
	"data/a file A2",
	"data/b file A",
	"etc/ dir 0755",
	"etc/again file new",
	"etc/passwd file root:x:0:0",
	"f2d/ dir 0755",
	"f2d/x file x",
	"lib symlink usr/lib",
	"opq/ dir 0755",
	"opq/new file n",
	"same/ dir 0755",
	"same/x file X",
	"same/y hardlink same/x",
	"usr/ dir 0755",
	"usr/lib/ dir 0755",
	"usr/lib/libc.so file libc2",
}

// treeOf lists a tar archive, sorted, one line per entry: "NAME dir MODE", "NAME file BODY",
// "NAME symlink TARGET", "NAME hardlink TARGET". It fails the test on a duplicate name or a
// hardlink to a name not written before it.
func treeOf(t testing.TB, b []byte) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	seen := map[string]bool{}
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read output: %v", err)
		}
		if seen[h.Name] {
			t.Errorf("duplicate entry %q", h.Name)
		}
		seen[h.Name] = true
		switch h.Typeflag {
		case tar.TypeDir:
			out = append(out, fmt.Sprintf("%s dir %04o", h.Name, h.Mode))
		case tar.TypeReg:
			body, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s file %s", h.Name, body))
		case tar.TypeSymlink:
			out = append(out, fmt.Sprintf("%s symlink %s", h.Name, h.Linkname))
		case tar.TypeLink:
			if !seen[h.Linkname] {
				t.Errorf("hardlink %q to %q, which is not earlier in the archive", h.Name, h.Linkname)
			}
			out = append(out, fmt.Sprintf("%s hardlink %s", h.Name, h.Linkname))
		default:
			out = append(out, fmt.Sprintf("%s type %c", h.Name, h.Typeflag))
		}
	}
	sort.Strings(out)
	return out
}

func diffTree(t testing.TB, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("tree:\ngot:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// newRegistry serves an in-memory registry on 127.0.0.1, its handler wrapped by wrap if not nil,
// and returns its host:port.
func newRegistry(t testing.TB, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// push writes img to ref, with credentials if the registry wants them.
func push(t testing.TB, ref string, img v1.Image, auth authn.Authenticator) {
	t.Helper()
	if auth == nil {
		auth = authn.Anonymous
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithAuth(auth)); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// remoteWriteIndex pushes an index and its images.
func remoteWriteIndex(ref string, idx v1.ImageIndex) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	return remote.WriteIndex(r, idx, remote.WithAuth(authn.Anonymous))
}

// fast is Options for tests: anonymous, short retry delays.
func fast() Options {
	return Options{Auth: authn.Anonymous, RetryDelay: time.Millisecond, Timeout: 5 * time.Second}
}

func digestOf(t testing.TB, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func flatten(t testing.TB, r *Reader) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := r.Flatten(context.Background(), &buf); err != nil {
		t.Fatalf("Flatten: %v", err)
	}
	return buf.Bytes()
}

func writeGroup(t testing.TB, r *Reader, group ...int) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := r.WriteGroup(context.Background(), group, &buf); err != nil {
		t.Fatalf("WriteGroup(%v): %v", group, err)
	}
	return buf.Bytes()
}

// memSource serves layers from memory: the seam the merge tests and the fuzz target use.
type memSource struct{ blobs [][]byte }

func (m *memSource) openLayer(_ context.Context, l *layer) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(m.blobs[l.index])), nil
}
func (m *memSource) remote() bool             { return false }
func (m *memSource) describe(l *layer) string { return fmt.Sprintf("layer %d", l.index) }
func (m *memSource) fail(_ context.Context, what string, err error) error {
	return fmt.Errorf("%s: %w", what, err)
}

// memReader is a Reader over uncompressed layer archives.
func memReader(blobs ...[]byte) *Reader {
	r := &Reader{name: "mem", src: &memSource{blobs: blobs}, opt: Options{RetryDelay: time.Millisecond, Timeout: time.Second}}
	for i, b := range blobs {
		sum := sha256.Sum256(b)
		h := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
		r.layers = append(r.layers, layer{index: i, mediaType: types.OCIUncompressedLayer, digest: h, diffID: h, size: int64(len(b))})
	}
	r.img.Layers = len(blobs)
	return r
}
