package cli

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestContextTar checks the build context the CLI uploads: .dockerignore applied (a "!" pattern
// re-includes below an excluded directory), links kept as links, owners dropped.
func TestContextTar(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		".dockerignore": "*.key\nbuild\n!build/keep.txt\n", "a.txt": "a", "s.key": "secret",
		"build/x.o": "obj", "build/keep.txt": "keep", "src/main.go": "package main",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := contextTar(dir, &buf); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" {
			t.Errorf("%s: owner %d:%d %q kept", h.Name, h.Uid, h.Gid, h.Uname)
		}
		if h.Name == "link" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/passwd") {
			t.Errorf("link: type %c -> %q, want the link itself", h.Typeflag, h.Linkname)
		}
		got = append(got, h.Name)
	}
	slices.Sort(got)
	want := []string{".dockerignore", "a.txt", "build/keep.txt", "link", "src/", "src/main.go"}
	if !slices.Equal(got, want) {
		t.Errorf("context = %q\nwant %q", got, want)
	}
}

// TestDefaultDockerfile: a build without --file reads the context's Dockerfile, or this
// directory's without a context.
func TestDefaultDockerfile(t *testing.T) {
	if got := defaultDockerfile(""); got != "Dockerfile" {
		t.Errorf("no context: %q", got)
	}
	if got := defaultDockerfile("app"); got != filepath.Join("app", "Dockerfile") {
		t.Errorf("context app: %q", got)
	}
}
