package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestSnapshots: a snapshot carries a sandbox's changes (new files, edits, deletions) but not
// excluded paths; sandboxes made from it see them; snapshots chain, each storing only its diff.
func TestSnapshots(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	sb := p.create(corral.CreateRequest{})
	t.Run("gvisor refused", func(t *testing.T) {
		needGVisor(t)
		gv := p.create(corral.CreateRequest{Runtime: "gvisor"})
		p.sh(gv.ID, "echo x > /root/x")
		_, err := p.Client.Snapshot(ctx, gv.ID, corral.SnapshotRequest{Name: "gv", Version: "1"})
		if !corral.IsInvalid(err) || !strings.Contains(err.Error(), "runc sandboxes only") {
			t.Fatalf("snapshot of a gVisor sandbox: %v, want an invalid-request error naming the runtime", err)
		}
		if _, err := p.Client.Layer(ctx, "gv", "1"); !corral.IsNotFound(err) {
			t.Fatalf("refused snapshot left a layer: %v", err)
		}
		if got, _ := p.Client.GetSandbox(ctx, gv.ID); got.State != corral.StateRunning {
			t.Fatalf("refused snapshot changed the sandbox: %s", got.State)
		}
		p.Client.DeleteSandbox(ctx, gv.ID)
	})
	p.sh(sb.ID, "mkdir -p /work/build && echo v1 > /work/app && echo answer > /work/build/secret && rm /etc/hostname && echo edited >> /etc/passwd && dd if=/dev/zero of=/work/blob bs=1M count=4 2>/dev/null")

	snap, err := p.Client.Snapshot(ctx, sb.ID, corral.SnapshotRequest{Name: "env", Version: "1", Exclude: []string{"/work/build"}})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Kind != corral.KindSnapshot || snap.Snapshot == nil || snap.Snapshot.Base != "base:test" || snap.Snapshot.Sandbox != sb.ID {
		t.Fatalf("snapshot layer = %+v", snap)
	}
	if got := p.sh(sb.ID, "echo still running"); got != "still running\n" {
		t.Fatalf("source sandbox after the snapshot: %q", got)
	}

	child := p.create(corral.CreateRequest{FromSnapshot: "env:1"})
	got := p.sh(child.ID, "cat /work/app; tail -1 /etc/passwd; ls /etc/hostname 2>&1 >/dev/null | wc -l; ls /work; stat -c %s /work/blob")
	if want := "v1\nedited\n1\napp\nblob\n4194304\n"; got != want {
		t.Fatalf("sandbox from the snapshot sees %q, want %q", got, want)
	}
	if child.FromSnapshot != "env:1" || child.Base != "base:test" {
		t.Fatalf("child record: base %q from %q", child.Base, child.FromSnapshot)
	}

	// A chain: change the child, snapshot it, start a grandchild.
	p.sh(child.ID, "echo v2 > /work/app && rm /work/blob")
	snap2, err := p.Client.Snapshot(ctx, child.ID, corral.SnapshotRequest{Name: "env", Version: "2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap2.Snapshot.Parents) != 1 || snap2.Snapshot.Parents[0] != "env:1" {
		t.Fatalf("second snapshot's parents = %v, want [env:1]", snap2.Snapshot.Parents)
	}
	if snap2.Size >= snap.Size {
		t.Fatalf("chained snapshot stores %d bytes, the first %d: it should hold only its own diff", snap2.Size, snap.Size)
	}
	grand := p.create(corral.CreateRequest{FromSnapshot: "env:2"})
	if got := p.sh(grand.ID, "cat /work/app; ls /work; tail -1 /etc/passwd"); got != "v2\napp\nedited\n" {
		t.Fatalf("grandchild sees %q", got)
	}

	// Bad requests change nothing.
	for _, req := range []corral.SnapshotRequest{
		{Name: "env", Version: "1"},                                  // taken
		{Name: "env", Version: "3", Exclude: []string{"../etc"}},     // relative
		{Name: "env", Version: "3", Exclude: []string{"/a/../../x"}}, // escapes
		{Name: "Bad Name", Version: "1"},
	} {
		if _, err := p.Client.Snapshot(ctx, sb.ID, req); err == nil || !(corral.IsInvalid(err) || corral.IsConflict(err)) {
			t.Fatalf("Snapshot(%+v) err = %v, want invalid or conflict", req, err)
		}
	}
	if _, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{FromSnapshot: "env:1", Base: "base:test"}); !corral.IsInvalid(err) {
		t.Fatalf("from_snapshot with base: %v, want invalid", err)
	}
	if _, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{FromSnapshot: "base:test"}); !corral.IsInvalid(err) {
		t.Fatalf("from_snapshot naming a base layer: %v, want invalid", err)
	}

	// The CLI shape.
	if _, errOut, code := p.cli("", "snapshot", sb.ID, "--name", "env:cli", "--exclude", "/work/build"); code != 0 {
		t.Fatalf("corral snapshot: %d %s", code, errOut)
	}
	out, errOut, code := p.cli("", "create", "--from-snapshot", "env:cli", "-o", "json")
	if code != 0 {
		t.Fatalf("corral create --from-snapshot: %d %s", code, errOut)
	}
	var fromCLI corral.Sandbox
	json.Unmarshal([]byte(out), &fromCLI)
	if got := p.sh(fromCLI.ID, "cat /work/app; ls /work/build 2>/dev/null | wc -l"); !strings.HasPrefix(got, "v1\n0") {
		t.Fatalf("sandbox from the CLI snapshot: %q", got)
	}
}
