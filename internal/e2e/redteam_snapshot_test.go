package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// capProbe is a static helper run inside sandboxes: busybox has no setcap or getfattr.
const capProbe = `package main

import (
	"fmt"
	"os"
	"syscall"
)

// cap_net_raw+ep, VFS_CAP_REVISION_2.
var capNetRaw = []byte{0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

func main() {
	var err error
	switch os.Args[1] {
	case "setcap":
		err = syscall.Setxattr(os.Args[2], "security.capability", capNetRaw, 0)
	case "getcap":
		_, err = syscall.Getxattr(os.Args[2], "security.capability", make([]byte, 64))
	case "mknod":
		err = syscall.Mknod(os.Args[2], syscall.S_IFCHR|0o666, 1<<8|1)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ok")
}
`

// TestRedTeamSnapshotPrivilege (issue 22 item 6): what root in a sandbox plants in its writable
// layer (a file capability, a setuid binary, device nodes, names spelling whiteouts that would
// hide the layers below) neither fails its snapshot nor reaches a sandbox made from it; an
// imported layer and a tar uploaded into a sandbox carry no capability either, and a layer with
// a device node is refused.
func TestRedTeamSnapshotPrivilege(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(capProbe), 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module probe\ngo 1.21\n"), 0o644)
	build := exec.Command("go", "build", "-o", "probe", ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the capability probe: %v\n%s", err, out)
	}
	probe, err := os.ReadFile(filepath.Join(dir, "probe"))
	if err != nil {
		t.Fatal(err)
	}

	sb := p.create(corral.CreateRequest{})
	if _, err := p.Client.WriteFile(ctx, sb.ID, "/usr/local/bin/probe", bytes.NewReader(probe), corral.WriteFileOptions{Mode: 0o755, Parents: true}); err != nil {
		t.Fatal(err)
	}
	// The plants. The capability is set (root in a runc sandbox has CAP_SETFCAP), so the probe
	// works; mknod may be refused, and then there is simply no device to skip.
	if out := p.sh(sb.ID, "cp /bin/busybox /root/ping && probe setcap /root/ping && probe getcap /root/ping"); out != "ok\nok\n" {
		t.Fatalf("set a file capability inside: %q, want ok (the probe is broken)", out)
	}
	mknod := strings.TrimSpace(p.sh(sb.ID, "probe mknod /root/mem"))
	t.Logf("mknod inside the sandbox: %s", mknod)
	p.sh(sb.ID, "cp /bin/busybox /root/su && chmod 4755 /root/su && touch /.wh.etc /bin/.wh..wh..opq && mkdir -p /root/.wh.hidden && echo x > /root/.wh.hidden/f && echo mine > /root/notes")

	snap, err := p.Client.Snapshot(ctx, sb.ID, corral.SnapshotRequest{Name: "planted", Version: "1"})
	if err != nil {
		t.Fatalf("snapshot of a sandbox with planted entries: %v", err)
	}
	got := map[string]string{}
	for _, s := range snap.Snapshot.Skipped {
		got[s.Path] = s.Reason
	}
	want := []string{"/.wh.etc", "/bin/.wh..wh..opq", "/root/.wh.hidden"}
	if mknod == "ok" {
		want = append(want, "/root/mem")
	}
	for _, w := range want {
		if got[w] == "" {
			t.Errorf("snapshot skipped %v; want %s among them", snap.Snapshot.Skipped, w)
		}
	}
	if snap.Snapshot.SkippedCount != len(want) || len(got) != len(want) {
		t.Errorf("snapshot skipped %d (%v); want %d", snap.Snapshot.SkippedCount, snap.Snapshot.Skipped, len(want))
	}
	// The CLI says so too.
	if _, errOut, code := p.cli("", "snapshot", sb.ID, "--name", "planted:2"); code != 0 || !strings.Contains(errOut, "/.wh.etc: name starts with .wh.") {
		t.Errorf("corral snapshot: exit %d, stderr %q; want the skipped entries listed", code, errOut)
	}

	child := p.create(corral.CreateRequest{FromSnapshot: "planted:1"})
	check := `probe getcap /root/ping; stat -c %a /root/su; cat /root/notes; test -f /etc/passwd && echo etc-visible; test -x /bin/busybox && echo bin-visible; ls -a / /bin /root | grep -c '^\.wh\.' ; test -e /root/mem && echo mem || echo no-mem`
	if out, want := p.sh(child.ID, check), "no data available\n755\nmine\netc-visible\nbin-visible\n0\nno-mem\n"; out != want {
		t.Errorf("sandbox from the snapshot:\n%s\nwant\n%s", out, want)
	}

	// A layer import: the capability is dropped; a device node is refused and leaves no layer.
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tw.WriteHeader(&tar.Header{Name: "opt/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "opt/ping", Typeflag: tar.TypeReg, Mode: 0o4755, Size: int64(len(probe)), Format: tar.FormatPAX,
		PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "\x00\x00\x00\x02\x00\x20\x00\x00\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
			"SCHILY.xattr.trusted.evil": "x", "SCHILY.xattr.security.ima": "x"}})
	tw.Write(probe)
	tw.Close()
	if _, err := p.Client.ImportLayer(ctx, "capws", "1", corral.KindWorkspace, bytes.NewReader(layer.Bytes())); err != nil {
		t.Fatalf("import a layer with a capability: %v", err)
	}
	ws := p.create(corral.CreateRequest{Workspace: "capws:1"})
	if out, want := p.sh(ws.ID, "/opt/ping getcap /opt/ping; stat -c %a /opt/ping"), "no data available\n755\n"; out != want {
		t.Errorf("sandbox on the imported layer: %q, want %q", out, want)
	}
	var dev bytes.Buffer
	tw = tar.NewWriter(&dev)
	tw.WriteHeader(&tar.Header{Name: "mem", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 1})
	tw.Close()
	if _, err := p.Client.ImportLayer(ctx, "devws", "1", corral.KindWorkspace, bytes.NewReader(dev.Bytes())); !corral.IsInvalid(err) {
		t.Errorf("import a layer with a device node: %v, want invalid", err)
	}
	if _, err := p.Client.Layer(ctx, "devws", "1"); !corral.IsNotFound(err) {
		t.Errorf("refused import left a layer: %v", err)
	}

	// A tar uploaded into a sandbox sets no capability either.
	var up bytes.Buffer
	tw = tar.NewWriter(&up)
	tw.WriteHeader(&tar.Header{Name: "up", Typeflag: tar.TypeReg, Mode: 0o755, Size: 1, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "\x00\x00\x00\x02\x00\x20\x00\x00\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}})
	tw.Write([]byte("x"))
	tw.Close()
	if err := p.Client.TarIn(ctx, sb.ID, "/root", &up); err != nil {
		t.Fatalf("tar upload: %v", err)
	}
	if out := p.sh(sb.ID, "probe getcap /root/up"); out != "no data available\n" {
		t.Errorf("file uploaded with a capability in its tar header: getcap says %q", out)
	}
}
