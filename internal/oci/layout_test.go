package oci

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/corral-dev/corral/internal/errdefs"
)

// newLayout writes an empty OCI layout in a fresh directory.
func newLayout(t *testing.T) (string, layout.Path) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	return dir, p
}

func tagged(tag string) layout.Option {
	return layout.WithAnnotations(map[string]string{annotationRefName: tag})
}

func TestLayoutSingleImage(t *testing.T) {
	dir, p := newLayout(t)
	img := imageOf(t, baseLayers(t)...)
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	r, err := Open(context.Background(), Source{Layout: dir}, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if got, want := r.Image().Digest, digestOf(t, img); got != want {
		t.Errorf("Digest = %s, want %s", got, want)
	}
	if got := r.Image().Config.WorkingDir; got != "/work" {
		t.Errorf("WorkingDir = %q, want /work", got)
	}
	diffTree(t, treeOf(t, flatten(t, r)), baseTree)
}

func TestLayoutTags(t *testing.T) {
	dir, p := newLayout(t)
	one := imageOf(t, layerOf(t, file("which", "one")))
	two := imageOf(t, layerOf(t, file("which", "two")))
	if err := p.AppendImage(one, tagged("v1")); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(two, layout.WithAnnotations(map[string]string{
		annotationContainerd: "docker.io/library/thing:v2"})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec string
		want v1.Image
	}{
		{dir + ":v1", one},
		{dir + ":v2", two},
		{dir + ":thing:v2", two},
		{dir + "@" + digestOf(t, one), one},
	} {
		r, err := Open(context.Background(), Source{Layout: tc.spec}, Options{})
		if err != nil {
			t.Fatalf("Open(%s): %v", tc.spec, err)
		}
		if got, want := r.Image().Digest, digestOf(t, tc.want); got != want {
			t.Errorf("Open(%s): Digest = %s, want %s", tc.spec, got, want)
		}
	}

	_, err := Open(context.Background(), Source{Layout: dir}, Options{})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "v1, docker.io/library/thing:v2") {
		t.Errorf("Open without a tag = %v, want ErrInvalid listing the tags", err)
	}
	_, err = Open(context.Background(), Source{Layout: dir + ":v3"}, Options{})
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), `tag "v3" not found`) {
		t.Errorf("Open(:v3) = %v, want ErrNotFound", err)
	}
	_, err = Open(context.Background(), Source{Layout: dir + "@sha256:" + strings.Repeat("0", 64)}, Options{})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open(@unknown digest) = %v, want ErrNotFound", err)
	}
	_, err = Open(context.Background(), Source{Layout: filepath.Join(dir, "nope")}, Options{})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open(missing dir) = %v, want ErrNotFound", err)
	}
	_, err = Open(context.Background(), Source{Layout: t.TempDir()}, Options{})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "no index.json") {
		t.Errorf("Open(empty dir) = %v, want ErrInvalid", err)
	}
	bad := t.TempDir()
	for _, index := range []string{`{`, `{"manifests":[{"digest":"sha256:x"}]}`, `{"manifests":[]}`,
		`{"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:` + strings.Repeat("1", 64) + `","size":2}]}`} {
		if err := os.WriteFile(filepath.Join(bad, "index.json"), []byte(index), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Open(context.Background(), Source{Layout: bad}, Options{})
		if !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Open(index.json %s) = %v, want ErrInvalid or ErrNotFound", index, err)
		}
	}
}

func TestLayoutMultiPlatform(t *testing.T) {
	dir, p := newLayout(t)
	mine := imageOf(t, layerOf(t, file("arch", "mine")))
	other := imageFor(t, "linux", "riscv64", layerOf(t, file("arch", "riscv64")))
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "riscv64"}}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtimeArch()}}},
	)
	if err := p.AppendIndex(idx, tagged("latest")); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{dir, dir + ":latest"} {
		r, err := Open(context.Background(), Source{Layout: spec}, Options{})
		if err != nil {
			t.Fatalf("Open(%s): %v", spec, err)
		}
		if got, want := r.Image().Digest, digestOf(t, mine); got != want {
			t.Errorf("Digest = %s, want %s", got, want)
		}
		diffTree(t, treeOf(t, flatten(t, r)), []string{"arch file mine"})
	}
}

func TestLayoutCorruptBlob(t *testing.T) {
	dir, p := newLayout(t)
	img := imageOf(t, layerOf(t, file("a", strings.Repeat("a", 1000))))
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ls, _ := img.Layers()
	d, _ := ls[0].Digest()
	blob := filepath.Join(dir, "blobs", d.Algorithm, d.Hex)
	b, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(context.Background(), Source{Layout: dir}, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}

	// The same gzip stream with different bytes in its header (the OS field): it decompresses to
	// the right tar, so only the blob digest catches it.
	b[9] ^= 0xff
	if err := os.WriteFile(blob, b, 0o644); err != nil {
		t.Fatal(err)
	}
	err = r.Flatten(context.Background(), &strings.Builder{})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "want "+d.String()) {
		t.Errorf("Flatten of a corrupt blob = %v, want ErrInvalid naming the digest", err)
	}

	if err := os.Remove(blob); err != nil {
		t.Fatal(err)
	}
	err = r.Flatten(context.Background(), &strings.Builder{})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Flatten of a missing blob = %v, want ErrNotFound", err)
	}
}
