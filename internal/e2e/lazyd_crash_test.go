package e2e

import (
	"strconv"
	"syscall"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestLazydCrash: a lazyd killed with SIGKILL leaves its FUSE mount behind, dead. The next
// create starts another lazyd, which detaches the dead mount first, so creates never block on
// it (they did: "mkdir .../layers/lazy/mnt: file exists" until someone unmounted by hand), and
// its sandboxes read their layers.
func TestLazydCrash(t *testing.T) {
	p := withBase(t)
	before := p.create(corral.CreateRequest{})
	p.sh(before.ID, "cat /bin/busybox >/dev/null")
	pids := lazydPids(p.DataDir)
	if len(pids) != 1 {
		t.Fatalf("lazyd processes of the data dir: %v", pids)
	}
	pid, _ := strconv.Atoi(pids[0])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the killed lazyd to be gone", func() bool {
		for _, q := range lazydPids(p.DataDir) {
			if q == pids[0] {
				return false
			}
		}
		return true
	})
	after := p.create(corral.CreateRequest{})
	if out := p.sh(after.ID, "busybox md5sum /bin/busybox | cut -c1-32"); len(out) < 32 {
		t.Fatalf("a sandbox made after lazyd died cannot read its layer: %q", out)
	}
	// A sandbox that was reading through the dead mount keeps what its page cache holds; reads
	// of anything else fail with EIO (a known gap: docs/ARCHITECTURE.md). Logged, not asserted.
	out, errOut, exit := p.run(before.ID, "/bin/sh", "-c", "echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; busybox md5sum /bin/busybox")
	t.Logf("the sandbox made before the crash: exit %+v, %q %q", exit, out, errOut)
	if got := lazydPids(p.DataDir); len(got) != 1 || got[0] == pids[0] {
		t.Fatalf("lazyd processes after the crash: %v (killed %s)", got, pids[0])
	}
}
