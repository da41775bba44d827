//go:build linux

package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// paxPrefix returns raw tar blocks holding a PAX extended header with the given records; put in
// front of an archive, they apply to its first entry. archive/tar refuses to write such records
// (a NUL in a path), which is why this builds them by hand.
func paxPrefix(records map[string]string) []byte {
	var body bytes.Buffer
	for k, v := range records {
		rec := " " + k + "=" + v + "\n"
		size := len(rec) + len(fmt.Sprint(len(rec)))
		if len(fmt.Sprint(size)) > len(fmt.Sprint(len(rec))) {
			size++ // the length counts its own digits
		}
		fmt.Fprintf(&body, "%d%s", size, rec)
	}
	blk := make([]byte, 512)
	copy(blk, "PaxHeaders/x")
	copy(blk[100:], "0000644\x00")
	copy(blk[108:], "0000000\x00")
	copy(blk[116:], "0000000\x00")
	copy(blk[124:], fmt.Sprintf("%011o\x00", body.Len()))
	copy(blk[136:], "00000000000\x00")
	blk[156] = 'x'
	copy(blk[257:], "ustar\x0000")
	copy(blk[148:], "        ")
	sum := 0
	for _, c := range blk {
		sum += int(c)
	}
	copy(blk[148:], fmt.Sprintf("%06o\x00 ", sum))
	out := append(blk, body.Bytes()...)
	if pad := len(out) % 512; pad != 0 {
		out = append(out, make([]byte, 512-pad)...)
	}
	return out
}

func TestImportRejects(t *testing.T) {
	honeypot := t.TempDir() // symlinks in the archives point here; nothing may land in it
	long := strings.Repeat("d/", 2047) + "ff"
	zeros := make([]byte, 4<<20)

	cases := []struct {
		name     string
		archive  func(t *testing.T) []byte
		cfg      Config
		wantKind error
		wantMsg  string
	}{
		{"dotdot", tarFn(file("../evil", "x")), Config{}, errdefs.ErrInvalid, `entry "../evil": ".." path component`},
		{"dotdot in the middle", tarFn(dir("a/"), file("a/../../evil", "x")), Config{}, errdefs.ErrInvalid, `".." path component`},
		{"dot component", tarFn(file("a/./b", "x")), Config{}, errdefs.ErrInvalid, `"." path component`},
		{"empty component", tarFn(file("a//b", "x")), Config{}, errdefs.ErrInvalid, `empty path component`},
		{"absolute", tarFn(file("/etc/passwd", "x")), Config{}, errdefs.ErrInvalid, `entry "/etc/passwd": absolute path`},
		{"write through absolute symlink",
			tarFn(symlink("a", honeypot), file("a/passwd", "owned")), Config{}, errdefs.ErrInvalid,
			`entry "a/passwd": path component "a" is a symlink`},
		{"write through relative symlink",
			tarFn(dir("d/"), symlink("d/up", "../.."), file("d/up/evil", "x")), Config{}, errdefs.ErrInvalid,
			`path component "d/up" is a symlink`},
		{"directory through symlink",
			tarFn(symlink("a", honeypot), dir("a/sub/")), Config{}, errdefs.ErrInvalid, `"a" is a symlink`},
		{"hardlink through symlink",
			tarFn(symlink("s", honeypot), hardlink("x", "s/secret")), Config{}, errdefs.ErrInvalid,
			`hardlink target "s/secret" goes through a symlink`},
		{"hardlink absolute", tarFn(hardlink("x", "/etc/passwd")), Config{}, errdefs.ErrInvalid, `hardlink target "/etc/passwd": absolute path`},
		{"hardlink dotdot", tarFn(hardlink("x", "../y")), Config{}, errdefs.ErrInvalid, `hardlink target "../y": ".." path component`},
		{"hardlink to missing", tarFn(hardlink("x", "nope")), Config{}, errdefs.ErrInvalid, `hardlink target "nope" is not in the layer`},
		{"hardlink forward", tarFn(hardlink("x", "later"), file("later", "y")), Config{}, errdefs.ErrInvalid, `is not in the layer`},
		{"hardlink to directory", tarFn(dir("d/"), hardlink("x", "d")), Config{}, errdefs.ErrInvalid, `hardlink target "d" is a directory`},
		{"hardlink to root", tarFn(hardlink("x", "./")), Config{}, errdefs.ErrInvalid, `hardlink to the layer root`},
		{"hardlink to whiteout", tarFn(file(".wh.gone", ""), hardlink("x", "gone")), Config{}, errdefs.ErrInvalid, `is a whiteout`},
		{"char device", tarFn(ent{name: "dev/mem", typ: tar.TypeChar, major: 1, minor: 1}), Config{}, errdefs.ErrInvalid,
			`entry "dev/mem": character device 1:1: device nodes are not allowed`},
		{"block device", tarFn(ent{name: "sda", typ: tar.TypeBlock, major: 8}), Config{}, errdefs.ErrInvalid, `block device 8:0: device nodes are not allowed`},
		{"file then directory", tarFn(file("x", "a"), dir("x/")), Config{}, errdefs.ErrInvalid,
			`entry "x/": duplicate entry: already a reg, now a dir`},
		{"directory then symlink", tarFn(dir("x/"), symlink("x", "/etc")), Config{}, errdefs.ErrInvalid, `already a dir, now a symlink`},
		{"parent is a file", tarFn(file("f", "a"), file("f/x", "b")), Config{}, errdefs.ErrInvalid, `parent "f" is a reg, not a directory`},
		{"root is a file", tarFn(file(".", "")), Config{}, errdefs.ErrInvalid, `the layer root must be a directory`},
		{"too large", tarFn(file("a", strings.Repeat("x", 600)), file("b", strings.Repeat("x", 600))), Config{MaxBytes: 1000}, errdefs.ErrTooLarge,
			`entry "b": a file of 600 bytes takes the layer past 1000 bytes`},
		{"too many entries", tarFn(file("a", ""), file("b", ""), file("c", ""), file("d", "")), Config{MaxEntries: 3}, errdefs.ErrTooLarge,
			`entry "d": the layer has more than 3 entries`},
		{"zstd bomb", func(t *testing.T) []byte { return zstdOf(t, tarOf(t, file("zeros", string(zeros)))) },
			Config{MaxRatio: 10, RatioFloor: 1 << 20}, errdefs.ErrTooLarge, `likely decompression bomb`},
		{"gzip bomb", func(t *testing.T) []byte { return gzipOf(t, tarOf(t, file("zeros", string(zeros)))) },
			Config{MaxRatio: 10, RatioFloor: 1 << 20}, errdefs.ErrTooLarge, `likely decompression bomb`},
		{"not a tar", func(*testing.T) []byte { return bytes.Repeat([]byte("garbage!"), 100) }, Config{}, errdefs.ErrInvalid, `malformed archive`},
		{"empty input", func(*testing.T) []byte { return nil }, Config{}, errdefs.ErrInvalid, `archive is empty`},
		{"truncated tar", func(t *testing.T) []byte { return tarOf(t, file("a", strings.Repeat("x", 5000)))[:2048] },
			Config{}, errdefs.ErrInvalid, `archive is truncated`},
		{"truncated gzip", func(t *testing.T) []byte {
			b := gzipOf(t, tarOf(t, file("a", strings.Repeat("xy", 50000))))
			return b[:len(b)-20]
		}, Config{}, errdefs.ErrInvalid, `archive is truncated`},
		{"corrupt gzip", func(t *testing.T) []byte {
			b := gzipOf(t, tarOf(t, file("a", "hello")))
			b[len(b)-6] ^= 0xff // the CRC-32
			return b
		}, Config{}, errdefs.ErrInvalid, `malformed archive`},
		{"corrupt zstd", func(t *testing.T) []byte {
			b := zstdOf(t, tarOf(t, file("a", strings.Repeat("hello world ", 1000))))
			b[len(b)/2] ^= 0xff
			return b
		}, Config{}, errdefs.ErrInvalid, `malformed archive`},
		{"garbage after gzip", func(t *testing.T) []byte {
			return append(gzipOf(t, tarOf(t, file("a", "x"))), bytes.Repeat([]byte("junk"), 10)...)
		}, Config{}, errdefs.ErrInvalid, `malformed archive`},
		{"xz", func(*testing.T) []byte { return []byte{0xfd, '7', 'z', 'X', 'Z', 0, 0, 0} }, Config{}, errdefs.ErrInvalid, `xz-compressed archives are not supported`},
		{"bzip2", func(*testing.T) []byte { return []byte("BZh91AY&SY") }, Config{}, errdefs.ErrInvalid, `bzip2-compressed archives are not supported`},
		{"NUL in name", func(t *testing.T) []byte {
			return append(paxPrefix(map[string]string{"path": "a\x00b"}), tarOf(t, file("a", "x"))...)
		}, Config{}, errdefs.ErrInvalid, `malformed archive`},
		{"name over PATH_MAX", tarFn(file(long, "x")), Config{}, errdefs.ErrInvalid, `name is 4096 bytes; the limit is 4095`},
		{"too deep", tarFn(file(strings.Repeat("d/", 512)+"f", "x")), Config{}, errdefs.ErrInvalid, `name is 513 components deep; the limit is 512`},
		{"component over NAME_MAX", tarFn(file(strings.Repeat("n", 256), "x")), Config{}, errdefs.ErrInvalid, `path component of 256 bytes; the limit is 255`},
		{"symlink target over PATH_MAX", tarFn(symlink("s", strings.Repeat("t", 4096))), Config{}, errdefs.ErrInvalid, `symlink target is 4096 bytes`},
		{"empty symlink target", tarFn(symlink("s", "")), Config{}, errdefs.ErrInvalid, `symlink with an empty target`},
		{"whiteout of dotdot", tarFn(file("a/.wh...", "")), Config{}, errdefs.ErrInvalid, `whiteout of ".." names no entry`},
		{"trusted xattr", tarFn(ent{name: "f", xattrs: map[string]string{"trusted.overlay.redirect": "/etc"}}), Config{}, errdefs.ErrInvalid,
			`extended attribute "trusted.overlay.redirect" is not allowed`},
		{"user.overlay xattr", tarFn(ent{name: "d/", typ: tar.TypeDir, xattrs: map[string]string{"user.overlay.opaque": "y"}}), Config{}, errdefs.ErrInvalid,
			`"user.overlay.opaque" is not allowed`},
		{"opaque xattr on a file", tarFn(ent{name: "f", xattrs: map[string]string{"trusted.overlay.opaque": "y"}}), Config{}, errdefs.ErrInvalid,
			`only accepted as "y" on a directory`},
		{"uid out of range", tarFn(ent{name: "f", uid: 1 << 32, owned: true}), Config{}, errdefs.ErrInvalid, `uid 4294967296 is out of range`},
		{"contiguous file", tarFn(ent{name: "f", typ: tar.TypeCont}), Config{}, errdefs.ErrInvalid, `unsupported entry type contiguous file`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.cfg)
			_, err := s.ImportTar(context.Background(), bytes.NewReader(tc.archive(t)))
			if err == nil {
				t.Fatalf("ImportTar succeeded; want an error containing %q", tc.wantMsg)
			}
			t.Logf("error: %v", err)
			if !errors.Is(err, tc.wantKind) {
				t.Errorf("error %q: kind %s, want %s", err, errdefs.Code(err), errdefs.Code(tc.wantKind))
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q\nwant it to contain %q", err, tc.wantMsg)
			}
			assertClean(t, s)
			if n := blobCount(t, s); n != 0 {
				t.Errorf("%d blobs stored; want 0", n)
			}
			if left, _ := os.ReadDir(honeypot); len(left) != 0 {
				t.Fatalf("the archive wrote %q outside the store", left[0].Name())
			}
		})
	}
}

func tarFn(ents ...ent) func(t *testing.T) []byte {
	return func(t *testing.T) []byte { return tarOf(t, ents...) }
}

func TestCleanPath(t *testing.T) {
	cases := []struct {
		name, wantRel, wantWhy string
	}{
		{"a", "a", ""},
		{"./a/b", "a/b", ""},
		{"././a/", "a", ""},
		{"a/b//", "a/b", ""},
		{"./", "", ""},
		{".", "", ""},
		{"", "", "empty name"},
		{"/a", "", "absolute path"},
		{"a/../b", "", `".." path component`},
		{"..", "", `".." path component`},
		{"a/./b", "", `"." path component`},
		{"a//b", "", "empty path component"},
		{"a\x00b", "", "NUL byte"},
		{strings.Repeat("x", 256), "", "NAME_MAX"},
		{strings.Repeat("x/", 2048), "", "PATH_MAX"},
		{strings.Repeat("x/", 511) + "x", strings.Repeat("x/", 511) + "x", ""},
		{strings.Repeat("x/", 512) + "x", "", "513 components deep"},
		{"..a/b..", "..a/b..", ""},
		{"a b/ü/\xff", "a b/ü/\xff", ""},
	}
	for _, tc := range cases {
		rel, why := cleanPath(tc.name)
		if rel != tc.wantRel || !strings.Contains(why, tc.wantWhy) || (tc.wantWhy == "") != (why == "") {
			t.Errorf("cleanPath(%q) = %q, %q; want %q, %q", tc.name, rel, why, tc.wantRel, tc.wantWhy)
		}
	}
}
