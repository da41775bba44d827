//go:build !lean

package cli

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// extractOCIArchive unpacks an OCI image layout kept in a tar file (podman save --format
// oci-archive, skopeo's oci-archive:) into a new temporary directory and returns it; the caller
// removes it. Only the layout's own files are taken (oci-layout, index.json, blobs/ALG/HEX), as
// regular files and directories: anything else in the archive, a link or a path that climbs out,
// is refused.
func extractOCIArchive(file string) (_ string, err error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	dir, err := os.MkdirTemp("", "corral-oci-archive-")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("%s is not an OCI archive (a tar of an image layout): %w", file, err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." {
			continue
		}
		parts := strings.Split(name, "/")
		ok := name == "oci-layout" || name == "index.json" || parts[0] == "blobs" && len(parts) <= 3 && !strings.Contains(name, "..")
		if !ok || path.IsAbs(name) {
			return "", fmt.Errorf("%s: %q is not part of an OCI image layout", file, h.Name)
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o700); err != nil {
				return "", err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
				return "", err
			}
			out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return "", fmt.Errorf("extract %s: %w", h.Name, err)
			}
		default:
			return "", fmt.Errorf("%s: %q is not a regular file or directory", file, h.Name)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return "", fmt.Errorf("%s is not an OCI archive: it has no index.json", file)
	}
	return dir, nil
}
