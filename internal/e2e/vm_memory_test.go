package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestMicroVMMemoryCgroup: a microvm's QEMU runs in its sandbox's own memory cgroup under the
// data dir's cgroup parent, limited to the guest's memory plus a bounded overhead, and the
// cgroup goes with the sandbox.
func TestMicroVMMemoryCgroup(t *testing.T) {
	needMicroVM(t)
	p := withBase(t)
	sb := p.create(corral.CreateRequest{Tier: "microvm", Limits: corral.Limits{MemoryBytes: 256 << 20}})
	pids := qemuPids(sb.ID)
	if len(pids) != 1 {
		t.Fatalf("QEMU processes of %s: %v", sb.ID, pids)
	}
	// cgroup v1 (this host) or v2: the memory controller's directory of the sandbox.
	dir := ""
	for _, d := range []string{"/sys/fs/cgroup/memory" + p.Cgroup + "/" + sb.ID, "/sys/fs/cgroup" + p.Cgroup + "/" + sb.ID} {
		if _, err := os.Stat(d); err == nil {
			dir = d
			break
		}
	}
	if dir == "" {
		t.Fatalf("no memory cgroup for %s under %s", sb.ID, p.Cgroup)
	}
	limitFile := "memory.limit_in_bytes"
	if strings.HasPrefix(dir, "/sys/fs/cgroup/"+strings.TrimPrefix(p.Cgroup, "/")) {
		limitFile = "memory.max"
	}
	b, err := os.ReadFile(filepath.Join(dir, limitFile))
	if err != nil {
		t.Fatal(err)
	}
	limit, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if limit < 256<<20 || limit > 256<<20+512<<20 {
		t.Errorf("QEMU's memory limit = %d bytes, want the guest's 256 MiB plus a bounded overhead", limit)
	}
	procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(pids[0])) {
		t.Errorf("QEMU (pid %d) is not in %s (procs %q)", pids[0], dir, procs)
	}
	if _, err := p.Client.DeleteSandbox(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the VM's cgroup removed with it", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
}
