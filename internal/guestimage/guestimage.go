// Package guestimage builds the boot files of a microvm sandbox: the guest kernel that
// scripts/guest-kernel.sh caches on the host, and an initramfs whose /init is the static
// corral-agent, next to the kernel modules the agent loads before it mounts the sandbox's root.
//
// Initramfs files are content-addressed (a hash of the agent, the modules and the format) in a
// cache directory, written atomically, so any number of processes may call Build at once.
package guestimage

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"

	"github.com/corral-dev/corral/internal/errdefs"
)

// DefaultKernelDir is where scripts/guest-kernel.sh leaves the current kernel.
const DefaultKernelDir = "/var/cache/corral/guest-kernel/current"

// formatVersion names the initramfs layout. Change it whenever writeInitramfs would write other
// bytes for the same inputs, so that cached images of the old layout are not reused.
const formatVersion = "corral-initramfs-1"

// maxAgentSize bounds the agent binary Build reads into memory (a real one is about 20 MiB).
const maxAgentSize = 256 << 20

// staleTempAge is how old an unfinished temporary file must be before Prune takes it for the
// leftover of a crashed Build rather than one in progress.
const staleTempAge = time.Hour

// Kernel is a guest kernel as scripts/guest-kernel.sh lays it out on the host.
type Kernel struct {
	Dir     string   // the kernel's directory, symlinks resolved
	Image   string   // path of the bzImage QEMU boots with -kernel
	Release string   // kernel release, e.g. 6.1.0-57-cloud-amd64
	Modules []string // paths of the guest's .ko files in load order, dependencies first
}

// LoadKernel reads a kernel directory laid out by scripts/guest-kernel.sh (usually
// DefaultKernelDir). It resolves symlinks first, so a later run of the script that points
// "current" at a newer kernel does not mix two kernels' files into one Kernel. A missing or
// incomplete directory is an errdefs.ErrUnavailable error that says to run the script.
func LoadKernel(dir string) (*Kernel, error) {
	missing := func(what string) error {
		return errdefs.Unavailable("guest kernel %s: %s; run scripts/guest-kernel.sh as root to fetch it", dir, what)
	}
	resolved, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, missing("no such directory")
	}
	if err != nil {
		return nil, fmt.Errorf("load guest kernel %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(resolved, ".done")); err != nil {
		return nil, missing("incomplete (no .done marker)")
	}
	k := &Kernel{Dir: resolved, Image: filepath.Join(resolved, "vmlinuz")}

	version, err := os.ReadFile(filepath.Join(resolved, "VERSION"))
	if err != nil {
		return nil, missing("no readable VERSION")
	}
	k.Release, _, _ = strings.Cut(string(version), "\n")
	k.Release = strings.TrimSpace(k.Release)
	if k.Release == "" {
		return nil, missing("VERSION has no kernel release on its first line")
	}
	if fi, err := os.Stat(k.Image); err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		return nil, missing("no vmlinuz")
	}

	order, err := os.ReadFile(filepath.Join(resolved, "modules", "order"))
	if err != nil {
		return nil, missing("no readable modules/order")
	}
	seen := map[string]bool{}
	for _, name := range strings.Split(string(order), "\n") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !validModuleName(name) {
			return nil, fmt.Errorf("load guest kernel %s: modules/order names %q, which is not a module name", dir, name)
		}
		if seen[name] {
			return nil, fmt.Errorf("load guest kernel %s: modules/order names %s twice", dir, name)
		}
		seen[name] = true
		p := filepath.Join(resolved, "modules", name+".ko")
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			return nil, missing("modules/order names " + name + " but modules/" + name + ".ko is missing")
		}
		k.Modules = append(k.Modules, p)
	}
	return k, nil
}

// validModuleName accepts the file names (without .ko) the script writes: letters, digits, - and _.
func validModuleName(s string) bool {
	if s == "" || s == "order" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Image is what QEMU boots: -kernel Kernel -initrd Initrd.
type Image struct {
	Kernel  string // path of the bzImage
	Initrd  string // path of the gzip-compressed cpio initramfs
	Release string // the kernel release, for logs and the sandbox view
}

// module is one kernel module as it goes into the initramfs.
type module struct {
	name string // file name without .ko
	data []byte
}

// Build returns the boot files for the agent binary at agentPath on kernel k. The initramfs holds
// /init (the agent), /lib/modules/<name>.ko for each of k's modules, /lib/modules/order (their
// names in load order, one a line), /dev/console, and the empty directories /dev, /proc, /sys,
// /lib, /lib/modules, /newroot and /run. It is built once per content of the agent and modules
// and cached in cacheDir as initrd-<sha256>.cpio.gz; a cached file is returned without being
// rewritten. The file is written to a temporary name, synced and renamed into place, so
// concurrent callers (in one process or several) are safe and a crash leaves no partial image.
// The agent must be a static x86-64 ELF executable; anything else is an errdefs.ErrInvalid error.
func Build(ctx context.Context, k *Kernel, agentPath, cacheDir string) (Image, error) {
	if k == nil {
		return Image{}, errdefs.Invalid("kernel", "no guest kernel given")
	}
	if err := ctx.Err(); err != nil {
		return Image{}, err
	}
	agent, err := readAgent(agentPath)
	if err != nil {
		return Image{}, err
	}
	if err := checkStaticELF(agentPath, agent); err != nil {
		return Image{}, err
	}
	mods := make([]module, 0, len(k.Modules))
	for _, p := range k.Modules {
		name, ok := strings.CutSuffix(filepath.Base(p), ".ko")
		if !ok || !validModuleName(name) {
			return Image{}, errdefs.Invalid("kernel", "module %s is not a <name>.ko file", p)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return Image{}, fmt.Errorf("read guest kernel module: %w", err)
		}
		mods = append(mods, module{name: name, data: data})
	}

	// Both the key and the image come from the bytes read above, so a file replaced meanwhile
	// cannot give an image that does not match its name.
	img := Image{
		Kernel:  k.Image,
		Initrd:  filepath.Join(cacheDir, "initrd-"+initrdKey(k.Release, agent, mods)+".cpio.gz"),
		Release: k.Release,
	}
	if fi, err := os.Stat(img.Initrd); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		return img, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return Image{}, fmt.Errorf("create initramfs cache: %w", err)
	}
	err = writeAtomic(img.Initrd, func(w io.Writer) error {
		return writeInitramfs(&ctxWriter{ctx: ctx, w: w}, agent, mods)
	})
	if err != nil {
		return Image{}, fmt.Errorf("build initramfs %s: %w", img.Initrd, err)
	}
	return img, nil
}

// Prune removes the initramfs files in cacheDir other than keep's, and temporary files that
// crashed Builds left behind. keep.Initrd must lie in cacheDir (it guards against emptying the
// wrong cache). Run it only where no other caller may still boot from an older image: QEMU reads
// the initrd when it starts, so running VMs do not mind, but an Image returned to another caller
// and not yet booted would be gone.
func Prune(cacheDir string, keep Image) error {
	if keep.Initrd == "" {
		return errdefs.Invalid("keep", "no initramfs to keep")
	}
	cdi, err := os.Stat(cacheDir)
	if err != nil {
		return fmt.Errorf("prune initramfs cache: %w", err)
	}
	kdi, err := os.Stat(filepath.Dir(keep.Initrd))
	if err != nil || !os.SameFile(cdi, kdi) {
		return errdefs.Invalid("keep", "%s is not in the initramfs cache %s", keep.Initrd, cacheDir)
	}
	keepName := filepath.Base(keep.Initrd)
	entries, err := os.ReadDir(cacheDir)
	if err != nil {
		return fmt.Errorf("prune initramfs cache: %w", err)
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == keepName:
			continue
		case strings.HasPrefix(name, "initrd-") && strings.HasSuffix(name, ".cpio.gz"):
		case strings.HasPrefix(name, ".initrd-") && strings.HasSuffix(name, ".tmp"):
			fi, err := e.Info()
			if err != nil || time.Since(fi.ModTime()) < staleTempAge {
				continue
			}
		default:
			continue
		}
		if err := os.Remove(filepath.Join(cacheDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("prune initramfs cache: %w", err)
	}
	return nil
}

// initrdKey hashes everything that decides the initramfs bytes. Each field is framed with its
// length, so no two different inputs hash the same stream.
func initrdKey(release string, agent []byte, mods []module) string {
	h := sha256.New()
	field := func(h hash.Hash, b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field(h, []byte(formatVersion))
	field(h, []byte(release))
	field(h, agent)
	for _, m := range mods {
		field(h, []byte(m.name))
		field(h, m.data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// writeInitramfs writes the gzip-compressed cpio archive. Entries are sorted by name, which
// puts every directory before its contents, and carry no time or owner, so equal inputs give
// equal bytes.
func writeInitramfs(w io.Writer, agent []byte, mods []module) error {
	type entry struct {
		name  string
		mode  uint32 // type bits and permissions
		data  []byte
		major uint32
		minor uint32
	}
	entries := []entry{
		{name: "dev", mode: modeDir | 0o755},
		{name: "dev/console", mode: modeCharDev | 0o600, major: 5, minor: 1},
		{name: "init", mode: modeRegular | 0o755, data: agent},
		{name: "lib", mode: modeDir | 0o755},
		{name: "lib/modules", mode: modeDir | 0o755},
		{name: "newroot", mode: modeDir | 0o755},
		{name: "proc", mode: modeDir | 0o555},
		{name: "run", mode: modeDir | 0o755},
		{name: "sys", mode: modeDir | 0o555},
	}
	var order strings.Builder
	seen := map[string]bool{}
	for _, m := range mods {
		if seen[m.name] {
			return fmt.Errorf("module %s given twice", m.name)
		}
		seen[m.name] = true
		entries = append(entries, entry{name: "lib/modules/" + m.name + ".ko", mode: modeRegular | 0o644, data: m.data})
		order.WriteString(m.name + "\n")
	}
	entries = append(entries, entry{name: "lib/modules/order", mode: modeRegular | 0o644, data: []byte(order.String())})
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })

	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	cw := newCPIOWriter(zw)
	for _, e := range entries {
		perm := e.mode & 0o7777
		switch e.mode &^ 0o7777 {
		case modeDir:
			err = cw.dir(e.name, perm)
		case modeCharDev:
			err = cw.charDev(e.name, perm, e.major, e.minor)
		default:
			err = cw.file(e.name, perm, e.data)
		}
		if err != nil {
			return err
		}
	}
	if err := cw.close(); err != nil {
		return err
	}
	return zw.Close()
}

// writeAtomic writes path through a temporary file in the same directory: write, fsync, rename,
// then fsync the directory so the rename itself survives a crash.
func writeAtomic(path string, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+strings.TrimSuffix(filepath.Base(path), ".cpio.gz")+"-*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := write(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readAgent reads the agent binary, which must be a regular file of at most maxAgentSize bytes.
func readAgent(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read agent: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read agent: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, errdefs.Invalid("agent", "%s is not a regular file", path)
	}
	if fi.Size() > maxAgentSize {
		return nil, errdefs.Invalid("agent", "%s is %d bytes, more than the %d an agent may be", path, fi.Size(), maxAgentSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxAgentSize+1))
	if err != nil {
		return nil, fmt.Errorf("read agent: %w", err)
	}
	if len(data) > maxAgentSize {
		return nil, errdefs.Invalid("agent", "%s grew past %d bytes while being read", path, maxAgentSize)
	}
	return data, nil
}

// ctxWriter fails writes once ctx is done, so a cancelled Build stops early.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

// Write writes p unless ctx is done.
func (c *ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}
