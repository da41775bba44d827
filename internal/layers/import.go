//go:build linux

package layers

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// maxTrailing is how much decompressed data may follow the end of the tar archive (tar writers pad
// to a 10 KiB record). Reading it to the end checks the gzip or zstd checksum.
const maxTrailing = 1 << 20

// zstdMaxWindow bounds the memory a zstd frame may ask for; zstd --ultra -22 uses 128 MiB.
const zstdMaxWindow = 128 << 20

// ImportTar reads a tar archive (plain, gzip or zstd, detected from its first bytes), stores its
// tree and returns the blob. If a blob with the same digest is already stored, the new copy is
// discarded and the stored blob is returned. On error nothing is left in the store.
//
// What it accepts:
//   - Names are relative paths; a leading "./" and trailing slashes are fine. Absolute names, ".."
//     or "." components, empty components, NUL bytes, names of PATH_MAX (4096) bytes or more,
//     components over NAME_MAX (255) and names more than 512 components deep are refused.
//   - Parent directories missing from the archive are created 0755. No entry is ever created
//     through a symlink, so "a -> /etc" followed by "a/passwd" is refused. Symlink targets are
//     stored as written, absolute or with "..": they resolve inside the container.
//   - A hardlink must name an entry extracted earlier, by a path that passes the same rules, and
//     not a directory or whiteout.
//   - Regular files, directories, symlinks, hardlinks and fifos are accepted; character and block
//     devices only with Config.AllowDevices, except the 0:0 character device, overlayfs's whiteout.
//     Contiguous files and other types are refused; GNU sparse files are written out in full.
//   - A repeated name must keep its type: a later file, symlink, fifo or device replaces the
//     earlier one (as tar does), a later directory updates the earlier one's metadata, a change
//     of type is refused. A whiteout never replaces an entry of the same layer, and an entry
//     replaces a whiteout, since OCI whiteouts only hide lower layers; a directory that replaces
//     a whiteout is new and so opaque (the lower layers' directory of that name stays hidden).
//   - OCI whiteouts become overlayfs ones: ".wh.NAME" a 0:0 character device NAME and
//     ".wh..wh..opq" the xattr trusted.overlay.opaque=y on its directory. Other ".wh..wh." names
//     (AUFS bookkeeping) are skipped.
//   - Owner (numeric; names are ignored), mode, mtime and atime are kept; setuid/setgid and file
//     capabilities (security.capability) follow Config.SetID (dropped by default). Extended
//     attributes user.* are kept, trusted.overlay.* (but an opaque directory's) and user.overlay.*
//     are refused, others (other security.* and trusted.*, ACLs) are dropped with a log line.
//   - Limits: Config.MaxBytes of file content, Config.MaxEntries entries, Config.MaxRatio
//     expansion over the input. Corrupt tar, gzip or zstd data and an empty (0-byte) input are
//     refused; xz and bzip2 are refused by name.
//
// Refusals wrap errdefs.ErrInvalid or errdefs.ErrTooLarge and name the entry and the reason. A
// full disk wraps errdefs.ErrExhausted. ImportTar checks ctx between reads; a Read that blocks
// must be unblocked by its owner (net/http does so for request bodies).
func (s *Store) ImportTar(ctx context.Context, r io.Reader) (Blob, error) {
	start := time.Now()
	stage, err := os.MkdirTemp(s.stagingDir, "import-")
	if err != nil {
		return Blob{}, s.importError(ctx, fmt.Errorf("create staging directory: %w", err))
	}
	blob, stored, in, err := s.importTar(ctx, r, stage)
	if rerr := removeAll(stage); rerr != nil {
		// Open removes it at the next start.
		s.log.Error("remove staging directory", "dir", stage, "err", rerr)
	}
	if err != nil {
		return Blob{}, s.importError(ctx, err)
	}
	took := time.Since(start)
	s.log.Info("layer imported", "digest", blob.Digest, "size", blob.Size, "files", blob.Files,
		"input_bytes", in, "new", stored, "image_bytes", blob.ImageSize, "took", took.Round(time.Millisecond),
		"mb_per_s", int64(float64(blob.Size)/1e6/max(took.Seconds(), 1e-9)))
	return blob, nil
}

// importError gives an import failure its kind.
func (s *Store) importError(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("import layer: %w", cerr)
	}
	if isNoSpace(err) {
		s.log.Error("layer import ran out of space", "dir", s.cfg.Dir, "err", err)
		return fmt.Errorf("import layer: no space left in the layer store: %w", errdefs.ErrExhausted)
	}
	return fmt.Errorf("import layer: %w", err)
}

// importTar extracts r into stage/fs and publishes the tree as an EROFS image unless the same
// content is stored already; stored says whether it published.
func (s *Store) importTar(ctx context.Context, r io.Reader, stage string) (blob Blob, stored bool, in int64, err error) {
	counted := &countingReader{r: r}
	br := bufio.NewReaderSize(counted, 64<<10)
	stream, compressed, closeStream, err := decompress(br)
	if err != nil {
		return Blob{}, false, counted.n, err
	}
	defer closeStream()

	tree := filepath.Join(stage, "fs")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return Blob{}, false, counted.n, err
	}
	rootfd, err := unix.Open(tree, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Blob{}, false, counted.n, &os.PathError{Op: "open", Path: tree, Err: err}
	}
	defer unix.Close(rootfd)
	if err := unix.Fchmod(rootfd, 0o755); err != nil { // undo the umask
		return Blob{}, false, counted.n, err
	}

	x := newExtractor(ctx, s.cfg, s.log, rootfd, counted)
	defer x.close()
	tr := tar.NewReader(&ctxReader{ctx: ctx, r: stream})
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Blob{}, false, counted.n, readError(err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return Blob{}, false, counted.n, err
		}
	}
	if compressed {
		n, err := io.Copy(io.Discard, io.LimitReader(stream, maxTrailing+1))
		if err != nil {
			return Blob{}, false, counted.n, readError(err)
		}
		if n > maxTrailing {
			return Blob{}, false, counted.n, invalidArchive("more than %d bytes follow the end of the tar archive", maxTrailing)
		}
	}
	if err := x.finish(); err != nil {
		return Blob{}, false, counted.n, err
	}

	blob, err = digestTree(ctx, tree, x.hashes)
	if err != nil {
		return Blob{}, false, counted.n, fmt.Errorf("digest tree: %w", err)
	}
	// One conversion per digest at a time in this process: a concurrent import of the same
	// content waits and then finds it stored.
	done, err := s.claimDigest(ctx, blob.Digest)
	if err != nil {
		return Blob{}, false, counted.n, err
	}
	defer done()
	// Ask the blob store, not the memory of this process: another node may have removed it.
	s.forget(blob.Digest)
	if m, err := s.meta(ctx, blob.Digest); err == nil {
		return m.blob(), false, counted.n, nil // the same content is stored
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return Blob{}, false, counted.n, err
	}
	blob, err = s.publish(ctx, stage, tree, blob)
	if err != nil {
		return Blob{}, false, counted.n, err
	}
	return blob, true, counted.n, nil
}

// claimDigest waits until no other import of this process is publishing digest and claims it;
// done releases the claim.
func (s *Store) claimDigest(ctx context.Context, digest string) (done func(), err error) {
	for {
		s.mu.Lock()
		busy, ok := s.importing[digest]
		if !ok {
			ch := make(chan struct{})
			s.importing[digest] = ch
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.importing, digest)
				s.mu.Unlock()
				close(ch)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// readError classifies an error met while reading the archive: cancellation, a failure of the
// caller's reader and the store's own refusals pass through, anything else is a malformed archive.
func readError(err error) error {
	var rej *rejectError
	var src *sourceError
	switch {
	case errors.As(err, &rej), errors.As(err, &src),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalidArchive("archive is truncated")
	}
	return invalidArchive("malformed archive: %v", err)
}

// decompress detects the compression of the input from its magic number.
func decompress(br *bufio.Reader) (stream io.Reader, compressed bool, closeFn func(), err error) {
	magic, err := br.Peek(6)
	if len(magic) == 0 {
		if err == io.EOF {
			return nil, false, nil, invalidArchive("archive is empty (0 bytes); an empty layer is a tar archive with no entries")
		}
		return nil, false, nil, err
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, false, nil, readError(err)
		}
		return zr, true, func() { zr.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}),
		len(magic) >= 4 && magic[0]&0xf0 == 0x50 && bytes.Equal(magic[1:4], []byte{0x2a, 0x4d, 0x18}): // skippable frame
		// One goroutine: the decoder runs in the caller's, so nothing outlives ImportTar.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			return nil, false, nil, err
		}
		return zr, true, zr.Close, nil
	case bytes.HasPrefix(magic, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return nil, false, nil, invalidArchive("xz-compressed archives are not supported; send a plain, gzip or zstd tar")
	case bytes.HasPrefix(magic, []byte("BZh")):
		return nil, false, nil, invalidArchive("bzip2-compressed archives are not supported; send a plain, gzip or zstd tar")
	}
	return br, false, func() {}, nil
}

// countingReader counts the bytes read from the caller and marks the caller's errors.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		err = &sourceError{err}
	}
	return n, err
}

// sourceError is a failure of the caller's reader, not of the archive.
type sourceError struct{ err error }

func (e *sourceError) Error() string { return "read archive: " + e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// ctxReader stops reading once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
