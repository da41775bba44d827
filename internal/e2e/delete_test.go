package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestDeleteKill9ResumesCleanup deletes a batch of sandboxes (networked, with a background
// process each) and SIGKILLs corral up right after the answers, while their host cleanup is
// still queued or running: nothing of them runs once the delete answered, and a restarted
// corral finishes the cleanups (reconcile) so that nothing is left on the host.
func TestDeleteKill9ResumesCleanup(t *testing.T) { forRuntimes(t, testDeleteKill9ResumesCleanup) }

func testDeleteKill9ResumesCleanup(t *testing.T, rt string) {
	p := withBaseOn(t, rt, "--dns-upstream", "127.0.0.1:5353")
	ctx := context.Background()
	n := 6
	if rt == "microvm" {
		n = 3 // each is a VM
	}
	var ids []string
	for range n {
		sb := p.create(corral.CreateRequest{Network: &corral.NetworkPolicy{Allow: []string{"198.51.100.9:80/tcp"}}})
		if _, err := p.Client.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"sleep", "300"}}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}

	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			del, err := p.Client.DeleteSandbox(ctx, id)
			if err != nil || (del.State != corral.StateDeleting && del.State != corral.StateStopped) || del.Reason != corral.ReasonDeleted {
				t.Errorf("delete %s = %+v, %v; want deleting or stopped (deleted)", id, del, err)
				return
			}
			// Nothing of the sandbox runs once the delete answered.
			if rt == "microvm" {
				if pids := qemuPids(id); len(pids) > 0 {
					t.Errorf("QEMU of %s still runs after the delete answered: %v", id, pids)
				}
			} else if procs := cgroupProcs(p.Cgroup, id); len(procs) > 0 {
				t.Errorf("processes of %s still run after the delete answered: %v", id, procs)
			}
			if _, _, _, err := p.Client.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}}); !corral.IsConflict(err) {
				t.Errorf("exec in deleted sandbox %s: %v, want conflict", id, err)
			}
		}()
	}
	wg.Wait()
	p.Kill9()
	// Evidence that the kill cut cleanups short (not a condition: how many were left depends on
	// the machine's speed).
	left, _ := os.ReadDir(filepath.Join(p.DataDir, "sandboxes"))
	vms, _ := os.ReadDir(filepath.Join(p.DataDir, "vms"))
	t.Logf("state left when corral was killed: %d sandbox dirs, %d vm dirs", len(left), len(vms))

	p.Restart()
	for _, id := range ids {
		got, err := p.Client.GetSandbox(ctx, id)
		if err != nil || got.State != corral.StateStopped || got.Reason != corral.ReasonDeleted {
			t.Errorf("sandbox %s after the restart: %+v, %v; want stopped (deleted)", id, got, err)
		}
	}
	p.Stop()
	assertNoLeftovers(t, p)
}

// cgroupProcs returns the pids in any cgroup of sandbox id under parent.
func cgroupProcs(parent, id string) []string {
	var pids []string
	files, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", parent, "*"+id+"*", "cgroup.procs"))
	more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", parent, "*"+id+"*", "cgroup.procs"))
	for _, f := range append(files, more...) {
		b, _ := os.ReadFile(f)
		pids = append(pids, strings.Fields(string(b))...)
	}
	return pids
}
