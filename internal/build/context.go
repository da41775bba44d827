package build

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Limits on a build context, as on every archive Corral takes: its bytes, its entries and how
// much its files may expand to.
const (
	DefaultMaxContextBytes   int64 = 2 << 30
	DefaultMaxContextEntries       = 100_000
	maxIgnoreBytes                 = 1 << 20
)

// Context is an uploaded build context: a tar spooled to a file and indexed. Only regular files,
// directories and symbolic links are kept (a link is copied as a link, never followed); names
// are cleaned and checked, so nothing in it names a place outside it.
type Context struct {
	f       *os.File
	entries map[string]*Entry // by clean relative name; "." is the root
	names   []string          // sorted
	ignore  *Ignore
}

// Entry is one file of a context.
type Entry struct {
	Name   string // clean, relative, never "." or with ".."
	Hdr    tar.Header
	offset int64  // of the content in the spool file
	Sum    string // sha256 of the content (regular files)
}

// ReadContext spools the tar r into a temporary file in dir and indexes it. .dockerignore at the
// root of the archive is honoured (entries it excludes are dropped). Errors are ErrInvalid or
// ErrTooLarge.
func ReadContext(r io.Reader, dir string, maxBytes int64, maxEntries int) (c *Context, err error) {
	f, err := os.CreateTemp(dir, "build-context-*")
	if err != nil {
		return nil, fmt.Errorf("spool build context: %w", err)
	}
	os.Remove(f.Name()) // the open file is enough
	c = &Context{f: f, entries: map[string]*Entry{}}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	cr := &countReader{r: io.LimitReader(r, maxBytes+1)}
	tr := tar.NewReader(io.TeeReader(cr, f))
	var ignoreText []byte
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if cr.n > maxBytes {
				return nil, fmt.Errorf("build context is larger than %d bytes: %w", maxBytes, errdefs.ErrTooLarge)
			}
			return nil, errdefs.Invalid("context", "read tar: %v", err)
		}
		if n++; n > maxEntries {
			return nil, fmt.Errorf("build context has more than %d entries: %w", maxEntries, errdefs.ErrTooLarge)
		}
		name, why := cleanName(h.Name)
		if why != "" {
			return nil, errdefs.Invalid("context", "tar entry %q: %s", h.Name, why)
		}
		e := &Entry{Name: name, Hdr: *h}
		switch h.Typeflag {
		case tar.TypeReg:
			if h.Size < 0 {
				return nil, errdefs.Invalid("context", "tar entry %q: negative size", h.Name)
			}
			e.offset = cr.n // the content starts where the header ended
			sum := sha256.New()
			var dst io.Writer = sum
			var ig strings.Builder
			if name == ".dockerignore" {
				dst = io.MultiWriter(sum, &limitedBuilder{b: &ig, max: maxIgnoreBytes})
			}
			if _, err := io.Copy(dst, tr); err != nil {
				if cr.n > maxBytes {
					return nil, fmt.Errorf("build context is larger than %d bytes: %w", maxBytes, errdefs.ErrTooLarge)
				}
				return nil, errdefs.Invalid("context", "read %q: %v", h.Name, err)
			}
			e.Sum = hex.EncodeToString(sum.Sum(nil))
			if name == ".dockerignore" {
				ignoreText = []byte(ig.String())
			}
		case tar.TypeDir, tar.TypeSymlink:
			if name == "." {
				continue
			}
		case tar.TypeXGlobalHeader, tar.TypeXHeader:
			continue
		default:
			return nil, errdefs.Invalid("context", "tar entry %q: %s: only files, directories and symbolic links may be in a build context", h.Name, typeName(h.Typeflag))
		}
		if name == "." {
			return nil, errdefs.Invalid("context", "tar entry %q: the root is not a file", h.Name)
		}
		c.entries[name] = e
	}
	if cr.n > maxBytes {
		return nil, fmt.Errorf("build context is larger than %d bytes: %w", maxBytes, errdefs.ErrTooLarge)
	}
	if ignoreText != nil {
		ig, err := ParseIgnore(string(ignoreText))
		if err != nil {
			return nil, err
		}
		c.ignore = ig
		for name := range c.entries {
			if ig.Excludes(name) {
				delete(c.entries, name)
			}
		}
	}
	for name := range c.entries {
		c.names = append(c.names, name)
	}
	sort.Strings(c.names)
	return c, nil
}

// EmptyContext is the context of a build that uploaded none.
func EmptyContext() *Context { return &Context{entries: map[string]*Entry{}} }

// Close releases the spool file.
func (c *Context) Close() error {
	if c == nil || c.f == nil {
		return nil
	}
	return c.f.Close()
}

// Len is the number of entries kept.
func (c *Context) Len() int { return len(c.entries) }

// Entries returns the entries kept, sorted by name.
func (c *Context) Entries() []*Entry {
	out := make([]*Entry, 0, len(c.names))
	for _, name := range c.names {
		out = append(out, c.entries[name])
	}
	return out
}

// Open returns the content of a regular file entry.
func (c *Context) Open(e *Entry) io.Reader {
	return io.NewSectionReader(c.f, e.offset, e.Hdr.Size)
}

// cleanName checks a context entry name: relative, no "..", no NUL. It returns the cleaned
// name, or why it is refused.
func cleanName(name string) (string, string) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", "NUL in name"
	}
	if strings.HasPrefix(name, "/") {
		return "", "absolute path"
	}
	for _, p := range strings.Split(name, "/") {
		if p == ".." {
			return "", "path with \"..\" leaves the context"
		}
	}
	return path.Clean(name), ""
}

func typeName(t byte) string {
	switch t {
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "device node"
	case tar.TypeFifo:
		return "fifo"
	}
	return fmt.Sprintf("type %q", t)
}

// Copied is one file a COPY puts into the image: the context entry and where it goes, relative
// to the COPY's destination directory.
type Copied struct {
	Entry *Entry
	Rel   string // "" for the destination itself (a file COPY to a file name)
}

// ErrOutside is the cause of a COPY source that names a place outside the context.
var ErrOutside = errors.New("outside the build context")

// Select resolves one COPY source (a path or glob, relative to the context root; a leading / is
// the root) into the entries it copies, keyed by their destination path relative to the
// COPY's destination directory. A directory source copies what is in it, not itself.
func (c *Context) Select(src string) ([]Copied, bool, error) {
	if strings.IndexByte(src, 0) >= 0 {
		return nil, false, fmt.Errorf("COPY source %q: NUL in name", src)
	}
	rel := path.Clean("/" + src)
	for _, p := range strings.Split(src, "/") {
		if p == ".." {
			// path.Clean from the root keeps ".." inside, so refuse it where it is written.
			return nil, false, fmt.Errorf("COPY source %q: %w", src, ErrOutside)
		}
	}
	rel = strings.TrimPrefix(rel, "/")
	if rel == "" {
		rel = "."
	}
	if strings.ContainsAny(rel, "*?[") {
		var out []Copied
		matched := false
		for _, name := range c.names {
			ok, err := path.Match(rel, name)
			if err != nil {
				return nil, false, fmt.Errorf("COPY source %q: %v", src, err)
			}
			if !ok {
				continue
			}
			matched = true
			out = append(out, c.under(name, path.Base(name))...)
		}
		if !matched {
			return nil, false, fmt.Errorf("COPY source %q matches nothing in the build context", src)
		}
		return out, true, nil
	}
	if rel == "." {
		return c.under(".", ""), true, nil
	}
	e, ok := c.entries[rel]
	if !ok {
		// A directory implied by its files (tars need not list directories).
		if !c.hasUnder(rel) {
			return nil, false, fmt.Errorf("COPY source %q is not in the build context (or .dockerignore excludes it)", src)
		}
		return c.under(rel, ""), true, nil
	}
	if e.Hdr.Typeflag == tar.TypeDir {
		return c.under(rel, ""), true, nil
	}
	return []Copied{{Entry: e, Rel: ""}}, false, nil
}

// under returns the entries below dir (not dir itself), renamed below prefix. A non-directory
// name returns itself as prefix.
func (c *Context) under(dir, prefix string) []Copied {
	if e, ok := c.entries[dir]; ok && e.Hdr.Typeflag != tar.TypeDir {
		return []Copied{{Entry: e, Rel: prefix}}
	}
	var out []Copied
	if e, ok := c.entries[dir]; ok && prefix != "" {
		out = append(out, Copied{Entry: e, Rel: prefix})
	}
	pre := dir + "/"
	if dir == "." {
		pre = ""
	}
	for _, name := range c.names {
		if strings.HasPrefix(name, pre) {
			out = append(out, Copied{Entry: c.entries[name], Rel: path.Join(prefix, strings.TrimPrefix(name, pre))})
		}
	}
	return out
}

func (c *Context) hasUnder(dir string) bool {
	i := sort.SearchStrings(c.names, dir+"/")
	return i < len(c.names) && strings.HasPrefix(c.names[i], dir+"/")
}

type countReader struct {
	r io.Reader
	n int64
}

// Read counts what it reads.
func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

type limitedBuilder struct {
	b   *strings.Builder
	max int
}

// Write keeps the first max bytes and drops the rest.
func (l *limitedBuilder) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		if len(p) > room {
			l.b.Write(p[:room])
		} else {
			l.b.Write(p)
		}
	}
	return len(p), nil
}
