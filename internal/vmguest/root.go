package vmguest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/agentrpc"
)

// switchRoot makes newroot (a mount point) the root, as switch_root(8) does: it deletes the
// initramfs's files (they live in RAM; mount points and what is below them are kept), moves
// newroot onto / and chroots into it. cwd and root are per process (Go's threads share them).
func switchRoot(newroot string) error {
	var st unix.Stat_t
	if err := unix.Stat("/", &st); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	removeTree("/", st.Dev)
	if err := unix.Chdir(newroot); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: move %s to /: %w", newroot, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switch root: chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	return nil
}

// removeTree removes what is inside dir and on device dev, without following symbolic links and
// without descending into other file systems (mount points). Failures are ignored: what cannot
// be removed only costs memory.
func removeTree(dir string, dev uint64) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil || st.Dev != dev {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			removeTree(p, dev)
			unix.Rmdir(p) // fails for a directory that holds a mount point
			continue
		}
		unix.Unlink(p)
	}
}

// mountSpec is one mount of the sandbox's root.
type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

// sandboxMounts are the mounts a container sandbox gets (internal/runtime/runc/spec.go), in
// order, for a /dev/shm of shm bytes.
func sandboxMounts(shm int64) []mountSpec {
	const nosuidExecDev = unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV
	return []mountSpec{
		{"proc", "/proc", "proc", nosuidExecDev, ""},
		{"tmpfs", "/dev", "tmpfs", unix.MS_NOSUID | unix.MS_STRICTATIME, "mode=755,size=65536k"},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{"shm", "/dev/shm", "tmpfs", nosuidExecDev, "mode=1777,size=" + strconv.FormatInt(shm, 10)},
		{"mqueue", "/dev/mqueue", "mqueue", nosuidExecDev, ""},
		// Read-only once the cgroup is set up (setupCgroup): see setupSandbox.
		{"sysfs", "/sys", "sysfs", nosuidExecDev, ""},
	}
}

// devices are the nodes of a container's /dev (runc's defaults).
var devices = []struct {
	name         string
	major, minor uint32
}{
	{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
}

// devLinks are the symbolic links of a container's /dev.
var devLinks = [][2]string{
	{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
	{"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"},
}

// setupSandbox gives the (new) root what a container sandbox's root has: /proc, a /dev with the
// standard nodes, /dev/pts, /dev/shm, /dev/mqueue, a read-only /sys with the sandbox's cgroup at
// /sys/fs/cgroup, the masked and read-only paths, and /etc/resolv.conf. It runs after the switch
// into the root, so a symbolic link in the image cannot point a mount outside it.
func setupSandbox(c *Config) error {
	shm := c.ShmBytes
	if shm == 0 {
		shm = DefaultShmBytes
	}
	for _, m := range sandboxMounts(shm) {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return fmt.Errorf("mount %s: %w", m.target, err)
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
		if m.target == "/dev" {
			if err := populateDev("/dev"); err != nil {
				return err
			}
		}
	}
	if err := setupCgroup("/sys/fs/cgroup", "/dev/.cgroup", c.Pids); err != nil {
		return err
	}
	if err := remountReadOnly("/sys"); err != nil {
		return err
	}
	if err := maskPaths(agentrpc.MaskedPaths(), agentrpc.ReadonlyPaths()); err != nil {
		return err
	}
	if c.ResolvConf != "" {
		if err := writeEtcFile("/etc/resolv.conf", c.ResolvConf); err != nil {
			return err
		}
	}
	return writeEtcFile("/etc/hosts", agentrpc.HostsFile())
}

// populateDev makes the standard nodes and links in dev (a fresh tmpfs).
func populateDev(dev string) error {
	for _, d := range devices {
		p := filepath.Join(dev, d.name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		if err := unix.Chmod(p, 0o666); err != nil { // mknod applied the umask
			return fmt.Errorf("chmod %s: %w", p, err)
		}
	}
	for _, l := range devLinks {
		if err := os.Symlink(l[0], filepath.Join(dev, l[1])); err != nil {
			return err
		}
	}
	return nil
}

// remountReadOnly makes the mount at target read-only (the mount, not the file system: other
// mounts of it keep their flags), keeping nosuid, nodev and noexec.
func remountReadOnly(target string) error {
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s read-only: %w", target, err)
	}
	return nil
}

// maskPaths hides masked (a file gets /dev/null bound over it, a directory an empty read-only
// tmpfs) and makes readonly read-only, as runc does for a container. Missing paths are skipped.
func maskPaths(masked, readonly []string) error {
	for _, p := range masked {
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		if fi.IsDir() {
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0")
		} else {
			err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range readonly {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", p, err)
		}
		if err := remountReadOnly(p); err != nil {
			return err
		}
	}
	return nil
}

// setupCgroup puts the agent (and so every command) into the cgroup "sandbox" with pids.max set
// to pids (0: "max"), and shows that cgroup, read-only, at dir: the agent finds its memory.events
// at dir/memory.events (agentrpc.Config.MemoryEvents' default), and commands, which run as root
// with CAP_DAC_OVERRIDE, can neither raise the limit nor leave the cgroup. The hierarchy is
// mounted at tmp (a fresh directory, removed again) only while it is set up, so the sandbox's
// mount table shows the one read-only mount.
func setupCgroup(dir, tmp string, pids int64) error {
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	defer os.Remove(tmp)
	if err := unix.Mount("cgroup2", tmp, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount cgroup2: %w", err)
	}
	defer unix.Unmount(tmp, unix.MNT_DETACH)
	// pids gives the sandbox's cgroup its pids.max; memory its memory.events (OOM kills, which
	// go unreported without it).
	if err := os.WriteFile(filepath.Join(tmp, "cgroup.subtree_control"), []byte("+pids"), 0); err != nil {
		return fmt.Errorf("enable the pids controller: %w", err)
	}
	os.WriteFile(filepath.Join(tmp, "cgroup.subtree_control"), []byte("+memory"), 0)
	sandbox := filepath.Join(tmp, "sandbox")
	if err := os.Mkdir(sandbox, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create the sandbox cgroup: %w", err)
	}
	limit := "max"
	if pids > 0 {
		limit = strconv.FormatInt(pids, 10)
	}
	if err := os.WriteFile(filepath.Join(sandbox, "pids.max"), []byte(limit), 0); err != nil {
		return fmt.Errorf("set pids.max: %w", err)
	}
	// "0" moves the writing process, all its threads.
	if err := os.WriteFile(filepath.Join(sandbox, "cgroup.procs"), []byte("0"), 0); err != nil {
		return fmt.Errorf("join the sandbox cgroup: %w", err)
	}
	if err := unix.Mount(sandbox, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the sandbox cgroup: %w", err)
	}
	return remountReadOnly(dir)
}

// writeEtcFile replaces path with a regular file holding content. The image's entry is removed
// first: Debian-like images make /etc/resolv.conf a symbolic link (to systemd's stub), which
// must not be followed.
func writeEtcFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
