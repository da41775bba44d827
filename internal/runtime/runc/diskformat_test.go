package runc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestDiskFormats: disks formatted from the kept copy of mkfs's writes are clean ext4 filesystems
// (e2fsck -fn), for a second disk of a size (the copy) as for the first, sparse or allocated.
func TestDiskFormats(t *testing.T) {
	mkfs, err := findMkfs()
	if err != nil {
		t.Skip(err)
	}
	fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		for _, p := range []string{"/usr/sbin/e2fsck", "/sbin/e2fsck"} {
			if _, serr := os.Stat(p); serr == nil {
				fsck, err = p, nil
			}
		}
	}
	if err != nil {
		t.Skip("no e2fsck")
	}
	dir := t.TempDir()
	d := &diskFormats{mkfs: mkfs, scratch: dir}
	for _, size := range []int64{64 << 20, 1 << 30} {
		for i := range 2 {
			img := formatImage(t, d, filepath.Join(dir, "disk.img"), size)
			if out, err := exec.Command(fsck, "-fn", img).CombinedOutput(); err != nil {
				t.Errorf("size %d, disk %d: e2fsck: %v\n%s", size, i, err, out)
			}
			os.Remove(img)
		}
		var kept int
		for _, r := range d.bySize[size] {
			kept += len(r.data)
		}
		if kept == 0 || kept > 4<<20 {
			t.Errorf("size %d: %d bytes kept", size, kept)
		}
		t.Logf("size %d: %d ranges, %d bytes kept", size, len(d.bySize[size]), kept)
	}
	// A size whose writes are too large to keep is formatted by mkfs, and remembered as such.
	huge := int64(256 << 30)
	img := formatImage(t, d, filepath.Join(dir, "huge.img"), huge)
	if r, ok := d.bySize[huge]; !ok || r != nil {
		t.Errorf("a 256 GiB format: kept %d ranges (remembered: %v), want none, remembered", len(r), ok)
	}
	if out, err := exec.Command(fsck, "-fn", img).CombinedOutput(); err != nil {
		t.Errorf("256 GiB disk by mkfs: e2fsck: %v\n%s", err, out)
	}
	os.Remove(img)
	// The scratch images are gone.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in the scratch directory: %v", ents)
	}
}

// formatImage makes a sparse image of size bytes at img and formats it with d.
func formatImage(t *testing.T, d *diskFormats, img string, size int64) string {
	t.Helper()
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if err := d.write(context.Background(), f, size); err != nil {
		t.Fatal(err)
	}
	return img
}
