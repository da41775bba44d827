package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
)

// Nothing in a data directory is for the host's other users: the store (with its -wal and
// -shm), the log, tokens and keys, checkpoint and snapshot images, console logs, VM state,
// lazyd's sockets and chunk cache. Two things keep it so:
//
//   - The daemons run with umask 077 (PrivateUmask), so whatever they create without an
//     explicit mode (SQLite's -wal and -shm take the database's mode, a shell's `>> corral.log`
//     before the first start aside) is 0600/0700. Code that makes a file a sandbox or a VM's
//     own uid must read (a resolv.conf bind-mounted into the sandbox, a VM's boot files read
//     through a descriptor) sets its mode explicitly after creating it.
//   - At every start SecureDataDir takes group and other bits off the data directory, every
//     entry in it and every entry one level further down, so a directory an older Corral (or
//     the operator's umask) left 0755 is closed too. It never goes deeper: below that level lie
//     what sandboxes own (overlay upper directories, rootfs mounts, layer trees, whose modes are
//     the sandbox's and are meant for the users inside it), reachable only through the
//     directories it closed. It does not follow symbolic links or cross into mounts.

// privateUmask is the daemons' umask: nothing they create is open to group or others.
const privateUmask = 0o077

// PrivateUmask sets the process's umask to 077. The daemons (`corral up`, `server`, `edge`,
// `lazyd`) call it before they create anything.
func PrivateUmask() { syscall.Umask(privateUmask) }

// keepContents names the top-level directories of a data directory whose contents keep their
// modes: the directory itself is closed, but what is in it is read by someone else through
// a descriptor or a bind mount (a sandbox's resolv.conf; a VM's boot files read by its own uid),
// or is shared on purpose (the directory blob store's objects, for corral processes on a
// shared mount).
var keepContents = map[string]bool{"net": true, "vmboot": true, "blobs": true}

// SecureDataDir takes group and other permission bits off dir, off every entry of it and off
// every entry one level below (except in keepContents' directories), without
// following links or crossing mounts. It returns how many modes it changed.
func SecureDataDir(dir string, log *slog.Logger) (int, error) {
	root, err := os.Lstat(dir)
	if err != nil {
		return 0, fmt.Errorf("secure data dir: %w", err)
	}
	if !root.IsDir() {
		return 0, fmt.Errorf("secure data dir: %s is not a directory", dir)
	}
	changed := 0
	var errs []error
	fix := func(p string, fi fs.FileInfo) {
		m := fi.Mode()
		if m&fs.ModeSymlink != 0 || m.Perm()&0o077 == 0 {
			return
		}
		// Keep setuid/setgid/sticky off: nothing in a data directory has a reason to carry them.
		if err := os.Chmod(p, m.Perm()&^0o077); err != nil {
			errs = append(errs, err)
			return
		}
		log.Info("data dir: closed an entry to other users", "path", p, "was", fmt.Sprintf("%04o", m.Perm()))
		changed++
	}
	fix(dir, root)
	dev := devOf(root)
	top, err := os.ReadDir(dir)
	if err != nil {
		return changed, fmt.Errorf("secure data dir: %w", err)
	}
	for _, e := range top {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil || devOf(fi) != dev {
			continue // gone, or a mount: not ours to change
		}
		fix(p, fi)
		if !fi.IsDir() || keepContents[e.Name()] {
			continue
		}
		subs, err := os.ReadDir(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, s := range subs {
			sp := filepath.Join(p, s.Name())
			sfi, err := os.Lstat(sp)
			if err != nil || devOf(sfi) != dev {
				continue
			}
			fix(sp, sfi)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return changed, fmt.Errorf("secure data dir: %w", err)
	}
	return changed, nil
}

func devOf(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev)
	}
	return 0
}
