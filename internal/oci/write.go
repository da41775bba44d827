package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Flatten writes the image's root filesystem as one uncompressed tar: the layers applied in order,
// whiteouts and opaque directories resolved, no whiteout entries left. Entries are unique; the
// directories, symlinks, devices and fifos come first, depth-first, then the regular files, a
// file with several names as the file and hardlinks to it. A directory that no layer lists but
// that an entry needs is written 0755 and owned by root, as the layer store would create it. On
// error what was written is incomplete and must be discarded.
func (r *Reader) Flatten(ctx context.Context, w io.Writer) error {
	all := make([]int, len(r.layers))
	for i := range all {
		all[i] = i
	}
	return r.merge(ctx, all, false, w)
}

// Groups splits the layers into runs of consecutive layers whose stored sizes add up to at most
// threshold bytes, in order; a layer larger than threshold is a group of its own. A threshold of
// zero or less makes every layer its own group.
func (r *Reader) Groups(threshold int64) [][]int {
	var groups [][]int
	var cur []int
	var sum int64
	for i, l := range r.layers {
		if len(cur) > 0 && (threshold <= 0 || sum+l.size > threshold) {
			groups = append(groups, cur)
			cur, sum = nil, 0
		}
		cur = append(cur, i)
		sum += l.size
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	return groups
}

// WriteGroup writes the layers of group (consecutive indexes, ascending, as Groups returns them)
// as one uncompressed tar that the layer store imports as one layer; stacked in order, the groups
// of an image show what Flatten writes.
//
// The layers are merged as Flatten merges them (later layers win; a whiteout or opaque directory
// of a later layer removes what earlier layers of the group put there) and written in the same
// order, plus the whiteouts and opaque markers that may hide something below the group, as OCI
// ".wh.NAME" and ".wh..wh..opq" entries. A group that starts at layer 0 has nothing below it and
// gets none. A directory that replaces a file or a deleted directory is written opaque, also in a
// group of one layer: a layer that holds both ".wh.d" and "d/" means a new, empty d. A hardlink to
// a file of a layer below the group cannot be written and fails with errdefs.ErrInvalid. On error
// what was written is incomplete and must be discarded.
func (r *Reader) WriteGroup(ctx context.Context, group []int, w io.Writer) error {
	if len(group) == 0 {
		return errdefs.Invalid("group", "is empty")
	}
	for k, i := range group {
		if i < 0 || i >= len(r.layers) {
			return errdefs.Invalid("group", "layer %d is out of range: the image has %d layers", i, len(r.layers))
		}
		if k > 0 && i != group[k-1]+1 {
			return errdefs.Invalid("group", "layers %v are not consecutive and ascending", group)
		}
	}
	return r.merge(ctx, group, group[0] != 0, w)
}

// merge writes the layers idx merged; see Flatten and WriteGroup.
func (r *Reader) merge(ctx context.Context, idx []int, keep bool, w io.Writer) error {
	s, err := r.begin(ctx, idx)
	if err != nil {
		return err
	}
	defer s.end()
	names := make([]string, len(idx))
	for g, i := range idx {
		names[g] = r.src.describe(&r.layers[i])
	}
	m := newMerger(names, keep)

	// First pass: the headers.
	for g, i := range idx {
		if err := s.scan(ctx, i, func(e int, hdr *tar.Header, _ io.Reader) error {
			return m.apply(g, e, hdr)
		}); err != nil {
			return err
		}
	}

	if paths := m.uncertain(); len(paths) > 0 {
		if m.found, err = s.existsBelow(ctx, idx[0], paths); err != nil {
			return err
		}
	}

	// Second pass: the tree, then the files' content as the layers hold it.
	tw := tar.NewWriter(w)
	if err := m.writeTree(tw, len(idx)); err != nil {
		return fmt.Errorf("write merged layers: %w", err)
	}
	buf := make([]byte, 256<<10)
	for g, i := range idx {
		want := m.content[g]
		found := 0
		err := s.scan(ctx, i, func(e int, hdr *tar.Header, data io.Reader) error {
			ino := want[e]
			if ino == nil {
				return nil
			}
			found++
			if !hasContent(hdr.Typeflag) {
				return errdefs.Invalid("image", "%s changed between two reads", names[g])
			}
			h := outHeader(hdr, ino.names[0])
			if err := tw.WriteHeader(h); err != nil {
				return &writeErr{err}
			}
			if _, err := io.CopyBuffer(writerOnly{tw}, readerOnly{&readErrReader{data}}, buf); err != nil {
				var re *readErr
				if errors.As(err, &re) {
					return re.err
				}
				return &writeErr{err}
			}
			for _, n := range ino.names[1:] {
				if err := tw.WriteHeader(linkHeader(h, n, ino.names[0])); err != nil {
					return &writeErr{err}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if found != len(want) {
			return errdefs.Invalid("image", "%s changed between two reads", names[g])
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write merged layers: %w", err)
	}
	return nil
}

// scan reads layer i's archive, calling fn for each entry (e counts from 0) with a reader of its
// content, then checks the layer's digests.
func (s *session) scan(ctx context.Context, i int, fn func(e int, hdr *tar.Header, data io.Reader) error) error {
	ls, err := s.open(ctx, i)
	if err != nil {
		return err
	}
	defer ls.close()
	for e := 0; ; e++ {
		hdr, err := ls.tar.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return ls.readError(err)
		}
		if err := fn(e, hdr, ls.tar); err != nil {
			var we *writeErr
			if errors.As(err, &we) {
				return fmt.Errorf("write merged layers: %w", we.err)
			}
			if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrTooLarge) {
				return err
			}
			return ls.readError(err)
		}
	}
	return ls.check()
}

// writeErr marks a failure of the caller's writer.
type writeErr struct{ err error }

// Error implements error.
func (e *writeErr) Error() string { return e.err.Error() }

// Unwrap returns the cause.
func (e *writeErr) Unwrap() error { return e.err }

// readErr marks a failure to read, where reading and writing share one io.Copy.
type readErr struct{ err error }

// Error implements error.
func (e *readErr) Error() string { return e.err.Error() }

// Unwrap returns the cause.
func (e *readErr) Unwrap() error { return e.err }

type readErrReader struct{ r io.Reader }

// Read implements io.Reader.
func (r *readErrReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		err = &readErr{err}
	}
	return n, err
}

// writerOnly and readerOnly hide ReadFrom and WriteTo so that io.CopyBuffer uses its buffer and
// the read and write errors stay apart.
type writerOnly struct{ io.Writer }
type readerOnly struct{ io.Reader }

// existsBelow reports which of paths the image has as layers 0 to top-1 build it. It reads those
// layers from the top down and stops once every path is decided: a layer decides a path if it
// has an entry there (the path exists), or deletes or opaques it or a parent, or puts a file in
// a parent's place (it does not).
func (s *session) existsBelow(ctx context.Context, top int, paths []string) (map[string]bool, error) {
	undecided := map[string]bool{}
	interesting := map[string]bool{"": true}
	for _, p := range paths {
		undecided[p] = true
		for q := p; q != ""; q, _ = splitPath(q) {
			interesting[q] = true
		}
	}
	found := map[string]bool{}
	for j := top - 1; j >= 0 && len(undecided) > 0; j-- {
		created := map[string]bool{} // path -> is a directory
		hidden := map[string]bool{}  // deleted by a whiteout, or opaque (key: the directory + "/")
		err := s.scan(ctx, j, func(_ int, hdr *tar.Header, _ io.Reader) error {
			rel, why := cleanName(hdr.Name)
			if why != "" || rel == "" || hdr.Typeflag == tar.TypeXGlobalHeader {
				return nil // Flatten and WriteGroup of this layer say what is wrong with it
			}
			dir, base := splitPath(rel)
			switch {
			case base == opaqueMarker:
				if interesting[dir] {
					hidden[dir+"/"] = true
				}
			case hasMeta(rel):
			case strings.HasPrefix(base, whiteoutPrefix):
				if t := joinPath(dir, base[len(whiteoutPrefix):]); interesting[t] {
					hidden[t] = true
				}
			case interesting[rel]:
				created[rel] = hdr.Typeflag == tar.TypeDir
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		for p := range undecided {
			if _, ok := created[p]; ok {
				found[p] = true
				delete(undecided, p)
				continue
			}
			gone := hidden[p]
			for q := p; !gone && q != ""; {
				q, _ = splitPath(q)
				isDir, ok := created[q]
				gone = hidden[q+"/"] || (q != "" && (hidden[q] || ok && !isDir))
			}
			if gone {
				delete(undecided, p)
			}
		}
	}
	return found, nil
}
