package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamLayerImport feeds `corral layer import` hostile archives: traversal, absolute names,
// links out of the layer, device nodes, overlay xattrs, a huge sparse file, deep nesting and
// bombs. Each is refused with a clear error, no
// layer is published, nothing lands outside the import's staging directory, the staging
// directory is emptied, and corral stays healthy. Layer import runs on the host, before any
// runtime, so this runs once.
func TestRedTeamLayerImport(t *testing.T) {
	// 96 MiB: above the ratio check's 64 MiB floor, so a bomb meets the ratio first.
	p := withBase(t, "--max-layer-bytes", fmt.Sprint(96<<20))
	ctx := context.Background()
	mark := "rt-escape-" + randHex(4)
	outside := t.TempDir()
	type entry struct {
		hdr  tar.Header
		body []byte
	}
	reg := func(name string) entry {
		return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}, body: []byte("x")}
	}
	tarOfEntries := func(es ...entry) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range es {
			if err := tw.WriteHeader(&e.hdr); err != nil {
				t.Fatalf("tar header %s: %v", e.hdr.Name, err)
			}
			tw.Write(e.body)
		}
		tw.Close()
		return buf.Bytes()
	}
	deep := strings.Repeat("d/", 2000) // within PATH_MAX, but deeper than mkfs.erofs survives
	cases := []struct {
		name  string
		tar   func() []byte
		want  string // in the error; "" for "accepted or refused, but cleanly"
		large bool   // refused as too large (exit says so) rather than invalid
	}{
		{"traversal", func() []byte { return tarOfEntries(reg("../../../../" + mark)) }, `".." path component`, false},
		{"traversal in the middle", func() []byte { return tarOfEntries(reg("a/../../" + mark)) }, `".." path component`, false},
		{"absolute name", func() []byte { return tarOfEntries(reg(outside + "/" + mark)) }, "absolute path", false},
		{"symlink escape", func() []byte {
			return tarOfEntries(entry{hdr: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}}, reg("l/"+mark))
		}, "symlink", false},
		{"relative symlink escape", func() []byte {
			return tarOfEntries(entry{hdr: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../" + strings.TrimPrefix(outside, "/")}}, reg("l/"+mark))
		}, "symlink", false},
		{"hardlink to an absolute path", func() []byte {
			return tarOfEntries(entry{hdr: tar.Header{Name: mark, Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}})
		}, "absolute path", false},
		{"hardlink climbing out", func() []byte {
			return tarOfEntries(entry{hdr: tar.Header{Name: mark, Typeflag: tar.TypeLink, Linkname: "../../../../etc/shadow"}})
		}, `".." path component`, false},
		{"hardlink through a symlink", func() []byte {
			return tarOfEntries(entry{hdr: tar.Header{Name: "e", Typeflag: tar.TypeSymlink, Linkname: "/etc"}},
				entry{hdr: tar.Header{Name: mark, Typeflag: tar.TypeLink, Linkname: "e/shadow"}})
		}, "symlink", false},
		{"char device", func() []byte {
			return tarOfEntries(entry{hdr: tar.Header{Name: "mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666}})
		}, "device nodes are not allowed", false},
		{"block device", func() []byte {
			return tarOfEntries(entry{hdr: tar.Header{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8, Mode: 0o666}})
		}, "device nodes are not allowed", false},
		{"overlay redirect xattr", func() []byte {
			return tarOfEntries(entry{hdr: tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.redirect": "/etc"}}})
		}, "extended attribute", false},
		{"huge sparse file", func() []byte { return sparseTar(t, "sparse", 1<<40) }, "", true},
		{"deep nesting", func() []byte { return tarOfEntries(reg(deep + mark)) }, "components deep", false},
		{"gzip bomb", func() []byte {
			// 90 files of 1 MiB of zeros: under the size limit, each small, ~90 KiB compressed.
			var buf bytes.Buffer
			zw := gzip.NewWriter(&buf)
			tw := tar.NewWriter(zw)
			for i := range 90 {
				tw.WriteHeader(&tar.Header{Name: fmt.Sprint("zeros", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 20})
				io.CopyN(tw, zeros{}, 1<<20)
			}
			tw.Close()
			zw.Close()
			return buf.Bytes()
		}, "expands more than 200 times", true},
		{"over the size limit", func() []byte {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: 100 << 20})
			io.CopyN(tw, &randomish{}, 100<<20)
			tw.Close()
			return buf.Bytes()
		}, "", true},
	}
	dir := t.TempDir()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, fmt.Sprintf("%d.tar", i))
			if err := os.WriteFile(file, tc.tar(), 0o644); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("hostile%d", i)
			start := time.Now()
			_, stderr, code := p.cli("", "layer", "import", name+":1", "--kind", "base", "--tar", file)
			took := time.Since(start)
			switch {
			case code == 0:
				t.Fatalf("imported; want a refusal")
			case tc.want != "" && !strings.Contains(stderr, tc.want):
				t.Fatalf("refusal %q does not say %q", stderr, tc.want)
			case tc.large && !strings.Contains(stderr, "large") && !strings.Contains(stderr, "ratio") && !strings.Contains(stderr, "limit"):
				t.Fatalf("refusal %q does not name the size limit", stderr)
			default:
				if _, err := p.Client.Layer(ctx, name, "1"); !corral.IsNotFound(err) {
					t.Fatalf("a refused import left the layer: %v", err)
				}
			}
			t.Logf("%s: exit %d in %s: %s", tc.name, code, took.Round(time.Millisecond), strings.TrimSpace(stderr))
			// Nothing escaped: no file named mark outside a layer's own tree, anywhere the
			// import could have reached.
			for _, root := range []string{outside, filepath.Dir(p.DataDir), "/etc"} {
				filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
					if err == nil && d.Name() == mark && !strings.HasPrefix(path, filepath.Join(p.DataDir, "layers")) && !strings.HasPrefix(path, filepath.Join(p.DataDir, "blobs")) {
						t.Errorf("%s exists", path)
					}
					if err == nil && d.IsDir() && path != root && (root == "/etc" || strings.Count(path, "/") > 12) {
						return fs.SkipDir
					}
					return nil
				})
			}
			eventually(t, 10*time.Second, "the staging directory emptied", func() bool {
				ents, _ := os.ReadDir(filepath.Join(p.DataDir, "layers", "staging"))
				return len(ents) == 0
			})
			if err := p.Client.Health(ctx); err != nil {
				t.Fatalf("corral after the import: %v", err)
			}
		})
	}
}

// randomish reads as incompressible bytes, cheaply (a xorshift stream).
type randomish struct{ s uint64 }

func (r *randomish) Read(p []byte) (int, error) {
	if r.s == 0 {
		r.s = 0x9e3779b97f4a7c15
	}
	for i := range p {
		r.s ^= r.s << 13
		r.s ^= r.s >> 7
		r.s ^= r.s << 17
		p[i] = byte(r.s)
	}
	return len(p), nil
}

// sparseTar is a tar holding one PAX 1.0 sparse file named name of size bytes with a single
// 512-byte data block: a few KiB that expand to size. archive/tar reads such files but cannot
// write them, so the blocks are made here.
func sparseTar(t *testing.T, name string, size int64) []byte {
	t.Helper()
	block := func(name string, typ byte, n int64) []byte {
		b := make([]byte, 512)
		copy(b[0:], name)
		copy(b[100:], "0000644\x00")
		copy(b[108:], "0000000\x00")
		copy(b[116:], "0000000\x00")
		copy(b[124:], fmt.Sprintf("%011o\x00", n))
		copy(b[136:], "00000000000\x00")
		b[156] = typ
		copy(b[257:], "ustar\x0000")
		for i := 148; i < 156; i++ {
			b[i] = ' '
		}
		var sum int
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
		return b
	}
	pad := func(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }
	record := func(k, v string) string {
		r := " " + k + "=" + v + "\n"
		n := len(r) + len(fmt.Sprint(len(r))) // the length counts its own digits
		if len(fmt.Sprint(n)) != len(fmt.Sprint(len(r))) {
			n = len(r) + len(fmt.Sprint(n))
		}
		return fmt.Sprint(n) + r
	}
	pax := record("GNU.sparse.major", "1") + record("GNU.sparse.minor", "0") + record("GNU.sparse.name", name) +
		record("GNU.sparse.realsize", fmt.Sprint(size))
	// The data: the map (one entry: 512 bytes at offset size-512) in a block, then that block.
	sparseMap := pad([]byte(fmt.Sprintf("1\n%d\n512\n", size-512)))
	data := append(sparseMap, bytes.Repeat([]byte("s"), 512)...)
	var out []byte
	out = append(out, block("PaxHeaders/"+name, 'x', int64(len(pax)))...)
	out = append(out, pad([]byte(pax))...)
	out = append(out, block(name, '0', int64(len(data)))...)
	out = append(out, data...)
	out = append(out, make([]byte, 1024)...)
	// Check the archive reads as intended before it is used as an attack.
	tr := tar.NewReader(bytes.NewReader(out))
	h, err := tr.Next()
	if err != nil || h.Name != name || h.Size != size {
		t.Fatalf("sparse tar: %+v, %v", h, err)
	}
	return out
}
