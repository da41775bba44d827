package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/mountinfo"
	corral "github.com/corral-dev/corral/sdk/go"
)

// volumeImage returns the host path of the image of the volume name of the project, read from
// the data dir (one image per volume ID).
func (p *corralProc) volumeImages() []string {
	p.t.Helper()
	m, _ := filepath.Glob(filepath.Join(p.DataDir, "volumes", "vol-*.ext4"))
	return m
}

// volumeLeftovers lists what a detached volume must not leave on the host: mounts of its
// images under the data dir, and loop devices backed by them.
func (p *corralProc) volumeLeftovers() []string {
	p.t.Helper()
	var left []string
	mps, err := mountinfo.Under(filepath.Join(p.DataDir, "sandboxes"))
	if err != nil {
		p.t.Fatal(err)
	}
	for _, m := range mps {
		if strings.Contains(m, "/vol/") {
			left = append(left, "mount "+m)
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if strings.HasPrefix(strings.TrimSpace(string(b)), filepath.Join(p.DataDir, "volumes")+"/") {
			left = append(left, "loop "+f+" -> "+strings.TrimSpace(string(b)))
		}
	}
	return left
}

// TestVolumes is issue 27's volume check on every runtime: data a sandbox writes in a volume is
// read by another after the first is deleted, across a corral up restart; a read-only
// attachment cannot write; a second read-write attachment is a 409 that leaves nothing; an
// attached volume cannot be deleted; a deleted sandbox leaves no mount or loop device.
func TestVolumes(t *testing.T) {
	needRoot(t)
	forRuntimes(t, func(t *testing.T, rt string) {
		p := withBaseOn(t, rt)
		ctx := context.Background()
		out, errOut, code := p.cli("", "volume", "create", "data", "--size", "64M", "-o", "json")
		if code != 0 {
			t.Fatalf("corral volume create: %d %s", code, errOut)
		}
		var v corral.Volume
		if err := json.Unmarshal([]byte(out), &v); err != nil || v.Name != "data" || v.SizeBytes != 64<<20 {
			t.Fatalf("volume %s: %v", out, err)
		}
		if imgs := p.volumeImages(); len(imgs) != 1 {
			t.Fatalf("volume images %v, want one", imgs)
		}

		a := p.create(corral.CreateRequest{Volumes: []corral.VolumeMount{{Name: "data", Path: "/data"}}})
		p.sh(a.ID, "echo hello-from-a > /data/f && mkdir -p /data/sub && echo deep > /data/sub/g && sync")
		if got, _ := p.Client.GetSandbox(ctx, a.ID); len(got.Volumes) != 1 || got.Volumes[0].Name != "data" {
			t.Fatalf("sandbox volumes %+v", got.Volumes)
		}

		before, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{})
		req := corral.CreateRequest{Base: "base:test", Volumes: []corral.VolumeMount{{Name: "data", Path: "/data"}}}
		if rt == "microvm" {
			req.Tier, req.Limits.MemoryBytes = "microvm", 256<<20
		} else {
			req.Runtime = rt
		}
		if _, err := p.Client.CreateSandbox(ctx, req); !corral.IsConflict(err) {
			t.Fatalf("a second read-write attachment: %v, want 409", err)
		}
		req.Volumes[0].ReadOnly = true
		if _, err := p.Client.CreateSandbox(ctx, req); !corral.IsConflict(err) {
			t.Fatalf("a read-only attachment beside the writer: %v, want 409", err)
		}
		if after, _ := p.Client.ListSandboxes(ctx, corral.ListOptions{}); len(after) != len(before) {
			t.Fatalf("refused creates left sandboxes: %d before, %d after", len(before), len(after))
		}
		if err := p.Client.DeleteVolume(ctx, "", "data"); !corral.IsConflict(err) {
			t.Fatalf("delete an attached volume: %v, want 409", err)
		}
		if _, err := p.Client.DeleteSandbox(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if left := p.volumeLeftovers(); len(left) > 0 {
			t.Fatalf("a deleted sandbox left %v", left)
		}

		p.Stop()
		p.Restart()

		b := p.create(corral.CreateRequest{Volumes: []corral.VolumeMount{{Name: "data", Path: "/data", ReadOnly: true}}})
		c := p.create(corral.CreateRequest{Volumes: []corral.VolumeMount{{Name: "data", Path: "/mnt/shared", ReadOnly: true}}})
		if got := p.sh(b.ID, "cat /data/f /data/sub/g"); got != "hello-from-a\ndeep\n" {
			t.Fatalf("B read %q, want what A wrote", got)
		}
		if got := p.sh(c.ID, "cat /mnt/shared/f"); got != "hello-from-a\n" {
			t.Fatalf("C read %q", got)
		}
		if _, _, exit := p.run(b.ID, "/bin/sh", "-c", "echo x > /data/new"); exit == nil || exit.Code == 0 {
			t.Fatal("a read-only attachment could write")
		}
		if _, _, exit := p.run(b.ID, "/bin/sh", "-c", "mount -o remount,rw /data"); exit == nil || exit.Code == 0 {
			t.Fatal("a read-only attachment could be remounted read-write")
		}
		got, err := p.Client.Volume(ctx, "", "data")
		if err != nil || len(got.AttachedTo) != 2 {
			t.Fatalf("volume %+v, %v; want two read-only attachments", got, err)
		}
		for _, id := range []string{b.ID, c.ID} {
			if _, err := p.Client.DeleteSandbox(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if left := p.volumeLeftovers(); len(left) > 0 {
			t.Fatalf("deleted sandboxes left %v", left)
		}
		if _, errOut, code := p.cli("", "volume", "rm", "data"); code != 0 {
			t.Fatalf("corral volume rm: %s", errOut)
		}
		if _, err := p.Client.Volume(ctx, "", "data"); !corral.IsNotFound(err) {
			t.Fatalf("get a deleted volume: %v", err)
		}
		if imgs := p.volumeImages(); len(imgs) != 0 {
			t.Fatalf("volume rm left images %v", imgs)
		}
	})
}

// TestVolumeBadInput: each bad request is a clear 4xx naming the problem, with nothing made.
func TestVolumeBadInput(t *testing.T) {
	needRoot(t)
	p := withBase(t)
	ctx := context.Background()
	c := p.Client
	if _, err := c.CreateVolume(ctx, corral.CreateVolumeRequest{Name: "data", SizeBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  corral.CreateVolumeRequest
		want func(error) bool
		msg  string
	}{
		{"taken", corral.CreateVolumeRequest{Name: "data", SizeBytes: 32 << 20}, corral.IsConflict, "already exists"},
		{"bad name", corral.CreateVolumeRequest{Name: "Bad/Name", SizeBytes: 32 << 20}, corral.IsInvalid, "name"},
		{"too small", corral.CreateVolumeRequest{Name: "tiny", SizeBytes: 1 << 20}, corral.IsInvalid, "size_bytes"},
		{"no project", corral.CreateVolumeRequest{Name: "x", SizeBytes: 32 << 20, Project: "nope"}, corral.IsInvalid, "nope"},
	} {
		if _, err := c.CreateVolume(ctx, tc.req); !tc.want(err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.msg)
		}
	}
	// Larger than the quota: refused, naming the quota.
	if _, err := c.CreateProject(ctx, "small"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetQuota(ctx, "small", corral.Quota{DiskBytes: func() *int64 { n := int64(100 << 20); return &n }()}); err != nil {
		t.Fatal(err)
	}
	_, err := c.CreateVolume(ctx, corral.CreateVolumeRequest{Name: "big", SizeBytes: 200 << 20, Project: "small"})
	if !corral.IsExhausted(err) || !strings.Contains(err.Error(), "disk_bytes") || !strings.Contains(err.Error(), "small") {
		t.Fatalf("a volume over the disk quota: %v", err)
	}
	if vs, _ := c.Volumes(ctx, "small"); len(vs) != 0 {
		t.Fatalf("a refused volume was made: %+v", vs)
	}
	for _, tc := range []struct {
		name string
		vols []corral.VolumeMount
		msg  string
	}{
		{"root", []corral.VolumeMount{{Name: "data", Path: "/"}}, "/"},
		{"proc", []corral.VolumeMount{{Name: "data", Path: "/proc/x"}}, "/proc"},
		{"dev", []corral.VolumeMount{{Name: "data", Path: "/dev"}}, "/dev"},
		{"sys", []corral.VolumeMount{{Name: "data", Path: "/sys"}}, "/sys"},
		{"agent", []corral.VolumeMount{{Name: "data", Path: "/.corral-agent"}}, "/.corral"},
		{"relative", []corral.VolumeMount{{Name: "data", Path: "data"}}, "absolute"},
		{"unclean", []corral.VolumeMount{{Name: "data", Path: "/a/../proc"}}, "clean"},
		{"missing", []corral.VolumeMount{{Name: "nope", Path: "/data"}}, "does not exist"},
		{"twice", []corral.VolumeMount{{Name: "data", Path: "/a", ReadOnly: true}, {Name: "data", Path: "/b", ReadOnly: true}}, "twice"},
	} {
		_, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Volumes: tc.vols})
		if !corral.IsInvalid(err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want 400 naming %q", tc.name, err, tc.msg)
		}
	}
	if list, _ := c.ListSandboxes(ctx, corral.ListOptions{}); len(list) != 0 {
		t.Fatalf("refused creates left sandboxes: %+v", list)
	}
}

// TestVolumeProjectRmForce: deleting a project with force removes its volumes (and their
// images) after its sandboxes; without force it refuses while it owns one.
func TestVolumeProjectRmForce(t *testing.T) {
	needRoot(t)
	p := withBase(t)
	ctx := context.Background()
	if _, err := p.Client.CreateProject(ctx, "vp"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.CreateVolume(ctx, corral.CreateVolumeRequest{Name: "home", SizeBytes: 32 << 20, Project: "vp"}); err != nil {
		t.Fatal(err)
	}
	sb := p.create(corral.CreateRequest{Project: "vp", Volumes: []corral.VolumeMount{{Name: "home", Path: "/home/u"}}})
	p.sh(sb.ID, "echo x > /home/u/x")
	if _, errOut, code := p.cli("", "project", "rm", "vp"); code == 0 || !strings.Contains(errOut, "sandboxes") {
		t.Fatalf("project rm without force: %d %s", code, errOut)
	}
	if _, errOut, code := p.cli("", "project", "rm", "vp", "--force"); code != 0 {
		t.Fatalf("project rm --force: %s", errOut)
	}
	if imgs := p.volumeImages(); len(imgs) != 0 {
		t.Fatalf("project rm --force left volume images %v", imgs)
	}
	if left := p.volumeLeftovers(); len(left) > 0 {
		t.Fatalf("project rm --force left %v", left)
	}
	if q, err := p.Client.Quota(ctx, ""); err != nil || q.Usage.DiskBytes != 0 {
		t.Fatalf("root usage after the project went: %+v, %v", q, err)
	}
}

// TestVolumePause: a paused sandbox keeps its volume (attached, its data there on resume), and
// deleting it paused detaches everything.
func TestVolumePause(t *testing.T) {
	needRoot(t)
	forRuntimes(t, func(t *testing.T, rt string) {
		p := withBaseOn(t, rt)
		ctx := context.Background()
		if _, err := p.Client.CreateVolume(ctx, corral.CreateVolumeRequest{Name: "v", SizeBytes: 32 << 20}); err != nil {
			t.Fatal(err)
		}
		a := p.create(corral.CreateRequest{Volumes: []corral.VolumeMount{{Name: "v", Path: "/v"}}})
		p.sh(a.ID, "echo one > /v/f")
		if _, err := p.Client.PauseSandbox(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if v, err := p.Client.Volume(ctx, "", "v"); err != nil || len(v.AttachedTo) != 1 {
			t.Fatalf("a paused sandbox's volume: %+v, %v", v, err)
		}
		if _, err := p.Client.ResumeSandbox(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if got := p.sh(a.ID, "cat /v/f; echo two >> /v/f"); got != "one\n" {
			t.Fatalf("after resume: %q", got)
		}
		if _, err := p.Client.PauseSandbox(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Client.DeleteSandbox(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if left := p.volumeLeftovers(); len(left) > 0 {
			t.Fatalf("deleting a paused sandbox left %v", left)
		}
		b := p.create(corral.CreateRequest{Volumes: []corral.VolumeMount{{Name: "v", Path: "/v", ReadOnly: true}}})
		if got := p.sh(b.ID, "cat /v/f"); got != "one\ntwo\n" {
			t.Fatalf("the next sandbox read %q", got)
		}
	})
}
