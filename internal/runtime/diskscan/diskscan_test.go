package diskscan

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// image makes dir/entry/name of size bytes (sparse: no blocks allocated).
func image(t testing.TB, dir, entry, name string, size int64) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, entry), 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, entry, name)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestScan: figures are read once and reused for maxAge (forever when negative, never when 0);
// directories that go are dropped; Forget makes a name read again.
func TestScan(t *testing.T) {
	dir := t.TempDir()
	a := image(t, dir, "a", "disk.img", 1<<20)
	image(t, dir, "b", "disk.img", 2<<20)
	os.Mkdir(filepath.Join(dir, "no-image"), 0o700)
	os.WriteFile(filepath.Join(dir, "a-file"), nil, 0o600)
	clock := time.Unix(1000, 0)
	s := &Scanner{now: func() time.Time { return clock }}
	names := []string{"disk.img"}
	if got := s.Scan(dir, names, -1); got.Images != 2 || got.Size != 3<<20 || got.Allocated != 0 {
		t.Fatalf("first scan = %+v, want 2 images, 3 MiB, none allocated", got)
	}
	// Grown on disk: a negative maxAge keeps the first figures; 0 reads again.
	if err := os.Truncate(a, 4<<20); err != nil {
		t.Fatal(err)
	}
	if got := s.Scan(dir, names, -1); got.Size != 3<<20 {
		t.Errorf("kept scan size = %d, want the first figures (3 MiB)", got.Size)
	}
	if got := s.Scan(dir, names, 0); got.Size != 6<<20 {
		t.Errorf("fresh scan size = %d, want 6 MiB", got.Size)
	}
	// maxAge: reused while younger, read again once as old.
	os.Truncate(a, 1<<20)
	if got := s.Scan(dir, names, time.Second); got.Size != 6<<20 {
		t.Errorf("scan within maxAge: size %d, want the cached 6 MiB", got.Size)
	}
	clock = clock.Add(time.Second)
	if got := s.Scan(dir, names, time.Second); got.Size != 3<<20 {
		t.Errorf("scan after maxAge: size %d, want 3 MiB", got.Size)
	}
	// Allocated bytes count, at most each image's size.
	f, _ := os.OpenFile(a, os.O_WRONLY, 0)
	f.WriteAt(make([]byte, 64<<10), 0)
	f.Close()
	if got := s.Scan(dir, names, 0); got.Allocated < 64<<10 || got.Allocated > 1<<20 {
		t.Errorf("allocated = %d, want the 64 KiB written (at most the image's 1 MiB)", got.Allocated)
	}
	// A directory removed is dropped; one made again under the same name is read after Forget.
	os.RemoveAll(filepath.Join(dir, "b"))
	if got := s.Scan(dir, names, -1); got.Images != 1 || got.Size != 1<<20 {
		t.Errorf("after removing b: %+v, want 1 image of 1 MiB", got)
	}
	os.RemoveAll(filepath.Join(dir, "a"))
	s.Forget(dir, "a")
	image(t, dir, "a", "disk.img", 8<<20)
	if got := s.Scan(dir, names, -1); got.Images != 1 || got.Size != 8<<20 {
		t.Errorf("a made again: %+v, want its new 8 MiB image", got)
	}
	// A directory without an image is kept as such until Forget, then read again.
	image(t, dir, "no-image", "disk.img", 1<<20)
	if got := s.Scan(dir, names, -1); got.Images != 1 {
		t.Errorf("an image in a directory known to have none: %+v, want it unseen until Forget", got)
	}
	s.Forget(dir, "no-image")
	if got := s.Scan(dir, names, -1); got.Images != 2 || got.Size != 9<<20 {
		t.Errorf("after Forget: %+v, want 2 images, 9 MiB", got)
	}
	if got := s.Scan(filepath.Join(dir, "missing"), names, -1); got != (Sum{}) {
		t.Errorf("scan of a missing directory = %+v", got)
	}
}

// BenchmarkScan: one Scan of N sandboxes' directories with the figures kept (a sandbox's disk,
// maxAge < 0) against every image read (maxAge 0), and against what the runc runtime did on
// every create before this package (glob: filepath.Glob, then a stat of each image).
func BenchmarkScan(b *testing.B) {
	for _, n := range []int{100, 1000} {
		dir := b.TempDir()
		for i := range n {
			image(b, dir, fmt.Sprintf("sb-%05d", i), "disk.img", 1<<30)
		}
		for _, c := range []struct {
			name   string
			maxAge time.Duration
		}{{"kept", -1}, {"read", 0}, {"glob", 0}} {
			b.Run(fmt.Sprintf("%s/%d", c.name, n), func(b *testing.B) {
				var s Scanner
				scan := func() Sum { return s.Scan(dir, []string{"disk.img"}, c.maxAge) }
				if c.name == "glob" {
					scan = func() Sum { return globScan(dir, "disk.img") }
				}
				scan()
				for b.Loop() {
					if got := scan(); got.Images != n {
						b.Fatalf("found %d images, want %d", got.Images, n)
					}
				}
			})
		}
	}
}

// globScan is the runc runtime's DiskUse before this package, for BenchmarkScan.
func globScan(dir, name string) Sum {
	var sum Sum
	imgs, _ := filepath.Glob(filepath.Join(dir, "*", name))
	for _, img := range imgs {
		var st unix.Stat_t
		if unix.Stat(img, &st) != nil {
			continue
		}
		sum.Images++
		sum.Size += st.Size
		sum.Allocated += min(st.Blocks*512, st.Size)
	}
	return sum
}
