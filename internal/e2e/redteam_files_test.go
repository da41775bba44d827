package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamFiles attacks the file paths between host and sandbox: the files API, tar upload
// and download and `corral cp` in both directions, with symbolic links (to host paths, to
// /proc/1/root, climbing with ../), hard links, absolute and ".." names and device nodes. The
// host holds a secret file, a victim directory and the admin token at known paths; none may be
// read, listed, written or moved through any of them.
func TestRedTeamFiles(t *testing.T) { forRuntimes(t, testRedTeamFiles) }

func testRedTeamFiles(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	c := p.Client
	host := t.TempDir()
	secret := filepath.Join(host, "secret")
	victim := filepath.Join(host, "victim")
	os.WriteFile(secret, []byte("host-secret-"+randHex(8)), 0o600)
	os.Mkdir(victim, 0o755)
	os.WriteFile(filepath.Join(victim, "keep"), []byte("keep"), 0o644)
	token := filepath.Join(p.DataDir, "admin.token")
	hostUntouched := func(t *testing.T) {
		t.Helper()
		ents, _ := os.ReadDir(victim)
		if len(ents) != 1 || ents[0].Name() != "keep" {
			t.Fatalf("the host directory %s was written: %v", victim, ents)
		}
		if b, _ := os.ReadFile(filepath.Join(victim, "keep")); string(b) != "keep" {
			t.Fatalf("the host file %s/keep was changed: %q", victim, b)
		}
	}
	leaks := func(b []byte) bool {
		s, _ := os.ReadFile(secret)
		tok, _ := os.ReadFile(token)
		return bytes.Contains(b, s) || bytes.Contains(b, bytes.TrimSpace(tok)) || bytes.Contains(b, []byte("host-secret-"))
	}

	sb := p.create(corral.CreateRequest{Limits: corral.Limits{DiskBytes: 64 << 20}})
	// Links planted inside the sandbox at every host path the attacker knows.
	up := strings.Repeat("../", 12)
	p.sh(sb.ID, strings.Join([]string{
		"mkdir -p /trap",
		"ln -s " + secret + " /trap/abs-secret",
		"ln -s " + up + strings.TrimPrefix(secret, "/") + " /trap/up-secret",
		"ln -s /proc/1/root" + secret + " /trap/proc-secret",
		"ln -s " + token + " /trap/abs-token",
		"ln -s /proc/1/root" + token + " /trap/proc-token",
		"ln -s " + victim + " /trap/abs-victim",
		"ln -s " + up + strings.TrimPrefix(victim, "/") + " /trap/up-victim",
		"ln -s /proc/1/root" + victim + " /trap/proc-victim",
		"ln -s /proc/1/root/ /trap/proc-root",
		"ln -s /proc/self/root/../../.. /trap/self-root",
	}, " && "))
	links := []string{"abs-secret", "up-secret", "proc-secret", "abs-token", "proc-token"}
	dirLinks := []string{"abs-victim", "up-victim", "proc-victim"}

	t.Run("files read through links", func(t *testing.T) {
		for _, l := range links {
			rc, err := c.ReadFile(ctx, sb.ID, "/trap/"+l)
			if err == nil {
				b, _ := io.ReadAll(rc)
				rc.Close()
				if leaks(b) {
					t.Errorf("ReadFile /trap/%s returned the host's file", l)
				}
			}
			if st, err := c.Stat(ctx, sb.ID, "/trap/"+l); err == nil && st.Link == "" {
				t.Errorf("Stat /trap/%s: %+v, want the link itself", l, st)
			}
		}
	})
	t.Run("files list through links", func(t *testing.T) {
		for _, l := range append(dirLinks, "proc-root", "self-root") {
			list, _ := c.List(ctx, sb.ID, "/trap/"+l)
			for _, fi := range list {
				if fi.Name == "keep" || fi.Name == "admin.token" || fi.Name == "corral.db" {
					t.Errorf("List /trap/%s shows the host's %s", l, fi.Name)
				}
			}
		}
	})
	t.Run("files write through links", func(t *testing.T) {
		for _, l := range dirLinks {
			c.WriteFile(ctx, sb.ID, "/trap/"+l+"/pwned", strings.NewReader("x"), corral.WriteFileOptions{})
			c.WriteFile(ctx, sb.ID, "/trap/"+l+"/keep", strings.NewReader("x"), corral.WriteFileOptions{})
			c.Mkdir(ctx, sb.ID, corral.MkdirRequest{Path: "/trap/" + l + "/dir", Parents: true})
		}
		c.WriteFile(ctx, sb.ID, "/trap/proc-root"+victim+"/pwned", strings.NewReader("x"), corral.WriteFileOptions{Parents: true})
		hostUntouched(t)
	})
	t.Run("files move through links", func(t *testing.T) {
		p.sh(sb.ID, "echo moved > /root/m")
		for _, l := range dirLinks {
			c.Move(ctx, sb.ID, "/root/m", "/trap/"+l+"/moved")
			c.Move(ctx, sb.ID, "/trap/"+l+"/keep", "/root/stolen-"+l)
		}
		hostUntouched(t)
		if out := p.sh(sb.ID, "cat /root/stolen-* 2>/dev/null; true"); strings.Contains(out, "keep") {
			t.Fatalf("a move through a link took the host's file: %q", out)
		}
	})
	t.Run("files remove through links", func(t *testing.T) {
		for _, l := range dirLinks {
			c.Remove(ctx, sb.ID, "/trap/"+l+"/keep", false)
		}
		hostUntouched(t)
	})
	t.Run("tar out through links", func(t *testing.T) {
		for _, l := range append(dirLinks, "proc-root", "self-root") {
			rc, err := c.TarOut(ctx, sb.ID, "/trap/"+l)
			if err != nil {
				continue
			}
			var names []string
			tr := tar.NewReader(rc)
			for {
				h, err := tr.Next()
				if err != nil {
					break
				}
				names = append(names, h.Name)
				if b, _ := io.ReadAll(tr); leaks(b) || (h.Name == "keep" && string(b) == "keep") {
					t.Errorf("TarOut /trap/%s carries the host's %s", l, h.Name)
				}
			}
			rc.Close()
		}
		// The whole tree: the links stay links, and the host files are not in it.
		rc, err := c.TarOut(ctx, sb.ID, "/trap")
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if h.Name != "" && h.Typeflag != tar.TypeSymlink && h.Typeflag != tar.TypeDir {
				t.Errorf("TarOut /trap: %s is a %c, want every entry a link", h.Name, h.Typeflag)
			}
		}
		rc.Close()
		if _, err := c.TarOut(ctx, sb.ID, "/proc/1"); !corral.IsInvalid(err) {
			t.Errorf("TarOut /proc/1: %v, want invalid (procfs is never archived)", err)
		}
	})

	// Hostile tars uploaded into /up: each is refused, writes nothing through a link, and the
	// host is untouched.
	// The sandbox's own copies of the host paths (made through /proc/1/root above) go, so that
	// a check below sees only what a tar made.
	p.sh(sb.ID, "mkdir -p /up && rm -rf "+victim+" /etc/pwned*")
	hostile := []struct {
		name    string
		entries []tar.Header
		check   string // shell test that must print nothing
	}{
		{"tar in symlink then file through it", []tar.Header{
			{Name: "l", Typeflag: tar.TypeSymlink, Linkname: victim},
			{Name: "l/pwned", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
			"ls " + victim + "/pwned 2>/dev/null"},
		{"tar in relative symlink climbing then file", []tar.Header{
			{Name: "r", Typeflag: tar.TypeSymlink, Linkname: up + "etc"},
			{Name: "r/pwned", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
			"ls /etc/pwned 2>/dev/null"},
		{"tar in symlink to proc root then file", []tar.Header{
			{Name: "p", Typeflag: tar.TypeSymlink, Linkname: "/proc/1/root/etc"},
			{Name: "p/pwned", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
			"ls /etc/pwned 2>/dev/null"},
		{"tar in hardlink to absolute path", []tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}},
			"ls /up/h 2>/dev/null"},
		{"tar in hardlink climbing out", []tar.Header{{Name: "h2", Typeflag: tar.TypeLink, Linkname: "../etc/passwd"}},
			"ls /up/h2 2>/dev/null"},
		{"tar in hardlink through a link", []tar.Header{
			{Name: "e", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			{Name: "h3", Typeflag: tar.TypeLink, Linkname: "e/passwd"}},
			"ls /up/h3 2>/dev/null"},
		{"tar in absolute name", []tar.Header{{Name: "/etc/pwned-abs", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
			"ls /etc/pwned-abs /up/etc/pwned-abs 2>/dev/null"},
		{"tar in dotdot name", []tar.Header{{Name: "a/../../pwned-dd", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}},
			"ls /pwned-dd 2>/dev/null"},
		{"tar in block device", []tar.Header{{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8, Mode: 0o666}},
			"ls /up/sda 2>/dev/null"},
		{"tar in char device", []tar.Header{{Name: "mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666}},
			"ls /up/mem 2>/dev/null"},
	}
	for _, h := range hostile {
		t.Run(h.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, e := range h.entries {
				tw.WriteHeader(&e)
				if e.Size > 0 {
					tw.Write(bytes.Repeat([]byte("x"), int(e.Size)))
				}
			}
			tw.Close()
			if err := c.TarIn(ctx, sb.ID, "/up", &buf); !corral.IsInvalid(err) {
				t.Errorf("TarIn: %v, want invalid", err)
			}
			if out := p.sh(sb.ID, h.check+"; true"); out != "" {
				t.Errorf("after the refused tar: %s", out)
			}
			hostUntouched(t)
		})
	}
	t.Run("tar in setuid bits cleared", func(t *testing.T) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "suid", Typeflag: tar.TypeReg, Size: 1, Mode: 0o6755, Uid: 0})
		tw.Write([]byte("x"))
		tw.Close()
		if err := c.TarIn(ctx, sb.ID, "/up", &buf); err != nil {
			t.Fatal(err)
		}
		if got := p.sh(sb.ID, "stat -c %a /up/suid"); got != "755\n" {
			t.Fatalf("mode of an uploaded setuid file: %q, want 755", got)
		}
	})
	t.Run("tar in bomb", func(t *testing.T) {
		// 128 MiB of zeros into a 64 MiB disk: the disk limit stops it, the sandbox goes on.
		pr, pw := io.Pipe()
		go func() {
			tw := tar.NewWriter(pw)
			tw.WriteHeader(&tar.Header{Name: "bomb", Typeflag: tar.TypeReg, Size: 128 << 20, Mode: 0o644})
			io.CopyN(tw, zeros{}, 128<<20)
			pw.CloseWithError(tw.Close())
		}()
		if err := c.TarIn(ctx, sb.ID, "/up", pr); err == nil {
			t.Errorf("TarIn of 128 MiB into a 64 MiB disk succeeded")
		}
		pr.Close()
		// A gzip stream is not a tar: refused, not inflated.
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		io.CopyN(zw, zeros{}, 64<<20)
		zw.Close()
		if err := c.TarIn(ctx, sb.ID, "/up", &gz); !corral.IsInvalid(err) {
			t.Errorf("TarIn of a gzip bomb: %v, want invalid", err)
		}
		p.sh(sb.ID, "rm -f /up/bomb")
		if got := p.sh(sb.ID, "echo fine"); got != "fine\n" {
			t.Fatalf("after the bombs: %q", got)
		}
	})

	// corral cp, both ways.
	t.Run("cp out keeps links as links", func(t *testing.T) {
		dst := t.TempDir()
		if _, errOut, code := p.cli("", "cp", sb.ID+":/trap", dst); code != 0 {
			t.Fatalf("cp out: %s", errOut)
		}
		filepath.Walk(dst, func(path string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				t.Errorf("cp out made a regular file %s from a link", path)
			}
			return nil
		})
		// A file copied over a link left by an earlier copy replaces the link, never writes
		// through it.
		p.sh(sb.ID, "rm /trap/abs-victim && echo pwned > /trap/abs-victim")
		if _, errOut, code := p.cli("", "cp", sb.ID+":/trap", dst); code != 0 {
			t.Fatalf("second cp out: %s", errOut)
		}
		hostUntouched(t)
		if b, _ := os.ReadFile(filepath.Join(dst, "trap", "abs-victim")); string(b) != "pwned\n" {
			t.Fatalf("second cp out: abs-victim = %q", b)
		}
		p.sh(sb.ID, "rm /trap/abs-victim && ln -s "+victim+" /trap/abs-victim")
		// One file through a link in the sandbox: the sandbox's view, never the host's file.
		out := filepath.Join(dst, "token-copy")
		p.cli("", "cp", sb.ID+":/trap/abs-token", out)
		if b, _ := os.ReadFile(out); leaks(b) {
			t.Fatalf("cp out of a link to the admin token copied the host's token")
		}
	})
	t.Run("cp in does not follow local links into the sandbox", func(t *testing.T) {
		src := t.TempDir()
		os.WriteFile(filepath.Join(src, "plain"), []byte("plain"), 0o644)
		os.Symlink(secret, filepath.Join(src, "to-secret"))
		os.Symlink(token, filepath.Join(src, "to-token"))
		if _, errOut, code := p.cli("", "cp", src, sb.ID+":/cpin"); code != 0 {
			t.Fatalf("cp in: %s", errOut)
		}
		got := p.sh(sb.ID, "cd /cpin && cat plain && for f in to-secret to-token; do [ -L $f ] && echo link; cat $f 2>/dev/null; done; true")
		if leaks([]byte(got)) || !strings.HasPrefix(got, "plainlink\n") {
			t.Fatalf("cp in of local links: %q", got)
		}
		// Into a destination that is a link to a host path: lands in the sandbox, not the host.
		p.cli("", "cp", filepath.Join(src, "plain"), sb.ID+":/trap/abs-victim/plain")
		p.cli("", "cp", src, sb.ID+":/trap/up-victim/")
		hostUntouched(t)
	})
	if got := p.sh(sb.ID, "echo still here"); got != "still here\n" {
		t.Fatalf("sandbox after the file attacks: %q", got)
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
