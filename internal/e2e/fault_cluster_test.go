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

	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/store/pgtest"
	corral "github.com/corral-dev/corral/sdk/go"
)

// faultFleet is a small cluster for the fault suite: PostgreSQL, two server replicas and two
// edges, each edge a "host" in its own network namespace (as in TestCluster).
type faultFleet struct {
	t      *testing.T
	pg     *pgtest.Cluster
	s1, s2 *proc
	edges  []*proc
	token  string
	// loads are the phases' loads, verified again once every fault is over.
	loads  []*faultLoad
	c1, c2 *corral.Client
}

func startFaultFleet(t *testing.T) *faultFleet {
	t.Helper()
	needRoot(t)
	tag := randHex(2)
	fleet := newFleetNet(t, tag, 2)
	pg, err := pgtest.Start(fleetGateway, "127.0.0.1")
	if errors.Is(err, pgtest.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	dsn, err := pg.CreateDB("faults")
	if err != nil {
		t.Fatal(err)
	}
	f := &faultFleet{t: t, pg: pg}
	shared, sdir := t.TempDir(), t.TempDir()
	s1url, s2url := "http://"+freePortOn(t, fleetGateway), "http://"+freePortOn(t, fleetGateway)
	var procs []*proc
	t.Cleanup(func() { dumpProcLogs(t, procs) })
	server := func(name, url, dir string) *proc {
		p := startProc(t, name, url, "server", "--store", dsn, "--data-dir", dir, "--listen", strings.TrimPrefix(url, "http://"),
			"--node-listen", freePortOn(t, fleetGateway),
			"--blob-store", "dir:"+shared, "--lease-grace", "5s", "--log-level", "debug", "--webhook-allow-private", "--webhook-backoff", "100ms")
		procs = append(procs, p)
		return p
	}
	f.s1 = server("server1", s1url, sdir)
	f.s2 = server("server2", s2url, t.TempDir())
	t.Cleanup(f.s1.stop)
	t.Cleanup(f.s2.stop)
	admin, err := os.ReadFile(filepath.Join(sdir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	f.token = strings.TrimSpace(string(admin))
	f.c1, f.c2 = corral.New(s1url, f.token), corral.New(s2url, f.token)
	for i := range 2 {
		name := fmt.Sprintf("edge%d", i+1)
		dir, err := os.MkdirTemp("", "crl-")
		if err != nil {
			t.Fatal(err)
		}
		listen := fleet.hosts[i].addr + ":7071"
		ntag := tag[:2] + fmt.Sprint(i+1)
		// A lease of 5 s and as much grace: an edge its supervisor restarts within seconds keeps
		// its sandboxes.
		args := []string{"edge", "--server", []string{s1url, s2url}[i], "--join-token", filepath.Join(sdir, "join.token"),
			"--name", name, "--data-dir", dir, "--listen", listen, "--cgroup-parent", "/corral-e2e-" + ntag, "--runc", runcPath(),
			"--disk-pool", "1", "--net-tag", ntag, "--net-pool", fmt.Sprintf("10.%d.%d.0/24", 252, (int(tag[0])*4+i)%256), "--lease-ttl", "5s", "--log-level", "debug"}
		p := &proc{t: t, name: name, prefix: fleet.enter(i), args: args, url: "https://" + listen, cgroup: "/corral-e2e-" + ntag}
		p.start()
		t.Cleanup(func() {
			select {
			case <-p.done:
				p.start()
			default:
			}
			cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			list, err := f.c2.ListSandboxes(cctx, corral.ListOptions{})
			if err != nil {
				t.Errorf("list the sandboxes to delete at the end: %v", err)
			}
			for _, sb := range list {
				if sb.Node == name && (sb.State == corral.StateRunning || sb.State == corral.StateCreating) {
					if _, err := f.c2.DeleteSandbox(cctx, sb.ID); err != nil {
						t.Errorf("delete %s at the end: %v (its record: %+v)", sb.ID, err, sb)
					}
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
		procs = append(procs, p)
		f.edges = append(f.edges, p)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(layers.WriteTar(context.Background(), busyboxRootfs(t), pw)) }()
	if _, err := f.c2.ImportLayerWith(t.Context(), "base", "test", corral.KindBase, corral.ImportOptions{Public: true}, pr); err != nil {
		t.Fatal(err)
	}
	return f
}

// phase runs the load through both replicas, injects fault after a few seconds (it returns when
// the fault is over), waits for the service, lets the load run on, and verifies it.
func (f *faultFleet) phase(t *testing.T, name string, stall bool, fault func()) {
	t.Helper()
	l := newFaultLoad(t, f.token, f.c1URL(), f.s2.url).start()
	runFor(3 * time.Second)
	end := l.expect(stall)
	began := time.Now()
	fault()
	over := time.Since(began)
	back := waitService(t, f.c2, serviceBackWithin)
	end()
	runFor(3 * time.Second)
	l.stop()
	r := l.verify(f.c2)
	r.FaultFor, r.RecoveredIn = over, back
	r.log(t, name)
	f.loads = append(f.loads, l)
}

func (f *faultFleet) c1URL() string { return f.s1.url }

// TestFaultCluster injects, one after the other under load through both server replicas: kill -9
// of an edge (restarted at once, as its supervisor would), kill -9 of a server replica (down
// past a node lease and its grace, every node still ready, then restarted), and a PostgreSQL
// restart. After each: no sandbox lost, no acknowledged write or
// step lost, every failure a connection error during the fault or a retryable 503.
func TestFaultCluster(t *testing.T) {
	f := startFaultFleet(t)
	t.Run("kill -9 edge", func(t *testing.T) {
		f.phase(t, "kill -9 of an edge, restarted", false, func() {
			f.edges[0].kill9()
			f.edges[0].start()
		})
	})
	t.Run("kill -9 server replica", func(t *testing.T) {
		// The replica killed is the one delivering webhooks: the other takes delivery over.
		hooks := clusterWebhook(t, f.c2)
		var victim, survivor *proc
		eventually(t, 30*time.Second, "a replica delivering webhooks", func() bool {
			for _, p := range []*proc{f.s1, f.s2} {
				if strings.Contains(p.log(), "this replica delivers the webhooks") {
					victim = p
				}
			}
			return victim != nil
		})
		survivor = map[*proc]*proc{f.s1: f.s2, f.s2: f.s1}[victim]
		f.phase(t, "kill -9 of a server replica (the one delivering webhooks), down past a node lease, restarted", false, func() {
			victim.kill9()
			eventually(t, 15*time.Second, survivor.name+" takes webhook delivery over", func() bool {
				return strings.Contains(survivor.log(), "this replica delivers the webhooks")
			})
			// The edge that joined through the victim heartbeats through the survivor (the node
			// channel fails over): past a lease and its grace with the victim down, every node
			// is still ready.
			time.Sleep(11 * time.Second) // the edges' 5 s lease, the servers' 5 s grace, 1 s more
			sc := map[*proc]*corral.Client{f.s1: f.c1, f.s2: f.c2}[survivor]
			nodes, err := sc.Nodes(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range nodes {
				if n.State != corral.NodeReady {
					t.Errorf("node %s is %s with one replica down; want it ready (its heartbeats go to the other)", n.Name, n.State)
				}
			}
			victim.start()
		})
		sb, err := f.c2.CreateSandbox(t.Context(), corral.CreateRequest{Base: "base:test", Limits: faultLimits})
		if err != nil {
			t.Fatal(err)
		}
		hooks.check(t, t.Context(), f.c1, map[string][]string{sb.Node: {sb.ID}})
		if _, err := f.c2.DeleteSandbox(t.Context(), sb.ID); err != nil {
			t.Error(err)
		}
	})
	t.Run("PostgreSQL restart", func(t *testing.T) {
		// A fast shutdown, as an operator's restart or a failover does (pgtest's immediate
		// Restart is a crash of a cluster run with synchronous_commit off, which may lose its
		// last commits by design).
		f.phase(t, "PostgreSQL restarted (fast shutdown)", false, func() {
			if err := f.pg.RestartFast(); err != nil {
				t.Fatal(err)
			}
		})
	})
	// What each phase left running, and its data, outlived the faults after it.
	for _, l := range f.loads {
		l.t = t
		l.unclear = nil // reported by its phase
		r := l.verify(f.c2)
		t.Logf("after every fault: sandboxes lost %d of %d; writes lost %d of %d; steps lost %d of %d", r.Lost, r.Running, r.FilesLost, r.Files, r.StepsLost, r.Steps)
	}
}
