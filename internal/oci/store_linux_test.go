//go:build linux

package oci

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/erofs"
	"github.com/corral-dev/corral/internal/layers"
)

// importTar imports what write writes into s, through a pipe as the daemon will.
func importTar(t *testing.T, s *layers.Store, write func(io.Writer) error) layers.Blob {
	t.Helper()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(write(pw)) }()
	blob, err := s.ImportTar(context.Background(), pr)
	pr.Close()
	if err != nil {
		t.Fatalf("ImportTar: %v", err)
	}
	return blob
}

// listTree describes every entry below root: type, mode, owner, and content or link target.
func listTree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %v %d:%d", rel, fi.Mode(), st.Uid, st.Gid)
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += " " + string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += " -> " + target
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestImportedGroupsStackToFlatten imports the test image into the layer store flattened and
// in several groupings, stacks each grouping with overlayfs as a sandbox would, and checks that
// every stack shows the same tree as the flattened layer.
func TestImportedGroupsStackToFlatten(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the layer store sets ownership, whiteout devices and trusted.* xattrs")
	}
	if _, err := erofs.Version(); err != nil {
		t.Skipf("the layer store needs mkfs.erofs: %v", err)
	}
	blobs, err := blobstore.Open(context.Background(), "dir:"+filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := layers.Open(layers.Config{Dir: filepath.Join(t.TempDir(), "layers"), Blobs: blobs}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	host := newRegistry(t, nil)
	ref := host + "/corral/base:v1"
	push(t, ref, imageOf(t, baseLayers(t)...), nil)
	base, err := Open(context.Background(), Source{Image: ref}, fast())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("base", func(t *testing.T) {
		want := stackGroupings(t, s, base)
		if !slices.Contains(want, "data/b -rw-r--r-- 0:0 A") || slices.ContainsFunc(want, func(l string) bool { return strings.HasPrefix(l, "opq/old") }) {
			t.Errorf("flattened tree is wrong:\n%s", strings.Join(want, "\n"))
		}
	})
	t.Run("group", func(t *testing.T) { stackGroupings(t, s, memReader(groupLayers(t)...)) })
}

// stackGroupings checks r's groupings against its flattened tree, which it returns.
// mountLayer mounts a stored layer until the test ends.
func mountLayer(t *testing.T, s *layers.Store, digest string) string {
	t.Helper()
	p, err := s.Acquire(context.Background(), digest)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Release(digest) })
	return p
}

func stackGroupings(t *testing.T, s *layers.Store, r *Reader) []string {
	ctx := context.Background()
	flat := importTar(t, s, func(w io.Writer) error { return r.Flatten(ctx, w) })
	flatDir := mountLayer(t, s, flat.Digest)
	want := listTree(t, flatDir)

	for _, grouping := range [][][]int{{{0}, {1}, {2}}, {{0}, {1, 2}}, {{0, 1}, {2}}, {{0, 1, 2}}} {
		t.Run(fmt.Sprint(grouping), func(t *testing.T) {
			var dirs []string
			for _, g := range grouping {
				b := importTar(t, s, func(w io.Writer) error { return r.WriteGroup(ctx, g, w) })
				dirs = append(dirs, mountLayer(t, s, b.Digest))
			}
			if len(dirs) == 1 {
				if dirs[0] != flatDir {
					t.Errorf("one group of all layers is not the flattened layer")
				}
				return
			}
			slices.Reverse(dirs) // overlayfs lists the top layer first
			mnt := t.TempDir()
			if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(dirs, ":")); err != nil {
				if err == unix.ENODEV {
					t.Skip("overlayfs is not available")
				}
				t.Fatalf("mount overlay: %v", err)
			}
			defer unix.Unmount(mnt, unix.MNT_DETACH)
			diffTree(t, listTree(t, mnt), want)
		})
	}
	return want
}
