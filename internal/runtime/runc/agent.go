package runc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// agentCache holds one sealed memfd copy of each agent binary in use, shared by every sandbox.
// A sealed memfd cannot be written, resized, chmod'ed or unsealed by anyone, so the container's
// root, which can open /proc/1/exe, gets a read-only view of a private copy, never the host file.
type agentCache struct {
	mu   sync.Mutex
	imgs map[string]*agentImage // by host path; protected by mu
}

type agentImage struct {
	key  fileKey
	f    *os.File // the sealed memfd
	refs int      // Creates using f right now; protected by agentCache.mu
	old  bool     // replaced by a newer copy: close when refs drops to 0; protected by agentCache.mu
}

// fileKey identifies one version of a file: a rebuilt or replaced binary changes it.
type fileKey struct {
	dev, ino  uint64
	size      int64
	mtimeNsec int64
}

func keyOf(st *unix.Stat_t) fileKey {
	return fileKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtimeNsec: st.Mtim.Nano()}
}

// acquire returns the memfd for the current version of path; release it once runc has started.
func (c *agentCache) acquire(path string) (*agentImage, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, errdefs.Invalid("AgentPath", "%s: %v", path, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if img := c.imgs[path]; img != nil && img.key == keyOf(&st) {
		img.refs++
		return img, nil
	}
	f, key, err := sealedCopy(path)
	if err != nil {
		return nil, err
	}
	if prev := c.imgs[path]; prev != nil {
		prev.old = true
		if prev.refs == 0 {
			prev.f.Close()
		}
	}
	img := &agentImage{key: key, f: f, refs: 1}
	c.imgs[path] = img
	return img, nil
}

func (c *agentCache) release(img *agentImage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if img.refs--; img.refs == 0 && img.old {
		img.f.Close()
	}
}

func (c *agentCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, img := range c.imgs {
		img.old = true
		if img.refs == 0 {
			img.f.Close()
		}
		delete(c.imgs, p)
	}
}

// sealedCopy copies the regular file at path into a sealed, executable memfd.
func sealedCopy(path string) (*os.File, fileKey, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fileKey{}, errdefs.Invalid("AgentPath", "%v", err)
	}
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return nil, fileKey{}, fmt.Errorf("stat agent %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fileKey{}, errdefs.Invalid("AgentPath", "%s is not a regular file", path)
	}
	// MFD_EXEC (Linux 6.3+) keeps the memfd executable when vm.memfd_noexec asks for noexec by
	// default; older kernels reject the flag and make memfds executable anyway.
	const flags = unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	fd, err := unix.MemfdCreate("corral-agent", flags|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate("corral-agent", flags)
	}
	if err != nil {
		return nil, fileKey{}, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:corral-agent")
	fail := func(err error) (*os.File, fileKey, error) {
		f.Close()
		return nil, fileKey{}, err
	}
	n, err := io.Copy(f, src)
	if err != nil {
		return fail(fmt.Errorf("copy agent %s: %w", path, err))
	}
	if n != st.Size {
		return fail(fmt.Errorf("copy agent %s: file changed while copying", path))
	}
	if err := unix.Fchmod(fd, 0o555); err != nil {
		return fail(fmt.Errorf("chmod agent memfd: %w", err))
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals|unix.F_SEAL_EXEC); errors.Is(err, unix.EINVAL) {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals) // F_SEAL_EXEC is Linux 6.3+
		if err != nil {
			return fail(fmt.Errorf("seal agent memfd: %w", err))
		}
	} else if err != nil {
		return fail(fmt.Errorf("seal agent memfd: %w", err))
	}
	return f, keyOf(&st), nil
}
