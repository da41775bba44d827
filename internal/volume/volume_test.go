package volume

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

func TestCreateAllocatesHonestly(t *testing.T) {
	d, err := Open(t.TempDir(), "")
	if err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	const id, size = "vol-0123456789abcdef", 64 << 20
	if err := d.Create(ctx, id, size); err != nil {
		t.Fatal(err)
	}
	if n, err := d.Bytes(); err != nil || n < size {
		t.Fatalf("Bytes = %d, %v; want the full %d allocated", n, err, size)
	}
	if err := d.Create(ctx, id, size); err == nil {
		t.Fatal("made a volume twice")
	}
	if err := d.Create(ctx, "../x", size); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad ID: %v", err)
	}
	ids, tmp, err := d.List()
	if err != nil || len(ids) != 1 || ids[0] != id || len(tmp) != 0 {
		t.Fatalf("List = %v %v %v", ids, tmp, err)
	}
	if err := d.Remove(id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Path(id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image left: %v", err)
	}
	if n, _ := d.Bytes(); n != 0 {
		t.Fatalf("Bytes after Remove = %d", n)
	}
}
