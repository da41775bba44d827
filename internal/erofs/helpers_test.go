//go:build linux

package erofs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// requireRoot skips tests that mount, attach loop devices, mknod, chown or set trusted.* xattrs.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, loop devices, mknod, chown and trusted.* xattrs")
	}
}

// requireMkfs skips tests when erofs-utils is not installed.
func requireMkfs(t testing.TB) {
	t.Helper()
	if _, err := Version(); err != nil {
		t.Skipf("skipping: %v", err)
	}
}

// requireKernel skips tests when the kernel cannot mount EROFS (fsopen loads the module if needed).
func requireKernel(t testing.TB) {
	t.Helper()
	requireRoot(t)
	fd, err := unix.Fsopen("erofs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		t.Skipf("skipping: kernel cannot mount erofs (CONFIG_EROFS_FS; modprobe erofs): fsopen: %v", err)
	}
	unix.Close(fd)
}

// requireAll is the usual precondition of a mount test.
func requireAll(t testing.TB) {
	t.Helper()
	requireRoot(t)
	requireMkfs(t)
	requireKernel(t)
}

// testDir returns a fresh directory that, when the test ends, must hold no mounts and back no loop
// devices. If some remain (a failed test), they are reported and detached so later tests and the
// directory's removal are not disturbed.
func testDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() {
		mis, err := readMountinfo()
		if err != nil {
			t.Error(err)
			return
		}
		for i := len(mis) - 1; i >= 0; i-- {
			if mp := mis[i].mountPoint; strings.HasPrefix(mp, dir+"/") {
				t.Errorf("mount left behind at %s (%s from %s)", mp, mis[i].fsType, mis[i].source)
				unix.Unmount(mp, unix.MNT_DETACH)
			}
		}
		if devs := loopsBackedUnder(dir); len(devs) > 0 {
			// Autoclear runs when the last opener closes, which umount(2) does before returning.
			t.Errorf("loop devices still attached to files under %s: %v", dir, devs)
		}
	})
	return dir
}

// loopsBackedUnder returns the loop devices whose backing file lies under dir.
func loopsBackedUnder(dir string) []string {
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var devs []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // detached meanwhile
		}
		file := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if strings.HasPrefix(file, dir+"/") {
			devs = append(devs, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p))))
		}
	}
	return devs
}

// mountsAt returns the mountinfo lines whose mount point is exactly mp.
func mountsAt(t testing.TB, mp string) []mountInfo {
	t.Helper()
	mis, err := readMountinfo()
	if err != nil {
		t.Fatal(err)
	}
	var out []mountInfo
	for _, mi := range mis {
		if mi.mountPoint == mp {
			out = append(out, mi)
		}
	}
	return out
}

// mountForTest mounts image at a new directory under dir and unmounts it when the test ends.
func mountForTest(t *testing.T, image, dir string, opts MountOptions) (string, Backing) {
	t.Helper()
	target, err := os.MkdirTemp(dir, "mnt-")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Mount(image, target, opts)
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	t.Cleanup(func() {
		if len(mountsAt(t, target)) > 0 {
			if err := Unmount(target); err != nil {
				t.Errorf("Unmount: %v", err)
			}
		}
	})
	return target, b
}

// capNetRaw is a version-2 security.capability value granting CAP_NET_RAW (bit 13), effective.
var capNetRaw = []byte{0x01, 0, 0, 0x02, 0x00, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// makeTree fills dir with every kind of entry a Corral layer can hold. It needs root.
func makeTree(t *testing.T, dir string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	p := func(rel string) string { return filepath.Join(dir, rel) }
	file := func(rel string, body []byte, mode os.FileMode, uid, gid int) {
		t.Helper()
		must(os.WriteFile(p(rel), body, 0o600))
		must(os.Chown(p(rel), uid, gid)) // before chmod: chown clears setuid and setgid
		must(os.Chmod(p(rel), mode))
	}
	mkdir := func(rel string, mode os.FileMode, uid, gid int) {
		t.Helper()
		must(os.Mkdir(p(rel), 0o700))
		must(os.Chown(p(rel), uid, gid))
		must(os.Chmod(p(rel), mode))
	}
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}

	must(os.Chmod(dir, 0o755))
	mkdir("d", 0o755, 0, 0)
	mkdir("d/sub", 0o750, 10, 20)
	file("f", []byte("hello\n"), 0o755|os.ModeSetuid, 1234, 5678)
	must(unix.Setxattr(p("f"), "user.foo", []byte("bar"), 0))
	must(unix.Setxattr(p("f"), "security.capability", capNetRaw, 0))
	must(os.Link(p("f"), p("d/hard")))
	must(os.Link(p("f"), p("d/sub/hard2")))
	file("sgid", []byte("#!/bin/sh\n"), 0o755|os.ModeSetgid, 0, 50)
	file("empty", nil, 0o644, 70000, 80000) // ids above 65535 need extended inodes
	file("large", random(8<<20+123), 0o644, 0, 0)
	file("tail", random(4096*3+1), 0o600, 0, 0)
	// A sparse file: holes must read back as zeros.
	f, err := os.Create(p("sparse"))
	must(err)
	_, err = f.WriteAt([]byte("end"), 16<<20)
	must(err)
	must(f.Close())
	must(os.Symlink("../f", p("d/sym")))
	must(os.Lchown(p("d/sym"), 42, 43))
	must(os.Symlink(strings.Repeat("x/", 1000)+"target", p("longlink")))
	must(os.Symlink("/dangling/absolute", p("dangling")))
	must(unix.Mknod(p("wh"), unix.S_IFCHR, 0)) // an overlay whiteout (mode 0000)
	must(unix.Setxattr(p("wh"), "trusted.note", []byte("1"), 0))
	must(unix.Mknod(p("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mknod(p("blk"), unix.S_IFBLK|0o660, int(unix.Mkdev(8, 300))))
	must(unix.Mkfifo(p("fifo"), 0o640))
	must(os.Lchown(p("fifo"), 7, 8))
	l, err := net.Listen("unix", p("sock"))
	must(err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	must(l.Close())
	mkdir("opq", 0o755, 0, 0)
	must(unix.Setxattr(p("opq"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Setxattr(p("opq"), "user.dir", bytes.Repeat([]byte("v"), 1000), 0))
	file("opq/x", []byte("x"), 0o644, 0, 0)
	mkdir("sticky", 0o777|os.ModeSticky, 0, 0)
	mkdir("sgiddir", 0o775|os.ModeSetgid, 0, 100)
	file(strings.Repeat("n", 254), []byte("long name"), 0o644, 0, 0) // 255 needs erofs-utils 1.8.5
	file("space and\nnewline", []byte("odd name"), 0o644, 0, 0)
	deep := "deep"
	for i := range 30 {
		deep = filepath.Join(deep, fmt.Sprintf("%02d-%s", i, strings.Repeat("d", 60)))
	}
	must(os.MkdirAll(p(deep), 0o755))
	file(filepath.Join(deep, "leaf"), []byte("deep"), 0o644, 0, 0)
	for i := range 300 { // a directory spanning several blocks
		file(fmt.Sprintf("d/sub/many-%03d", i), nil, 0o644, 0, 0)
	}
	// Fixed, distinct times last: creating entries changes their directories' mtimes.
	base := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	var all []string
	must(filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		all = append(all, path)
		return err
	}))
	for i, path := range all {
		mt := base.Add(time.Duration(i)*time.Second + time.Duration(i)*123457)
		ts := []unix.Timespec{unix.NsecToTimespec(base.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}
		must(unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// entryInfo is what the round trip must keep of one entry.
type entryInfo struct {
	typ    uint32 // S_IFMT bits
	perm   uint32 // permission, setuid, setgid and sticky bits
	uid    uint32
	gid    uint32
	size   int64
	sha    string // regular files
	link   string // symlinks
	rdev   uint64 // devices
	mtime  unix.Timespec
	nlink  uint64 // non-directories
	xattrs map[string]string
	ino    uint64 // for hardlink identity; not compared directly
}

// describe returns an entryInfo for every entry under root, keyed by its slash-separated path.
func describe(t *testing.T, root string) map[string]entryInfo {
	t.Helper()
	out := map[string]entryInfo{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		e := entryInfo{
			typ:   st.Mode & unix.S_IFMT,
			perm:  st.Mode & 0o7777,
			uid:   st.Uid,
			gid:   st.Gid,
			mtime: st.Mtim,
			ino:   st.Ino,
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			e.size = st.Size
			e.nlink = uint64(st.Nlink)
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
			e.sha = hex.EncodeToString(h.Sum(nil))
		case unix.S_IFLNK:
			e.size = st.Size
			e.link, err = os.Readlink(path)
			if err != nil {
				return err
			}
		case unix.S_IFCHR, unix.S_IFBLK:
			e.rdev = uint64(st.Rdev)
			e.nlink = uint64(st.Nlink)
		case unix.S_IFDIR:
		default:
			e.nlink = uint64(st.Nlink)
		}
		e.xattrs = xattrs(t, path)
		out[filepath.ToSlash(rel)] = e
		return nil
	})
	if err != nil {
		t.Fatalf("describe %s: %v", root, err)
	}
	return out
}

// xattrs returns every extended attribute of path, without following a symlink.
func xattrs(t *testing.T, path string) map[string]string {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(path, buf)
	if err != nil {
		t.Fatalf("llistxattr %s: %v", path, err)
	}
	out := map[string]string{}
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(path, name, v)
		if err != nil {
			t.Fatalf("lgetxattr %s %s: %v", path, name, err)
		}
		out[name] = string(v[:m])
	}
	return out
}

// compareTrees fails the test for every difference between the trees at want and got, entry by
// entry, including which entries are hardlinks of which.
func compareTrees(t *testing.T, want, got string) {
	t.Helper()
	w, g := describe(t, want), describe(t, got)
	for rel, we := range w {
		ge, ok := g[rel]
		if !ok {
			t.Errorf("%s: missing from %s", rel, got)
			continue
		}
		wi, gi := we, ge
		wi.ino, gi.ino = 0, 0
		if fmt.Sprint(wi) != fmt.Sprint(gi) {
			t.Errorf("%s:\n got %+v\nwant %+v", rel, gi, wi)
		}
	}
	for rel := range g {
		if _, ok := w[rel]; !ok {
			t.Errorf("%s: in %s but not in the source", rel, got)
		}
	}
	// Hardlink identity: same inode in the source if and only if same inode in the copy.
	byIno := map[uint64]string{}
	for rel, we := range w {
		if we.typ == unix.S_IFREG && we.nlink > 1 {
			if first, ok := byIno[we.ino]; ok {
				if g[first].ino != g[rel].ino {
					t.Errorf("%s and %s are hardlinks in the source but not in %s", first, rel, got)
				}
			} else {
				byIno[we.ino] = rel
			}
		}
	}
	seen := map[uint64]string{}
	for rel, ge := range g {
		if ge.typ == unix.S_IFDIR {
			continue
		}
		if other, ok := seen[ge.ino]; ok && w[other].ino != w[rel].ino {
			t.Errorf("%s and %s share an inode in %s but not in the source", other, rel, got)
		}
		seen[ge.ino] = rel
	}
}

// errorsIsAll reports whether err matches every target.
func errorsIsAll(err error, targets ...error) bool {
	for _, target := range targets {
		if !errors.Is(err, target) {
			return false
		}
	}
	return true
}
