package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/mountinfo"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamVolumes: a volume's path cannot be steered out of the sandbox by the image. The
// image (a toolkit layer over the base) makes the attach path, or a directory on the way to it,
// a symlink to /proc, to /, out of the root by "..", or to a host path; or makes it a file. The
// mount must never follow the link: each create is refused with a 400 naming the path, the
// volume is left unattached, nothing of the sandbox stays mounted, and the host paths the links
// name are untouched. A symlink a sandbox writes into a volume is only data to the next one.
func TestRedTeamVolumes(t *testing.T) {
	needRoot(t)
	forRuntimes(t, func(t *testing.T, rt string) {
		p := withBaseOn(t, rt)
		ctx := context.Background()
		hostDir := t.TempDir() // a host path an image's link names
		mark := filepath.Join(hostDir, "mark")
		if err := os.WriteFile(mark, []byte("host"), 0o644); err != nil {
			t.Fatal(err)
		}
		layer := t.TempDir()
		for name, target := range map[string]string{
			"to-proc": "/proc", "to-root": "/", "up": "../../../../..", "to-host": hostDir, "etc-link": "/etc",
		} {
			if err := os.Symlink(target, filepath.Join(layer, name)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(layer, "a-file"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		p.importDir("evil", "1", corral.KindToolkit, layer)
		if _, err := p.Client.CreateVolume(ctx, corral.CreateVolumeRequest{Name: "v", SizeBytes: 32 << 20}); err != nil {
			t.Fatal(err)
		}
		req := func(path string) corral.CreateRequest {
			r := corral.CreateRequest{Base: "base:test", Toolkits: []string{"evil:1"}, Volumes: []corral.VolumeMount{{Name: "v", Path: path}}}
			if rt == "microvm" {
				r.Tier, r.Limits.MemoryBytes = "microvm", 256<<20
			} else {
				r.Runtime = rt
			}
			return r
		}
		for _, tc := range []struct{ path, want string }{
			{"/to-proc", "symlink"},
			{"/to-root", "symlink"},
			{"/up", "symlink"},
			{"/to-host", "symlink"},
			{"/to-host/sub", "symlink"},
			{"/etc-link/cron.d", "symlink"},
			{"/a-file", "not a directory"},
			{"/a-file/sub", "not a directory"},
		} {
			_, err := p.Client.CreateSandbox(ctx, req(tc.path))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("volume at %s: %v, want a refusal naming %q", tc.path, err, tc.want)
			}
			if !corral.IsInvalid(err) && rt != "microvm" {
				t.Errorf("volume at %s: %v, want 400", tc.path, err)
			}
		}
		live, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{State: corral.StateRunning})
		if len(live) != 0 {
			t.Fatalf("refused creates left running sandboxes: %+v", live)
		}
		if v, err := p.Client.Volume(ctx, "", "v"); err != nil || len(v.AttachedTo) != 0 {
			t.Fatalf("refused creates left the volume attached: %+v, %v", v, err)
		}
		if left := p.volumeLeftovers(); len(left) > 0 {
			t.Fatalf("refused creates left %v", left)
		}
		if mps, _ := mountinfo.Under(hostDir); len(mps) > 0 {
			t.Fatalf("a volume was mounted on the host path %s: %v", hostDir, mps)
		}
		if b, err := os.ReadFile(mark); err != nil || string(b) != "host" {
			t.Fatalf("the host path's file changed: %q, %v", b, err)
		}
		if ents, _ := os.ReadDir(hostDir); len(ents) != 1 {
			t.Fatalf("something was made in the host path: %v", ents)
		}

		// A symlink written into a volume is data: the next sandbox mounts the volume where it
		// asks, whatever the volume holds, and reading the link resolves inside that sandbox.
		a := p.create(corral.CreateRequest{Volumes: []corral.VolumeMount{{Name: "v", Path: "/data"}}})
		p.sh(a.ID, "ln -s "+hostDir+" /data/escape && ln -s / /data/root && mkdir /data/d")
		if _, err := p.Client.DeleteSandbox(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		b := p.create(corral.CreateRequest{Volumes: []corral.VolumeMount{{Name: "v", Path: "/data"}}})
		if out, _, exit := p.run(b.ID, "/bin/sh", "-c", "cat /data/escape/mark"); exit != nil && exit.Code == 0 {
			t.Fatalf("a link in the volume reached the host's file: %q", out)
		}
		if o, e, x := p.run(b.ID, "/bin/sh", "-c", "ls -la /data/ /; echo y > /data/root/in-sandbox && test -f /in-sandbox"); x == nil || x.Code != 0 {
			t.Fatalf("write through a link in the volume: %+v %s %s", x, o, e)
		}
		if b, err := os.ReadFile(mark); err != nil || string(b) != "host" {
			t.Fatalf("the host path's file changed: %q, %v", b, err)
		}
	})
}
