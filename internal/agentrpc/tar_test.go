package agentrpc

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// entry describes one archive entry for building test archives.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func makeTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, ModTime: time.Unix(1700000000, 0)}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	tw.Close()
	return buf.Bytes()
}

// tree lists a directory as "path type [content|target]" lines.
func tree(t testing.TB, dir string) string {
	var lines []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			lines = append(lines, rel+" -> "+target)
		case fi.IsDir():
			lines = append(lines, rel+"/ "+fi.Mode().Perm().String())
		default:
			b, _ := os.ReadFile(p)
			lines = append(lines, rel+" "+fi.Mode().Perm().String()+" "+string(b))
		}
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func TestTarRoundTrip(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "d", "e"), 0o750)
	os.WriteFile(filepath.Join(src, "top.txt"), []byte("top"), 0o600)
	os.WriteFile(filepath.Join(src, "d", "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(src, "d", "e", "deep"), bytes.Repeat([]byte("z"), 100000), 0o644)
	os.Symlink("../top.txt", filepath.Join(src, "d", "link"))
	os.Symlink("/etc/passwd", filepath.Join(src, "abs-link"))

	rc, err := c.TarOut(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	archive, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Names are relative to the archived directory.
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(h.Name, "/") || strings.Contains(h.Name, src) {
			t.Errorf("entry name %q is not relative", h.Name)
		}
	}
	dst := filepath.Join(t.TempDir(), "new", "dst")
	if err := c.TarIn(ctx, dst, bytes.NewReader(archive), WriteOptions{Parents: true}); err != nil {
		t.Fatal(err)
	}
	if got, want := tree(t, dst), tree(t, src); got != want {
		t.Errorf("extracted tree differs:\n%s\nwant:\n%s", got, want)
	}

	// A single file is archived under its base name.
	rc, err = c.TarOut(ctx, filepath.Join(src, "top.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tr = tar.NewReader(rc)
	h, err := tr.Next()
	if err != nil || h.Name != "top.txt" || h.Size != 3 {
		t.Errorf("file archive: %+v, %v", h, err)
	}
	rc.Close()

	if _, err := c.TarOut(ctx, filepath.Join(src, "missing")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("TarOut(missing) = %v, want ErrNotFound", err)
	}
	if _, err := c.TarOut(ctx, "/proc/self"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("TarOut(/proc/self) = %v, want ErrInvalid", err)
	}
}

func TestTarInRejectsEscapes(t *testing.T) {
	c, _ := startServer(t, func(cfg *Config) { cfg.TarInLimit, cfg.TarInEntries = 1000, 3 })
	ctx := testCtx(t)
	tests := []struct {
		name    string
		entries []entry
		kind    error
		msg     string
	}{
		{"dotdot", []entry{{name: "../x", typ: tar.TypeReg, body: "x"}}, errdefs.ErrInvalid, `"../x": path with ".." escapes`},
		{"dotdot inside", []entry{{name: "a/../../x", typ: tar.TypeReg}}, errdefs.ErrInvalid, "escapes"},
		{"absolute", []entry{{name: "/abs", typ: tar.TypeReg, body: "x"}}, errdefs.ErrInvalid, `"/abs": absolute path`},
		{"symlink then write through", []entry{
			{name: "link", typ: tar.TypeSymlink, link: "OUTSIDE"},
			{name: "link/file", typ: tar.TypeReg, body: "x"},
		}, errdefs.ErrInvalid, "goes through the symbolic link link: rejected"},
		{"relative symlink out then write through", []entry{
			{name: "up", typ: tar.TypeSymlink, link: "../.."},
			{name: "up/escaped", typ: tar.TypeReg, body: "x"},
		}, errdefs.ErrInvalid, "symbolic link"},
		{"symlink then mkdir through", []entry{
			{name: "l2", typ: tar.TypeSymlink, link: "OUTSIDE"},
			{name: "l2/sub/", typ: tar.TypeDir},
		}, errdefs.ErrInvalid, "symbolic link"},
		{"hard link out", []entry{{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}}, errdefs.ErrInvalid, "hard link target"},
		{"hard link through symlink", []entry{
			{name: "l3", typ: tar.TypeSymlink, link: "OUTSIDE"},
			{name: "h", typ: tar.TypeLink, link: "l3/secret"},
		}, errdefs.ErrInvalid, "symbolic link"},
		{"char device", []entry{{name: "null", typ: tar.TypeChar}}, errdefs.ErrInvalid, "device node"},
		{"block device", []entry{{name: "sda", typ: tar.TypeBlock}}, errdefs.ErrInvalid, "device node"},
		{"too large", []entry{{name: "big", typ: tar.TypeReg, body: strings.Repeat("b", 1001)}}, errdefs.ErrTooLarge, "limit of 1000 bytes"},
		{"too many entries", []entry{{name: "a", typ: tar.TypeReg}, {name: "b", typ: tar.TypeReg}, {name: "c", typ: tar.TypeReg}, {name: "d", typ: tar.TypeReg}},
			errdefs.ErrTooLarge, "more than 3 entries"},
		{"not a tar", nil, errdefs.ErrInvalid, "read tar"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "OUTSIDE")
			os.Mkdir(outside, 0o755)
			os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
			dst := filepath.Join(base, "dst")
			os.Mkdir(dst, 0o755)
			// Symlink targets in the archive are relative to the link: make OUTSIDE resolve.
			for i := range tt.entries {
				if tt.entries[i].link == "OUTSIDE" {
					tt.entries[i].link = outside
				}
			}
			archive := []byte("this is not a tar archive, just some text that is long enough to fill a header block......................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................")
			if tt.entries != nil {
				archive = makeTar(t, tt.entries...)
			}
			err := c.TarIn(ctx, dst, bytes.NewReader(archive), WriteOptions{})
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("got %v, want %v containing %q", err, tt.kind, tt.msg)
			}
			if got := tree(t, outside); got != "secret -rw------- s" {
				t.Errorf("outside directory changed:\n%s", got)
			}
			if _, err := os.Stat(filepath.Join(base, "escaped")); err == nil {
				t.Errorf("a file escaped to %s", base)
			}
		})
	}
}

func TestTarInPreexistingSymlinks(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	os.Mkdir(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "f"), []byte("orig"), 0o644)
	dst := filepath.Join(base, "dst")
	os.Mkdir(dst, 0o755)
	// A link already in the target directory is not written through either...
	os.Symlink(outside, filepath.Join(dst, "dirlink"))
	err := c.TarIn(ctx, dst, bytes.NewReader(makeTar(t, entry{name: "dirlink/f", typ: tar.TypeReg, body: "evil"})), WriteOptions{})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("write through an existing dir link: %v, want ErrInvalid", err)
	}
	// ...and a link at a file's name is replaced, not followed.
	os.Symlink(filepath.Join(outside, "f"), filepath.Join(dst, "filelink"))
	if err := c.TarIn(ctx, dst, bytes.NewReader(makeTar(t, entry{name: "filelink", typ: tar.TypeReg, body: "new"})), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "f")); string(b) != "orig" {
		t.Errorf("outside file overwritten: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "filelink")); string(b) != "new" {
		t.Errorf("filelink content %q", b)
	}
	// Entries with setuid lose it; missing parents are created.
	if err := c.TarIn(ctx, dst, bytes.NewReader(makeTar(t, entry{name: "p/q/suid", typ: tar.TypeReg, mode: 0o4755, body: "x"})), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "p", "q", "suid")); err != nil || fi.Mode()&os.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("suid entry: %v, %v", fi.Mode(), err)
	}
	if err := c.TarIn(ctx, filepath.Join(base, "missing"), bytes.NewReader(makeTar(t)), WriteOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing target without parents: %v, want ErrNotFound", err)
	}
}

// TestTarInWithoutOpenat2 runs the component walk used on kernels without openat2.
func TestTarInWithoutOpenat2(t *testing.T) {
	base := t.TempDir()
	dst := filepath.Join(base, "dst")
	os.MkdirAll(filepath.Join(dst, "real"), 0o755)
	os.Symlink(base, filepath.Join(dst, "link"))
	root, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	x := &extractor{root: int(root.Fd()), dir: dst, cached: -1}
	if fd, err := x.walk("e", "real/new/deeper", true); err != nil {
		t.Errorf("walk with create: %v", err)
	} else {
		syscall.Close(fd)
	}
	if _, err := x.walk("e", "link/x", true); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("walk through a link: %v, want ErrInvalid", err)
	}
	if _, err := os.Stat(filepath.Join(base, "x")); err == nil {
		t.Error("walk created a directory through the link")
	}
}

// FuzzEntryName checks that no accepted archive name can leave the target directory.
func FuzzEntryName(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "/abs", "a/../../b", "./a", "a//b/", ".", "..", "a/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		clean, err := entryName(name)
		if err != nil {
			return
		}
		if strings.HasPrefix(clean, "/") || clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains(clean, "/../") || strings.HasSuffix(clean, "/..") {
			t.Fatalf("%q accepted as %q", name, clean)
		}
		if clean != "" && filepath.Join("/root-dir", clean) != "/root-dir/"+clean {
			t.Fatalf("%q accepted as %q, which is not clean", name, clean)
		}
	})
}
