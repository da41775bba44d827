package guestimage

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

// elfBinary returns a minimal x86-64 ELF executable: one PT_LOAD and, when interp is set, a
// PT_INTERP naming it, the way a dynamically linked program has one.
func elfBinary(machine elf.Machine, interp string) []byte {
	const ehsize, phsize = 64, 56
	phnum := 1
	if interp != "" {
		phnum = 2
	}
	dataOff := uint64(ehsize + phsize*phnum)
	var b bytes.Buffer
	hdr := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Entry: 0x400000 + dataOff, Phoff: ehsize, Ehsize: ehsize, Phentsize: phsize, Phnum: uint16(phnum),
		Shentsize: 64,
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.Write(&b, binary.LittleEndian, hdr)
	code := []byte{0xeb, 0xfe} // jmp .
	total := dataOff + uint64(len(code)) + uint64(len(interp)) + 1
	binary.Write(&b, binary.LittleEndian, elf.Prog64{
		Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X), Vaddr: 0x400000, Paddr: 0x400000,
		Filesz: total, Memsz: total, Align: 0x1000,
	})
	if interp != "" {
		off := dataOff + uint64(len(code))
		binary.Write(&b, binary.LittleEndian, elf.Prog64{
			Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Off: off, Vaddr: 0x400000 + off,
			Paddr: 0x400000 + off, Filesz: uint64(len(interp)) + 1, Memsz: uint64(len(interp)) + 1, Align: 1,
		})
	}
	b.Write(code)
	if interp != "" {
		b.WriteString(interp)
		b.WriteByte(0)
	}
	return b.Bytes()
}

func writeFile(t *testing.T, path string, data []byte, perm os.FileMode) string {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(path), 0o755))
	must(t, os.WriteFile(path, data, perm))
	return path
}

// fakeKernel lays out a kernel directory the way scripts/guest-kernel.sh does and returns it
// behind a "current" symlink.
func fakeKernel(t *testing.T, modules ...string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "linux-image-1.2.3-4-cloud-amd64_1.2.3-4")
	writeFile(t, filepath.Join(dir, "vmlinuz"), []byte("not really a bzImage"), 0o644)
	writeFile(t, filepath.Join(dir, "config"), []byte("CONFIG_VIRTIO=m\n"), 0o644)
	writeFile(t, filepath.Join(dir, "VERSION"), []byte("1.2.3-4-cloud-amd64\n1.2.3-4\n"), 0o644)
	for _, m := range modules {
		writeFile(t, filepath.Join(dir, "modules", m+".ko"), []byte("module "+m), 0o644)
	}
	writeFile(t, filepath.Join(dir, "modules", "order"), []byte(strings.Join(modules, "\n")+"\n"), 0o644)
	writeFile(t, filepath.Join(dir, ".done"), nil, 0o644)
	must(t, os.Symlink(filepath.Base(dir), filepath.Join(root, "current")))
	return filepath.Join(root, "current")
}

var testModules = []string{"virtio_ring", "virtio", "virtio_mmio", "virtio-rng"}

func testInputs(t *testing.T) (*Kernel, string) {
	t.Helper()
	k, err := LoadKernel(fakeKernel(t, testModules...))
	if err != nil {
		t.Fatal(err)
	}
	agent := writeFile(t, filepath.Join(t.TempDir(), "corral-agent"), elfBinary(elf.EM_X86_64, ""), 0o755)
	return k, agent
}

func TestLoadKernel(t *testing.T) {
	cur := fakeKernel(t, testModules...)
	k, err := LoadKernel(cur)
	if err != nil {
		t.Fatal(err)
	}
	real, _ := filepath.EvalSymlinks(cur)
	if k.Dir != real {
		t.Errorf("Dir: got %s, want the resolved %s", k.Dir, real)
	}
	if k.Image != filepath.Join(real, "vmlinuz") {
		t.Errorf("Image: got %s", k.Image)
	}
	if k.Release != "1.2.3-4-cloud-amd64" {
		t.Errorf("Release: got %q, want 1.2.3-4-cloud-amd64", k.Release)
	}
	var want []string
	for _, m := range testModules {
		want = append(want, filepath.Join(real, "modules", m+".ko"))
	}
	if !slices.Equal(k.Modules, want) {
		t.Errorf("Modules: got %v, want %v", k.Modules, want)
	}
}

func TestLoadKernelErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(dir string)
		want   string
	}{
		{"missing dir", func(dir string) { os.RemoveAll(dir) }, "no such directory"},
		{"no .done", func(dir string) { os.Remove(filepath.Join(dir, ".done")) }, "no .done"},
		{"no vmlinuz", func(dir string) { os.Remove(filepath.Join(dir, "vmlinuz")) }, "no vmlinuz"},
		{"no VERSION", func(dir string) { os.Remove(filepath.Join(dir, "VERSION")) }, "VERSION"},
		{"no order", func(dir string) { os.Remove(filepath.Join(dir, "modules", "order")) }, "modules/order"},
		{"module missing", func(dir string) { os.Remove(filepath.Join(dir, "modules", "virtio.ko")) }, "virtio.ko is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := fakeKernel(t, testModules...)
			dir, _ := filepath.EvalSymlinks(cur)
			tc.break_(dir)
			_, err := LoadKernel(cur)
			if err == nil {
				t.Fatal("got no error")
			}
			if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), "scripts/guest-kernel.sh") {
				t.Errorf("got %q (unavailable: %v), want an unavailable error with %q naming the script",
					err, errors.Is(err, errdefs.ErrUnavailable), tc.want)
			}
		})
	}
	t.Run("bad order", func(t *testing.T) {
		cur := fakeKernel(t, "virtio")
		dir, _ := filepath.EvalSymlinks(cur)
		writeFile(t, filepath.Join(dir, "modules", "order"), []byte("virtio\n../../etc/passwd\n"), 0o644)
		if _, err := LoadKernel(cur); err == nil || !strings.Contains(err.Error(), "not a module name") {
			t.Errorf("got %v, want a 'not a module name' error", err)
		}
	})
}

// TestLoadKernelHost reads the kernel scripts/guest-kernel.sh fetched, where it has run.
func TestLoadKernelHost(t *testing.T) {
	if _, err := os.Stat(DefaultKernelDir); err != nil {
		t.Skipf("no guest kernel at %s (run scripts/guest-kernel.sh as root): %v", DefaultKernelDir, err)
	}
	k, err := LoadKernel(DefaultKernelDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range k.Modules {
		names = append(names, strings.TrimSuffix(filepath.Base(m), ".ko"))
	}
	for _, want := range []string{"virtio_mmio", "virtio_blk", "virtio_console", "erofs", "overlay"} {
		if !slices.Contains(names, want) {
			t.Errorf("modules %v lack %s", names, want)
		}
	}
	if i, j := slices.Index(names, "virtio"), slices.Index(names, "virtio_mmio"); i < 0 || i > j {
		t.Errorf("modules %v: virtio must come before virtio_mmio", names)
	}
	t.Logf("kernel %s with %d modules: %v", k.Release, len(k.Modules), names)
}

func gunzip(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBuildContents(t *testing.T) {
	k, agent := testInputs(t)
	cache := t.TempDir()
	img, err := Build(context.Background(), k, agent, cache)
	if err != nil {
		t.Fatal(err)
	}
	if img.Kernel != k.Image || img.Release != k.Release || filepath.Dir(img.Initrd) != cache ||
		!strings.HasPrefix(filepath.Base(img.Initrd), "initrd-") || !strings.HasSuffix(img.Initrd, ".cpio.gz") {
		t.Errorf("got %+v", img)
	}
	entries, err := readCPIO(gunzip(t, img.Initrd))
	if err != nil {
		t.Fatal(err)
	}
	agentData, _ := os.ReadFile(agent)
	type want struct {
		mode         uint32
		data         string
		major, minor uint32
	}
	wants := map[string]want{
		"dev":               {mode: modeDir | 0o755},
		"dev/console":       {mode: modeCharDev | 0o600, major: 5, minor: 1},
		"init":              {mode: modeRegular | 0o755, data: string(agentData)},
		"lib":               {mode: modeDir | 0o755},
		"lib/modules":       {mode: modeDir | 0o755},
		"lib/modules/order": {mode: modeRegular | 0o644, data: "virtio_ring\nvirtio\nvirtio_mmio\nvirtio-rng\n"},
		"newroot":           {mode: modeDir | 0o755},
		"proc":              {mode: modeDir | 0o555},
		"run":               {mode: modeDir | 0o755},
		"sys":               {mode: modeDir | 0o555},
	}
	for _, m := range testModules {
		wants["lib/modules/"+m+".ko"] = want{mode: modeRegular | 0o644, data: "module " + m}
	}
	var names []string
	for i, e := range entries {
		names = append(names, e.name)
		w, ok := wants[e.name]
		if !ok {
			t.Errorf("unexpected entry %s", e.name)
			continue
		}
		delete(wants, e.name)
		if e.mode != w.mode || string(e.data) != w.data || e.rdevMajor != w.major || e.rdevMinor != w.minor {
			t.Errorf("%s: got mode %o rdev %d,%d %d bytes, want mode %o rdev %d,%d %d bytes",
				e.name, e.mode, e.rdevMajor, e.rdevMinor, len(e.data), w.mode, w.major, w.minor, len(w.data))
		}
		if e.ino != uint32(i+1) || e.mtime != 0 || e.uid != 0 || e.gid != 0 {
			t.Errorf("%s: got ino %d mtime %d uid %d gid %d, want ino %d and zeros", e.name, e.ino, e.mtime, e.uid, e.gid, i+1)
		}
	}
	for name := range wants {
		t.Errorf("missing entry %s", name)
	}
	if !slices.IsSorted(names) {
		t.Errorf("entries are not sorted: %v", names)
	}
	if fi, err := os.Stat(img.Initrd); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("initrd mode: %v %v, want 0644", fi.Mode(), err)
	}
}

func TestBuildReproducible(t *testing.T) {
	k, agent := testInputs(t)
	a, err := Build(context.Background(), k, agent, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(context.Background(), k, agent, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(a.Initrd) != filepath.Base(b.Initrd) {
		t.Errorf("names differ: %s and %s", a.Initrd, b.Initrd)
	}
	ab, _ := os.ReadFile(a.Initrd)
	bb, _ := os.ReadFile(b.Initrd)
	if !bytes.Equal(ab, bb) {
		t.Errorf("two builds of the same inputs differ (%d and %d bytes)", len(ab), len(bb))
	}
}

func TestBuildCached(t *testing.T) {
	k, agent := testInputs(t)
	cache := t.TempDir()
	first, err := Build(context.Background(), k, agent, cache)
	if err != nil {
		t.Fatal(err)
	}
	// Mark the cached file: a second Build must hand it back untouched.
	must(t, os.WriteFile(first.Initrd, []byte("marker"), 0o644))
	again, err := Build(context.Background(), k, agent, cache)
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Errorf("got %+v, want %+v", again, first)
	}
	if b, _ := os.ReadFile(first.Initrd); string(b) != "marker" {
		t.Error("the second Build rewrote the cached initramfs")
	}

	// Other agent bytes are another key.
	other := writeFile(t, filepath.Join(t.TempDir(), "agent2"), append(elfBinary(elf.EM_X86_64, ""), 0), 0o755)
	img2, err := Build(context.Background(), k, other, cache)
	if err != nil {
		t.Fatal(err)
	}
	if img2.Initrd == first.Initrd {
		t.Error("a different agent got the same initramfs")
	}
	// So is another module set.
	k2 := *k
	k2.Modules = k.Modules[:2]
	img3, err := Build(context.Background(), &k2, agent, cache)
	if err != nil {
		t.Fatal(err)
	}
	if img3.Initrd == first.Initrd || img3.Initrd == img2.Initrd {
		t.Error("a different module set got an existing initramfs")
	}
}

func TestBuildConcurrent(t *testing.T) {
	k, agent := testInputs(t)
	cache := t.TempDir()
	const n = 8
	imgs := make([]Image, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { imgs[i], errs[i] = Build(context.Background(), k, agent, cache) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || imgs[i] != imgs[0] {
			t.Errorf("caller %d: got %+v, %v; want %+v", i, imgs[i], errs[i], imgs[0])
		}
	}
	if _, err := readCPIO(gunzip(t, imgs[0].Initrd)); err != nil {
		t.Error(err)
	}
	left, _ := os.ReadDir(cache)
	if len(left) != 1 {
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Errorf("cache holds %v, want the initramfs alone", names)
	}
}

func TestBuildRefusesAgent(t *testing.T) {
	k, _ := testInputs(t)
	dir := t.TempDir()
	cases := map[string]string{
		"dynamic": writeFile(t, filepath.Join(dir, "dynamic"), elfBinary(elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2"), 0o755),
		"arm64":   writeFile(t, filepath.Join(dir, "arm64"), elfBinary(elf.EM_AARCH64, ""), 0o755),
		"script":  writeFile(t, filepath.Join(dir, "script"), []byte("#!/bin/sh\necho hi\n"), 0o755),
		"dir":     dir,
	}
	// A real dynamically linked program, where the host has one.
	if _, err := os.Stat("/bin/true"); err == nil {
		if f, err := elf.Open("/bin/true"); err == nil {
			if slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
				cases["/bin/true"] = "/bin/true"
			}
			f.Close()
		}
	}
	cache := t.TempDir()
	for name, path := range cases {
		_, err := Build(context.Background(), k, path, cache)
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: got %v, want an invalid-argument error", name, err)
			continue
		}
		t.Logf("%s: %v", name, err)
	}
	if _, err := Build(context.Background(), k, cases["dynamic"], cache); err == nil ||
		!strings.Contains(err.Error(), "dynamically linked") || !strings.Contains(err.Error(), "ld-linux") {
		t.Errorf("dynamic: got %v, want it to say dynamically linked and name the interpreter", err)
	}
	if left, _ := os.ReadDir(cache); len(left) != 0 {
		t.Errorf("refused builds left %d files in the cache", len(left))
	}
}

func TestBuildCancelled(t *testing.T) {
	k, agent := testInputs(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cache := t.TempDir()
	if _, err := Build(ctx, k, agent, cache); !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	if left, _ := os.ReadDir(cache); len(left) != 0 {
		t.Errorf("a cancelled build left %d files", len(left))
	}
}

func TestPrune(t *testing.T) {
	k, agent := testInputs(t)
	cache := t.TempDir()
	keep, err := Build(context.Background(), k, agent, cache)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(cache, "initrd-0000.cpio.gz"), []byte("old"), 0o644)
	oldTmp := writeFile(t, filepath.Join(cache, ".initrd-1111-123.tmp"), []byte("crashed"), 0o644)
	old := time.Now().Add(-2 * staleTempAge)
	must(t, os.Chtimes(oldTmp, old, old))
	writeFile(t, filepath.Join(cache, ".initrd-2222-456.tmp"), []byte("in progress"), 0o644)
	writeFile(t, filepath.Join(cache, "unrelated"), []byte("x"), 0o644)

	if err := Prune(cache, Image{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("empty keep: got %v, want invalid", err)
	}
	if err := Prune(cache, Image{Initrd: filepath.Join(t.TempDir(), "initrd-x.cpio.gz")}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("keep elsewhere: got %v, want invalid", err)
	}
	if err := Prune(cache, keep); err != nil {
		t.Fatal(err)
	}
	var got []string
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		got = append(got, e.Name())
	}
	want := []string{".initrd-2222-456.tmp", filepath.Base(keep.Initrd), "unrelated"}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after Prune: got %v, want %v", got, want)
	}
}
