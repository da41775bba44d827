package guestimage

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// cpioEntry is one entry as readCPIO parses it back.
type cpioEntry struct {
	name                                          string
	ino, mode, uid, gid, nlink, mtime             uint32
	devMajor, devMinor, rdevMajor, rdevMinor, chk uint32
	data                                          []byte
}

// readCPIO parses a newc archive strictly: magic, hex fields, NUL-terminated names, 4-byte padding
// with zero bytes, and a trailer with nothing after it.
func readCPIO(b []byte) ([]cpioEntry, error) {
	var out []cpioEntry
	off := 0
	for {
		if off%4 != 0 {
			return nil, fmt.Errorf("entry at %d is not 4-byte aligned", off)
		}
		if len(b)-off < cpioHeaderSize {
			return nil, fmt.Errorf("truncated header at %d", off)
		}
		h := b[off : off+cpioHeaderSize]
		if string(h[:6]) != cpioMagic {
			return nil, fmt.Errorf("bad magic %q at %d", h[:6], off)
		}
		var f [13]uint32
		for i := range f {
			s := string(h[6+8*i : 6+8*i+8])
			v, err := strconv.ParseUint(s, 16, 32)
			if err != nil || strings.ToUpper(s) != s {
				return nil, fmt.Errorf("bad field %d %q at %d", i, s, off)
			}
			f[i] = uint32(v)
		}
		e := cpioEntry{ino: f[0], mode: f[1], uid: f[2], gid: f[3], nlink: f[4], mtime: f[5],
			devMajor: f[7], devMinor: f[8], rdevMajor: f[9], rdevMinor: f[10], chk: f[12]}
		size, namesize := int(f[6]), int(f[11])
		p := off + cpioHeaderSize
		if namesize < 1 || p+namesize > len(b) || b[p+namesize-1] != 0 {
			return nil, fmt.Errorf("bad name at %d", off)
		}
		e.name = string(b[p : p+namesize-1])
		if err := zeros(b, p+namesize, off+pad4(cpioHeaderSize+namesize)); err != nil {
			return nil, err
		}
		p = off + pad4(cpioHeaderSize+namesize)
		if p+size > len(b) {
			return nil, fmt.Errorf("truncated data of %s", e.name)
		}
		e.data = b[p : p+size]
		if err := zeros(b, p+size, p+pad4(size)); err != nil {
			return nil, err
		}
		off = p + pad4(size)
		if e.name == cpioTrailer {
			if off != len(b) {
				return nil, fmt.Errorf("%d bytes after the trailer", len(b)-off)
			}
			return out, nil
		}
		out = append(out, e)
	}
}

func zeros(b []byte, from, to int) error {
	if to > len(b) {
		return fmt.Errorf("truncated padding at %d", from)
	}
	for i := from; i < to; i++ {
		if b[i] != 0 {
			return fmt.Errorf("padding byte at %d is %#x", i, b[i])
		}
	}
	return nil
}

func TestCPIORoundTrip(t *testing.T) {
	var buf bytes.Buffer
	cw := newCPIOWriter(&buf)
	// Names and sizes of 0 to 5 bytes cover every padding case.
	must(t, cw.dir("d", 0o755))
	must(t, cw.charDev("d/console", 0o600, 5, 1))
	must(t, cw.file("d/ab", 0o644, []byte("x")))
	must(t, cw.file("d/abc", 0o600, []byte("xy")))
	must(t, cw.file("d/abcd", 0o755, []byte("xyz")))
	must(t, cw.file("d/abcde", 0o644, []byte("wxyz")))
	must(t, cw.file("d/e", 0o644, []byte("vwxyz")))
	must(t, cw.file("empty", 0o644, nil))
	must(t, cw.close())

	got, err := readCPIO(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name  string
		mode  uint32
		nlink uint32
		data  string
	}{
		{"d", modeDir | 0o755, 2, ""},
		{"d/console", modeCharDev | 0o600, 1, ""},
		{"d/ab", modeRegular | 0o644, 1, "x"},
		{"d/abc", modeRegular | 0o600, 1, "xy"},
		{"d/abcd", modeRegular | 0o755, 1, "xyz"},
		{"d/abcde", modeRegular | 0o644, 1, "wxyz"},
		{"d/e", modeRegular | 0o644, 1, "vwxyz"},
		{"empty", modeRegular | 0o644, 1, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.name != w.name || g.mode != w.mode || g.nlink != w.nlink || string(g.data) != w.data {
			t.Errorf("entry %d: got %s %o nlink %d %q, want %s %o nlink %d %q",
				i, g.name, g.mode, g.nlink, g.data, w.name, w.mode, w.nlink, w.data)
		}
		if g.ino != uint32(i+1) || g.uid != 0 || g.gid != 0 || g.mtime != 0 || g.chk != 0 {
			t.Errorf("entry %s: got ino %d uid %d gid %d mtime %d check %d, want ino %d and zeros",
				g.name, g.ino, g.uid, g.gid, g.mtime, g.chk, i+1)
		}
	}
	if c := got[1]; c.rdevMajor != 5 || c.rdevMinor != 1 {
		t.Errorf("console: got rdev %d,%d, want 5,1", c.rdevMajor, c.rdevMinor)
	}

	// An independent reader must agree: busybox's cpio, where the host has it.
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Log("no busybox on PATH: skipping the cross-check with busybox cpio")
		return
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bb, "cpio", "-t")
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	cmd.Stderr = &stderr // "N blocks"
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("busybox cpio -t: %v\n%s", err, stderr.Bytes())
	}
	var names []string
	for _, w := range want {
		names = append(names, w.name)
	}
	if g, w := strings.TrimSpace(string(out)), strings.Join(names, "\n"); g != w {
		t.Errorf("busybox cpio -t: got\n%s\nwant\n%s", g, w)
	}
	// Extract the regular files (device nodes need root, so they are left out).
	dir := t.TempDir()
	cmd = exec.Command(bb, "cpio", "-i", "-d", "d/abcde", "d/e", "empty")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("busybox cpio -i: %v\n%s", err, out)
	}
	for name, want := range map[string]string{"d/abcde": "wxyz", "d/e": "vwxyz", "empty": ""} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(b) != want {
			t.Errorf("extracted %s: got %q, %v; want %q", name, b, err, want)
		}
	}
}

func TestCPIOBadNames(t *testing.T) {
	for _, name := range []string{"", "/init", cpioTrailer} {
		cw := newCPIOWriter(&bytes.Buffer{})
		if err := cw.file(name, 0o644, nil); err == nil {
			t.Errorf("file %q: got no error", name)
		}
		if err := cw.close(); err == nil {
			t.Errorf("close after bad name %q: got no error", name)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
