package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"path"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/corral-dev/corral/internal/layers"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestImageImport: `corral layer import --image` pulls a two-layer image from a registry (served
// by this test on loopback), flattens it (the second layer's whiteout applied) and keeps its
// config, which sandboxes built on it get as their environment and command defaults.
func TestImageImport(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()

	var base bytes.Buffer
	if err := layers.WriteTar(ctx, busyboxRootfs(t), &base); err != nil {
		t.Fatal(err)
	}
	top := tarOf(t, map[string]string{"opt/app/hello": "from the image\n", "bin/.wh.vi": ""})
	img := empty.Image
	for _, b := range [][]byte{base.Bytes(), top} {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Env: []string{"PATH=/bin", "GREETING=hello"}, WorkingDir: "/opt/app", Entrypoint: []string{"/bin/sh"}}
	img, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.TrimPrefix(reg.URL, "http://") + "/test/app:1"
	r, _ := name.ParseReference(ref, name.Insecure)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}

	if _, stderr, code := p.cli("", "layer", "import", "app:1", "--kind", "base", "--image", ref); code != 0 {
		t.Fatalf("corral layer import --image: %s", stderr)
	}
	if _, stderr, code := p.cli("", "layer", "import", "app:2", "--kind", "base", "--image", strings.TrimSuffix(ref, ":1")+":nope"); code == 0 || !strings.Contains(stderr, "not found") {
		t.Fatalf("import of a missing tag: exit %d, %s", code, stderr)
	}
	l, err := p.Client.Layer(ctx, "app", "1")
	if err != nil || l.ImageConfig == nil || l.ImageConfig.WorkingDir != "/opt/app" {
		t.Fatalf("layer app:1 = %+v, %v", l, err)
	}
	sb := p.create(corral.CreateRequest{Base: "app:1", Env: []string{"EXTRA=1"}})
	const script = `echo "$GREETING $EXTRA"; pwd; cat hello; [ -e /bin/vi ] && echo vi-present || echo vi-gone`
	const want = "hello 1\n/opt/app\nfrom the image\nvi-gone\n"
	if got := p.sh(sb.ID, script); got != want {
		t.Fatalf("sandbox on the imported image: %q", got)
	}

	// --split: one Corral layer per image layer (threshold 0); the top stacks on the part, and a
	// sandbox sees exactly what the flattened import shows, the whiteout applied across layers.
	if _, stderr, code := p.cli("", "layer", "import", "app:split", "--kind", "base", "--image", ref, "--split", "--collapse-below", "0"); code != 0 {
		t.Fatalf("corral layer import --split: %s", stderr)
	}
	stacked, err := p.Client.Layer(ctx, "app", "split")
	if err != nil || len(stacked.Below) != 1 || stacked.Below[0] != "app.part1:split" || stacked.ImageConfig == nil {
		t.Fatalf("layer app:split = %+v, %v; want it stacked on app.part1:split with the image config", stacked, err)
	}
	part, err := p.Client.Layer(ctx, "app.part1", "split")
	if err != nil || part.Size < stacked.Size {
		t.Fatalf("part app.part1:split = %+v, %v; want the (larger) busybox layer", part, err)
	}
	sb = p.create(corral.CreateRequest{Base: "app:split", Env: []string{"EXTRA=1"}})
	if got := p.sh(sb.ID, script); got != want {
		t.Fatalf("sandbox on the split image: %q", got)
	}
	if _, err := p.Client.DeleteLayer(ctx, "app.part1", "split"); !corral.IsConflict(err) {
		t.Errorf("deleting a part under a published layer: %v; want conflict", err)
	}
	// With the default threshold the two small layers collapse into one.
	if _, stderr, code := p.cli("", "layer", "import", "app:collapsed", "--kind", "base", "--image", ref, "--split"); code != 0 {
		t.Fatalf("corral layer import --split (default threshold): %s", stderr)
	}
	if l, err := p.Client.Layer(ctx, "app", "collapsed"); err != nil || len(l.Below) != 0 || l.Digest != must(p.Client.Layer(ctx, "app", "1")).Digest {
		t.Errorf("layer app:collapsed = %+v, %v; want one layer, the flattened one", l, err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// tarOf builds a tar of regular files (mode 0644, parents created as directories).
func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for d := path.Dir(n); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	ds := make([]string, 0, len(dirs))
	for d := range dirs {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	for _, d := range ds {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755})
	}
	for _, n := range names {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(files[n]))})
		io.WriteString(tw, files[n])
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
