package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// diskTestFS makes an ext4 filesystem of size bytes in an image file, loop-mounted on a fresh short
// directory (agent sockets live under a data dir). The test's cleanup unmounts it, checks that
// no loop device is left on the image, and removes both.
func diskTestFS(t *testing.T, size int64) string {
	t.Helper()
	work, err := os.MkdirTemp("", "crl-fs-")
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(work, "fs.img")
	mnt, err := os.MkdirTemp("", "crl-")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err == nil {
		err = syscall.Fallocate(int(f.Fd()), 0, 0, size)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"mkfs.ext4", "-q", "-F", "-m", "0", img}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	t.Cleanup(func() {
		// After corral's own cleanup (registered later, so run earlier): nothing may hold the mount.
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s (something of corral still holds the data dir's filesystem)", mnt, err, out)
			exec.Command("umount", "-l", mnt).Run()
		}
		// The kernel detaches an autoclear loop device after the unmount returns (its release
		// runs on a workqueue): give it a moment before calling it left behind.
		var out []byte
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			out, _ = exec.Command("losetup", "-j", img).Output()
			if len(bytes.TrimSpace(out)) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("loop device left on the test filesystem's image: %s", out)
		}
		os.Remove(mnt)
		os.RemoveAll(work)
	})
	return mnt
}

// startCorralOnDir is startCorral on a data dir the caller made (and removes).
func startCorralOnDir(t *testing.T, dataDir string, extra ...string) *corralProc {
	t.Helper()
	needRoot(t)
	p := &corralProc{t: t, DataDir: dataDir, Listen: freePort(t), extra: extra}
	p.pickHostResources()
	p.URL = "http://" + p.Listen
	p.start()
	t.Cleanup(p.cleanup)
	return p
}

// loopsBackedUnderDir lists the loop devices whose backing file lies under dir.
func loopsBackedUnderDir(dir string) []string {
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var devs []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			devs = append(devs, p)
		}
	}
	return devs
}

// fillDisk writes zeros to path until its filesystem is full, the way anything else on a host
// (a log, another tenant) fills it.
func fillDisk(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		m, err := f.Write(buf)
		n += int64(m)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatalf("fill %s: %v", path, err)
		}
	}
	// What was acknowledged into the page cache must reach the disk, or the disk is not full.
	for f.Sync() != nil {
		if err := f.Truncate(n - 1<<20); err != nil {
			t.Fatal(err)
		}
		n -= 1 << 20
	}
	return n
}

// ackedWrite is a write Corral acknowledged: a file and the checksum of what was written.
type ackedWrite struct {
	sandbox, path, sum string
	viaAPI             bool
}

// TestFaultFullDisk runs Corral on a small data-dir filesystem and fills it under load: creates
// are admitted only while the node's disk promise fits (then 409 node_full naming disk), another
// writer fills the host filesystem, the sandboxes go on writing through the files API and
// commands until their own disks are full, and then: writes failed with ENOSPC (never silently),
// every acknowledged write reads back intact from disk, the sandboxes still run commands, a
// create is node_full naming disk, and after deletes and corral's exit nothing is left
// (mounts, loop devices).
func TestFaultFullDisk(t *testing.T) {
	needRoot(t)
	fs := diskTestFS(t, 512<<20)
	// 64 MiB disks, none made ahead: the filesystem holds about seven.
	p := startCorralOnDir(t, fs, "--sandbox-disk", "64M", "--disk-pool", "-1", "--no-microvm")
	p.importDirWith(p.Client, "base", "test", corral.KindBase, busyboxRootfs(t), corral.ImportOptions{Public: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Admission: creates until the promise is spent; each allocates its whole disk.
	var sbs []string
	var refused error
	for range 20 {
		sb, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test"})
		if err != nil {
			refused = err
			break
		}
		sbs = append(sbs, sb.ID)
	}
	assertNodeFullDisk(t, "create beyond the node's disk", refused)
	if len(sbs) < 3 {
		t.Fatalf("only %d sandboxes of 64 MiB fit on a 512 MiB data dir", len(sbs))
	}
	t.Logf("%d sandboxes admitted, then: %v", len(sbs), refused)

	// Something else fills the host's filesystem.
	filled := fillDisk(t, filepath.Join(fs, "filler"))
	t.Cleanup(func() { os.Remove(filepath.Join(fs, "filler")) })
	t.Logf("filler took %d MiB; the data dir's filesystem is full", filled>>20)

	// Load: every sandbox writes through the files API and through a command that fsyncs,
	// 1 MiB at a time, until its own disk is full.
	var mu sync.Mutex
	var acks []ackedWrite
	var apiFull, cmdFull int
	var wg sync.WaitGroup
	for _, id := range sbs {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				buf := make([]byte, 1<<20)
				rand.Read(buf)
				path := fmt.Sprintf("/api-%d", i)
				_, err := p.Client.WriteFile(ctx, id, path, bytes.NewReader(buf), corral.WriteFileOptions{})
				if err != nil {
					if !corral.IsExhausted(err) || !strings.Contains(err.Error(), "no space left on device") {
						t.Errorf("files API write to a full disk of %s: %v, want exhausted (no space left on device)", id, err)
					}
					mu.Lock()
					apiFull++
					mu.Unlock()
					return
				}
				sum := sha256.Sum256(buf)
				mu.Lock()
				acks = append(acks, ackedWrite{id, path, hex.EncodeToString(sum[:]), true})
				mu.Unlock()
			}
		}()
		go func() {
			defer wg.Done()
			// Each file: 1 MiB from urandom, fsync'd by dd; its checksum is printed only when dd
			// succeeded. The first failure ends the loop and names its error.
			script := `i=0; while :; do
				if ! out=$(dd if=/dev/urandom of=/cmd-$i bs=1M count=1 conv=fsync 2>&1); then echo "FAIL $out"; exit 0; fi
				echo "OK /cmd-$i $(sha256sum /cmd-$i | cut -d' ' -f1)"; i=$((i+1)); done`
			out, _, exit, err := p.Client.Run(ctx, id, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
			if err != nil || exit == nil || exit.Code != 0 {
				t.Errorf("writer in %s: exit %+v, err %v\n%s", id, exit, err, out)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				switch f := strings.Fields(line); {
				case len(f) == 3 && f[0] == "OK":
					acks = append(acks, ackedWrite{id, f[1], f[2], false})
				case strings.HasPrefix(line, "FAIL"):
					if !strings.Contains(line, "No space left on device") {
						t.Errorf("command write in %s failed with %q, want ENOSPC", id, line)
					}
					cmdFull++
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if apiFull != len(sbs) || cmdFull != len(sbs) {
		t.Fatalf("%d of %d files-API writers and %d command writers ended on ENOSPC", apiFull, len(sbs), cmdFull)
	}
	t.Logf("%d writes acknowledged before every sandbox's disk was full", len(acks))

	// Everything acknowledged reads back from disk, not from the page cache.
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
	lost := 0
	for _, a := range acks {
		var got string
		if a.viaAPI {
			r, err := p.Client.ReadFile(ctx, a.sandbox, a.path)
			if err != nil {
				t.Errorf("read back %s in %s: %v", a.path, a.sandbox, err)
				lost++
				continue
			}
			h := sha256.New()
			_, err = io.Copy(h, r)
			r.Close()
			if err != nil {
				t.Errorf("read back %s in %s: %v", a.path, a.sandbox, err)
			}
			got = hex.EncodeToString(h.Sum(nil))
		} else {
			out, _, exit, err := p.Client.Run(ctx, a.sandbox, corral.ExecRequest{Argv: []string{"sha256sum", a.path}})
			if err != nil || exit == nil || exit.Code != 0 {
				t.Errorf("sha256sum %s in %s: %v %+v", a.path, a.sandbox, err, exit)
				lost++
				continue
			}
			got, _, _ = strings.Cut(string(out), " ")
		}
		if got != a.sum {
			t.Errorf("%s in %s reads back with sha256 %s, acknowledged %s", a.path, a.sandbox, got, a.sum)
			lost++
		}
	}
	t.Logf("acknowledged writes lost: %d of %d", lost, len(acks))

	// The sandboxes still work, the node refuses what it cannot hold, and a delete makes room.
	for _, id := range sbs {
		if out := p.sh(id, "echo alive"); strings.TrimSpace(out) != "alive" {
			t.Errorf("sandbox %s after its disk filled: %q", id, out)
		}
	}
	_, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test"})
	assertNodeFullDisk(t, "create on a full host disk", err)
	// A delete is recorded on a full disk (the store's reserve), and gives its disk back.
	if _, err := p.Client.DeleteSandbox(ctx, sbs[0]); err != nil {
		t.Fatalf("delete on a full disk: %v", err)
	}
	if err := os.Remove(filepath.Join(fs, "filler")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a create once the disk has room again", func() bool {
		sb, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test"})
		if err == nil {
			sbs[0] = sb.ID
		}
		return err == nil
	})

	// Nothing left: corral's cleanup deletes the sandboxes and stops it; then no mount and no
	// loop device of the data dir may remain (diskTestFS's cleanup unmounts and checks the image).
	p.cleanup()
	if devs := loopsBackedUnderDir(fs); len(devs) > 0 {
		t.Errorf("loop devices left backed by the data dir after corral stopped: %v", devs)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], fs+"/") {
			t.Errorf("mount left under the data dir: %s", line)
		}
	}
}

// assertNodeFullDisk fails the test unless err is a 409 node_full whose message names disk.
func assertNodeFullDisk(t *testing.T, what string, err error) {
	t.Helper()
	var ae *corral.APIError
	if !errors.As(err, &ae) || ae.Status != 409 || ae.Code != "node_full" || !strings.Contains(ae.Message, "disk: have") {
		t.Fatalf("%s: err = %v, want 409 node_full naming disk", what, err)
	}
}
