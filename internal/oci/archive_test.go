package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestDockerArchive(t *testing.T) {
	img := imageOf(t, baseLayers(t)...)
	path := filepath.Join(t.TempDir(), "img.tar")
	if err := tarball.WriteToFile(path, name.MustParseReference("corral/base:v1"), img); err != nil {
		t.Fatal(err)
	}
	r, err := Open(context.Background(), Source{DockerArchive: path}, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	cfg, _ := img.ConfigName()
	if got := r.Image(); got.Digest != cfg.String() || got.Layers != 3 || got.Config.User != "1000:1000" {
		t.Errorf("Image() = %+v, want digest %s (the config's), 3 layers, user 1000:1000", got, cfg)
	}
	diffTree(t, treeOf(t, flatten(t, r)), baseTree)
}

func TestDockerArchiveTags(t *testing.T) {
	one := imageOf(t, layerOf(t, file("which", "one")))
	two := imageOf(t, layerOf(t, file("which", "two")))
	path := filepath.Join(t.TempDir(), "imgs.tar")
	err := tarball.MultiRefWriteToFile(path, map[name.Reference]v1.Image{
		name.MustParseReference("corral/one:v1"):           one,
		name.MustParseReference("registry.example/two:v2"): two,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec string
		want string
	}{
		{path + ":corral/one:v1", "one"},
		{path + ":docker.io/corral/one:v1", "one"},
		{path + ":registry.example/two:v2", "two"},
	} {
		r, err := Open(context.Background(), Source{DockerArchive: tc.spec}, Options{})
		if err != nil {
			t.Fatalf("Open(%s): %v", tc.spec, err)
		}
		diffTree(t, treeOf(t, flatten(t, r)), []string{"which file " + tc.want})
	}
	_, err = Open(context.Background(), Source{DockerArchive: path}, Options{})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "holds 2 images") {
		t.Errorf("Open without a tag = %v, want ErrInvalid", err)
	}
	_, err = Open(context.Background(), Source{DockerArchive: path + ":corral/three:v3"}, Options{})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open(unknown tag) = %v, want ErrNotFound", err)
	}
	_, err = Open(context.Background(), Source{DockerArchive: path + ".missing"}, Options{})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open(missing file) = %v, want ErrNotFound", err)
	}
	notTar := filepath.Join(t.TempDir(), "x.tar")
	if err := os.WriteFile(notTar, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Open(context.Background(), Source{DockerArchive: notTar}, Options{})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Open(not a tar) = %v, want ErrInvalid", err)
	}
}

// TestDockerSaveClassic reads an archive laid out as the classic `docker save` writes it:
// uncompressed layers in directories, a layer two images share linked by a symlink.
func TestDockerSaveClassic(t *testing.T) {
	l1 := tarOf(t, dir("etc"), file("etc/os-release", "ID=test"), file("etc/tmp", "x"))
	l2 := tarOf(t, whiteout("etc/tmp"), file("hello", "world"))
	id := func(b []byte) string {
		sum := sha256.Sum256(b)
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	cfg := fmt.Sprintf(`{"architecture":%q,"os":"linux","rootfs":{"type":"layers","diff_ids":[%q,%q]},`+
		`"config":{"Env":["A=1"],"Cmd":["/hello"]}}`, runtimeArch(), id(l1), id(l2))
	manifest := `[{"Config":"cfg.json","RepoTags":["corral/x:1"],"Layers":["ccc/layer.tar","bbb/layer.tar"]}]`
	archive := tarOf(t,
		dir("aaa"), file("aaa/layer.tar", string(l1)),
		dir("bbb"), file("bbb/layer.tar", string(l2)),
		dir("ccc"), symlink("ccc/layer.tar", "../aaa/layer.tar"),
		file("cfg.json", cfg), file("manifest.json", manifest),
	)
	path := filepath.Join(t.TempDir(), "save.tar")
	if err := os.WriteFile(path, archive, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Open(context.Background(), Source{DockerArchive: path}, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	img := r.Image()
	if img.Digest != id([]byte(cfg)) || img.Size != int64(len(l1)+len(l2)) || img.Config.Cmd[0] != "/hello" {
		t.Errorf("Image() = %+v", img)
	}
	diffTree(t, treeOf(t, flatten(t, r)), []string{"etc/ dir 0755", "etc/os-release file ID=test", "hello file world"})
	diffTree(t, treeOf(t, writeGroup(t, r, 1)), []string{"etc/.wh.tmp file ", "hello file world"})
}
