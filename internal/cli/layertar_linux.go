//go:build linux && !lean

package cli

import (
	"context"
	"io"

	"github.com/corral-dev/corral/internal/layers"
)

// layerTar writes dir as a layer tar stream, in the canonical form the server's layer store
// reads back to the same digest.
func layerTar(ctx context.Context, dir string, w io.Writer) error {
	return layers.WriteTar(ctx, dir, w)
}
