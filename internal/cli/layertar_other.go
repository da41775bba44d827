//go:build !linux && !lean

package cli

import (
	"context"
	"errors"
	"io"
)

// layerTar is unavailable off Linux: a layer records Linux file metadata (owners, xattrs,
// overlay whiteouts) that other systems cannot read back faithfully.
func layerTar(ctx context.Context, dir string, w io.Writer) error {
	return errors.New("layer import --dir needs Linux; make a tar on Linux and pass it with --tar")
}
