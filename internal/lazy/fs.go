//go:build linux

package lazy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// rootNode is the mount's only directory: <name>.blob for every layer with a chunk table.
type rootNode struct {
	fs.Inode
	s *Server
}

var (
	_ fs.NodeLookuper   = (*rootNode)(nil)
	_ fs.NodeReaddirer  = (*rootNode)(nil)
	_ fs.NodeGetattrer  = (*blobNode)(nil)
	_ fs.NodeOpener     = (*blobNode)(nil)
	_ fs.NodeReader     = (*blobNode)(nil)
	_ fs.NodeReleaser   = (*blobNode)(nil)
	_ fs.NodeGetxattrer = (*blobNode)(nil)
)

func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	hexName, ok := strings.CutSuffix(name, ".blob")
	if !ok || !nameRE.MatchString(hexName) {
		return nil, syscall.ENOENT
	}
	l, err := r.s.layer(hexName)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			r.s.cfg.Log.Error("load a layer's chunk table", "layer", hexName, "err", err)
			return nil, syscall.EIO
		}
		return nil, syscall.ENOENT
	}
	n := &blobNode{s: r.s, l: l}
	n.attr(&out.Attr)
	return r.NewInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG, Ino: l.ino}), 0
}

func (r *rootNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	r.s.mu.Lock()
	names := make([]string, 0, len(r.s.layers))
	for name := range r.s.layers {
		names = append(names, name)
	}
	r.s.mu.Unlock()
	sort.Strings(names)
	ents := make([]fuse.DirEntry, 0, len(names))
	for _, n := range names {
		ents = append(ents, fuse.DirEntry{Name: n + ".blob", Mode: syscall.S_IFREG})
	}
	return fs.NewListDirStream(ents), 0
}

// blobNode is one layer's data blob, read-only.
type blobNode struct {
	fs.Inode
	s *Server
	l *layer
}

func (n *blobNode) attr(a *fuse.Attr) {
	a.Mode = syscall.S_IFREG | 0o400
	a.Size = uint64(n.l.t.DataSize)
	a.Blocks = (a.Size + 511) / 512
	a.Nlink = 1
	a.Ino = n.l.ino
}

func (n *blobNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.attr(&out.Attr)
	out.SetTimeout(time.Hour)
	return 0
}

func (n *blobNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return 0, unix.ENODATA
}

// blobHandle marks an open handle; the node does the work.
type blobHandle struct{}

func (n *blobNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 {
		return nil, 0, syscall.EROFS
	}
	n.s.mu.Lock()
	closing := n.s.closing
	n.s.mu.Unlock()
	if closing {
		return nil, 0, syscall.ENOTCONN // exiting: a mount now would read through a dead server
	}
	n.s.open(n.l)
	return &blobHandle{}, 0, 0
}

func (n *blobNode) Release(ctx context.Context, f fs.FileHandle) syscall.Errno {
	n.s.release(n.l)
	return 0
}

func (n *blobNode) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	var pid uint32
	if c, ok := fuse.FromContext(ctx); ok {
		pid = c.Pid
	}
	got, err := n.s.read(ctx, n.l, dest, off, pid)
	if err != nil {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:got]), 0
}

// Mount serves the server at <Dir>/mnt until Unmount. A FUSE mount a crashed server left there
// is detached first; EROFS mounts that still read through it keep failing with EIO (their
// sandboxes need restarting).
func (s *Server) Mount() (*fuse.Server, error) {
	mnt := filepath.Join(s.cfg.Dir, mntDir)
	if err := detachStaleMount(mnt, s.cfg.Log); err != nil {
		return nil, err
	}
	hour := time.Hour
	return fs.Mount(mnt, &rootNode{s: s}, &fs.Options{
		EntryTimeout: &hour,
		AttrTimeout:  &hour,
		MountOptions: fuse.MountOptions{
			DirectMountStrict: true, // as root, with no fusermount on the host
			FsName:            "corral-lazy",
			Name:              "corral",
			MaxWrite:          1 << 20, // 1 MiB READ requests
			MaxBackground:     64,
			DisableXAttrs:     true,
			// microvm sandboxes read the blobs through QEMU, which runs as a uid of its own and
			// gets the open descriptor from the edge: without allow_other the kernel refuses
			// every request of another uid, fstat and read through a passed descriptor included.
			// Nobody else can reach the files by path: the mount is under the 0700 data dir.
			AllowOther: true,
			// EROFS opens each blob once and reads it with direct I/O: no FUSE page cache, so
			// every byte is cached once, by EROFS.
		},
	})
}

// detachStaleMount detaches a FUSE mount of ours that a previous lazyd left at mnt (dead when it
// crashed, still served when another lazyd of this directory runs, which the caller's lock rules
// out).
func detachStaleMount(mnt string, log *slog.Logger) error {
	if _, err := os.Stat(mnt); errors.Is(err, syscall.ENOTCONN) || isFuseMount(mnt) {
		log.Warn("detaching the FUSE mount a previous lazyd left", "dir", mnt)
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("detach stale FUSE mount %s: %w", mnt, err)
		}
	}
	return nil
}

// DetachDead detaches the FUSE mount under dir (a lazyd's directory) if the lazyd that served it
// died: `corral down` calls it, since no new lazyd may start there to do it.
func DetachDead(dir string, log *slog.Logger) error {
	mnt := filepath.Join(dir, mntDir)
	if _, err := os.Stat(mnt); !errors.Is(err, syscall.ENOTCONN) {
		return nil
	}
	return detachStaleMount(mnt, log)
}

// isFuseMount reports whether dir is the mount point of a FUSE filesystem of ours.
func isFuseMount(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir && strings.Contains(line, " - fuse.corral ") {
			return true
		}
	}
	return false
}
