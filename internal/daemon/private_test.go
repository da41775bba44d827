package daemon

import (
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// TestSecureDataDir opens a data dir laid out as an older Corral left it, every entry open to
// other users, and checks that the data dir, its entries and theirs are closed while what
// sandboxes own (below that) and the files read through bind mounts or descriptors keep their
// modes; a second pass changes nothing.
func TestSecureDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	type entry struct {
		path string
		mode fs.FileMode // created with
		want fs.FileMode // after SecureDataDir
		dir  bool
	}
	entries := []entry{
		{"", 0o755, 0o700, true},
		{"corral.db", 0o644, 0o600, false},
		{"corral.db-wal", 0o644, 0o600, false},
		{"corral.db-shm", 0o664, 0o600, false},
		{"corral.log", 0o644, 0o600, false},
		{"admin.token", 0o640, 0o600, false},
		{"e2b.key", 0o644, 0o600, false},
		{"sandboxes", 0o755, 0o700, true},
		{"sandboxes/sb-1", 0o711, 0o700, true},
		{"sandboxes/sb-1/console.log", 0o644, 0o644, false}, // below the closed directories
		{"sandboxes/sb-1/rootfs", 0o755, 0o755, true},       // the sandbox's own
		{"sandboxes/sb-1/rootfs/tmp", fs.ModeSticky | 0o777, fs.ModeSticky | 0o777, true},
		{"runsc", 0o755, 0o700, true},
		{"runsc/checkpoint.img", 0o644, 0o600, false},
		{"vms", 0o711, 0o700, true},
		{"vmboot", 0o755, 0o700, true},
		{"vmboot/initrd-1.cpio.gz", 0o644, 0o644, false}, // read by VM uids through descriptors
		{"net", 0o755, 0o700, true},
		{"net/sb-1.resolv.conf", 0o644, 0o644, false}, // bind-mounted into the sandbox
		{"blobs", 0o755, 0o700, true},
		{"blobs/ab", 0o755, 0o755, true},
		{"layers", 0o755, 0o700, true},
		{"layers/lazy", 0o755, 0o700, true},
		{"layers/lazy/lazyd.log", 0o644, 0o644, false},
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.path)
		var err error
		if e.dir {
			err = os.Mkdir(p, 0o700)
		} else {
			err = os.WriteFile(p, []byte("secret"), 0o600)
		}
		if err == nil {
			err = os.Chmod(p, e.mode)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// A link is not followed: its target outside the data dir keeps its mode.
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(outside, 0o644)
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}

	n, err := SecureDataDir(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		fi, err := os.Lstat(filepath.Join(dir, e.path))
		if err != nil {
			t.Fatal(err)
		}
		got := fi.Mode() & (fs.ModePerm | fs.ModeSticky)
		if got != e.want {
			t.Errorf("%s: mode %04o, want %04o", e.path, got, e.want)
		}
	}
	if fi, _ := os.Stat(outside); fi.Mode().Perm() != 0o644 {
		t.Errorf("link target outside the data dir: mode %04o, want 0644", fi.Mode().Perm())
	}
	if n != 17 {
		t.Errorf("SecureDataDir changed %d modes, want 17", n)
	}
	if n, err := SecureDataDir(dir, slog.New(slog.DiscardHandler)); n != 0 || err != nil {
		t.Errorf("second SecureDataDir = %d, %v; want 0 changes", n, err)
	}
}
