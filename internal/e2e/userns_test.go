package e2e

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestUsernsOwners: with user namespaces (the default), files a sandbox owns keep their inside
// owners everywhere they travel: on its disk (stored as inside ids), through the files API,
// tar export, corral cp, a snapshot and a sandbox made from it; and files put in from outside
// belong to the sandbox's root, not to a host uid.
func TestUsernsOwners(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	info, err := p.Client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.UserNS == "" {
		t.Skipf("no user namespaces here: %s", info.UserNSUnavailable)
	}
	sb := p.create(corral.CreateRequest{})
	if got := p.sh(sb.ID, "mkdir /root/d && echo hi > /root/d/f && chown -R 1234:1234 /root/d && stat -c %u:%g /root/d/f"); got != "1234:1234\n" {
		t.Fatalf("inside after chown: %q", got)
	}

	t.Run("disk stores inside ids", func(t *testing.T) {
		files, _ := filepath.Glob(filepath.Join(p.DataDir, "sandboxes", "*", "disk", "upper", "root", "d", "f"))
		if len(files) != 1 {
			t.Fatalf("upper-dir copies of /root/d/f: %v", files)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(files[0], &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 1234 || st.Gid != 1234 {
			t.Fatalf("on the host's disk image: %d:%d, want 1234:1234 (inside ids)", st.Uid, st.Gid)
		}
	})

	t.Run("files API", func(t *testing.T) {
		fi, err := p.Client.Stat(ctx, sb.ID, "/root/d/f")
		if err != nil {
			t.Fatal(err)
		}
		if fi.UID != 1234 || fi.GID != 1234 {
			t.Fatalf("Stat: %d:%d", fi.UID, fi.GID)
		}
		if _, err := p.Client.WriteFile(ctx, sb.ID, "/root/put", strings.NewReader("x"), corral.WriteFileOptions{}); err != nil {
			t.Fatal(err)
		}
		if got := p.sh(sb.ID, "stat -c %u:%g /root/put"); got != "0:0\n" {
			t.Fatalf("file written through the API: %q, want the sandbox's root", got)
		}
	})

	t.Run("tar export", func(t *testing.T) {
		rc, err := p.Client.TarOut(ctx, sb.ID, "/root/d")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		checkTarOwner(t, rc, "f", 1234)
	})

	t.Run("corral cp", func(t *testing.T) {
		out, errOut, code := p.cli("", "cp", sb.ID+":/root/d", "-")
		if code != 0 {
			t.Fatalf("corral cp out: %d %s", code, errOut)
		}
		checkTarOwner(t, strings.NewReader(out), "f", 1234)
		local := filepath.Join(t.TempDir(), "in")
		os.WriteFile(local, []byte("in"), 0o644)
		if _, errOut, code := p.cli("", "cp", local, sb.ID+":/root/in"); code != 0 {
			t.Fatalf("corral cp in: %d %s", code, errOut)
		}
		if got := p.sh(sb.ID, "stat -c %u:%g /root/in"); got != "0:0\n" {
			t.Fatalf("file copied in: %q, want the sandbox's root", got)
		}
	})

	t.Run("snapshot and from-snapshot", func(t *testing.T) {
		if _, err := p.Client.Snapshot(ctx, sb.ID, corral.SnapshotRequest{Name: "owners", Version: "1"}); err != nil {
			t.Fatal(err)
		}
		child := p.create(corral.CreateRequest{FromSnapshot: "owners:1"})
		if got := p.sh(child.ID, "stat -c %u:%g /root/d/f /root/put; cat /root/d/f"); got != "1234:1234\n0:0\nhi\n" {
			t.Fatalf("sandbox from the snapshot: %q", got)
		}
		// The child's root may change what it inherited (the layer is idmapped to it).
		p.sh(child.ID, "echo more >> /root/d/f && chown 0:0 /root/d/f")
	})
}

// checkTarOwner reads a tar stream and checks the entry whose name ends in name is owned by uid.
func checkTarOwner(t *testing.T, r io.Reader, name string, uid int) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("no %s in the tar", name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(h.Name, "/"+name) || h.Name == name {
			if h.Uid != uid || h.Gid != uid {
				t.Fatalf("tar entry %s: owner %d:%d, want %d:%d", h.Name, h.Uid, h.Gid, uid, uid)
			}
			return
		}
	}
}
