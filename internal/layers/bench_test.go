//go:build linux

package layers

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// buildMixedTree writes a ~200 MB tree shaped like a toolchain layer: a few large files, many
// medium and small ones, half of the bytes random and half text-like, plus directories, symlinks
// and hardlinks. It returns the bytes of file content.
func buildMixedTree(tb testing.TB, root string) int64 {
	tb.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	words := []string{"func ", "return ", "import ", "package ", "if err != nil ", "{\n", "}\n", "\t", "x", "0x1f", "// ", "layer "}
	content := func(n int) []byte {
		b := make([]byte, 0, n)
		for len(b) < n {
			if rng.IntN(2) == 0 {
				for range min(512, n-len(b)) {
					b = append(b, byte(rng.Uint32()))
				}
			} else {
				for len(b) < n && rng.IntN(64) != 0 {
					b = append(b, words[rng.IntN(len(words))]...)
				}
			}
		}
		return b[:n]
	}
	var total int64
	write := func(rel string, n int) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, content(n), 0o644); err != nil {
			tb.Fatal(err)
		}
		total += int64(n)
	}
	for i := range 8 {
		write(fmt.Sprintf("lib/big%d.so", i), 10<<20)
	}
	for i := range 1500 {
		write(fmt.Sprintf("share/d%02d/m%d.bin", i%50, i), 50<<10)
	}
	for i := range 10000 {
		write(fmt.Sprintf("src/p%03d/s%d.go", i%500, i), 1024+rng.IntN(6<<10))
	}
	for i := range 500 {
		if err := os.Symlink(fmt.Sprintf("../s%d.go", i), filepath.Join(root, fmt.Sprintf("src/p%03d/link%d", i, i))); err != nil {
			tb.Fatal(err)
		}
	}
	for i := range 200 {
		if err := os.Link(filepath.Join(root, fmt.Sprintf("share/d%02d/m%d.bin", i%50, i)), filepath.Join(root, fmt.Sprintf("share/hl%d", i))); err != nil {
			tb.Fatal(err)
		}
	}
	return total
}

// benchInputs builds the mixed tree once per benchmark and archives it plain, gzip and zstd.
func benchInputs(b *testing.B) (size int64, files map[string]string) {
	dir := b.TempDir()
	src := filepath.Join(dir, "src")
	size = buildMixedTree(b, src)
	files = map[string]string{}
	for _, kind := range []string{"tar", "tar.gz", "tar.zst"} {
		p := filepath.Join(dir, "layer."+kind)
		f, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		var w io.WriteCloser = nopCloser{f}
		switch kind {
		case "tar.gz":
			w = gzip.NewWriter(f)
		case "tar.zst":
			if w, err = zstd.NewWriter(f); err != nil {
				b.Fatal(err)
			}
		}
		if err := WriteTar(context.Background(), src, w); err != nil {
			b.Fatal(err)
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
		f.Close()
		files[kind] = p
	}
	return size, files
}

func syncStore(b *testing.B, s *Store) {
	f, err := os.Open(s.cfg.Dir)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		b.Fatal(err)
	}
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// benchDir puts the benchmark's store on another filesystem, e.g. tmpfs to take the disk out.
var benchDir = flag.String("layers.benchdir", "", "directory for BenchmarkImportTar's store (default: a temp dir)")

// BenchmarkImportTar measures import throughput, in MB/s of file content, of a ~200 MB layer
// with ~12,000 files: extraction, digest, EROFS conversion, verification and storing the image.
//
//	go test -run '^$' -bench ImportTar -benchtime 3x ./internal/layers [-layers.benchdir /dev/shm]
func BenchmarkImportTar(b *testing.B) {
	size, inputs := benchInputs(b)
	for _, tc := range []struct{ name, input string }{
		{"tar", "tar"},
		{"tar.gz", "tar.gz"},
		{"tar.zst", "tar.zst"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			dir := b.TempDir()
			if *benchDir != "" {
				var err error
				if dir, err = os.MkdirTemp(*benchDir, "layers-bench-"); err != nil {
					b.Fatal(err)
				}
				defer os.RemoveAll(dir)
			}
			s, err := Open(Config{Dir: filepath.Join(dir, "layers"), Blobs: dirBlobs(b)}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			b.SetBytes(size)
			syncStore(b, s)
			b.ResetTimer()
			for range b.N {
				f, err := os.Open(inputs[tc.input])
				if err != nil {
					b.Fatal(err)
				}
				blob, err := s.ImportTar(context.Background(), f)
				f.Close()
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if blob.Size != size {
					b.Fatalf("imported %d bytes; want %d", blob.Size, size)
				}
				if err := s.Remove(context.Background(), blob.Digest); err != nil {
					b.Fatal(err)
				}
				syncStore(b, s) // the next import must not pay for this one's writeback and deletion
				b.StartTimer()
			}
			fi, _ := os.Stat(inputs[tc.input])
			b.ReportMetric(float64(fi.Size())/1e6, "input-MB")
		})
	}
}

// BenchmarkWriteTar measures archiving the same tree, for the CLI's --dir.
func BenchmarkWriteTar(b *testing.B) {
	src := filepath.Join(b.TempDir(), "src")
	size := buildMixedTree(b, src)
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		if err := WriteTar(context.Background(), src, io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
