package oci

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/corral-dev/corral/internal/errdefs"
)

// maxTrailing is how much uncompressed data may follow the end of a layer's tar archive (writers
// pad to a 10 KiB record); it is read to check the diff_id.
const maxTrailing = 1 << 20

// zstdMaxWindow bounds the memory a zstd frame may ask for; zstd --ultra -22 uses 128 MiB.
const zstdMaxWindow = 128 << 20

// errStalled is the cause of a download cancelled because no byte came for Options.Timeout.
var errStalled = errors.New("the transfer stalled")

// blobSource reads the stored bytes of an image's layers.
type blobSource interface {
	// openLayer opens the stored (possibly compressed) bytes of l.
	openLayer(ctx context.Context, l *layer) (io.ReadCloser, error)
	// remote says whether openLayer goes over the network: such layers are downloaded into
	// Options.TempDir before they are read, so that a broken transfer can be retried.
	remote() bool
	// describe names l for messages: "layer 2 (sha256:...) of image x".
	describe(l *layer) string
	// fail gives an error of openLayer, or of reading what it returned, its kind.
	fail(ctx context.Context, what string, err error) error
}

// session is the state of one Flatten or WriteGroup call.
type session struct {
	r       *Reader
	dir     string         // spool directory; "" for local sources
	spooled map[int]string // layer index -> downloaded blob
	inTotal map[int]bool   // layers whose size is in prog.total
	counted map[int]bool   // layers whose bytes prog.done already counts
	prog    progress
}

// begin starts a call that reads the layers idx, downloading them first if the source is remote,
// so that a registry failure fails the call before it writes anything. The caller must call end.
func (r *Reader) begin(ctx context.Context, idx []int) (*session, error) {
	s := &session{r: r, spooled: map[int]string{}, inTotal: map[int]bool{}, counted: map[int]bool{}}
	s.prog = progress{fn: r.opt.Progress, layers: len(r.layers)}
	for _, i := range idx {
		s.addTotal(i)
	}
	for _, i := range idx {
		if err := s.fetch(ctx, i); err != nil {
			s.end()
			return nil, err
		}
	}
	return s, nil
}

// addTotal counts layer i in the progress total, once.
func (s *session) addTotal(i int) {
	if !s.inTotal[i] {
		s.inTotal[i] = true
		s.prog.total += s.r.layers[i].size
	}
}

// fetch downloads layer i if the source is remote and it is not downloaded yet.
func (s *session) fetch(ctx context.Context, i int) error {
	if !s.r.src.remote() || s.spooled[i] != "" {
		return nil
	}
	if s.dir == "" {
		dir, err := os.MkdirTemp(s.r.opt.TempDir, "corral-oci-")
		if err != nil {
			return fmt.Errorf("create download directory: %w", err)
		}
		s.dir = dir
	}
	s.addTotal(i)
	p, err := s.download(ctx, i)
	if err != nil {
		return err
	}
	s.spooled[i] = p
	s.counted[i] = true
	return nil
}

// end removes the downloaded blobs.
func (s *session) end() {
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// download fetches layer i into the spool directory, retrying transfers that break.
func (s *session) download(ctx context.Context, i int) (string, error) {
	l := &s.r.layers[i]
	delay := s.r.opt.RetryDelay
	for attempt := 0; ; attempt++ {
		p, n, err := s.downloadOnce(ctx, l)
		if err == nil {
			s.prog.end(i)
			return p, nil
		}
		s.prog.done -= n
		if ctx.Err() != nil || attempt >= s.r.opt.Retries || !transientRead(err) {
			if errors.Is(err, errDigest) {
				return "", errdefs.Invalid("image", "%s: %v", s.r.src.describe(l), err)
			}
			return "", s.r.src.fail(ctx, s.r.src.describe(l), err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", s.r.src.fail(ctx, s.r.src.describe(l), ctx.Err())
		case <-t.C:
		}
		delay *= 3
	}
}

// downloadOnce makes one attempt at fetching l. n is the number of bytes it got.
func (s *session) downloadOnce(ctx context.Context, l *layer) (path string, n int64, err error) {
	f, err := os.CreateTemp(s.dir, "layer-")
	if err != nil {
		return "", 0, fmt.Errorf("create download file: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write download file: %w", cerr)
		}
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	timeout := s.r.opt.Timeout
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watchdog := time.AfterFunc(timeout, func() { cancel(errStalled) })
	defer watchdog.Stop()
	stalled := func(err error) error {
		if ctx.Err() == nil && errors.Is(context.Cause(dctx), errStalled) {
			return fmt.Errorf("%w: no data for %v", errStalled, timeout)
		}
		return err
	}

	rc, err := s.r.src.openLayer(dctx, l)
	if err != nil {
		return "", 0, stalled(err)
	}
	defer rc.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for {
		m, rerr := rc.Read(buf)
		watchdog.Reset(timeout)
		if m > 0 {
			if _, err := f.Write(buf[:m]); err != nil {
				return "", n, fmt.Errorf("write download file: %w", err)
			}
			h.Write(buf[:m])
			n += int64(m)
			s.prog.add(int64(m), l.index)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return "", n, stalled(rerr)
		}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != l.digest.Hex {
		return "", n, fmt.Errorf("%w: content has digest sha256:%s, want %s", errDigest, got, l.digest)
	}
	if n != l.size {
		return "", n, fmt.Errorf("%w: got %d bytes, the manifest says %d", errDigest, n, l.size)
	}
	return f.Name(), n, nil
}

// transientRead reports whether a broken download is worth another try.
func transientRead(err error) bool {
	return errors.Is(err, errStalled) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || isTimeout(err)
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// layerStream reads one layer: the stored bytes, decompressed, as a tar archive. Both the stored
// bytes and the uncompressed stream are hashed; check compares them with the layer's digest and
// diff_id once the archive has been read.
type layerStream struct {
	l      *layer
	what   string
	src    io.ReadCloser
	stored *hashReader // the stored bytes
	br     *bufio.Reader
	plain  *hashReader // the uncompressed tar
	tar    *tar.Reader
	prog   *progress // reports the end of the layer; nil when this read is not reported
	close  func()
}

// open opens layer i for reading from the start.
func (s *session) open(ctx context.Context, i int) (*layerStream, error) {
	l := &s.r.layers[i]
	what := s.r.src.describe(l)
	if err := s.fetch(ctx, i); err != nil {
		return nil, err
	}
	var rc io.ReadCloser
	var err error
	if p, ok := s.spooled[i]; ok {
		rc, err = os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("%s: open download: %w", what, err)
		}
	} else if rc, err = s.r.src.openLayer(ctx, l); err != nil {
		return nil, s.r.src.fail(ctx, what, err)
	}
	ls := &layerStream{l: l, what: what, src: rc}
	var in io.Reader = &ctxReader{ctx: ctx, r: rc}
	if !s.counted[i] {
		s.addTotal(i)
		s.counted[i] = true
		ls.prog = &s.prog
		in = &progressReader{r: in, p: &s.prog, layer: i}
	}
	ls.stored = newHashReader(&sourceReader{r: in})
	ls.br = bufio.NewReaderSize(ls.stored, 64<<10)
	plain, closeDec, err := decompress(ls.br)
	if err != nil {
		rc.Close()
		return nil, ls.readError(err)
	}
	ls.close = func() {
		closeDec()
		rc.Close()
	}
	ls.plain = newHashReader(plain)
	ls.tar = tar.NewReader(ls.plain)
	return ls, nil
}

// check reads what follows the end of the tar archive (at most maxTrailing bytes) and checks the
// uncompressed stream against the diff_id and the stored bytes against the digest.
func (ls *layerStream) check() error {
	// The rest of the uncompressed stream, then whatever the decompressor left unread.
	for _, r := range []io.Reader{ls.plain, ls.br} {
		n, err := io.Copy(io.Discard, io.LimitReader(r, maxTrailing+1))
		if err != nil {
			return ls.readError(err)
		}
		if n > maxTrailing {
			return errdefs.Invalid("image", "%s: more than %d bytes follow the end of the tar archive", ls.what, maxTrailing)
		}
	}
	if got := ls.plain.sum(); got != ls.l.diffID.String() {
		return errdefs.Invalid("image", "%s: uncompressed content has digest %s, but the config's diff_id is %s", ls.what, got, ls.l.diffID)
	}
	if ls.l.digest.Hex != "" {
		if got := ls.stored.sum(); got != ls.l.digest.String() {
			return errdefs.Invalid("image", "%s: content has digest %s, want %s", ls.what, got, ls.l.digest)
		}
	}
	if ls.prog != nil {
		ls.prog.end(ls.l.index)
	}
	return nil
}

// readError classifies an error met while reading the layer: the source's own failures keep
// their kind, everything else (corrupt compression or tar) is the layer's fault.
func (ls *layerStream) readError(err error) error {
	var se *sourceError
	if errors.As(err, &se) {
		if errors.Is(se.err, context.Canceled) || errors.Is(se.err, context.DeadlineExceeded) {
			return fmt.Errorf("%s: %w", ls.what, se.err)
		}
		return fmt.Errorf("read %s: %w", ls.what, se.err)
	}
	return errdefs.Invalid("image", "%s: %v", ls.what, err)
}

// decompress detects gzip and zstd from the first bytes; anything else is read as is.
func decompress(br *bufio.Reader) (io.Reader, func(), error) {
	magic, err := br.Peek(6)
	if err != nil && err != io.EOF {
		var se *sourceError
		if errors.As(err, &se) {
			return nil, nil, err
		}
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, func() { zr.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(zstdMaxWindow), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, fmt.Errorf("zstd: %w", err)
		}
		return zr, zr.Close, nil
	case bytes.HasPrefix(magic, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return nil, nil, errors.New("xz-compressed layers are not supported")
	case bytes.HasPrefix(magic, []byte("BZh")):
		return nil, nil, errors.New("bzip2-compressed layers are not supported")
	}
	return br, func() {}, nil
}

// hashReader hashes what is read through it.
type hashReader struct {
	r io.Reader
	h hash.Hash
}

func newHashReader(r io.Reader) *hashReader { return &hashReader{r: r, h: sha256.New()} }

// Read implements io.Reader.
func (h *hashReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	return n, err
}

func (h *hashReader) sum() string { return "sha256:" + hex.EncodeToString(h.h.Sum(nil)) }

// sourceError marks a failure to read the stored bytes, as opposed to a fault in them.
type sourceError struct{ err error }

// Error implements error.
func (e *sourceError) Error() string { return e.err.Error() }

// Unwrap returns the cause.
func (e *sourceError) Unwrap() error { return e.err }

type sourceReader struct{ r io.Reader }

// Read implements io.Reader.
func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = &sourceError{err}
	}
	return n, err
}

// ctxReader fails reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

// Read implements io.Reader.
func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// progress reports to Options.Progress.
type progress struct {
	fn          func(done, total int64, layer, layers int)
	done, total int64
	last        int64 // done at the last report
	layers      int
}

func (p *progress) add(n int64, layer int) {
	p.done += n
	if p.fn != nil && p.done-p.last >= 1<<20 {
		p.last = p.done
		p.fn(p.done, p.total, layer, p.layers)
	}
}

func (p *progress) end(layer int) {
	if p.fn != nil {
		p.last = p.done
		p.fn(p.done, p.total, layer, p.layers)
	}
}

type progressReader struct {
	r     io.Reader
	p     *progress
	layer int
}

// Read implements io.Reader.
func (r *progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.add(int64(n), r.layer)
	return n, err
}
