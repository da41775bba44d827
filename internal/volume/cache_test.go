package volume

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"
)

// TestCache: an import whose bytes do not match the digest leaves the image in place and
// nothing else; a marker records the version until cleared; Remove takes both; List reports
// neither a marker nor a marker being written as an image.
func TestCache(t *testing.T) {
	d, err := Open(t.TempDir(), "")
	if err != nil {
		t.Skip(err)
	}
	const id = "vol-0123456789abcdef"
	one, two := []byte("version one"), []byte("version two")
	sum := func(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }
	if _, _, ok := d.Cached(id); ok {
		t.Fatal("cached before anything was imported")
	}
	if err := d.Import(id, bytes.NewReader(one), sum(one)); err != nil {
		t.Fatal(err)
	}
	if err := d.SetCached(id, 1, sum(one)); err != nil {
		t.Fatal(err)
	}
	if v, dg, ok := d.Cached(id); !ok || v != 1 || dg != sum(one) {
		t.Fatalf("Cached = %d %s %v", v, dg, ok)
	}
	if err := d.Import(id, bytes.NewReader(two), sum(one)); err == nil {
		t.Fatal("an import with the wrong digest succeeded")
	}
	if b, _ := os.ReadFile(d.Path(id)); !bytes.Equal(b, one) {
		t.Fatalf("a failed import changed the image: %q", b)
	}
	ids, tmp, err := d.List()
	if err != nil || len(ids) != 1 || len(tmp) != 0 {
		t.Fatalf("List = %v %v %v; want the image alone", ids, tmp, err)
	}
	if err := d.ClearCached(id); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := d.Cached(id); ok {
		t.Fatal("cached after ClearCached")
	}
	d.SetCached(id, 1, sum(one))
	if err := d.Remove(id); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(d.dir); len(ents) != 0 {
		t.Fatalf("Remove left %v", ents)
	}
}
