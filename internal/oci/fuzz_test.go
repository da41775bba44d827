package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"path"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// checkOutput checks what Flatten or WriteGroup wrote: a tar archive with unique names, every
// hardlink after its target, nothing below a non-directory, and with whiteouts false no whiteout.
func checkOutput(t *testing.T, b []byte, whiteouts bool) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	kinds := map[string]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("output is not a tar archive: %v", err)
		}
		rel, why := cleanName(h.Name)
		if why != "" {
			t.Fatalf("output entry %q: %s", h.Name, why)
		}
		if _, dup := kinds[rel]; dup {
			t.Fatalf("output has %q twice", rel)
		}
		kinds[rel] = h.Typeflag
		if !whiteouts && strings.HasPrefix(path.Base(rel), whiteoutPrefix) {
			t.Fatalf("output has whiteout %q", rel)
		}
		if h.Typeflag == tar.TypeLink {
			if k, ok := kinds[h.Linkname]; !ok || k == tar.TypeDir {
				t.Fatalf("hardlink %q to %q, not an earlier file", rel, h.Linkname)
			}
		}
		for d := path.Dir(rel); d != "." && rel != ""; d = path.Dir(d) {
			if k, ok := kinds[d]; ok && k != tar.TypeDir {
				t.Fatalf("%q is below the non-directory %q", rel, d)
			}
		}
	}
}

// opsToLayers turns fuzz bytes into layers: each pair of bytes is one entry (or a new layer),
// with names from a small set so that entries collide.
func opsToLayers(t *testing.T, ops []byte) [][]byte {
	names := []string{"a", "b", "a/b", "a/c", "b/a", "a/b/c", "c", ".wh..wh.plnk/1"}
	var layers [][]byte
	var cur []ent
	for i := 0; i+1 < len(ops) && len(layers) < 4; i += 2 {
		n := names[int(ops[i+1])%len(names)]
		switch ops[i] % 8 {
		case 0:
			cur = append(cur, file(n, n))
		case 1:
			cur = append(cur, dir(n))
		case 2:
			cur = append(cur, symlink(n, "/"+n))
		case 3:
			cur = append(cur, hardlink(n, names[int(ops[i+1]/8)%len(names)]))
		case 4:
			cur = append(cur, whiteout(n))
		case 5:
			cur = append(cur, opaque(path.Dir(n)))
		default:
			layers = append(layers, tarOf(t, cur...))
			cur = nil
		}
	}
	return append(layers, tarOf(t, cur...))
}

func FuzzMerge(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, 6, 0, 4, 0, 0, 3})
	f.Add([]byte{1, 0, 0, 2, 3, 16, 6, 0, 4, 0, 6, 0, 5, 2, 0, 4})
	f.Add([]byte{0, 7, 3, 56, 6, 0, 0, 1, 6, 0, 4, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		r := memReader(opsToLayers(t, ops)...)
		var buf bytes.Buffer
		if err := r.Flatten(context.Background(), &buf); err == nil {
			checkOutput(t, buf.Bytes(), false)
		}
		for _, g := range r.Groups(0) {
			buf.Reset()
			if err := r.WriteGroup(context.Background(), g, &buf); err == nil {
				checkOutput(t, buf.Bytes(), true)
			}
		}
		if n := len(r.layers); n > 1 {
			buf.Reset()
			if err := r.WriteGroup(context.Background(), []int{1, n - 1}[:min(2, n-1)], &buf); err == nil {
				checkOutput(t, buf.Bytes(), true)
			}
		}
	})
}

// FuzzFlattenArchive feeds arbitrary bytes as a layer.
func FuzzFlattenArchive(f *testing.F) {
	f.Add(tarOf(f, dir("a"), file("a/b", "x"), hardlink("c", "a/b"), whiteout("d")))
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0})
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		// A sparse entry may claim terabytes of holes; the layer store stops such an import, and
		// limitedBuffer plays its part.
		buf := &limitedBuffer{max: 16 << 20}
		if err := memReader(b).Flatten(context.Background(), buf); err == nil {
			checkOutput(t, buf.Bytes(), false)
		}
	})
}

// fakeStore serves one manifest for every digest and one config.
type fakeStore struct{ manifestRaw, configRaw []byte }

func (f *fakeStore) manifest(context.Context, v1.Descriptor) ([]byte, types.MediaType, error) {
	return f.manifestRaw, "", nil
}
func (f *fakeStore) config(context.Context, v1.Descriptor) ([]byte, error) { return f.configRaw, nil }

// FuzzResolve feeds arbitrary manifests and configs to the code that checks them.
func FuzzResolve(f *testing.F) {
	f.Add([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:`+strings.Repeat("a", 64)+`","size":10},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:`+strings.Repeat("b", 64)+`","size":5}]}`),
		[]byte(`{"os":"linux","architecture":"amd64","rootfs":{"type":"layers","diff_ids":["sha256:`+strings.Repeat("c", 64)+`"]},"config":{"Env":["A=b"]}}`))
	f.Add([]byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:`+strings.Repeat("a", 64)+`","size":1,"platform":{"os":"linux","architecture":"amd64"}}]}`),
		[]byte(`{}`))
	f.Add([]byte(`{"schemaVersion":1}`), []byte(`null`))
	f.Fuzz(func(t *testing.T, manifest, config []byte) {
		st := &fakeStore{manifestRaw: manifest, configRaw: config}
		want := v1.Platform{OS: "linux", Architecture: "amd64"}
		img, layers, err := resolve(context.Background(), st, "image", "x", manifest, "", v1.Hash{}, want)
		if err == nil && (img.Layers != len(layers) || img.Platform == "") {
			t.Fatalf("resolve = %+v with %d layers", img, len(layers))
		}
	})
}

// limitedBuffer fails writes past max bytes.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if l.Len()+len(p) > l.max {
		return 0, io.ErrShortWrite
	}
	return l.Buffer.Write(p)
}
