package cli

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type tarEntry struct {
	name, link string
	typ        byte
	body       string
}

func makeTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// outsideFiles lists what exists in parent apart from the extraction directory "out".
func outsideFiles(t testing.TB, parent string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(parent, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(parent, p)
		if rel == "." || rel == "out" || strings.HasPrefix(rel, "out"+string(filepath.Separator)) {
			return nil
		}
		out = append(out, rel)
		return nil
	})
	return out
}

func TestExtractTreeStaysInside(t *testing.T) {
	tests := []struct {
		name    string
		entries []tarEntry
		wantErr string
	}{
		{name: "dot dot", entries: []tarEntry{{name: "../evil", typ: tar.TypeReg, body: "x"}}, wantErr: "leaves the target directory"},
		{name: "nested dot dot", entries: []tarEntry{{name: "a/../../evil", typ: tar.TypeReg, body: "x"}}, wantErr: "leaves the target directory"},
		{name: "symlink out then write through it", entries: []tarEntry{
			{name: "link", typ: tar.TypeSymlink, link: ".."},
			{name: "link/evil", typ: tar.TypeReg, body: "x"},
		}, wantErr: "extract link/evil"},
		{name: "absolute symlink then write through it", entries: []tarEntry{
			{name: "abs", typ: tar.TypeSymlink, link: "/tmp"},
			{name: "abs/evil", typ: tar.TypeReg, body: "x"},
		}, wantErr: "extract abs/evil"},
		{name: "hard link out", entries: []tarEntry{{name: "h", typ: tar.TypeLink, link: "../secret"}}, wantErr: "leaves the target directory"},
		{name: "absolute names are made relative", entries: []tarEntry{{name: "/etc/passwd", typ: tar.TypeReg, body: "x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			os.WriteFile(filepath.Join(parent, "secret"), []byte("s"), 0o600)
			out := filepath.Join(parent, "out")
			os.Mkdir(out, 0o755)
			err := extractTree(t.Context(), bytes.NewReader(makeTar(t, tt.entries...)), out)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("extractTree error = %v, want %q", err, tt.wantErr)
			}
			if got := outsideFiles(t, parent); len(got) != 1 || got[0] != "secret" {
				t.Errorf("files outside the target: %v", got)
			}
		})
	}
	parent := t.TempDir()
	out := filepath.Join(parent, "out")
	os.Mkdir(out, 0o755)
	if err := extractTree(t.Context(), bytes.NewReader(makeTar(t, tarEntry{name: "/etc/passwd", typ: tar.TypeReg, body: "x"})), out); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "etc", "passwd")); err != nil || string(b) != "x" {
		t.Errorf("/etc/passwd landed as out/etc/passwd = %q, %v", b, err)
	}
}

func TestWriteTreeRoundTrip(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o750)
	os.WriteFile(filepath.Join(src, "a", "b", "f"), []byte("data"), 0o600)
	os.WriteFile(filepath.Join(src, "top"), nil, 0o755)
	os.Symlink("a/b/f", filepath.Join(src, "ln"))
	var buf bytes.Buffer
	if err := writeTree(t.Context(), src, &buf); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Uid != 0 || h.Uname != "" {
			t.Errorf("%s: owner %d/%q leaked into the tar", h.Name, h.Uid, h.Uname)
		}
		names = append(names, h.Name)
	}
	if got, want := strings.Join(names, " "), "a/ a/b/ a/b/f ln top"; got != want {
		t.Errorf("entries = %s, want %s", got, want)
	}
	dst := t.TempDir()
	if err := extractTree(t.Context(), &buf, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "ln")); err != nil || string(b) != "data" {
		t.Errorf("through the copied symlink: %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "a", "b", "f")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("a/b/f mode = %v, %v; want 0600", fi.Mode(), err)
	}
}

// FuzzExtractTree checks that no tar stream, however malformed, writes outside the target.
func FuzzExtractTree(f *testing.F) {
	f.Add(makeTar(f, tarEntry{name: "a/b", typ: tar.TypeReg, body: "x"}))
	f.Add(makeTar(f, tarEntry{name: "l", typ: tar.TypeSymlink, link: ".."}, tarEntry{name: "l/x", typ: tar.TypeReg, body: "x"}))
	f.Add(makeTar(f, tarEntry{name: "d/", typ: tar.TypeDir}, tarEntry{name: "h", typ: tar.TypeLink, link: "d/../../x"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Entries may legitimately be huge (a sparse file of a terabyte takes a few bytes of
		// tar); that is the size of what was asked for, not an escape, so skip such inputs.
		tr := tar.NewReader(bytes.NewReader(data))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if h.Size > 1<<20 {
				t.Skip()
			}
		}
		parent := t.TempDir()
		out := filepath.Join(parent, "out")
		os.Mkdir(out, 0o755)
		_ = extractTree(t.Context(), bytes.NewReader(data), out)
		if got := outsideFiles(t, parent); len(got) != 0 {
			t.Fatalf("files outside the target: %v", got)
		}
	})
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1024", 1024, true},
		{"512M", 512 << 20, true},
		{"512m", 512 << 20, true},
		{"1G", 1 << 30, true},
		{"1GiB", 1 << 30, true},
		{"1Gi", 1 << 30, true},
		{"1.5g", 3 << 29, true},
		{"100MB", 100e6, true},
		{"2kb", 2000, true},
		{"10B", 10, true},
		{"", 0, false},
		{"M", 0, false},
		{"12X", 0, false},
		{"-1G", 0, false},
		{"1e3", 0, false},
		{"99999999999T", 0, false},
	}
	for _, tt := range tests {
		got, err := parseSize(tt.in)
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("parseSize(%q) = %d, %v; want %d, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestParseLocation(t *testing.T) {
	tests := []struct {
		in      string
		want    location
		wantErr bool
	}{
		{in: "sb-1:/a/b", want: location{sandbox: "sb-1", path: "/a/b"}},
		{in: "./a:b", want: location{path: "./a:b"}},
		{in: "/x/y:z", want: location{path: "/x/y:z"}},
		{in: "file", want: location{path: "file"}},
		{in: "-", want: location{path: "-"}},
		{in: ":x", want: location{path: ":x"}},
		{in: "sb-1:rel", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseLocation(tt.in)
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Errorf("parseLocation(%q) = %+v, %v; want %+v (error %v)", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
