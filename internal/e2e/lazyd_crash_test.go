package e2e

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestLazydCrash: a lazyd killed with SIGKILL is replaced by its keeper, which held the FUSE
// connection meanwhile: the new lazyd resumes it, so a sandbox that was reading its layer reads
// it whole after the crash (page cache dropped), and creates never block on the crash (they
// did: "mkdir .../layers/lazy/mnt: file exists" until someone unmounted by hand).
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
	// The sandbox made before the crash reads its layer through the resumed connection, its
	// page cache dropped first (from the host: the sandbox may not write drop_caches).
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatal(err)
	}
	want := p.sh(after.ID, "busybox md5sum /bin/busybox | cut -c1-32")
	if got := p.sh(before.ID, "busybox md5sum /bin/busybox | cut -c1-32"); got != want {
		t.Fatalf("the sandbox made before the crash reads %q, want %q", got, want)
	}
	if got := lazydPids(p.DataDir); len(got) != 1 || got[0] == pids[0] {
		t.Fatalf("lazyd processes after the crash: %v (killed %s)", got, pids[0])
	}
}
