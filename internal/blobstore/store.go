//go:build linux

package blobstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Info describes one stored object.
type Info struct {
	Key     string    // the key the object was stored under
	Size    int64     // length in bytes
	ModTime time.Time // when the object was last written, as the backend records it
}

// Store is a flat namespace of objects addressed by key, each written whole by Put and never
// modified in place. Every method is safe for concurrent use, by goroutines of one process and by
// processes on several hosts that open the same location. Every method checks its key first; a
// bad key fails with an error that wraps errdefs.ErrInvalid and names it.
type Store interface {
	// Put stores r under key, replacing any object already there. size is the exact length when
	// known, or -1; a reader that yields more or fewer bytes than a known size fails the Put with
	// errdefs.ErrInvalid. The object becomes visible whole or not at all: a failed or cancelled Put
	// leaves the previous object (or none) in place, except that on S3 an error that comes after
	// the server had every byte (a lost response) leaves the outcome unknown; Put again to be sure.
	// Concurrent Puts of one key all succeed and one of them wins whole. Cancelling ctx takes
	// effect at the next Read of r; a Read that blocks is not interrupted.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get opens key for reading. A missing key is an error wrapping errdefs.ErrNotFound. The caller
	// must close the reader; ctx bounds the whole read for the S3 backend.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// GetRange reads length bytes of key from off. The reader is short when the object ends first
	// and empty when off is at or past the end. A negative off or length wraps errdefs.ErrInvalid; a
	// missing key wraps errdefs.ErrNotFound.
	GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error)
	// Stat describes key. A missing key wraps errdefs.ErrNotFound.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes key. A missing key is not an error. A Get that opened the object before the
	// Delete may still read it to the end on the directory backend.
	Delete(ctx context.Context, key string) error
	// List returns every object whose key starts with prefix, sorted by key. prefix is a key, a key
	// followed by '/', a key's beginning, or empty for all objects.
	List(ctx context.Context, prefix string) ([]Info, error)
	// String names the location for logs. It never includes credentials.
	String() string
}

// Key limits. The per-segment limit is the usual filesystem NAME_MAX, so that every valid key can
// be stored by the directory backend too.
const (
	MaxKeyLen     = 512 // bytes in a whole key
	MaxSegmentLen = 255 // bytes in one '/'-separated segment
)

// tmpDir is the directory backend's staging directory under the root. A key's first segment may
// not be tmpDir on any backend, so that a key means the same thing everywhere.
const tmpDir = ".tmp"

// CheckKey reports whether key is a valid object key: non-empty, at most MaxKeyLen bytes,
// '/'-separated segments of [A-Za-z0-9._:-] of at most MaxSegmentLen bytes, no empty, "." or ".."
// segment, and a first segment other than ".tmp". The error wraps errdefs.ErrInvalid and quotes
// the key.
func CheckKey(key string) error {
	if key == "" {
		return errdefs.Invalid("key", "empty key")
	}
	if len(key) > MaxKeyLen {
		return errdefs.Invalid("key", "%s is %d bytes long; the limit is %d", quoteKey(key), len(key), MaxKeyLen)
	}
	for i, seg := range strings.Split(key, "/") {
		if err := checkSegment(key, seg); err != nil {
			return err
		}
		if i == 0 && seg == tmpDir {
			return errdefs.Invalid("key", "%s starts with %q, which is reserved", quoteKey(key), tmpDir)
		}
	}
	return nil
}

// checkPrefix checks a List prefix: an empty string, or complete key segments each followed by
// '/' and then the beginning of one more segment.
func checkPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if len(prefix) > MaxKeyLen {
		return errdefs.Invalid("prefix", "%s is %d bytes long; the limit is %d", quoteKey(prefix), len(prefix), MaxKeyLen)
	}
	if strings.HasPrefix(prefix, "/") {
		return errdefs.Invalid("prefix", "%s starts with '/'", quoteKey(prefix))
	}
	dir, last := splitPrefix(prefix)
	if dir != "" {
		if err := CheckKey(dir); err != nil {
			return errdefs.Invalid("prefix", "%s: %v", quoteKey(prefix), err)
		}
	}
	if len(last) > MaxSegmentLen {
		return errdefs.Invalid("prefix", "%s has a segment longer than %d bytes", quoteKey(prefix), MaxSegmentLen)
	}
	if i := strings.IndexFunc(last, func(c rune) bool { return !keyChar(c) }); i >= 0 {
		return errdefs.Invalid("prefix", "%s has the character %q, allowed are A-Z a-z 0-9 . _ : -", quoteKey(prefix), last[i])
	}
	return nil
}

// splitPrefix splits prefix at its last '/': the directory part (without the slash) and the
// beginning of a segment below it.
func splitPrefix(prefix string) (dir, last string) {
	i := strings.LastIndexByte(prefix, '/')
	if i < 0 {
		return "", prefix
	}
	return prefix[:i], prefix[i+1:]
}

func checkSegment(key, seg string) error {
	switch {
	case seg == "" && strings.HasPrefix(key, "/"):
		return errdefs.Invalid("key", "%s starts with '/'", quoteKey(key))
	case seg == "":
		return errdefs.Invalid("key", "%s has an empty segment", quoteKey(key))
	case seg == "." || seg == "..":
		return errdefs.Invalid("key", "%s has the segment %q", quoteKey(key), seg)
	case len(seg) > MaxSegmentLen:
		return errdefs.Invalid("key", "%s has a segment longer than %d bytes", quoteKey(key), MaxSegmentLen)
	}
	for i := 0; i < len(seg); i++ {
		if !keyChar(rune(seg[i])) {
			return errdefs.Invalid("key", "%s has the byte %q, allowed are A-Z a-z 0-9 . _ : - and '/' between segments", quoteKey(key), seg[i])
		}
	}
	return nil
}

func keyChar(c rune) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == ':' || c == '-'
}

// quoteKey quotes a key for an error message, cut short when it is too long to read.
func quoteKey(key string) string {
	if len(key) > 80 {
		return fmt.Sprintf("%q...", key[:80])
	}
	return fmt.Sprintf("%q", key)
}

// checkRange checks GetRange's arguments.
func checkRange(off, length int64) error {
	if off < 0 {
		return errdefs.Invalid("offset", "negative offset %d", off)
	}
	if length < 0 {
		return errdefs.Invalid("length", "negative length %d", length)
	}
	return nil
}

// Open parses a store spec and opens the store it names. The forms are:
//
//	dir:/abs/path   a directory, created 0700 if missing (a bare absolute path works too)
//	s3://bucket[/prefix]?endpoint=http://127.0.0.1:9000&region=us-east-1[&access_key_file=/path]
//
// The S3 form uses path-style addressing; endpoint defaults to https://s3.amazonaws.com and
// region to us-east-1. Credentials come from access_key_file (two lines: the access key, then
// the secret) or else from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the optional
// AWS_SESSION_TOKEN. Open checks that the bucket exists and that the server accepts the
// credentials. A malformed spec wraps errdefs.ErrInvalid, a missing bucket errdefs.ErrNotFound,
// refused credentials errdefs.ErrDenied and an unreachable endpoint errdefs.ErrUnavailable.
func Open(ctx context.Context, spec string) (Store, error) {
	cfg, err := parseSpec(spec)
	if err != nil {
		return nil, err
	}
	if cfg.s3 != nil {
		return openS3(ctx, *cfg.s3)
	}
	return openDir(ctx, cfg.dir)
}

// storeSpec is a parsed spec: dir is set for the directory backend, s3 for S3.
type storeSpec struct {
	dir string
	s3  *s3Spec
}

// s3Spec is the S3 part of a spec. Credentials are resolved by openS3, not here, so that parsing
// stays free of I/O.
type s3Spec struct {
	bucket        string
	prefix        string // empty, or a valid key; objects are stored as prefix + "/" + key
	endpoint      *url.URL
	region        string
	accessKeyFile string
}

const (
	defaultS3Endpoint = "https://s3.amazonaws.com"
	defaultS3Region   = "us-east-1"
)

func parseSpec(spec string) (storeSpec, error) {
	switch {
	case strings.HasPrefix(spec, "dir:"):
		return parseDirSpec(spec, strings.TrimPrefix(spec, "dir:"))
	case strings.HasPrefix(spec, "/"):
		return parseDirSpec(spec, spec)
	case strings.HasPrefix(spec, "s3://"):
		s, err := parseS3Spec(spec)
		return storeSpec{s3: s}, err
	}
	return storeSpec{}, errdefs.Invalid("store", "%q is not a store spec; use dir:/abs/path or s3://bucket[/prefix]?endpoint=URL", spec)
}

func parseDirSpec(spec, path string) (storeSpec, error) {
	if !filepath.IsAbs(path) {
		return storeSpec{}, errdefs.Invalid("store", "%q: the directory must be an absolute path", spec)
	}
	return storeSpec{dir: filepath.Clean(path)}, nil
}

func parseS3Spec(spec string) (*s3Spec, error) {
	u, err := url.Parse(spec)
	if err != nil {
		// url.Error repeats the whole spec, which may hold a pasted secret.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, errdefs.Invalid("store", "parse %q: %v", redactSpec(spec), err)
	}
	if u.User != nil {
		return nil, errdefs.Invalid("store", "%s: credentials do not belong in the spec; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or give access_key_file=", redactSpec(spec))
	}
	if u.Fragment != "" || u.RawFragment != "" {
		return nil, errdefs.Invalid("store", "%q: a store spec has no #fragment", spec)
	}
	s := &s3Spec{bucket: u.Host, prefix: strings.Trim(u.Path, "/"), region: defaultS3Region}
	if err := s3utils.CheckValidBucketNameStrict(u.Host); err != nil || u.Port() != "" {
		return nil, errdefs.Invalid("store", "%q: %q is not a valid bucket name (3-63 of a-z 0-9 . -)", spec, u.Host)
	}
	if s.prefix != "" {
		if err := CheckKey(s.prefix); err != nil {
			return nil, errdefs.Invalid("store", "%q: bad prefix: %v", spec, err)
		}
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, errdefs.Invalid("store", "%q: parse query: %v", spec, err)
	}
	endpoint := defaultS3Endpoint
	for name, vals := range q {
		if len(vals) != 1 {
			return nil, errdefs.Invalid("store", "%q: %s is given %d times", spec, name, len(vals))
		}
		switch v := vals[0]; name {
		case "endpoint":
			endpoint = v
		case "region":
			s.region = v
		case "access_key_file":
			if !filepath.IsAbs(v) {
				return nil, errdefs.Invalid("store", "%q: access_key_file must be an absolute path", spec)
			}
			s.accessKeyFile = v
		default:
			return nil, errdefs.Invalid("store", "%q: unknown parameter %q; known are endpoint, region and access_key_file", spec, name)
		}
	}
	if s.region == "" {
		return nil, errdefs.Invalid("store", "%q: empty region", spec)
	}
	if s.endpoint, err = parseEndpoint(endpoint); err != nil {
		return nil, errdefs.Invalid("store", "%q: %v", spec, err)
	}
	return s, nil
}

func parseEndpoint(endpoint string) (*url.URL, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("endpoint: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("endpoint %q: the scheme must be http or https", endpoint)
	}
	if u.Host == "" || u.User != nil || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("endpoint %q: want scheme://host[:port] and nothing more", endpoint)
	}
	return &url.URL{Scheme: u.Scheme, Host: u.Host}, nil
}

// redactSpec drops any user information from a spec that failed to parse, so a secret pasted into
// it does not reach the log.
func redactSpec(spec string) string {
	rest, ok := strings.CutPrefix(spec, "s3://")
	if !ok {
		return spec
	}
	if at := strings.IndexByte(rest, '@'); at >= 0 && !strings.ContainsAny(rest[:at], "/?#") {
		return "s3://REDACTED@" + rest[at+1:]
	}
	return spec
}

// putReader passes Put's reader through. It stops with ctx's error once ctx is done, checked
// before and after every Read so that a cancelled Put never hands its consumer the end of the
// data. It fails when a known size is not met, and it remembers the first error: Put reports
// putReader.err in preference to what the copy returned, which the S3 client may have reworded.
type putReader struct {
	ctx  context.Context
	r    io.Reader
	size int64 // the promised length, or -1
	n    int64 // bytes handed out
	err  error // the first failure: ctx's, the reader's or the length's
}

func newPutReader(ctx context.Context, r io.Reader, size int64) *putReader {
	return &putReader{ctx: ctx, r: r, size: size}
}

// Read implements io.Reader.
func (p *putReader) Read(b []byte) (int, error) {
	if p.err == nil {
		p.err = p.ctx.Err()
	}
	if p.err != nil {
		return 0, p.err
	}
	n, err := p.read(b)
	if p.err == nil {
		p.err = p.ctx.Err()
	}
	if p.err != nil {
		return 0, p.err
	}
	return n, err
}

func (p *putReader) read(b []byte) (int, error) {
	if p.size < 0 {
		n, err := p.r.Read(b)
		if err != nil && err != io.EOF {
			p.err = err
		}
		return n, err
	}
	if p.n == p.size {
		return 0, p.checkEnd()
	}
	if int64(len(b)) > p.size-p.n {
		b = b[:p.size-p.n]
	}
	n, err := p.r.Read(b)
	p.n += int64(n)
	switch {
	case err == io.EOF && p.n < p.size:
		p.err = errdefs.Invalid("size", "the reader ended after %d bytes, %d were promised", p.n, p.size)
	case err != nil && err != io.EOF:
		p.err = err
	case p.n == p.size:
		// Look for extra bytes before handing out the last ones: a consumer that stops at exactly
		// size bytes, as the S3 client does, would never see an error returned after them.
		if err := p.checkEnd(); err != io.EOF {
			return 0, err
		}
	}
	return n, p.err
}

// checkEnd reads past the promised end: io.EOF when the reader ends there, an error otherwise.
func (p *putReader) checkEnd() error {
	var b [1]byte
	for {
		n, err := p.r.Read(b[:])
		switch {
		case n > 0:
			p.err = errdefs.Invalid("size", "the reader has more than the %d bytes promised", p.size)
			return p.err
		case err == io.EOF:
			return io.EOF
		case err != nil:
			p.err = err
			return err
		}
	}
}
