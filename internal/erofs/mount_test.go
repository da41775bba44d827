//go:build linux

package erofs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// buildForTest builds an image of src under dir and returns its path.
func buildForTest(t *testing.T, src, dir, name string) string {
	t.Helper()
	img := filepath.Join(dir, name)
	start := time.Now()
	if err := Build(context.Background(), src, img); err != nil {
		t.Fatalf("Build: %v", err)
	}
	t.Logf("built %s in %v", name, time.Since(start))
	return img
}

// TestRoundTrip builds an image of a tree holding every kind of entry, mounts it both ways and
// compares the mount with the source entry by entry.
func TestRoundTrip(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	makeTree(t, src)
	img := buildForTest(t, src, dir, "layer.erofs")

	for _, tc := range []struct {
		name string
		opts MountOptions
	}{{"default", MountOptions{}}, {"loop", MountOptions{ForceLoop: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			mnt, b := mountForTest(t, img, dir, tc.opts)
			t.Logf("mounted with backing %+v in %v", b, time.Since(start))
			switch {
			case tc.opts.ForceLoop && (b.Kind != BackingLoop || !strings.HasPrefix(b.Device, "/dev/loop")):
				t.Errorf("Backing = %+v; want a loop device", b)
			case !tc.opts.ForceLoop && b.Kind == BackingLoop:
				t.Logf("this kernel refused a file-backed mount (no CONFIG_EROFS_FS_BACKED_BY_FILE, or the temp dir is on tmpfs or a stacked fs); Mount fell back to loop")
			}
			mi := mountsAt(t, mnt)
			if len(mi) != 1 || mi[0].fsType != "erofs" {
				t.Fatalf("mountinfo at %s: %+v; want one erofs mount", mnt, mi)
			}
			if b.Kind == BackingFile && b.DirectIO != strings.Contains(mi[0].superOptions, "directio") {
				t.Errorf("Backing.DirectIO = %v but the super options are %q", b.DirectIO, mi[0].superOptions)
			}
			if b.Kind == BackingLoop {
				dio, _ := os.ReadFile("/sys/block/" + filepath.Base(b.Device) + "/loop/dio")
				if b.DirectIO != (strings.TrimSpace(string(dio)) == "1") {
					t.Errorf("Backing.DirectIO = %v but %s reports dio=%s", b.DirectIO, b.Device, dio)
				}
			}
			var st unix.Statfs_t
			if err := unix.Statfs(mnt, &st); err != nil {
				t.Fatal(err)
			}
			const want = unix.ST_RDONLY | unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOEXEC
			if st.Flags&want != want {
				t.Errorf("mount flags %#x; want ro,nosuid,nodev,noexec", st.Flags)
			}
			compareTrees(t, src, mnt)
			if err := os.WriteFile(filepath.Join(mnt, "new"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
				t.Errorf("writing to the mount: %v; want EROFS", err)
			}
			if err := Unmount(mnt); err != nil {
				t.Fatalf("Unmount: %v", err)
			}
			// Autoclear detaches the device once the mount lets go of it, asynchronously since
			// Linux 5.17 ("loop: make autoclear operation asynchronous"): give it a moment.
			attached := func() []string {
				devs := loopsBackedUnder(dir)
				if b.Device != "" {
					// The device itself may already back another file: tests of other packages
					// attach loop devices too, and autoclear freed this one for them.
					if back, err := os.ReadFile("/sys/block/" + filepath.Base(b.Device) + "/loop/backing_file"); err == nil && strings.TrimSpace(string(back)) == img {
						devs = append(devs, b.Device)
					}
				}
				return devs
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(attached()) > 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if devs := attached(); len(devs) > 0 {
				t.Errorf("5 s after Unmount, loop devices still back %s: %v", img, devs)
			}
		})
	}
}

// TestOverlayStacking stacks two images under an overlay the way a sandbox does: the top image has
// a whiteout for a file of the bottom one and an opaque directory over one of its directories. The
// merged view must hide both, and the mount flags of the images (nosuid, nodev, noexec) must not
// reach through the overlay.
func TestOverlayStacking(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	mk := func(rel string) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write := func(p, body string, mode os.FileMode) {
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	// nobody must reach the setuid binary: open up the test's temp directories.
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a, b := mk("A"), mk("B")
	mk("A/etc")
	mk("A/opt/old")
	write(filepath.Join(a, "etc/gone"), "deleted by B", 0o644)
	write(filepath.Join(a, "etc/kept"), "from A", 0o644)
	write(filepath.Join(a, "opt/old/file"), "hidden by opaque", 0o644)
	write(filepath.Join(a, "opt/a-only"), "hidden by opaque", 0o644)
	mk("B/etc")
	mk("B/opt/new")
	if err := unix.Mknod(filepath.Join(b, "etc/gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(b, "opt"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(b, "opt/new/file"), "from B", 0o644)
	if err := unix.Mknod(filepath.Join(b, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	id, idErr := exec.LookPath("id")
	if idErr == nil {
		body, err := os.ReadFile(id)
		if err != nil {
			t.Fatal(err)
		}
		write(filepath.Join(b, "suid-id"), string(body), 0o755|os.ModeSetuid)
	}

	imgA := buildForTest(t, a, dir, "a.erofs")
	imgB := buildForTest(t, b, dir, "b.erofs")
	lowerA, _ := mountForTest(t, imgA, dir, MountOptions{})
	lowerB, _ := mountForTest(t, imgB, dir, MountOptions{ForceLoop: true}) // one of each backing
	merged, upper, work := mk("merged"), mk("upper"), mk("work")
	opts := "lowerdir=" + lowerB + ":" + lowerA + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(merged, 0) })

	ls := func(rel string) string {
		ents, err := os.ReadDir(filepath.Join(merged, rel))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return strings.Join(names, " ")
	}
	if got, want := ls("etc"), "kept"; got != want {
		t.Errorf("merged etc/ = %q; want %q (the whiteout must hide etc/gone)", got, want)
	}
	if _, err := os.Lstat(filepath.Join(merged, "etc/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lstat etc/gone: %v; want not exist", err)
	}
	if got, want := ls("opt"), "new"; got != want {
		t.Errorf("merged opt/ = %q; want %q (opaque opt/ must hide A's entries)", got, want)
	}
	if got, _ := os.ReadFile(filepath.Join(merged, "etc/kept")); string(got) != "from A" {
		t.Errorf("etc/kept = %q", got)
	}

	// The images' nodev does not reach through the overlay: the device node works.
	if err := os.WriteFile(filepath.Join(merged, "null"), []byte("x"), 0); err != nil {
		t.Errorf("write to a device node through the overlay: %v", err)
	}
	// Nor do nosuid and noexec: a setuid-root binary run by nobody through the overlay gets euid 0.
	if idErr != nil {
		t.Logf("skipping the setuid check: %v", idErr)
	} else {
		cmd := exec.Command(filepath.Join(merged, "suid-id"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "euid=0") {
			t.Errorf("setuid id through the overlay: %v: %s; want euid=0", err, out)
		}
	}

	// overlayfs keeps private clones of its layers' mounts, so unmounting an image that an overlay
	// uses succeeds; the filesystem, and a loop device behind it, live on until the overlay goes.
	for _, l := range []string{lowerA, lowerB} {
		if err := Unmount(l); err != nil {
			t.Errorf("Unmount of a lower layer in use: %v", err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(merged, "opt/new/file")); string(got) != "from B" {
		t.Errorf("after unmounting the layers, opt/new/file = %q; want %q", got, "from B")
	}
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
}

// TestUnmountBusy: a mount with a file open in it is busy; Unmount says so, naming the target,
// and leaves it mounted rather than detaching it lazily.
func TestUnmountBusy(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o755)
	plainTree(t, src, "x")
	mnt, _ := mountForTest(t, buildForTest(t, src, dir, "img.erofs"), dir, MountOptions{})
	f, err := os.Open(filepath.Join(mnt, "a/f"))
	if err != nil {
		t.Fatal(err)
	}
	old := unmountBusyGrace
	unmountBusyGrace = 20 * time.Millisecond
	defer func() { unmountBusyGrace = old }()
	err = Unmount(mnt)
	if !errorsIsAll(err, unix.EBUSY, errdefs.ErrConflict) || !strings.Contains(err.Error(), mnt) {
		t.Errorf("Unmount with an open file: %v; want EBUSY and ErrConflict naming the target", err)
	}
	if len(mountsAt(t, mnt)) != 1 {
		t.Errorf("the busy mount is gone")
	}
	f.Close()
	if err := Unmount(mnt); err != nil {
		t.Errorf("Unmount after closing the file: %v", err)
	}
}

// TestMountImageOnOverlay: an image on a stacked filesystem cannot back a file-backed mount
// (ENOTBLK); Mount must fall back to a loop device.
func TestMountImageOnOverlay(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o755)
	plainTree(t, src, "x")
	lower := filepath.Join(dir, "lower")
	os.Mkdir(lower, 0o755)
	buildForTest(t, src, lower, "img.erofs")
	merged := filepath.Join(dir, "merged")
	os.Mkdir(merged, 0o755)
	if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+lower+":"+src); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(merged, 0) })

	mnt, b := mountForTest(t, filepath.Join(merged, "img.erofs"), dir, MountOptions{})
	if b.Kind != BackingLoop {
		t.Errorf("Backing = %+v; want loop for an image on overlayfs", b)
	}
	if got, _ := os.ReadFile(filepath.Join(mnt, "a/f")); string(got) != "x" {
		t.Errorf("a/f = %q", got)
	}
	if err := Unmount(mnt); err != nil {
		t.Fatal(err)
	}
}

// TestMountErrors: the error names the image, the target and each attempt's cause.
func TestMountErrors(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	bad := filepath.Join(dir, "bad.erofs")
	if err := os.WriteFile(bad, make([]byte, 16<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "mnt")
	os.Mkdir(target, 0o755)

	_, err := Mount(bad, target, MountOptions{})
	t.Logf("Mount of a corrupt image: %v", err)
	if err == nil {
		t.Fatal("Mount of a corrupt image succeeded")
	}
	for _, want := range []string{bad, target, "loop"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := Mount(filepath.Join(dir, "missing.erofs"), target, MountOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Mount of a missing image: %v; want ErrNotFound", err)
	}
	if err := Unmount(target); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Unmount of a plain directory: %v; want ErrNotFound", err)
	}
	if len(mountsAt(t, target)) != 0 {
		t.Errorf("a failed Mount left a mount at %s", target)
	}
}
