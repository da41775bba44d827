//go:build linux

package layers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// canonicalHeader starts the canonical form; bump the version if the form ever changes.
const canonicalHeader = "corral.layer.v1\n"

// Overlay whiteout spellings (OCI image-spec, "Whiteouts").
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	opaqueMarker   = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
)

// capabilityXattr holds a file's capabilities; an import keeps it only with SetIDKeep.
const capabilityXattr = "security.capability"

// fileID names an inode.
type fileID struct{ dev, ino uint64 }

// xattr is one extended attribute.
type xattr struct {
	name  string
	value []byte
}

// node is one entry of a tree, as walkTree reports it.
type node struct {
	rel    string // slash-separated path from the root; "" for the root itself
	dirfd  int    // the parent directory (the root's own fd for the root); valid during the callback
	name   string // name inside dirfd; "." for the root
	st     unix.Stat_t
	target string  // symlink text
	xattrs []xattr // preserved attributes only (keepXattr), sorted by name
	linkTo string  // set when an earlier entry (in walk order) has the same inode: that entry's rel
}

func (n *node) typ() uint32 { return n.st.Mode & unix.S_IFMT }

// isWhiteout reports whether st is an overlayfs whiteout: a 0:0 character device.
func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// keepXattr reports whether an extended attribute is part of a layer: it is preserved on import,
// written by WriteTar and covered by the digest.
func keepXattr(name string) bool {
	switch {
	case name == capabilityXattr, name == opaqueXattr:
		return true
	case strings.HasPrefix(name, "user.overlay."):
		return false // steers overlayfs mounted with userxattr; never trusted from a layer
	case strings.HasPrefix(name, "user."):
		return true
	}
	return false
}

// walkTree calls fn for every entry of the tree at root, the root first, in depth-first pre-order
// with the names of each directory sorted bytewise: the order of the canonical form. It never
// follows a symlink below root. Sockets are reported too; callers skip them.
func walkTree(ctx context.Context, root string, fn func(*node) error) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(fd)
	w := &walker{ctx: ctx, fn: fn, links: make(map[fileID]string), buf: make([]byte, 32<<10)}
	n := &node{dirfd: fd, name: "."}
	if err := unix.Fstat(fd, &n.st); err != nil {
		return &os.PathError{Op: "stat", Path: root, Err: err}
	}
	if n.xattrs, err = readXattrs(fd, "."); err != nil {
		return &os.PathError{Op: "listxattr", Path: root, Err: err}
	}
	if err := fn(n); err != nil {
		return err
	}
	return w.dir(fd, "", root)
}

type walker struct {
	ctx   context.Context
	fn    func(*node) error
	links map[fileID]string // first rel seen for each multiply-linked inode
	buf   []byte            // getdents buffer
}

// dir reports the entries of the directory open as fd, then descends into its subdirectories.
// It holds one fd per level; Go raises RLIMIT_NOFILE at start, and PATH_MAX bounds the depth.
func (w *walker) dir(fd int, rel, root string) error {
	names, err := readDirNames(fd, w.buf)
	if err != nil {
		return &os.PathError{Op: "readdir", Path: joinRel(root, rel), Err: err}
	}
	slices.Sort(names)
	for _, name := range names {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		n := &node{dirfd: fd, name: name, rel: joinRel(rel, name)}
		if err := unix.Fstatat(fd, name, &n.st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "lstat", Path: joinRel(root, n.rel), Err: err}
		}
		typ := n.typ()
		if typ != unix.S_IFDIR && n.st.Nlink > 1 && !isWhiteout(&n.st) {
			id := fileID{n.st.Dev, n.st.Ino}
			if first, ok := w.links[id]; ok {
				n.linkTo = first
			} else {
				w.links[id] = n.rel
			}
		}
		if n.linkTo == "" {
			if typ == unix.S_IFLNK {
				if n.target, err = readlinkat(fd, name); err != nil {
					return &os.PathError{Op: "readlink", Path: joinRel(root, n.rel), Err: err}
				}
			}
			if n.xattrs, err = readXattrs(fd, name); err != nil {
				return &os.PathError{Op: "listxattr", Path: joinRel(root, n.rel), Err: err}
			}
		}
		if err := w.fn(n); err != nil {
			if err == fs.SkipDir {
				continue // the callback leaves out this entry and everything below it
			}
			return err
		}
		if typ == unix.S_IFDIR {
			cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return &os.PathError{Op: "open", Path: joinRel(root, n.rel), Err: err}
			}
			err = w.dir(cfd, n.rel, root)
			unix.Close(cfd)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// readDirNames lists the directory open as fd, without "." and "..".
func readDirNames(fd int, buf []byte) ([]string, error) {
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		b := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, b)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(b[:n]), nil
		}
	}
}

// procPath names dirfd/name through /proc, so that the l*xattr calls, which only take paths, can
// reach an entry relative to a directory fd without following a symlink in its last component.
func procPath(dirfd int, name string) string {
	return procFD(dirfd) + "/" + name
}

// procFD names the file open as fd through /proc.
func procFD(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// readXattrs returns the preserved extended attributes of dirfd/name, sorted by name.
func readXattrs(dirfd int, name string) ([]xattr, error) {
	p := procPath(dirfd, name)
	var list []byte
	for size := 1024; ; size *= 4 {
		list = make([]byte, size)
		n, err := unix.Llistxattr(p, list)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		list = list[:n]
		break
	}
	var out []xattr
	for _, attr := range strings.Split(string(list), "\x00") {
		if attr == "" || !keepXattr(attr) {
			continue
		}
		v, err := lgetxattr(p, attr)
		if errors.Is(err, unix.ENODATA) {
			continue // removed between list and get
		}
		if err != nil {
			return nil, fmt.Errorf("getxattr %s: %w", attr, err)
		}
		out = append(out, xattr{name: attr, value: v})
	}
	slices.SortFunc(out, func(a, b xattr) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

func lgetxattr(path, attr string) ([]byte, error) {
	for size := 256; ; size *= 4 {
		b := make([]byte, size)
		n, err := unix.Lgetxattr(path, attr, b)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			continue
		}
		if err != nil {
			return nil, err
		}
		return b[:n], nil
	}
}

// canonical writes the canonical form of a tree.
type canonical struct {
	h   io.Writer
	buf []byte
}

func (c *canonical) field(key, value string) {
	c.buf = append(c.buf[:0], key...)
	c.buf = append(c.buf, ' ')
	c.buf = strconv.AppendInt(c.buf, int64(len(value)), 10)
	c.buf = append(c.buf, ' ')
	c.buf = append(c.buf, value...)
	c.buf = append(c.buf, '\n')
	c.h.Write(c.buf)
}

func (c *canonical) end() { c.h.Write([]byte{'\n'}) }

// digestTree computes the Blob (digest, content size, entry count) of the tree at root; see the
// package doc for the canonical form. known holds the content hashes of regular files, by inode,
// that the caller computed while writing them; other files are read and hashed here. A nil known
// rehashes everything, which is what Verify wants.
func digestTree(ctx context.Context, root string, known map[fileID][sha256.Size]byte) (Blob, error) {
	return canonicalForm(ctx, root, known, nil)
}

// canonicalForm is digestTree that also writes the canonical form to w, if not nil.
func canonicalForm(ctx context.Context, root string, known map[fileID][sha256.Size]byte, w io.Writer) (Blob, error) {
	h := sha256.New()
	c := &canonical{h: h}
	if w != nil {
		c.h = io.MultiWriter(h, w)
	}
	io.WriteString(c.h, canonicalHeader)
	var blob Blob
	content := sha256.New()
	buf := make([]byte, 256<<10)
	err := walkTree(ctx, root, func(n *node) error {
		typ := n.typ()
		if typ == unix.S_IFSOCK {
			return nil // cannot be archived; not part of a layer
		}
		if n.rel == "" {
			c.field("path", ".")
		} else {
			c.field("path", n.rel)
			blob.Files++
		}
		defer c.end()
		if n.linkTo != "" {
			c.field("type", "hardlink")
			c.field("target", n.linkTo)
			return nil
		}
		if isWhiteout(&n.st) {
			c.field("type", "whiteout")
			return nil
		}
		c.field("type", typeName(typ))
		c.field("mode", fmt.Sprintf("%04o", n.st.Mode&0o7777))
		c.field("uid", strconv.FormatUint(uint64(n.st.Uid), 10))
		c.field("gid", strconv.FormatUint(uint64(n.st.Gid), 10))
		switch typ {
		case unix.S_IFREG:
			sum, ok := known[fileID{n.st.Dev, n.st.Ino}]
			if !ok {
				fd, err := unix.Openat(n.dirfd, n.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					return &os.PathError{Op: "open", Path: n.rel, Err: err}
				}
				f := os.NewFile(uintptr(fd), n.rel)
				content.Reset()
				_, err = io.CopyBuffer(content, f, buf)
				f.Close()
				if err != nil {
					return fmt.Errorf("hash %s: %w", n.rel, err)
				}
				content.Sum(sum[:0])
			}
			c.field("size", strconv.FormatInt(n.st.Size, 10))
			c.field("sha256", hex.EncodeToString(sum[:]))
			blob.Size += n.st.Size
		case unix.S_IFLNK:
			c.field("target", n.target)
		case unix.S_IFCHR, unix.S_IFBLK:
			c.field("rdev", fmt.Sprintf("%d:%d", unix.Major(n.st.Rdev), unix.Minor(n.st.Rdev)))
		}
		for _, x := range n.xattrs {
			c.field("xattr", x.name+"\x00"+string(x.value))
		}
		return nil
	})
	if err != nil {
		return Blob{}, err
	}
	blob.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	return blob, nil
}

func typeName(typ uint32) string {
	switch typ {
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFREG:
		return "reg"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFCHR:
		return "char"
	case unix.S_IFBLK:
		return "block"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	}
	return "unknown"
}
