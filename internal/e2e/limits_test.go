package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestCreateLimitsPolicy: a create whose limits break its tier's bounds (internal/limits) is a
// 400 naming the field and the tier, refused before anything is allocated: no sandbox record
// (not even a failed one), no mount, no network slot, no VM. The microvm's own minimums (128 MiB
// of memory, 64 MiB of disk) are among them: they were checked only after the layers were
// mounted and the network attached, which left a failed record.
func TestCreateLimitsPolicy(t *testing.T) {
	forRuntimes(t, func(t *testing.T, rt string) {
		p := withBaseOn(t, rt)
		ctx := context.Background()
		tier, runtime := "container", rt
		if rt == "microvm" {
			tier, runtime = "microvm", ""
		}
		cases := []struct {
			name   string
			limits corral.Limits
			field  string
		}{
			{"cpus below the least", corral.Limits{CPUs: 0.001}, "limits.cpus"},
			{"cpus above the most", corral.Limits{CPUs: 65}, "limits.cpus"},
			{"memory below the least", corral.Limits{MemoryBytes: 8 << 20}, "limits.memory_bytes"},
			{"memory above the most", corral.Limits{MemoryBytes: 257 << 30}, "limits.memory_bytes"},
			{"pids below the least", corral.Limits{Pids: 7}, "limits.pids"},
			{"pids negative", corral.Limits{Pids: -1}, "limits.pids"},
			{"disk below the least", corral.Limits{DiskBytes: 8 << 20}, "limits.disk_bytes"},
			{"disk above the node's most", corral.Limits{DiskBytes: 65 << 30}, "limits.disk_bytes"},
			{"open files below the least", corral.Limits{OpenFiles: 63}, "limits.open_files"},
			{"open files above the most", corral.Limits{OpenFiles: 1<<20 + 1}, "limits.open_files"},
			{"output below the least", corral.Limits{OutputBytes: 1 << 10}, "limits.output_bytes"},
			{"output above the most", corral.Limits{OutputBytes: 1<<30 + 1}, "limits.output_bytes"},
		}
		if tier == "microvm" {
			// Enough for a container, too little for a VM.
			cases = append(cases,
				struct {
					name   string
					limits corral.Limits
					field  string
				}{"memory below a VM's least", corral.Limits{MemoryBytes: 64 << 20}, "limits.memory_bytes"},
				struct {
					name   string
					limits corral.Limits
					field  string
				}{"disk below a VM's least", corral.Limits{DiskBytes: 32 << 20}, "limits.disk_bytes"})
		}
		before := hostState(p)
		for _, c := range cases {
			req := corral.CreateRequest{Base: "base:test", Tier: tier, Runtime: runtime, Limits: c.limits,
				Network: &corral.NetworkPolicy{Mode: corral.NetworkAllowlist}}
			sb, err := p.Client.CreateSandbox(ctx, req)
			var ae *corral.APIError
			if !errors.As(err, &ae) || ae.Status != 400 || ae.Field != c.field || !strings.Contains(ae.Message, "on "+tier) {
				t.Errorf("%s: create = %v, %v; want a 400 naming %s on %s", c.name, sb, err, c.field, tier)
			}
		}
		all, err := p.Client.ListSandboxes(ctx, corral.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range all {
			t.Errorf("sandbox %s (%s: %s) left by a refused create", sb.ID, sb.State, sb.Reason)
		}
		if after := hostState(p); after != before {
			t.Errorf("the refused creates changed the host:\nbefore %s\nafter  %s", before, after)
		}
		if rt == "runc" {
			// The same memory a microvm refuses is a container's to take.
			sb := p.create(corral.CreateRequest{Limits: corral.Limits{MemoryBytes: 64 << 20}})
			if sb.Limits.MemoryBytes != 64<<20 || sb.Limits.CPUs != 1 || sb.Limits.Pids != 1024 {
				t.Errorf("limits %+v; want memory 64 MiB and the defaults", sb.Limits)
			}
			if _, err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		p.Stop()
		assertNoLeftovers(t, p)
	})
}

// hostState sums up what a create allocates on the host for p's Corral: mounts under its data
// dir, its network namespaces (ready slots included), sandbox and VM state directories and
// QEMU processes.
func hostState(p *corralProc) string {
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	mounts := strings.Count(string(mi), p.DataDir)
	ns, _ := filepath.Glob("/run/netns/corral-" + p.NetTag + "-*")
	sbs, _ := os.ReadDir(filepath.Join(p.DataDir, "sandboxes"))
	vms, _ := os.ReadDir(filepath.Join(p.DataDir, "vms"))
	var names []string
	for _, e := range append(sbs, vms...) {
		names = append(names, e.Name())
	}
	return fmt.Sprintf("mounts %d, netns %d, state %v, qemu %d", mounts, len(ns), names, len(instanceQEMUPids(p)))
}
