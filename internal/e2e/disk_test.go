package e2e

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestDiskAdmission: a node admits sandboxes while their disks fit its data dir's filesystem,
// refuses the next with 409 node_full naming disk, takes one again once a delete gave its disk
// back, and bounds each sandbox's disk by --max-sandbox-disk whatever the project's quota.
func TestDiskAdmission(t *testing.T) {
	needRoot(t)
	fs := diskTestFS(t, 256<<20)
	p := startCorralOnDir(t, fs, "--sandbox-disk", "32M", "--max-sandbox-disk", "96M", "--disk-pool", "-1", "--no-microvm")
	p.importDirWith(p.Client, "base", "test", corral.KindBase, busyboxRootfs(t), corral.ImportOptions{Public: true})
	ctx := context.Background()

	_, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: corral.Limits{DiskBytes: 128 << 20}})
	var ae *corral.APIError
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Field != "limits.disk_bytes" {
		t.Fatalf("create above --max-sandbox-disk: err = %v, want 400 naming limits.disk_bytes", err)
	}

	var ids []string
	for range 20 {
		sb, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test"})
		if err != nil {
			assertNodeFullDisk(t, "create beyond the node's disk", err)
			t.Logf("refused after %d: %v", len(ids), err)
			break
		}
		ids = append(ids, sb.ID)
	}
	if len(ids) < 2 || len(ids) == 20 {
		t.Fatalf("%d sandboxes of 32 MiB admitted on a 256 MiB data dir", len(ids))
	}
	// The CLI says the same, and exits non-zero.
	_, errOut, code := p.cli("", "create", "--base", "base:test")
	if code == 0 || !strings.Contains(errOut, "disk: have") {
		t.Fatalf("corral create on a full node: exit %d, stderr %q; want a failure naming disk", code, errOut)
	}
	if _, err := p.Client.DeleteSandbox(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test"}); err != nil {
		t.Fatalf("create after a delete gave its disk back: %v", err)
	}
}

// TestDiskFlagsValidated: corral up refuses disk flags that contradict each other, before it
// changes anything.
func TestDiskFlagsValidated(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--sandbox-disk", "1G", "--max-sandbox-disk", "512M"},
		{"--sandbox-disk", "1M"},
		{"--overcommit-disk", "0.01"},
	} {
		cmd := exec.Command(filepath.Join(binDir, "corral"), append([]string{"up", "--data-dir", filepath.Join(dir, "d"), "--listen", freePort(t)}, args...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), strings.TrimPrefix(args[0], "--")) {
			t.Errorf("corral up %v: err %v, output %q; want a refusal naming the flag", args, err, out)
		}
		if matches, _ := filepath.Glob(filepath.Join(dir, "d", "*")); len(matches) > 0 {
			t.Errorf("corral up %v left %v", args, matches)
		}
	}
}
