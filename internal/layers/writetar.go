//go:build linux

package layers

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// WriteTar writes the tree at dir to w as a deterministic tar archive that ImportTar turns back
// into the same tree and digest. The CLI uses it to push a directory as a layer.
//
// The archive lists "./" (the root's metadata) and then every entry in canonical order (see the
// package doc): numeric uid/gid without user or group names, permission and setuid/setgid/sticky
// bits, mtime to the second (no atime or ctime), symlink targets as they are, the second and later
// names of an inode as hardlinks to the first, fifos and devices, and the preserved extended
// attributes as PAX SCHILY.xattr records. Overlayfs whiteouts (0:0 character devices) become OCI
// ".wh.NAME" files and trusted.overlay.opaque directories get a ".wh..wh..opq" entry (both empty,
// mode 0, owner 0:0, mtime 0: a whiteout's metadata means nothing), so a layer that was imported
// exports the same archive. Sockets are skipped. A file whose own name starts
// with ".wh." cannot be represented and fails the call with errdefs.ErrInvalid. Symlinks are never
// followed below dir. Reading other users' files needs the rights to read them.
func WriteTar(ctx context.Context, dir string, w io.Writer) error {
	return WriteTarExcluding(ctx, dir, w, nil)
}

// WriteTarExcluding is WriteTar leaving out every entry whose path relative to dir is in exclude
// or below one that is (paths relative, cleaned, without a leading "/").
func WriteTarExcluding(ctx context.Context, dir string, w io.Writer, exclude []string) error {
	return WriteTarWith(ctx, dir, w, TarOptions{Exclude: exclude})
}

// Skipped is an entry a snapshot's archive left out, and why.
type Skipped struct {
	Path   string // relative to the tree's root
	Reason string
}

// Reasons an entry is skipped (Skipped.Reason).
const (
	SkipDevice      = "device node: a layer carries no devices"
	SkipSocket      = "socket: not a file a layer can hold"
	SkipWhiteout    = "name starts with .wh.: in a layer it would mean a whiteout and hide files below"
	SkipLinkSkipped = "hard link to a skipped or excluded entry"
)

// TarOptions configures WriteTarWith.
type TarOptions struct {
	// Exclude leaves out these paths and everything below them (relative, cleaned, without a
	// leading "/").
	Exclude []string
	// Skip, when set, makes the archive of a tree someone else made (a sandbox's writable
	// layer): what a layer cannot hold is left out and reported to Skip instead of failing
	// the call. That is device nodes other than whiteouts (ImportTar refuses them), sockets,
	// entries (a directory with all below it) whose name starts with ".wh." (an OCI whiteout's
	// spelling: ".wh.etc" would hide the lower layers' /etc, ".wh..wh..opq" every file beside
	// it), and hard links to any of those or to an excluded file. Skip is called in walk
	// order.
	Skip func(Skipped)
}

// WriteTarWith is WriteTar with options.
func WriteTarWith(ctx context.Context, dir string, w io.Writer, opts TarOptions) error {
	tw := tar.NewWriter(w)
	buf := make([]byte, 1<<20)
	excluded := make(map[string]bool, len(opts.Exclude))
	for _, e := range opts.Exclude {
		excluded[e] = true
	}
	skipped := map[string]bool{} // non-directories left out, for their hard links
	skip := func(n *node, reason string) error {
		if n.typ() != unix.S_IFDIR {
			skipped[n.rel] = true
		}
		opts.Skip(Skipped{Path: n.rel, Reason: reason})
		return fs.SkipDir
	}
	err := walkTree(ctx, dir, func(n *node) error {
		if excluded[n.rel] {
			if n.typ() != unix.S_IFDIR {
				skipped[n.rel] = true // a later hard link to it cannot name it
			}
			return fs.SkipDir
		}
		typ := n.typ()
		base := path.Base(n.rel)
		switch {
		case opts.Skip == nil:
		case n.linkTo != "" && skipped[n.linkTo]:
			return skip(n, SkipLinkSkipped)
		case n.rel != "" && strings.HasPrefix(base, whiteoutPrefix):
			return skip(n, SkipWhiteout)
		case typ == unix.S_IFSOCK:
			return skip(n, SkipSocket)
		case (typ == unix.S_IFCHR || typ == unix.S_IFBLK) && !isWhiteout(&n.st):
			return skip(n, SkipDevice)
		}
		if typ == unix.S_IFSOCK {
			return nil
		}
		if n.rel != "" && strings.HasPrefix(base, whiteoutPrefix) {
			return errdefs.Invalid("path "+n.rel, "a file named .wh.* cannot be stored in a layer: the name means a whiteout")
		}
		hdr := &tar.Header{
			Name:    n.rel,
			Mode:    int64(n.st.Mode & 0o7777),
			Uid:     int(n.st.Uid),
			Gid:     int(n.st.Gid),
			ModTime: time.Unix(n.st.Mtim.Sec, 0),
		}
		if n.linkTo != "" {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, n.linkTo
			return tw.WriteHeader(hdr)
		}
		if isWhiteout(&n.st) {
			parent, _ := path.Split(n.rel)
			return tw.WriteHeader(&tar.Header{Name: parent + whiteoutPrefix + base, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)})
		}
		opaque := false
		for _, x := range n.xattrs {
			if x.name == opaqueXattr {
				opaque = typ == unix.S_IFDIR && string(x.value) == "y"
				continue // becomes .wh..wh..opq, or is not a layer's to carry
			}
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = make(map[string]string)
			}
			hdr.PAXRecords["SCHILY.xattr."+x.name] = string(x.value)
		}
		switch typ {
		case unix.S_IFDIR:
			hdr.Typeflag = tar.TypeDir
			if n.rel == "" {
				hdr.Name = "./"
			} else {
				hdr.Name += "/"
			}
		case unix.S_IFREG:
			hdr.Typeflag, hdr.Size = tar.TypeReg, n.st.Size
		case unix.S_IFLNK:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, n.target
		case unix.S_IFCHR, unix.S_IFBLK:
			hdr.Typeflag = tar.TypeChar
			if typ == unix.S_IFBLK {
				hdr.Typeflag = tar.TypeBlock
			}
			hdr.Devmajor, hdr.Devminor = int64(unix.Major(n.st.Rdev)), int64(unix.Minor(n.st.Rdev))
		case unix.S_IFIFO:
			hdr.Typeflag = tar.TypeFifo
		default:
			return fmt.Errorf("%s: unsupported file type %o", n.rel, typ)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", n.rel, err)
		}
		if opaque {
			marker := &tar.Header{Name: joinRel(n.rel, opaqueMarker), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
			if err := tw.WriteHeader(marker); err != nil {
				return fmt.Errorf("%s: %w", marker.Name, err)
			}
		}
		if typ == unix.S_IFREG {
			return copyFile(ctx, tw, n, buf)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write tar of %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write tar of %s: %w", dir, err)
	}
	return nil
}

// copyFile writes the content of a regular file into the archive: exactly the size its header
// announced, checking ctx between chunks.
func copyFile(ctx context.Context, tw *tar.Writer, n *node, buf []byte) error {
	fd, err := unix.Openat(n.dirfd, n.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: n.rel, Err: err}
	}
	f := os.NewFile(uintptr(fd), n.rel)
	defer f.Close()
	copied, err := io.CopyBuffer(tw, &ctxReader{ctx: ctx, r: io.LimitReader(f, n.st.Size)}, buf)
	if err != nil {
		return fmt.Errorf("%s: %w", n.rel, err)
	}
	if copied != n.st.Size {
		return fmt.Errorf("%s: file shrank from %d to %d bytes while being archived", n.rel, n.st.Size, copied)
	}
	return nil
}
