package agentrpc

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestWriteAndReadFileStreamed(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "big.bin")
	data := make([]byte, 5<<20+123)
	rand.Read(data)
	fi, err := c.WriteFile(ctx, p, bytes.NewReader(data), WriteOptions{Mode: 0o640})
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != int64(len(data)) || fi.Mode.Perm() != 0o640 || fi.Name != "big.bin" || fi.Path != p {
		t.Errorf("WriteFile = %+v", fi)
	}
	rc, fi2, err := c.ReadFile(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) || fi2.Size != int64(len(data)) {
		t.Errorf("ReadFile: %d bytes (want %d), %v", len(got), len(data), err)
	}
	// No temporary file is left behind.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory has %d entries after write", len(ents))
	}
}

func TestWriteFileReplacesAtomically(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("old"), 0o600)
	// A reader that fails midway leaves the old content and no temporary file.
	_, err := c.WriteFile(ctx, p, io.MultiReader(strings.NewReader("partial"), iotest.ErrReader(errors.New("boom"))), WriteOptions{})
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("failing reader: %v", err)
	}
	waitFor(t, "the agent to discard the temporary file", 2*time.Second, func() bool {
		ents, _ := os.ReadDir(dir)
		return len(ents) == 1
	})
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("content after failed write %q", b)
	}
	// A symbolic link at the path is replaced, not written through.
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("target"), 0o644)
	link := filepath.Join(dir, "link")
	os.Symlink(target, link)
	if _, err := c.WriteFile(ctx, link, strings.NewReader("new"), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "target" {
		t.Errorf("write went through the link: target now %q", b)
	}
	if fi, _ := os.Lstat(link); !fi.Mode().IsRegular() {
		t.Errorf("link not replaced: %v", fi.Mode())
	}
}

func TestWriteFileOptions(t *testing.T) {
	c, _ := startServer(t, func(cfg *Config) { cfg.EtcDir = writeEtc(t, testPasswd, testGroup) })
	ctx := testCtx(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "a", "b", "c.txt")
	if _, err := c.WriteFile(ctx, p, strings.NewReader("x"), WriteOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing parent: %v, want ErrNotFound", err)
	}
	fi, err := c.WriteFile(ctx, p, strings.NewReader("one\n"), WriteOptions{Parents: true})
	if err != nil || fi.Mode.Perm() != 0o644 {
		t.Fatalf("with parents: %+v, %v", fi, err)
	}
	fi, err = c.WriteFile(ctx, p, strings.NewReader("two\n"), WriteOptions{Append: true})
	if err != nil || fi.Size != 8 {
		t.Errorf("append: %+v, %v", fi, err)
	}
	if b, _ := os.ReadFile(p); string(b) != "one\ntwo\n" {
		t.Errorf("content %q", b)
	}
	if _, err := c.WriteFile(ctx, dir, strings.NewReader("x"), WriteOptions{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("write over a directory: %v, want ErrConflict", err)
	}
	if _, err := c.WriteFile(ctx, "relative/path", strings.NewReader("x"), WriteOptions{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("relative path: %v, want ErrInvalid", err)
	}
	if _, err := c.WriteFile(ctx, p, strings.NewReader("x"), WriteOptions{User: "mallory"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unknown user: %v, want ErrInvalid", err)
	}
	if os.Geteuid() == 0 {
		fi, err := c.WriteFile(ctx, filepath.Join(dir, "owned"), strings.NewReader("x"), WriteOptions{User: "alice", Mode: 0o600})
		if err != nil || fi.UID != 1000 || fi.GID != 1000 || fi.Mode.Perm() != 0o600 {
			t.Errorf("owned by alice: %+v, %v", fi, err)
		}
	}
}

func TestReadFileErrors(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	dir := t.TempDir()
	if _, _, err := c.ReadFile(ctx, filepath.Join(dir, "missing")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing: %v, want ErrNotFound", err)
	}
	if _, _, err := c.ReadFile(ctx, dir); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("directory: %v, want ErrInvalid", err)
	}
	fifo := filepath.Join(dir, "fifo")
	syscall.Mkfifo(fifo, 0o644)
	if _, _, err := c.ReadFile(ctx, fifo); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("fifo: %v, want ErrInvalid (and no hang)", err)
	}
}

func TestStatListMkdirRemove(t *testing.T) {
	c, _ := startServer(t, nil)
	ctx := testCtx(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "b.txt"), []byte("bb"), 0o644)
	os.Symlink("b.txt", filepath.Join(dir, "a-link"))

	fi, err := c.Stat(ctx, filepath.Join(dir, "a-link"))
	if err != nil || fi.Link != "b.txt" || fi.Mode&fs.ModeSymlink == 0 {
		t.Errorf("Stat(link) = %+v, %v", fi, err)
	}
	if _, err := c.Stat(ctx, filepath.Join(dir, "missing")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat(missing) = %v, want ErrNotFound", err)
	}

	d, err := c.Mkdir(ctx, filepath.Join(dir, "sub"), WriteOptions{Mode: 0o700})
	if err != nil || !d.IsDir || d.Mode.Perm() != 0o700 {
		t.Errorf("Mkdir = %+v, %v", d, err)
	}
	if _, err := c.Mkdir(ctx, filepath.Join(dir, "sub"), WriteOptions{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Mkdir existing: %v, want ErrConflict", err)
	}
	if _, err := c.Mkdir(ctx, filepath.Join(dir, "b.txt"), WriteOptions{Parents: true}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Mkdir -p over a file: %v, want ErrConflict", err)
	}
	if _, err := c.Mkdir(ctx, filepath.Join(dir, "sub"), WriteOptions{Parents: true}); err != nil {
		t.Errorf("Mkdir -p existing: %v", err)
	}
	if _, err := c.Mkdir(ctx, filepath.Join(dir, "x", "y"), WriteOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Mkdir without parent: %v, want ErrNotFound", err)
	}
	if d, err := c.Mkdir(ctx, filepath.Join(dir, "x", "y", "z"), WriteOptions{Parents: true}); err != nil || !d.IsDir {
		t.Errorf("Mkdir -p: %+v, %v", d, err)
	}

	list, err := c.List(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range list {
		names = append(names, f.Name)
	}
	if strings.Join(names, " ") != "a-link b.txt sub x" {
		t.Errorf("List = %v", names)
	}
	if _, err := c.List(ctx, filepath.Join(dir, "b.txt")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("List(file) = %v, want ErrInvalid", err)
	}
	// Many entries span several reply frames.
	many := filepath.Join(dir, "many")
	os.Mkdir(many, 0o755)
	for i := 0; i < 3*listBatch+7; i++ {
		os.WriteFile(filepath.Join(many, strings.Repeat("f", 1+i%50)+string(rune('a'+i%26))+strconv.Itoa(i)), nil, 0o644)
	}
	if list, err := c.List(ctx, many); err != nil || len(list) != 3*listBatch+7 {
		t.Errorf("List(many) = %d entries, %v", len(list), err)
	}

	if err := c.Remove(ctx, filepath.Join(dir, "x"), false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Remove non-empty: %v, want ErrConflict", err)
	}
	if err := c.Remove(ctx, filepath.Join(dir, "x"), true); err != nil {
		t.Errorf("Remove recursive: %v", err)
	}
	if err := c.Remove(ctx, filepath.Join(dir, "a-link"), false); err != nil {
		t.Errorf("Remove link: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b.txt")); err != nil {
		t.Errorf("removing the link removed its target: %v", err)
	}
	if err := c.Remove(ctx, filepath.Join(dir, "x"), false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Remove missing: %v, want ErrNotFound", err)
	}
	if err := c.Remove(ctx, "/", true); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Remove /: %v, want ErrInvalid", err)
	}
}
