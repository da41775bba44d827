//go:build linux

package layers

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSnapshotOfHostileUpper archives a writable layer as a sandbox's root could leave it (file
// capabilities, setuid, device nodes, a socket, files and a directory named like whiteouts, a
// hard link to one of them) the way a snapshot does, and imports it with the default Config: the
// archive is made, what a layer cannot hold is reported skipped, and the layer carries no
// privilege and hides nothing below it (a real whiteout, made by a deletion, still does).
func TestSnapshotOfHostileUpper(t *testing.T) {
	requireRoot(t)
	upper := t.TempDir()
	p := func(name string) string { return filepath.Join(upper, name) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(p("bin"), 0o755))
	must(os.WriteFile(p("bin/ping"), []byte("ping"), 0o755))
	must(unix.Setxattr(p("bin/ping"), "security.capability", capNetRaw, 0))
	must(os.WriteFile(p("bin/su"), []byte("su"), 0o755))
	must(os.Chmod(p("bin/su"), 0o4755))
	must(os.WriteFile(p("bin/tool"), []byte("tool"), 0o755))
	must(unix.Setxattr(p("bin/tool"), "trusted.evil", []byte("x"), 0))
	must(unix.Setxattr(p("bin/tool"), "user.note", []byte("kept"), 0))
	must(os.MkdirAll(p("dev"), 0o755))
	must(unix.Mknod(p("dev/mem"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1))))
	must(unix.Mknod(p("dev/sda"), unix.S_IFBLK|0o660, int(unix.Mkdev(8, 0))))
	must(os.Link(p("dev/mem"), p("dev/mem2")))
	must(unix.Mknod(p("gone"), unix.S_IFCHR, 0)) // a deletion of a lower file: a real whiteout
	must(os.WriteFile(p(".wh.etc"), nil, 0o644))
	must(os.Link(p(".wh.etc"), p("innocent")))
	must(os.MkdirAll(p("home/.wh..wh..opq"), 0o755))
	must(os.WriteFile(p("home/.wh..wh..opq/f"), []byte("x"), 0o644))
	must(os.WriteFile(p("home/notes"), []byte("mine"), 0o644))
	must(os.WriteFile(p("aa-excluded"), []byte("x"), 0o644))
	must(os.Link(p("aa-excluded"), p("zz-link")))
	must(os.MkdirAll(p("tmp"), 0o755))
	ln, err := net.Listen("unix", p("tmp/sock"))
	must(err)
	defer ln.Close()

	var skipped []Skipped
	var archive bytes.Buffer
	must(WriteTarWith(context.Background(), upper, &archive, TarOptions{Exclude: []string{"aa-excluded"}, Skip: func(s Skipped) { skipped = append(skipped, s) }}))
	want := []Skipped{
		{".wh.etc", SkipWhiteout},
		{"dev/mem", SkipDevice},
		{"dev/mem2", SkipLinkSkipped},
		{"dev/sda", SkipDevice},
		{"home/.wh..wh..opq", SkipWhiteout},
		{"innocent", SkipLinkSkipped},
		{"tmp/sock", SkipSocket},
		{"zz-link", SkipLinkSkipped},
	}
	if !slices.Equal(skipped, want) {
		t.Errorf("skipped:\n%v\nwant\n%v", skipped, want)
	}
	// Without Skip (a directory pushed by its owner) a whiteout-like name is still an error.
	if err := WriteTar(context.Background(), upper, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), ".wh.") {
		t.Errorf("WriteTar of the tree: %v, want the .wh. name refused", err)
	}

	s := newStore(t, Config{})
	layer, err := mounted(t, s, importBytes(t, s, archive.Bytes()).Digest)
	must(err)
	snap := snapshot(t, layer)
	for name, want := range map[string]string{
		"bin/ping":   "reg mode=0755",
		"bin/su":     "reg mode=0755", // setuid stripped
		"bin/tool":   `xattr:user.note="kept"`,
		"gone":       "whiteout",
		"home/notes": "reg mode=0644",
	} {
		if !strings.Contains(snap[name], want) {
			t.Errorf("%s = %q, want it to contain %q", name, snap[name], want)
		}
	}
	for name, desc := range snap {
		if strings.Contains(desc, "security.") || strings.Contains(desc, "trusted.") {
			t.Errorf("%s carries a privileged attribute: %s", name, desc)
		}
		if desc == "whiteout" && name != "gone" || strings.HasPrefix(desc, "char") || strings.HasPrefix(desc, "block") {
			t.Errorf("%s = %s: the layer has a device or whiteout the sandbox did not make by deleting", name, desc)
		}
		if strings.Contains(name, ".wh.") || name == "innocent" || name == "zz-link" || name == "aa-excluded" || strings.HasPrefix(name, "dev/") || name == "tmp/sock" {
			t.Errorf("%s is in the layer; it was skipped", name)
		}
	}
	// No directory of the layer is opaque (which would hide the lower layers' home).
	if _, err := unix.Getxattr(filepath.Join(layer, "home"), opaqueXattr, make([]byte, 8)); err == nil {
		t.Errorf("home is opaque in the layer")
	}
}
