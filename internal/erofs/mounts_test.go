//go:build linux

package erofs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

const (
	nameA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	nameB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// twoImages builds two small images under dir.
func twoImages(t *testing.T, dir string) (string, string) {
	t.Helper()
	var imgs []string
	for _, n := range []string{"a", "b"} {
		src := filepath.Join(dir, "src-"+n)
		if err := os.Mkdir(src, 0o755); err != nil {
			t.Fatal(err)
		}
		plainTree(t, src, n)
		imgs = append(imgs, buildForTest(t, src, dir, n+".erofs"))
	}
	return imgs[0], imgs[1]
}

// openMounts opens a Mounts over dir whose leftovers are swept when the test ends.
func openMounts(t *testing.T, dir string) *Mounts {
	t.Helper()
	m, err := OpenMounts(dir, nil)
	if err != nil {
		t.Fatalf("OpenMounts: %v", err)
	}
	return m
}

// sweepAll unmounts everything m holds, references or not.
func sweepAll(t *testing.T, m *Mounts) {
	t.Helper()
	for _, name := range []string{nameA, nameB} {
		for m.Refs(name) > 0 {
			if err := m.Release(name); err != nil {
				t.Errorf("Release(%s): %v", name[:8], err)
				break
			}
		}
	}
	if _, err := m.Sweep(); err != nil {
		t.Errorf("Sweep: %v", err)
	}
}

func TestMountsRefcount(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	imgA, _ := twoImages(t, dir)
	mdir := filepath.Join(dir, "mounts")
	m := openMounts(t, mdir)
	t.Cleanup(func() { sweepAll(t, m) })

	if fi, err := os.Stat(mdir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("mounts dir: %v, %v; want mode 0700", fi.Mode(), err)
	}
	p1, err := m.Acquire(nameA, imgA)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	p2, err := m.Acquire(nameA, imgA)
	if err != nil {
		t.Fatalf("second Acquire: %v", err)
	}
	if p1 != p2 || p1 != filepath.Join(mdir, nameA) {
		t.Errorf("Acquire paths %q, %q; want both %q", p1, p2, filepath.Join(mdir, nameA))
	}
	if n := len(mountsAt(t, p1)); n != 1 {
		t.Errorf("%d mounts at %s; want 1", n, p1)
	}
	if got, _ := os.ReadFile(filepath.Join(p1, "a/f")); string(got) != "a" {
		t.Errorf("a/f = %q", got)
	}
	if r := m.Refs(nameA); r != 2 {
		t.Errorf("Refs = %d; want 2", r)
	}
	if err := m.Release(nameA); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if r, n := m.Refs(nameA), len(mountsAt(t, p1)); r != 1 || n != 1 {
		t.Errorf("after one Release: refs %d, mounts %d; want 1, 1", r, n)
	}
	if err := m.Release(nameA); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if r, n := m.Refs(nameA), len(mountsAt(t, p1)); r != 0 || n != 0 {
		t.Errorf("after the last Release: refs %d, mounts %d; want 0, 0", r, n)
	}
	if _, err := os.Lstat(p1); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount point still there after the last Release: %v", err)
	}
	if err := m.Release(nameA); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Release without a reference: %v; want ErrNotFound", err)
	}
	if m.Hold(nameA) {
		t.Errorf("Hold of an unmounted name succeeded")
	}
}

func TestMountsConcurrentAcquire(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	imgA, _ := twoImages(t, dir)
	m := openMounts(t, filepath.Join(dir, "mounts"))
	t.Cleanup(func() { sweepAll(t, m) })

	const n = 8
	var wg sync.WaitGroup
	paths := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { paths[i], errs[i] = m.Acquire(nameA, imgA) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Errorf("Acquire %d: %q, %v", i, paths[i], errs[i])
		}
	}
	if got := len(mountsAt(t, paths[0])); got != 1 {
		t.Errorf("%d mounts at %s; want 1", got, paths[0])
	}
	if r := m.Refs(nameA); r != n {
		t.Errorf("Refs = %d; want %d", r, n)
	}
	for range n {
		wg.Go(func() {
			if err := m.Release(nameA); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
	}
	wg.Wait()
	if got := len(mountsAt(t, paths[0])); got != 0 {
		t.Errorf("%d mounts at %s after every Release; want 0", got, paths[0])
	}
}

// TestMountsAdoption simulates a restart: a second Mounts over the same directory adopts the
// mounts of the first (which is abandoned, as by a crash) without remounting them.
func TestMountsAdoption(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	imgA, imgB := twoImages(t, dir)
	mdir := filepath.Join(dir, "mounts")
	old := openMounts(t, mdir)
	pa, err := old.Acquire(nameA, imgA)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := old.Acquire(nameB, imgB)
	if err != nil {
		t.Fatal(err)
	}
	before := mountsAt(t, pa)
	// Leftovers of a crash: an empty mount point, and directories Mounts does not own.
	stale := filepath.Join(mdir, strings.Repeat("c", 64))
	foreign := filepath.Join(mdir, "not-a-digest")
	for _, d := range []string{stale, foreign, filepath.Join(foreign, "child")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	m := openMounts(t, mdir)
	t.Cleanup(func() { sweepAll(t, m) })
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale empty mount point not removed: %v", err)
	}
	if _, err := os.Lstat(foreign); err != nil {
		t.Errorf("a non-empty directory was removed: %v", err)
	}
	after := mountsAt(t, pa)
	if len(after) != 1 || len(before) != 1 || after[0] != before[0] {
		t.Errorf("mounts at %s before %+v, after %+v: want the same single mount", pa, before, after)
	}
	if r := m.Refs(nameA); r != 0 {
		t.Errorf("adopted Refs = %d; want 0", r)
	}
	if !m.Hold(nameA) {
		t.Fatalf("Hold of an adopted mount failed")
	}
	if m.Hold(strings.Repeat("d", 64)) {
		t.Errorf("Hold of an unknown name succeeded")
	}
	if p, err := m.Acquire(nameA, imgA); err != nil || p != pa {
		t.Errorf("Acquire of an adopted name: %q, %v", p, err)
	}
	if n := len(mountsAt(t, pa)); n != 1 {
		t.Errorf("%d mounts at %s after Acquire of an adopted name; want 1", n, pa)
	}

	n, err := m.Sweep()
	if n != 1 || err != nil {
		t.Errorf("Sweep = %d, %v; want 1 (b, unheld), nil", n, err)
	}
	if len(mountsAt(t, pb)) != 0 {
		t.Errorf("Sweep left %s mounted", pb)
	}
	if _, err := os.Lstat(pb); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Sweep left the mount point %s: %v", pb, err)
	}
	if len(mountsAt(t, pa)) != 1 || m.Refs(nameA) != 2 {
		t.Errorf("Sweep touched the held mount: refs %d", m.Refs(nameA))
	}
	for range 2 {
		if err := m.Release(nameA); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	if len(mountsAt(t, pa)) != 0 {
		t.Errorf("%s still mounted after its last Release", pa)
	}
	os.RemoveAll(foreign)
}

func TestMountsInvalid(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	m := openMounts(t, filepath.Join(dir, "mounts"))
	for _, name := range []string{"", "..", "../" + nameA[3:], strings.ToUpper(nameA), nameA[1:], nameA + "a", "g" + nameA[1:]} {
		if _, err := m.Acquire(name, "/nonexistent"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Acquire(%q): %v; want ErrInvalid", name, err)
		}
	}
	// A failed mount takes no reference and leaves no mount point.
	_, err := m.Acquire(nameA, filepath.Join(dir, "missing.erofs"))
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "missing.erofs") {
		t.Errorf("Acquire of a missing image: %v; want ErrNotFound naming it", err)
	}
	if m.Refs(nameA) != 0 {
		t.Errorf("failed Acquire left a reference")
	}
	if _, err := os.Lstat(filepath.Join(m.Dir(), nameA)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed Acquire left the mount point: %v", err)
	}
}

// TestMountsLinger: with SetLinger the last Release leaves the image mounted; an Acquire in the
// window takes it as it is (no second mount), the timer unmounts it once unused for that long,
// and Drop and Sweep unmount a lingering name at once.
func TestMountsLinger(t *testing.T) {
	requireAll(t)
	dir := testDir(t)
	imgA, imgB := twoImages(t, dir)
	m := openMounts(t, filepath.Join(dir, "mounts"))
	t.Cleanup(func() { sweepAll(t, m) })
	const linger = 300 * time.Millisecond
	m.SetLinger(linger)

	p, err := m.Acquire(nameA, imgA)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Release(nameA); err != nil {
		t.Fatal(err)
	}
	first := mountsAt(t, p)
	if r, n := m.Refs(nameA), len(first); r != 0 || n != 1 {
		t.Fatalf("after the last Release: refs %d, mounts %d; want 0, 1 (lingering)", r, n)
	}
	// Taken again within the window: the same mount (its mount ID), and the timer no longer
	// applies.
	if _, err := m.Acquire(nameA, imgA); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * linger)
	now := mountsAt(t, p)
	if r, n := m.Refs(nameA), len(now); r != 1 || n != 1 {
		t.Fatalf("held across the linger: refs %d, mounts %d; want 1, 1", r, n)
	}
	if now[0].id != first[0].id {
		t.Errorf("mount ID %s after the Acquire, %s before: mounted again instead of reused", now[0].id, first[0].id)
	}
	if err := m.Release(nameA); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(mountsAt(t, p)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still mounted %v after its last Release with a linger of %v", 10*time.Second, linger)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount point left after the linger: %v", err)
	}
	if err := m.Release(nameA); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Release after the linger: %v; want ErrNotFound", err)
	}

	// Drop: refused while referenced, at once when lingering; Sweep likewise.
	m.SetLinger(time.Hour)
	pb, err := m.Acquire(nameB, imgB)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Drop(nameB); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Drop of a referenced name: %v; want conflict", err)
	}
	m.Release(nameB)
	if err := m.Drop(nameB); err != nil || len(mountsAt(t, pb)) != 0 {
		t.Errorf("Drop of a lingering name: %v, %d mounts left", err, len(mountsAt(t, pb)))
	}
	if _, err := m.Acquire(nameA, imgA); err != nil {
		t.Fatal(err)
	}
	m.Release(nameA)
	if n, err := m.Sweep(); n != 1 || err != nil || len(mountsAt(t, p)) != 0 {
		t.Errorf("Sweep of a lingering name: %d, %v", n, err)
	}
}
