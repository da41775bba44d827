package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// writeTree writes the tree at dir to w as a tar stream whose names are relative to dir, for
// cp into a sandbox. Directories, regular files and symlinks are kept with their permission
// bits and mtimes; ownership is left to the server (the sandbox's user, not the local one);
// other kinds of files are skipped. Symlinks below dir are not followed.
func writeTree(ctx context.Context, dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case !info.Mode().IsRegular() && !info.IsDir():
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// extractTree extracts the tar stream r into the existing directory dir, for cp out of a
// sandbox. The stream comes from the sandbox and is untrusted: every entry is created through
// an os.Root, so neither "../" names, absolute names nor symlinks in the stream can make it
// write outside dir. Directories, regular files, symlinks and hard links are created with their
// permission bits (never setuid, setgid or sticky) and files keep their mtimes; ownership is
// the local user's; other entry kinds are skipped.
func extractTree(ctx context.Context, r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		name, ok := entryName(hdr.Name)
		if !ok {
			return fmt.Errorf("tar entry %q leaves the target directory", hdr.Name)
		}
		if name == "." {
			continue
		}
		perm := fs.FileMode(hdr.Mode) & fs.ModePerm
		if err := extractEntry(root, tr, hdr, name, perm); err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
	}
}

// entryName cleans a tar entry name to a relative slash path, reporting false for names that
// leave the directory ("../x", or "/" once made relative).
func entryName(n string) (string, bool) {
	n = path.Clean("./" + strings.TrimLeft(n, "/"))
	if n == ".." || strings.HasPrefix(n, "../") {
		return "", false
	}
	return n, true
}

func extractEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, name string, perm fs.FileMode) error {
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.MkdirAll(name, perm|0o700); err != nil {
			return err
		}
		return nil
	case tar.TypeReg:
		// A file that was a symlink in an earlier copy must not be written through.
		if fi, err := root.Lstat(name); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			if err := root.Remove(name); err != nil {
				return err
			}
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if err := root.Chmod(name, perm); err != nil {
			return err
		}
		if !hdr.ModTime.IsZero() {
			return root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		}
		return nil
	case tar.TypeSymlink, tar.TypeLink:
		if fi, err := root.Lstat(name); err == nil && !fi.IsDir() {
			if err := root.Remove(name); err != nil {
				return err
			}
		}
		if hdr.Typeflag == tar.TypeSymlink {
			return root.Symlink(hdr.Linkname, name)
		}
		target, ok := entryName(hdr.Linkname)
		if !ok {
			return fmt.Errorf("hard link to %q leaves the target directory", hdr.Linkname)
		}
		return root.Link(target, name)
	}
	return nil
}
