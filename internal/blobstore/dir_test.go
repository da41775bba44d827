//go:build linux

package blobstore

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// openTestDir opens a directory store on a root that Open has to create.
func openTestDir(t *testing.T) (Store, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "store")
	s, err := Open(t.Context(), "dir:"+root)
	if err != nil {
		t.Fatal(err)
	}
	return s, root
}

func dirBackend() backend {
	return backend{
		open: func(t *testing.T) Store {
			s, _ := openTestDir(t)
			return s
		},
		leftovers: func(t *testing.T, s Store) []string {
			entries, err := os.ReadDir(filepath.Join(s.(*dirStore).root, tmpDir))
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			return names
		},
	}
}

func TestDirConformance(t *testing.T) {
	testConformance(t, dirBackend())
}

func TestDirLayout(t *testing.T) {
	// A umask that would keep other corral processes on a shared mount out.
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	s, root := openTestDir(t)
	if got := s.String(); got != "dir:"+root {
		t.Errorf("String() = %q, want %q", got, "dir:"+root)
	}
	mustPut(t, s, "a/b/c", []byte("x"), true)
	for _, tc := range []struct {
		path string
		want fs.FileMode
	}{
		{"", fs.ModeDir | 0o700},
		{tmpDir, fs.ModeDir | 0o755},
		{"a", fs.ModeDir | 0o755},
		{"a/b", fs.ModeDir | 0o755},
		{"a/b/c", 0o644},
	} {
		fi, err := os.Lstat(filepath.Join(root, tc.path))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode(); got != tc.want {
			t.Errorf("mode of %q = %v, want %v", tc.path, got, tc.want)
		}
	}
}

func TestDirStaleTempFiles(t *testing.T) {
	s, root := openTestDir(t)
	tmp := filepath.Join(root, tmpDir)
	for _, name := range []string{"put-stale", "put-fresh"} {
		if err := os.WriteFile(filepath.Join(tmp, name), []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-staleTemp - time.Minute)
	if err := os.Chtimes(filepath.Join(tmp, "put-stale"), old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(t.Context(), s.String()); err != nil {
		t.Fatal(err)
	}
	if got := dirBackend().leftovers(t, s); !slices.Equal(got, []string{"put-fresh"}) {
		t.Errorf("after Open, .tmp holds %q; want only the fresh put-fresh", got)
	}
}

// TestDirSymlinks checks that no operation follows a symlink planted under the root, in the
// middle of a path or at its end.
func TestDirSymlinks(t *testing.T) {
	s, root := openTestDir(t)
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, "real/x", []byte("x"), true)
	for name, target := range map[string]string{"dirlink": outside, "filelink": secret, "real/inner": "../filelink"} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := t.Context()
	for _, key := range []string{"dirlink/secret", "filelink", "real/inner"} {
		_, getErr := s.Get(ctx, key)
		_, statErr := s.Stat(ctx, key)
		_, rangeErr := s.GetRange(ctx, key, 0, 3)
		for op, err := range map[string]error{"Get": getErr, "Stat": statErr, "GetRange": rangeErr} {
			if !errors.Is(err, errdefs.ErrDenied) || !strings.Contains(err.Error(), "symlink") {
				t.Errorf("%s(%s) error = %v, want ErrDenied naming the symlink", op, key, err)
			}
		}
	}
	for _, key := range []string{"dirlink/secret", "dirlink/new/x"} {
		if err := s.Put(ctx, key, strings.NewReader("evil"), 4); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("Put(%s) error = %v, want ErrDenied", key, err)
		}
	}
	if err := s.Delete(ctx, "dirlink/secret"); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("Delete(dirlink/secret) error = %v, want ErrDenied", err)
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "secret" {
		t.Errorf("the file outside the root now reads %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Put created a directory outside the root: %v", err)
	}
	infos, err := s.List(ctx, "")
	if err != nil || len(infos) != 1 || infos[0].Key != "real/x" {
		t.Errorf("List = %+v, %v; want only real/x, no symlinks", infos, err)
	}
}

func TestDirKeyAndPrefixConflict(t *testing.T) {
	s, _ := openTestDir(t)
	mustPut(t, s, "a", []byte("a"), true)
	mustPut(t, s, "c/d", []byte("d"), true)
	for _, key := range []string{"a/b", "a/b/c", "c"} {
		if err := s.Put(t.Context(), key, strings.NewReader("x"), 1); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("Put(%s) error = %v, want ErrConflict", key, err)
		}
	}
	checkContent(t, s, "a", []byte("a"))
	checkContent(t, s, "c/d", []byte("d"))
}

func TestDirSpecialFiles(t *testing.T) {
	s, root := openTestDir(t)
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Opening a FIFO for reading would block until a writer came; the store refuses it instead.
	if _, err := s.Get(t.Context(), "fifo"); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("Get(fifo) error = %v, want ErrInvalid saying it is not a regular file", err)
	}
	if infos, err := s.List(t.Context(), ""); err != nil || len(infos) != 0 {
		t.Errorf("List = %+v, %v; want nothing", infos, err)
	}
}

// TestDirLocalFiles: PutFile moves a finished file into place (no copy on the same filesystem)
// and LocalPath names the file that holds a key, refusing missing keys like Get.
func TestDirLocalFiles(t *testing.T) {
	s, root := openTestDir(t)
	ds := s.(*dirStore)
	src := filepath.Join(root, "..", "image")
	if err := os.WriteFile(src, []byte("erofs"), 0o600); err != nil {
		t.Fatal(err)
	}
	var before syscall.Stat_t
	syscall.Stat(src, &before)
	if err := ds.PutFile(t.Context(), "images/a.erofs", src); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(src); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("PutFile left the source file: %v", err)
	}
	p, err := ds.LocalPath("images/a.erofs")
	if err != nil || p != filepath.Join(root, "images/a.erofs") {
		t.Fatalf("LocalPath = %q, %v", p, err)
	}
	var after syscall.Stat_t
	if err := syscall.Stat(p, &after); err != nil || after.Ino != before.Ino {
		t.Errorf("the stored file is inode %d, the source was %d: PutFile copied instead of moving", after.Ino, before.Ino)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Errorf("stored file mode %v, want 0644", fi.Mode().Perm())
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "erofs" {
		t.Errorf("stored content %q, %v", b, err)
	}
	if _, err := ds.LocalPath("images/missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("LocalPath of a missing key = %v; want ErrNotFound", err)
	}
	if err := ds.PutFile(t.Context(), "../x", p); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("PutFile with a bad key = %v; want ErrInvalid", err)
	}
}
