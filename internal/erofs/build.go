//go:build linux

package erofs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// DefaultMkfs is where scripts/install-erofs-utils.sh caches the mkfs.erofs it builds (erofs-utils
// 1.8.6: Debian 12's 1.5 cannot store 255-byte names). Keep in step with that script.
const DefaultMkfs = "/var/cache/corral/erofs-utils/1.8.6/bin/mkfs.erofs"

// mkfsName is the erofs-utils tool Build runs when it is set (tests point it elsewhere); else
// $CORRAL_MKFS_EROFS, DefaultMkfs, then mkfs.erofs on PATH.
var mkfsName = ""

// sourceDateEpoch is the build time written to the superblock: 9999-12-31T23:59:59Z. mkfs.erofs
// clamps file mtimes to SOURCE_DATE_EPOCH, so a far-future value keeps every real mtime while
// making the superblock (and so the image) independent of when it was built.
const sourceDateEpoch = "253402300799"

// On-disk superblock layout (erofs_fs.h): the superblock starts 1 KiB into block 0.
const (
	sbOffset       = 1024
	sbMagic        = 0xE0F5E1E2
	sbChecksumOff  = sbOffset + 4
	sbFeatCompOff  = sbOffset + 8
	sbBlkSzBitsOff = sbOffset + 12
	sbUUIDOff      = sbOffset + 48
	featSBChecksum = 0x1 // EROFS_FEATURE_COMPAT_SB_CHKSUM
)

// Version reports the version of the mkfs.erofs that Build runs ("1.5", "1.8.10"). When the tool
// is missing the error wraps errdefs.ErrUnavailable and says how to install it.
func Version() (string, error) {
	path, err := lookMkfs()
	if err != nil {
		return "", err
	}
	// Every release prints its version last on the first line for -V ("mkfs.erofs 1.5",
	// "mkfs.erofs (erofs-utils) 1.8.6"): 1.8+ because it knows the option, 1.5 because it prints
	// its banner before rejecting an unknown option.
	out, _ := exec.Command(path, "-V").Output()
	line, _, _ := strings.Cut(string(out), "\n")
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "mkfs.erofs" || !versionAtLeast(f[len(f)-1], 1) {
		return "", fmt.Errorf("%s -V: unexpected output %q", path, line)
	}
	return f[len(f)-1], nil
}

func lookMkfs() (string, error) {
	name := mkfsName
	if name == "" {
		name = os.Getenv("CORRAL_MKFS_EROFS")
	}
	if name == "" {
		if _, err := os.Stat(DefaultMkfs); err == nil {
			return DefaultMkfs, nil
		}
		name = "mkfs.erofs"
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found: install erofs-utils (scripts/install-erofs-utils.sh builds 1.8.6; Debian/Ubuntu: apt-get install erofs-utils): %w",
			name, errdefs.ErrUnavailable)
	}
	return path, nil
}

// Build writes an uncompressed EROFS image of the tree at src to dst, which must not exist.
//
// The image keeps what an overlayfs lower layer needs: numeric uid and gid, permission bits with
// setuid, setgid and sticky, mtimes to the nanosecond, hardlinks, symlinks, fifos, sockets, device
// nodes (so 0:0 whiteouts), and all trusted.*, security.* and user.* xattrs (so
// trusted.overlay.opaque; reading trusted.* needs CAP_SYS_ADMIN, so a non-root caller silently
// loses them). The output is a function of the tree: building it twice gives the same bytes, and
// the filesystem UUID is derived from them. (erofs-utils before 1.9.3 stores each inode's xattrs in
// the order listxattr(2) reports them, so a copy of the tree whose filesystem lists them in another
// order gives other bytes.)
//
// The image is written to a temporary file beside dst, synced, renamed to dst and the directory
// synced. On any error, including ctx ending, nothing is left at dst or beside it. A missing
// mkfs.erofs wraps errdefs.ErrUnavailable, a missing or non-directory src errdefs.ErrNotFound or
// errdefs.ErrInvalid, an existing dst errdefs.ErrConflict.
func Build(ctx context.Context, src, dst string) error {
	return build(ctx, src, dst, "", 0, "build erofs image "+dst)
}

// Chunk sizes BuildSplit accepts. The upper bound is erofs-utils': it holds a whole chunk in
// memory while writing it.
const (
	MinChunkSize = 4096    // one EROFS block
	MaxChunkSize = 1 << 30 // 1 GiB
)

// BuildSplit is Build for lazily loaded layers: it writes the tree at src as two files, neither of
// which may exist. metaDst is an EROFS image holding all metadata (inodes, directories, xattrs,
// symlink targets, and each regular file's chunk index); dataDst, the data blob, holds the bytes
// of every regular file and is the image's one extra device (mount both with
// MountOptions.Devices). chunkSize, a power of two from MinChunkSize to MaxChunkSize, is the unit
// of the chunk index: each file's data is cut at multiples of chunkSize from its start, and chunks
// are stored in the blob at 4 KiB-aligned offsets, packed in the order mkfs.erofs writes files,
// with the gaps zero-filled. Identical chunks are stored once, and chunks of zeros only are not
// stored at all (holes). See Chunks for cutting the blob into content-addressed units.
//
// A tree with no regular-file data gives an empty (0-byte) blob. The image still records one
// extra device, of zero blocks; it mounts with the empty blob as its device, and also without
// one.
//
// Everything else is as for Build: the same content, the same flags, the same reproducibility
// (the same tree and chunkSize give the same bytes in both files), and a UUID derived from both
// files, so that two layers whose metadata differs only in file contents still get distinct
// UUIDs. Both files are written to temporary files beside their destinations, synced, and renamed
// into place, the blob first so that an image never names a missing blob; then the directories
// are synced. On any error nothing is left at either destination or beside it. A chunkSize out of
// range or metaDst equal to dataDst wraps errdefs.ErrInvalid; other errors are Build's.
func BuildSplit(ctx context.Context, src, metaDst, dataDst string, chunkSize int64) error {
	what := "build erofs image " + metaDst + " with data " + dataDst
	if chunkSize < MinChunkSize || chunkSize > MaxChunkSize || chunkSize&(chunkSize-1) != 0 {
		return fmt.Errorf("%s: chunk size %d is not a power of two from %d to %d: %w",
			what, chunkSize, MinChunkSize, MaxChunkSize, errdefs.ErrInvalid)
	}
	am, err1 := filepath.Abs(metaDst)
	ad, err2 := filepath.Abs(dataDst)
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if am == ad {
		return fmt.Errorf("%s: image and data blob must be two files: %w", what, errdefs.ErrInvalid)
	}
	return build(ctx, src, metaDst, dataDst, chunkSize, what)
}

// build is Build, or BuildSplit when data is set. what prefixes every error.
func build(ctx context.Context, src, dst, data string, chunkSize int64, what string) (err error) {
	mkfs, err := lookMkfs()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	st, err := os.Lstat(src)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: source %s: %w", what, src, errdefs.ErrNotFound)
	case err != nil:
		return fmt.Errorf("%s: %w", what, err)
	case !st.IsDir():
		return fmt.Errorf("%s: source %s is not a directory: %w", what, src, errdefs.ErrInvalid)
	}
	for _, p := range []string{dst, data} {
		if _, err := os.Lstat(p); p != "" && err == nil {
			return fmt.Errorf("%s: %s already exists: %w", what, p, errdefs.ErrConflict)
		}
	}

	// Temporary files beside their destinations, removed on any error. mkfs.erofs needs the blob
	// file to exist: without it, erofs-utils 1.8.6 exits 1 and prints nothing.
	var tmps []string
	defer func() {
		if err != nil {
			for _, t := range tmps {
				os.Remove(t)
			}
		}
	}()
	for _, p := range []string{dst, data} {
		if p == "" {
			continue
		}
		f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".tmp-*")
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		tmps = append(tmps, f.Name())
		f.Close()
	}
	tmp, tmpData := tmps[0], ""
	if data != "" {
		tmpData = tmps[1]
	}

	// The flags, and why (checked against erofs-utils 1.5 and 1.9 sources):
	//   no -z              uncompressed: the kernel reads file data in place, at native speed.
	//   no -x              the default xattr tolerance (2) keeps every xattr and only decides which
	//                      are stored once and shared; -x -1 would drop them all.
	//   no -T, --all-root, --force-uid/gid
	//                      each would overwrite metadata the layer must keep.
	//   --preserve-mtime   per-file mtimes (the default, said so that no release can change it).
	//   -U <nil UUID>      a fixed UUID so the bytes depend on the tree only; setUUID then
	//                      writes one derived from those bytes (overlayfs wants distinct UUIDs).
	//   --quiet            no progress output; errors still go to stderr.
	//   --chunksize, --blobdev (BuildSplit only)
	//                      chunk-indexed files whose data goes to the blob, deduplicated by chunk.
	//                      The blob's path is not recorded (its device slot's tag stays empty),
	//                      so the temporary name does not reach the image.
	// SOURCE_DATE_EPOCH fixes the superblock's build time (see sourceDateEpoch). On 1.5 it also
	// forces 64-byte extended inodes, which any file whose mtime differs from the build time needs
	// anyway. mkfs.erofs sorts each directory's entries by name before laying out their inodes, so
	// the readdir order of the source does not matter.
	//
	// mkfs.erofs opens every entry by its full path, which must stay under PATH_MAX: running it in
	// src on "." leaves nearly all of that to the tree.
	args := []string{"--quiet", "--preserve-mtime", "-U", "00000000-0000-0000-0000-000000000000"}
	if data != "" {
		absData, err := filepath.Abs(tmpData)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		args = append(args, "--chunksize="+strconv.FormatInt(chunkSize, 10), "--blobdev="+absData)
	}
	absTmp, err := filepath.Abs(tmp)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	cmd := exec.CommandContext(ctx, mkfs, append(args, absTmp, ".")...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+sourceDateEpoch)
	var out tailBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s from %s: %w", what, src, ctx.Err())
		}
		if why := explainMkfsFailure(src); why != nil {
			return fmt.Errorf("%s from %s: %w", what, src, why)
		}
		return fmt.Errorf("%s from %s: %s: %w: %s", what, src, mkfs, err, out.String())
	}
	if err := finishImage(ctx, tmp, tmpData); err != nil {
		return fmt.Errorf("%s from %s: %w", what, src, err)
	}

	// The blob first: an image in place always has its blob beside it.
	var placed []string
	for _, mv := range [][2]string{{tmpData, data}, {tmp, dst}} {
		if mv[1] == "" {
			continue
		}
		if err := unix.Renameat2(unix.AT_FDCWD, mv[0], unix.AT_FDCWD, mv[1], unix.RENAME_NOREPLACE); err != nil {
			for _, p := range placed {
				os.Remove(p) // ours: RENAME_NOREPLACE put it there
			}
			if errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("%s: %s already exists: %w", what, mv[1], errdefs.ErrConflict)
			}
			return fmt.Errorf("%s: rename: %w", what, err)
		}
		placed = append(placed, mv[1])
	}
	dirs := []string{filepath.Dir(dst)}
	if data != "" && filepath.Dir(data) != dirs[0] {
		dirs = append(dirs, filepath.Dir(data))
	}
	for _, d := range dirs {
		if err := syncDir(d); err != nil {
			for _, p := range placed {
				os.Remove(p)
			}
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

// finishImage writes the content-derived UUID into the image at path and syncs it, and the data
// blob at data if there is one.
func finishImage(ctx context.Context, path, data string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var blob io.ReaderAt
	if data != "" {
		d, err := os.Open(data)
		if err != nil {
			return err
		}
		defer d.Close()
		if err := d.Sync(); err != nil {
			return fmt.Errorf("sync data blob: %w", err)
		}
		blob = d
	}
	if err := setUUID(ctx, f, blob); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync image: %w", err)
	}
	return f.Close()
}

// setUUID sets the filesystem UUID of the image in f to a name-based UUID (RFC 9562 version 8)
// made from the SHA-256 of the image as mkfs.erofs wrote it (with a nil UUID), followed by the
// bytes of the data blob if data is not nil, and updates the superblock checksum. Images need
// distinct UUIDs (see the package doc); deriving them from the bytes keeps the build reproducible.
func setUUID(ctx context.Context, f *os.File, data io.ReaderAt) error {
	sb := make([]byte, 4096)
	if _, err := f.ReadAt(sb, 0); err != nil {
		return fmt.Errorf("read superblock: %w", err)
	}
	if m := binary.LittleEndian.Uint32(sb[sbOffset:]); m != sbMagic {
		return fmt.Errorf("read superblock: bad magic %#x", m)
	}
	bits := sb[sbBlkSzBitsOff]
	if bits < 9 || bits > 16 {
		return fmt.Errorf("read superblock: unsupported block size 2^%d", bits)
	}
	if bs := 1 << bits; bs != len(sb) {
		sb = make([]byte, bs)
		if _, err := f.ReadAt(sb, 0); err != nil {
			return fmt.Errorf("read superblock: %w", err)
		}
	}
	withCsum := binary.LittleEndian.Uint32(sb[sbFeatCompOff:])&featSBChecksum != 0
	// Check our checksum against mkfs.erofs's before trusting it to write one.
	if withCsum && sbChecksum(sb) != binary.LittleEndian.Uint32(sb[sbChecksumOff:]) {
		return errors.New("superblock checksum does not match the EROFS format this package knows")
	}
	if !bytes.Equal(sb[sbUUIDOff:sbUUIDOff+16], make([]byte, 16)) {
		return errors.New("mkfs.erofs ignored -U: the image has a random UUID")
	}

	h := sha256.New()
	if _, err := io.Copy(h, &ctxReader{ctx: ctx, r: io.NewSectionReader(f, 0, 1<<62)}); err != nil {
		return fmt.Errorf("hash image: %w", err)
	}
	if data != nil {
		if _, err := io.Copy(h, &ctxReader{ctx: ctx, r: io.NewSectionReader(data, 0, 1<<62)}); err != nil {
			return fmt.Errorf("hash data blob: %w", err)
		}
	}
	uuid := h.Sum(nil)[:16]
	uuid[6] = uuid[6]&0x0f | 0x80 // version 8
	uuid[8] = uuid[8]&0x3f | 0x80 // RFC 9562 variant
	copy(sb[sbUUIDOff:], uuid)
	if withCsum {
		binary.LittleEndian.PutUint32(sb[sbChecksumOff:], sbChecksum(sb))
	}
	if _, err := f.WriteAt(sb[sbOffset:], sbOffset); err != nil {
		return fmt.Errorf("write superblock: %w", err)
	}
	return nil
}

// sbChecksum is the kernel's crc32c(~0, superblock..end of block 0) with the checksum field
// zeroed. The kernel's crc32c does not invert its result; Go's does, hence the final ^.
func sbChecksum(block []byte) uint32 {
	b := bytes.Clone(block[sbOffset:])
	binary.LittleEndian.PutUint32(b[4:], 0)
	return ^crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli))
}

// explainMkfsFailure looks for what makes mkfs.erofs fail on a valid tree, so that the error
// says what to do instead of repeating mkfs.erofs's "No such file or directory" or "Cannot
// allocate memory". It returns nil when it finds nothing.
func explainMkfsFailure(src string) error {
	var long, deep string
	filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(src, p)
		switch {
		case d != nil && len(d.Name()) >= 255 && long == "":
			long = rel
		case len("./"+rel) >= unix.PathMax && deep == "":
			deep = rel
			return filepath.SkipDir
		}
		return nil
	})
	v, _ := Version()
	switch {
	case long != "" && !versionAtLeast(v, 1, 8, 5):
		// erofs-utils before 1.8.5 cut 255-byte names to 254 bytes, then cannot find the file.
		return fmt.Errorf("mkfs.erofs %s cannot store the 255-byte name of %q (fixed in erofs-utils 1.8.5): install a newer erofs-utils: %w",
			v, long, errdefs.ErrUnavailable)
	case deep != "":
		return fmt.Errorf("mkfs.erofs %s cannot reach %q: its path is %d bytes and mkfs.erofs needs every path, as \"./<path>\", under PATH_MAX (%d): %w",
			v, deep[:min(len(deep), 100)]+"...", len(deep), unix.PathMax, errdefs.ErrInvalid)
	}
	return nil
}

// versionAtLeast reports whether the dotted version v ("1.5", "1.8.10-g1234") is at least want.
// An unparsable v counts as old.
func versionAtLeast(v string, want ...int) bool {
	parts := strings.FieldsFunc(v, func(r rune) bool { return r == '.' || r == '-' || r == '+' })
	for i, w := range want {
		if i >= len(parts) {
			return w == 0
		}
		n, err := strconv.Atoi(parts[i])
		if err != nil {
			return false
		}
		if n != w {
			return n > w
		}
	}
	return true
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// ctxReader stops a long read when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

// Read reads from the underlying reader unless the context has ended.
func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// tailBuffer keeps the last 4 KiB written to it: enough of a tool's output for an error message.
type tailBuffer struct{ b []byte }

// Write keeps the tail of p.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if n := len(t.b) - 4096; n > 0 {
		t.b = t.b[n:]
	}
	return len(p), nil
}

// String returns what is kept, trimmed.
func (t *tailBuffer) String() string { return strings.TrimSpace(string(t.b)) }
