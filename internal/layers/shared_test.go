//go:build linux

package layers

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/blobstore/s3test"
	"github.com/corral-dev/corral/internal/errdefs"
)

// TestSharedS3Store: two nodes (stores with their own directories) over one real S3 server. A
// layer imported on one is mounted on the other after a checked download into its cache; an image
// changed in the bucket is refused on a node that has no copy yet, and leaves nothing there.
func TestSharedS3Store(t *testing.T) {
	needEROFS(t)
	srv := s3test.Start(t)
	ctx := context.Background()
	open := func() (*Store, blobstore.Store) {
		b, err := blobstore.Open(ctx, srv.Spec(s3test.Bucket, "layers-test", "&access_key_file="+srv.KeyFile))
		if err != nil {
			t.Fatal(err)
		}
		return newStore(t, Config{Blobs: b}), b
	}
	a, blobs := open()
	b, _ := open()
	blob := importBytes(t, a, tarOf(t, dir("etc/"), file("etc/motd", "hello from a"), symlink("motd", "etc/motd")))

	dirB, err := mounted(t, b, blob.Digest)
	if err != nil {
		t.Fatalf("Acquire on the second node: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(dirB, "motd")); err != nil || string(got) != "hello from a" {
		t.Errorf("read through the second node's mount = %q, %v", got, err)
	}
	ihex := strings.TrimPrefix(blob.Image, "sha256:")
	if _, err := os.Stat(filepath.Join(b.cacheDir, ihex+".erofs")); err != nil {
		t.Errorf("the second node has no cached image: %v", err)
	}
	if list, err := b.List(ctx); err != nil || len(list) != 1 || list[0].Digest != blob.Digest {
		t.Errorf("List on the second node = %+v, %v", list, err)
	}
	// Importing the same content on the second node is a no-op.
	if again := importBytes(t, b, tarOf(t, dir("etc/"), file("etc/motd", "hello from a"), symlink("motd", "etc/motd"))); again.Image != blob.Image {
		t.Errorf("re-import on the second node made image %s; want the stored %s", again.Image, blob.Image)
	}

	// Someone replaces the image in the bucket.
	bad := bytes.Repeat([]byte{0}, int(blob.ImageSize))
	if err := blobs.Put(ctx, imageKey(ihex), bytes.NewReader(bad), int64(len(bad))); err != nil {
		t.Fatal(err)
	}
	c, _ := open()
	if _, err := c.Acquire(ctx, blob.Digest); err == nil || !strings.Contains(err.Error(), "corrupt or replaced") {
		t.Errorf("Acquire of a replaced image = %v; want a corrupt-or-replaced error", err)
	}
	if entries, _ := os.ReadDir(c.cacheDir); len(entries) != 0 {
		t.Errorf("a refused download left %d files in the cache", len(entries))
	}
	assertClean(t, c)

	// A removal on one node is seen by imports on the others.
	if err := a.Remove(ctx, blob.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, blob.Digest); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat after removal on another node = %v; want ErrNotFound", err)
	}
}
