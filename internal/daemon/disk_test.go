package daemon

import (
	"log/slog"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDiskReserve: the reserve is an allocated file of reserveBytes, given once when the store
// finds the disk full, and made again when there is room.
func TestDiskReserve(t *testing.T) {
	r := newDiskReserve(t.TempDir(), slog.New(slog.DiscardHandler))
	if !r.make() {
		t.Fatal("no reserve made on a filesystem with room")
	}
	var st unix.Stat_t
	if err := unix.Stat(r.path, &st); err != nil || st.Blocks*512 < reserveBytes {
		t.Fatalf("reserve allocates %d bytes (%v), want %d", st.Blocks*512, err, reserveBytes)
	}
	if !r.release() {
		t.Fatal("release of a reserve reported nothing freed")
	}
	if _, err := os.Stat(r.path); !os.IsNotExist(err) {
		t.Fatalf("reserve still there after release: %v", err)
	}
	if r.release() {
		t.Fatal("a second release reported space freed")
	}
	if !r.make() {
		t.Fatal("reserve not made again")
	}
}
