package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/blobstore"
	"github.com/corral-dev/corral/internal/blobstore/s3test"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/store/pgtest"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestClusterVolumes: a volume in a cluster (PostgreSQL, one server, two edges, an S3 blob store
// that is a real versitygw) lives in the blob store and attaches on whichever node the sandbox
// lands. A writer on edge1 writes; while it is attached a second writer (on edge2) is a 409;
// its delete uploads the image as version 1; a reader on edge2 downloads it and reads what the
// writer wrote. A writer on edge2 makes version 2, and a create naming the volume without a
// node selector is placed on edge2, the one node caching version 2. A writer whose node dies
// loses its change: once the node is declared lost, the volume attaches elsewhere at its last
// uploaded version. Deleting the volume
// removes its objects, and a node that still caches a copy removes it when it starts again.
func TestClusterVolumes(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	pg, err := pgtest.Start("127.0.0.1")
	if errors.Is(err, pgtest.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	dsn, err := pg.CreateDB("vols")
	if err != nil {
		t.Fatal(err)
	}
	s3 := s3test.Start(t)
	spec := s3.Spec(s3test.Bucket, "cluster", "&access_key_file="+s3.KeyFile)
	bs, err := blobstore.Open(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var procs []*proc
	t.Cleanup(func() { dumpProcLogs(t, procs) })
	sdir := t.TempDir()
	surl := "http://" + freePortOn(t, "127.0.0.1")
	server := startProc(t, "server", surl, "server", "--store", dsn, "--data-dir", sdir, "--listen", strings.TrimPrefix(surl, "http://"),
		"--node-listen", freePortOn(t, "127.0.0.1"),
		"--blob-store", spec, "--lease-grace", "2s", "--log-level", "debug")
	procs = append(procs, server)
	t.Cleanup(server.stop)
	admin, err := os.ReadFile(filepath.Join(sdir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	c := corral.New(surl, strings.TrimSpace(string(admin)))
	tag := randHex(2)
	var dirs []string
	edge := func(i int) *proc {
		name := fmt.Sprintf("edge%d", i+1)
		dir, err := os.MkdirTemp("", "crl-")
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
		listen := freePortOn(t, "127.0.0.1")
		ntag := tag[:2] + fmt.Sprint(i+1)
		p := &proc{t: t, name: name, url: "https://" + listen, cgroup: "/corral-e2e-" + ntag, args: []string{"edge", "--server", surl,
			"--join-token", filepath.Join(sdir, "join.token"), "--name", name, "--data-dir", dir, "--listen", listen,
			"--cgroup-parent", "/corral-e2e-" + ntag, "--runc", runcPath(), "--disk-pool", "1", "--net-tag", ntag,
			"--net-pool", fmt.Sprintf("10.%d.%d.0/24", 251, (int(tag[0])*4+i)%256), "--lease-ttl", "3s", "--label", "host=" + name, "--log-level", "debug"}}
		p.start()
		procs = append(procs, p)
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			list, _ := c.ListSandboxes(cctx, corral.ListOptions{})
			for _, sb := range list {
				if sb.Node == name && (sb.State == corral.StateRunning || sb.State == corral.StatePaused) {
					c.DeleteSandbox(cctx, sb.ID)
				}
			}
			p.stop()
			if n := reapCgroups(p.cgroup); n > 0 {
				t.Errorf("%s left %d processes in its cgroups", name, n)
			}
			if n := unmountUnder(dir); n > 0 {
				t.Errorf("%s left %d mounts under %s", name, n, dir)
			}
			os.RemoveAll(dir)
		})
		return p
	}
	edges := []*proc{edge(0), edge(1)}

	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(layers.WriteTar(context.Background(), busyboxRootfs(t), pw)) }()
	if _, err := c.ImportLayerWith(ctx, "base", "test", corral.KindBase, corral.ImportOptions{Public: true}, pr); err != nil {
		t.Fatal(err)
	}
	create := func(node string, ro bool) (*corral.Sandbox, error) {
		req := corral.CreateRequest{Base: "base:test", Limits: corral.Limits{CPUs: 0.1, MemoryBytes: 128 << 20},
			Volumes: []corral.VolumeMount{{Name: "data", Path: "/data", ReadOnly: ro}}}
		if node != "" {
			req.NodeSelector = map[string]string{"host": node}
		}
		return c.CreateSandbox(ctx, req)
	}
	sh := func(id, script string) string {
		t.Helper()
		out, errOut, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
		if err != nil || exit.Code != 0 {
			t.Fatalf("%s in %s: exit %+v, %v: %s", script, id, exit, err, errOut)
		}
		return string(out)
	}
	objects := func() []string {
		t.Helper()
		objs, err := bs.List(ctx, "volumes/")
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, o := range objs {
			keys = append(keys, o.Key)
		}
		return keys
	}

	if _, err := c.CreateVolume(ctx, corral.CreateVolumeRequest{Name: "data", SizeBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	a, err := create("edge1", false)
	if err != nil {
		t.Fatal(err)
	}
	if a.Node != "edge1" {
		t.Fatalf("writer placed on %s, want edge1", a.Node)
	}
	sh(a.ID, "echo written-on-edge1 > /data/f")
	if _, err := create("edge2", false); !corral.IsConflict(err) {
		t.Fatalf("a second writer on another node: %v, want 409", err)
	}
	if _, err := create("edge2", true); !corral.IsConflict(err) {
		t.Fatalf("a reader on another node beside the writer: %v, want 409", err)
	}
	if keys := objects(); len(keys) != 0 {
		t.Fatalf("objects before the writer detached: %v, want none", keys)
	}
	if _, err := c.DeleteSandbox(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	keys := objects()
	if len(keys) != 1 || !strings.HasSuffix(keys[0], "/1.ext4.zst") {
		t.Fatalf("objects after the writer's delete: %v, want version 1", keys)
	}

	b, err := create("edge2", true)
	if err != nil {
		t.Fatal(err)
	}
	if got := sh(b.ID, "cat /data/f"); got != "written-on-edge1\n" {
		t.Fatalf("the reader on %s read %q, want what the writer on edge1 wrote", b.Node, got)
	}
	if _, err := c.DeleteSandbox(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	w2, err := create("edge2", false)
	if err != nil {
		t.Fatal(err)
	}
	sh(w2.ID, "echo again-on-edge2 >> /data/f")
	if _, err := c.DeleteSandbox(ctx, w2.ID); err != nil {
		t.Fatal(err)
	}
	if keys := objects(); len(keys) != 1 || !strings.HasSuffix(keys[0], "/2.ext4.zst") {
		t.Fatalf("objects after the second writer: %v, want version 2 alone", keys)
	}
	// Only edge2 caches version 2: placement prefers it (a random choice would miss 1 in 2).
	for range 3 {
		r, err := create("", true)
		if err != nil {
			t.Fatal(err)
		}
		if r.Node != "edge2" {
			t.Fatalf("a reader placed on %s, want edge2, which caches the current version", r.Node)
		}
		if got := sh(r.ID, "cat /data/f"); got != "written-on-edge1\nagain-on-edge2\n" {
			t.Fatalf("reader read %q", got)
		}
		if err := c.DeleteVolume(ctx, "", "data"); !corral.IsConflict(err) {
			t.Fatalf("delete an attached volume: %v, want 409", err)
		}
		if _, err := c.DeleteSandbox(ctx, r.ID); err != nil {
			t.Fatal(err)
		}
	}

	// A node that dies with the writer attached: once it is declared lost the attachment is
	// released, and the volume attaches elsewhere at its last uploaded version (the dead
	// writer's change is lost). Its new incarnation cleans up.
	dw, err := create("edge1", false)
	if err != nil {
		t.Fatal(err)
	}
	sh(dw.ID, "echo lost-with-its-node >> /data/f")
	edges[0].kill9()
	var w3 *corral.Sandbox
	eventually(t, 60*time.Second, "edge1 lost and its writer's attachment released", func() bool {
		w3, err = create("edge2", false)
		if err != nil && !corral.IsConflict(err) {
			t.Fatal(err)
		}
		return err == nil
	})
	if got := sh(w3.ID, "cat /data/f"); got != "written-on-edge1\nagain-on-edge2\n" {
		t.Fatalf("after the writer's node died, the volume reads %q; want its last uploaded version", got)
	}
	if _, err := c.DeleteSandbox(ctx, w3.ID); err != nil {
		t.Fatal(err)
	}
	edges[0].start()

	if err := c.DeleteVolume(ctx, "", "data"); err != nil {
		t.Fatal(err)
	}
	if keys := objects(); len(keys) != 0 {
		t.Fatalf("objects after the volume's delete: %v, want none", keys)
	}
	// The node that served the delete removed its copy; the other keeps its own until it
	// starts again.
	cached := func(i int) []string {
		m, _ := filepath.Glob(filepath.Join(dirs[i], "volumes", "vol-*"))
		return m
	}
	stale := -1
	for i := range edges {
		if len(cached(i)) > 0 {
			stale = i
		}
	}
	if stale < 0 {
		t.Fatal("no edge has a cached copy of the deleted volume (the test would prove nothing)")
	}
	// The transfers' costs, for the record (-v).
	for _, e := range edges {
		for _, l := range strings.Split(e.log(), "\n") {
			if strings.Contains(l, "volume image uploaded") || strings.Contains(l, "volume image downloaded") {
				t.Logf("%s: %s", e.name, l)
			}
		}
	}
	edges[stale].stop()
	edges[stale].start()
	if left := cached(stale); len(left) != 0 {
		t.Fatalf("%s, restarted, kept the deleted volume's copy: %v", edges[stale].name, left)
	}
}
