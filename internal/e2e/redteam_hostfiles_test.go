package e2e

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamHostFiles (issue 22 item 4): a host user other than root reads nothing Corral keeps
// in its data dir, and secrets given as --env are not written into logs. It runs sandboxes on
// every runtime with a secret in their create and exec environments, pauses the gVisor and
// microvm ones (a checkpoint image, a VM snapshot), then walks the whole data dir: no file is
// open to group or others, and no directory either, except beneath the places that hold what a
// sandbox or a VM owns (whose modes are theirs), each of which sits in a directory closed to
// group and others. Then it greps every log under the data dir, and corral up's own output, for
// the secrets.
func TestRedTeamHostFiles(t *testing.T) {
	p := withBase(t, "--microvm-debug")
	ctx := context.Background()
	secret := "crl-secret-" + randHex(12)
	execSecret := "crl-exec-secret-" + randHex(12)

	forRuntimes(t, func(t *testing.T, rt string) {
		req := corral.CreateRequest{Base: "base:test", Env: []string{"SECRET=" + secret},
			Network: &corral.NetworkPolicy{Mode: corral.NetworkAllowlist}}
		if rt == "microvm" {
			req.Tier, req.Limits.MemoryBytes = "microvm", 256<<20
		} else {
			req.Runtime = rt
		}
		sb := p.create(req)
		// The secret reaches the sandbox (so it went everywhere a create's env goes) without
		// the sandbox printing it.
		p.sh(sb.ID, `test "$SECRET" = "`+secret+`" && echo data > /root/file`)
		if out, errOut, code := p.cli("", "exec", "--env", "EXEC_SECRET="+execSecret, sb.ID, "--", "/bin/sh", "-c", `test "$EXEC_SECRET" = "`+execSecret+`"`); code != 0 {
			t.Fatalf("corral exec --env: exit %d\n%s%s", code, out, errOut)
		}
		// The daemon's umask (077) takes nothing from what the sandbox's other users need: its
		// root, its bind-mounted resolv.conf, a world-writable /tmp.
		out, errOut, exit := p.runReq(sb.ID, corral.ExecRequest{User: "65534", Argv: []string{"/bin/sh", "-c",
			"ls / >/dev/null && grep -q nameserver /etc/resolv.conf && touch /tmp/nobody && echo ok"}})
		if exit == nil || exit.Code != 0 || out != "ok\n" {
			t.Errorf("a non-root user in the sandbox: %q %q %+v, want ok", out, errOut, exit)
		}
		// A refused env value is not echoed into the log either.
		if _, _, _, err := p.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}, Env: []string{"=" + execSecret}}); !corral.IsInvalid(err) {
			t.Fatalf("exec with a malformed env entry: %v, want invalid", err)
		}
		if rt != "runc" {
			if _, err := p.Client.PauseSandbox(ctx, sb.ID); err != nil {
				t.Fatalf("pause: %v", err)
			}
		}
	})

	// Every entry of the data dir, but what a sandbox or VM owns.
	var dataDev uint64
	var checked, sealed int
	err := filepath.WalkDir(p.DataDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while we walked
			}
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		rel, _ := filepath.Rel(p.DataDir, path)
		if path == p.DataDir {
			dataDev = st.Dev
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return nil
		}
		// A mount (a sandbox's rootfs, a disk, a layer image, lazyd's FUSE) holds the sandbox's
		// or the layer's files with their own modes: its parent must be closed.
		if uint64(st.Dev) != dataDev || ownedBySandbox(rel) {
			parent, _ := os.Stat(filepath.Dir(path))
			if parent.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s (sandbox-owned) sits in %s, mode %04o: open to other users", rel, filepath.Dir(rel), parent.Mode().Perm())
			}
			sealed++
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		checked++
		if m := fi.Mode().Perm(); m&0o077 != 0 {
			t.Errorf("%s: mode %04o, open to group or others", rel, m)
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			t.Errorf("%s: mode %v: setuid/setgid in the data dir", rel, fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("data dir: %d entries checked, %d sandbox-owned places sealed by their parents", checked, sealed)

	// No secret in a log, nor in what corral up printed at debug level.
	logs := map[string][]byte{"corral up output": []byte(p.Logs())}
	// Every file with "log" in its name that lies on the data dir's own filesystem (state files,
	// config.json, vm.json and machine.json, hold the env by design: they are 0600, checked above).
	filepath.WalkDir(p.DataDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := os.Lstat(path)
		if err != nil || uint64(fi.Sys().(*syscall.Stat_t).Dev) != dataDev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if fi.Mode().IsRegular() && strings.Contains(strings.ToLower(d.Name()), "log") {
			if b, err := os.ReadFile(path); err == nil {
				logs[path] = b
			}
		}
		return nil
	})
	for name, b := range logs {
		for _, s := range []string{secret, execSecret} {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds a secret given as --env (%s...)", name, s[:16])
			}
		}
	}
	names := make([]string, 0, len(logs))
	for name := range logs {
		names = append(names, strings.TrimPrefix(name, p.DataDir+"/"))
	}
	t.Logf("grepped %d logs for the secrets: %s", len(names), strings.Join(names, ", "))

	// Paused sandboxes are not the harness's to clean up.
	list, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{})
	for _, sb := range list {
		p.Client.DeleteSandbox(ctx, sb.ID)
	}
}

// ownedBySandbox reports whether rel (relative to the data dir) holds what is not the host's
// to close, with the modes its readers need, so that its parent must be closed instead: an
// overlay upper or work directory, a rootfs, an extracted layer tree (the sandbox's users'),
// the agent binaries and resolv.conf files bind-mounted into sandboxes, a VM's boot files (read by the VM's own uid
// through a descriptor), and the directory blob store's objects (0644 in 0755 directories by
// design, for corral processes sharing its mount).
func ownedBySandbox(rel string) bool {
	switch filepath.Base(rel) {
	case "rootfs", "upper", "work", "tree":
		return true
	}
	switch filepath.Dir(rel) {
	case "sandboxes/.agents", "vmboot", "blobs", "net":
		return true
	}
	return false
}
