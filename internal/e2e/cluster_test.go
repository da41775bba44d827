package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/store/pgtest"
	corral "github.com/corral-dev/corral/sdk/go"
)

// proc is one corral process of a cluster test (a server or an edge).
type proc struct {
	t      *testing.T
	name   string
	prefix []string // runs corral through this command (nsenter into a host's namespace)
	args   []string
	url    string
	cmd    *exec.Cmd
	logs   *lockedWriter
	done   chan struct{}
	cgroup string // an edge's cgroup parent, removed at the end
}

// probeClient asks processes' /healthz: a server's in the clear, an edge's over TLS with a
// certificate only the cluster's servers check (the probe path needs none).
var probeClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

// edgeStore makes the store role edges of an older release use (`corral server edge-role`: no
// identity tables, no cluster secrets) and returns its DSN, for the servers' --edge-store.
// TestCluster's servers hand it out, as during an upgrade, and it checks that this release's
// edges never open it.
func edgeStore(t *testing.T, dsn string) string {
	t.Helper()
	role := "corral_edge_" + randHex(4)
	out, err := exec.Command(filepath.Join(binDir, "corral"), "server", "edge-role", "--store", dsn, "--role", role).CombinedOutput()
	if err != nil {
		t.Fatalf("corral server edge-role: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "CREATE ROLE "+role) || !strings.Contains(string(out), "REVOKE ALL ON \"api_tokens\"") {
		t.Fatalf("corral server edge-role printed:\n%s", out)
	}
	return strings.Replace(dsn, "postgres://postgres@", "postgres://"+role+"@", 1)
}

func startProc(t *testing.T, name, url string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, args: args, url: url}
	p.start()
	return p
}

func (p *proc) start() {
	p.t.Helper()
	argv := append(append(slices.Clone(p.prefix), filepath.Join(binDir, "corral")), p.args...)
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.logs = &lockedWriter{w: &bytes.Buffer{}}
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.done = make(chan struct{})
	go func() { p.cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := probeClient.Get(p.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-p.done:
			p.t.Fatalf("%s exited early:\n%s", p.name, p.log())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s not healthy after 30s:\n%s", p.name, p.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *proc) log() string {
	p.logs.mu.Lock()
	defer p.logs.mu.Unlock()
	return p.logs.w.String()
}

// dumpProcLogs keeps each process's log when t failed (keepLog).
func dumpProcLogs(t *testing.T, procs []*proc) {
	if !t.Failed() {
		return
	}
	dir := failedLogDir(t)
	for _, p := range procs {
		keepLog(t, dir, p.name, p.log())
	}
}

func (p *proc) kill9() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.kill9()
	}
}

// fleetNet is a cluster's network on this machine: a bridge in this namespace (the servers and
// PostgreSQL listen on its address) and one network namespace per host, each wired to the bridge
// by a veth pair whose bridge side can be taken down to cut the host off.
type fleetNet struct {
	t      *testing.T
	bridge string
	hosts  []fleetHost
}

type fleetHost struct {
	netns string // /run/netns/<netns>
	link  string // the veth's bridge side
	addr  string
}

// The fleet's network: 198.18.0.0/15 is for network tests (RFC 2544); nothing else here uses it.
const fleetGateway = "198.18.7.1"

func newFleetNet(t *testing.T, tag string, hosts int) *fleetNet {
	t.Helper()
	n := &fleetNet{t: t, bridge: "crlfb" + tag}
	t.Cleanup(n.close)
	n.ip("link", "add", n.bridge, "type", "bridge")
	n.ip("addr", "add", fleetGateway+"/24", "dev", n.bridge)
	n.ip("link", "set", n.bridge, "up")
	for i := range hosts {
		h := fleetHost{netns: fmt.Sprintf("crl-fleet-%s-%d", tag, i+1), link: fmt.Sprintf("crlf%sh%d", tag, i+1), addr: fmt.Sprintf("198.18.7.%d", 11+i)}
		n.hosts = append(n.hosts, h)
		n.ip("netns", "add", h.netns)
		n.ip("link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
		n.ip("link", "set", h.link, "master", n.bridge, "up")
		n.ip("-n", h.netns, "addr", "add", h.addr+"/24", "dev", "eth0")
		n.ip("-n", h.netns, "link", "set", "eth0", "up")
		n.ip("-n", h.netns, "link", "set", "lo", "up")
	}
	return n
}

func (n *fleetNet) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// partition cuts host i off the network (down) or heals it.
func (n *fleetNet) partition(i int, down bool) {
	n.t.Helper()
	state := "up"
	if down {
		state = "down"
	}
	n.ip("link", "set", n.hosts[i].link, state)
}

// enter is the command prefix that runs a process in host i's network namespace (and only
// that: its mounts and cgroups are this machine's, as a host's would be its own).
func (n *fleetNet) enter(i int) []string {
	return []string{"nsenter", "--net=/run/netns/" + n.hosts[i].netns, "--"}
}

func (n *fleetNet) close() {
	for _, h := range n.hosts {
		exec.Command("ip", "netns", "del", h.netns).Run() // the veths go with it
	}
	exec.Command("ip", "link", "del", n.bridge).Run()
}

// reapCgroups kills every process left in the cgroups under parent (every hierarchy), removes
// them, and returns how many processes it found.
func reapCgroups(parent string) int {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + parent)
	more, _ := filepath.Glob("/sys/fs/cgroup/*/*" + parent)
	dirs = append(dirs, more...)
	seen := map[int]bool{}
	for _, d := range dirs {
		filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.Name() == "cgroup.procs" {
				b, _ := os.ReadFile(path)
				for _, f := range strings.Fields(string(b)) {
					var pid int
					if fmt.Sscan(f, &pid); pid > 0 && !seen[pid] {
						seen[pid] = true
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
			return nil
		})
	}
	if len(seen) > 0 {
		time.Sleep(200 * time.Millisecond)
	}
	for _, d := range dirs {
		var sub []string
		filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				sub = append(sub, path)
			}
			return nil
		})
		for i := len(sub) - 1; i >= 0; i-- {
			os.Remove(sub[i])
		}
	}
	return len(seen)
}

// unmountUnder detaches every mount under dir (deepest first) and returns how many there were.
func unmountUnder(dir string) int {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, m := range points {
		syscall.Unmount(m, syscall.MNT_DETACH)
	}
	return len(points)
}

// freePortOn returns an address on ip with a port that is free now.
func freePortOn(t *testing.T, ip string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestCluster runs a fleet on this machine: PostgreSQL, two server replicas and three edges as
// separate processes, each edge a "host" with its own network namespace, address, data dir and
// cgroups. Through either replica: creates spread over the nodes, exec, list, delete; a quota
// holds exactly; node selectors, project pins and avoids, an edge's own capacity, cordon and
// drain steer placement. Then what goes wrong in fleets: a server replica killed mid-stream
// (the client re-attaches through the other from its offset), PostgreSQL restarted, a host
// partitioned briefly (nothing happens) and for long (lost, its sandboxes failed; healed, the
// old incarnation stops and a new one cleans up), and an edge killed with -9 under load (lost
// in bounded time, nothing else disturbed). Nothing is left behind.
func TestCluster(t *testing.T) {
	needRoot(t)
	// A hang anywhere fails the test with the processes' logs instead of eating CI's time.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	tag := randHex(2)
	fleet := newFleetNet(t, tag, 3)
	pg, err := pgtest.Start(fleetGateway, "127.0.0.1")
	if errors.Is(err, pgtest.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop) // after the processes' cleanups (registered later, run first)
	dsn, err := pg.CreateDB("fleet")
	if err != nil {
		t.Fatal(err)
	}
	edgeDSN := edgeStore(t, dsn)
	shared := t.TempDir() // the cluster's blob store: a directory every host reaches
	sdir := t.TempDir()
	s1url, s2url := "http://"+freePortOn(t, fleetGateway), "http://"+freePortOn(t, fleetGateway)
	var procs []*proc
	t.Cleanup(func() { dumpProcLogs(t, procs) })
	e2bAddr := freePortOn(t, fleetGateway)
	server := func(name, url, dir string, extra ...string) *proc {
		p := startProc(t, name, url, append([]string{"server", "--store", dsn, "--edge-store", edgeDSN, "--data-dir", dir, "--listen", strings.TrimPrefix(url, "http://"),
			"--node-listen", freePortOn(t, fleetGateway),
			"--blob-store", "dir:" + shared, "--lease-grace", "2s", "--log-level", "debug",
			"--webhook-allow-private", "--webhook-backoff", "100ms"}, extra...)...)
		procs = append(procs, p)
		return p
	}
	s1 := server("server1", s1url, sdir)
	s2 := server("server2", s2url, t.TempDir(), "--e2b-listen", e2bAddr, "--e2b-domain", "e2b.test")
	t.Cleanup(s1.stop) // after the edges' cleanups, which go through s2
	t.Cleanup(s2.stop)
	admin, err := os.ReadFile(filepath.Join(sdir, "admin.token"))
	if err != nil {
		t.Fatalf("the first replica wrote no admin token: %v", err)
	}
	token := strings.TrimSpace(string(admin))
	c1, c2 := corral.New(s1url, token), corral.New(s2url, token)
	clients := []*corral.Client{c1, c2}
	cli := func(url string, args ...string) (string, string, int) {
		return (&corralProc{t: t, URL: url, Token: token}).cli("", args...)
	}

	edge := func(i int, labels ...string) *proc {
		name := fmt.Sprintf("edge%d", i+1)
		dir, err := os.MkdirTemp("", "crl-")
		if err != nil {
			t.Fatal(err)
		}
		listen := fleet.hosts[i].addr + ":7071"
		ntag := tag[:2] + fmt.Sprint(i+1)
		args := []string{"edge", "--server", s1url, "--join-token", filepath.Join(sdir, "join.token"),
			"--name", name, "--data-dir", dir, "--listen", listen, "--cgroup-parent", "/corral-e2e-" + ntag, "--runc", runcPath(),
			"--disk-pool", "1", "--net-tag", ntag, "--net-pool", fmt.Sprintf("10.%d.%d.0/24", 253, (int(tag[0])*4+i)%256), "--lease-ttl", "3s", "--log-level", "debug"}
		for _, l := range labels {
			args = append(args, "--label", l)
		}
		if i == 2 {
			args = append(args, "--overcommit-cpu", "0.5") // its own final say, below the servers' 4
		}
		p := &proc{t: t, name: name, prefix: fleet.enter(i), args: args, url: "https://" + listen, cgroup: "/corral-e2e-" + ntag}
		p.start()
		t.Cleanup(func() {
			// A host the test left dead or cut off comes back first: its new incarnation removes
			// what the cluster gave up on, and the rest is deleted through a server.
			fleet.partition(i, false)
			select {
			case <-p.done:
				p.start()
			default:
			}
			cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			list, err := c2.ListSandboxes(cctx, corral.ListOptions{})
			if err != nil {
				t.Errorf("list the sandboxes to delete at the end: %v", err)
			}
			{
				for _, sb := range list {
					if sb.Node == name && (sb.State == corral.StateRunning || sb.State == corral.StatePaused) {
						if _, err := c2.DeleteSandbox(cctx, sb.ID); err != nil {
							t.Errorf("delete %s at the end: %v", sb.ID, err)
						}
					}
				}
			}
			p.stop()
			// Whatever is still there is a leak: reported, then removed so that one failure
			// does not leave the machine dirty for the next test.
			if n := reapCgroups(p.cgroup); n > 0 {
				t.Errorf("%s left %d processes in its cgroups", name, n)
			}
			if n := unmountUnder(dir); n > 0 {
				t.Errorf("%s left %d mounts under %s", name, n, dir)
			}
			os.RemoveAll(dir)
		})
		procs = append(procs, p)
		return p
	}
	e1 := edge(0, "pool=a")
	edge(1, "pool=a")
	e3 := edge(2, "pool=b", "gpu=fake")
	// The edges open no store, not even the one the servers hand edges of an older release
	// (--edge-store, as during an upgrade): everything below goes through the servers.
	edgeRole := strings.TrimPrefix(edgeDSN[:strings.Index(edgeDSN, "@")], "postgres://")
	if n, err := pg.Sessions(edgeRole); err != nil || n != 0 {
		t.Fatalf("sessions of the edges' role %s: %d, %v", edgeRole, n, err)
	}
	// They registered through the servers' node channel, knowing both replicas.
	for _, p := range procs {
		if strings.HasPrefix(p.name, "edge") && !regexp.MustCompile(`node registered.*through=https://[^ ,]+,https://`).MatchString(p.log()) {
			t.Errorf("%s did not register through the node channel knowing both replicas:\n%s", p.name, p.log())
		}
	}
	nodeStates := func() map[string]string {
		list, err := c2.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, n := range list {
			out[n.Name] = n.State
		}
		return out
	}
	if got := nodeStates(); len(got) != 3 || got["edge1"] != corral.NodeReady || got["edge3"] != corral.NodeReady {
		t.Fatalf("nodes after joining: %v", got)
	}

	// A layer published through one replica is usable on every node (public: the sandboxes
	// below are made in tenant projects).
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(layers.WriteTar(context.Background(), busyboxRootfs(t), pw)) }()
	if _, err := c2.ImportLayerWith(ctx, "base", "test", corral.KindBase, corral.ImportOptions{Public: true}, pr); err != nil {
		t.Fatal(err)
	}
	// Small sandboxes: what is under test is where they go, not how many a host holds.
	small := corral.Limits{CPUs: 0.05, MemoryBytes: 64 << 20}
	create := func(c *corral.Client, req corral.CreateRequest) *corral.Sandbox {
		t.Helper()
		req.Base, req.Limits = "base:test", small
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	run := func(c *corral.Client, id string) error {
		out, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"hostname"}})
		if err == nil && (exit.Code != 0 || strings.TrimSpace(string(out)) != id) {
			err = fmt.Errorf("exit %d, output %q", exit.Code, out)
		}
		return err
	}

	// Placement spreads creates; either replica serves each sandbox; deletes go through either.
	// A follower of either replica's event stream sees every node's events (issue 28).
	created := follow(t, c1, corral.EventQuery{Types: []string{corral.EventCreated}})
	hooks := clusterWebhook(t, c2)
	byNode := map[string][]string{}
	for i := range 6 {
		sb := create(clients[i%2], corral.CreateRequest{})
		byNode[sb.Node] = append(byNode[sb.Node], sb.ID)
	}
	if len(byNode) < 2 {
		t.Fatalf("placement used one node only: %v", byNode)
	}
	observeCluster(t, ctx, c1, c2, created, byNode)
	hooks.check(t, ctx, c1, byNode)
	for _, ids := range byNode {
		for _, id := range ids {
			for _, c := range clients {
				if err := run(c, id); err != nil {
					t.Fatalf("exec in %s through a replica: %v", id, err)
				}
			}
		}
	}
	if list, err := c2.ListSandboxes(ctx, corral.ListOptions{}); err != nil || len(list) != 6 {
		t.Fatalf("list through a replica: %d, %v", len(list), err)
	}
	// What they did reached the servers over the node channel: every sandbox's first exec, the
	// actions, and a last activity past the create, read through the other replica.
	eventually(t, 30*time.Second, "the report counts the sandboxes' first execs and actions", func() bool {
		rep, err := c1.Report(ctx, corral.ReportQuery{Since: time.Hour})
		if err != nil {
			return false
		}
		execs := 0
		for _, st := range rep.Setup {
			execs += st.Count
		}
		return execs >= 6 && rep.Actions >= 12
	})
	eventually(t, 30*time.Second, "the sandboxes' last activity is past their create", func() bool {
		list, err := c2.ListSandboxes(ctx, corral.ListOptions{})
		if err != nil {
			return false
		}
		for _, sb := range list {
			if !sb.LastActivityAt.After(sb.CreatedAt) {
				return false
			}
		}
		return len(list) == 6
	})
	// A fork through a replica: its copies are admitted by the servers for the caller the
	// replica sealed for the source's node, and run there.
	for node, ids := range byNode {
		res, err := c2.Fork(ctx, ids[0], corral.ForkRequest{Count: 2, DiskOnly: true})
		if err != nil || len(res) != 2 {
			t.Fatalf("fork %s through a replica: %+v, %v", ids[0], res, err)
		}
		for _, cp := range res {
			if cp.Node != node {
				t.Errorf("a copy of %s on %s, want %s", ids[0], cp.Node, node)
			}
			if err := run(c1, cp.ID); err != nil {
				t.Errorf("exec in copy %s: %v", cp.ID, err)
			}
			if _, err := c1.DeleteSandbox(ctx, cp.ID); err != nil {
				t.Errorf("delete copy %s: %v", cp.ID, err)
			}
		}
		break
	}
	for node, ids := range byNode {
		if _, err := c2.DeleteSandbox(ctx, ids[0]); err != nil {
			t.Fatal(err)
		}
		if sb := waitEnded(t, c1, ids[0]); sb.State != corral.StateStopped {
			t.Fatalf("a deleted sandbox through the other replica: %+v", sb)
		}
		byNode[node] = ids[1:]
	}

	// A quota holds exactly across both replicas and all nodes.
	if _, err := c1.CreateProject(ctx, "burst"); err != nil {
		t.Fatal(err)
	}
	limit := int64(3)
	if _, err := c1.SetQuota(ctx, "burst", corral.Quota{Sandboxes: &limit}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var burst []string
	refused := 0
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			sb, err := clients[i%2].CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: small, Project: "burst"})
			mu.Lock()
			defer mu.Unlock()
			var apiErr *corral.APIError
			switch {
			case err == nil:
				burst = append(burst, sb.ID)
			case errors.As(err, &apiErr) && apiErr.Status == 429:
				refused++
			default:
				t.Errorf("create in burst: %v", err)
			}
		})
	}
	wg.Wait()
	if len(burst) != 3 || refused != 13 {
		t.Fatalf("16 creates through two replicas against a quota of 3: %d admitted, %d refused", len(burst), refused)
	}
	if _, err := c1.DeleteSandbox(ctx, burst[0]); err != nil {
		t.Fatal(err)
	}
	// An idempotent create (admitted by the servers for the edge): retried through the other
	// replica, it answers with the sandbox the first one made, on whichever node that is.
	keyed := corral.CreateRequest{Base: "base:test", Limits: small, Project: "burst", IdempotencyKey: "cluster-keyed-1"}
	first, err := c1.CreateSandbox(ctx, keyed)
	if err != nil {
		t.Fatalf("create with an idempotency key: %v", err)
	}
	burst = append(burst, first.ID)
	for range 3 {
		again, err := c2.CreateSandbox(ctx, keyed)
		if err != nil || again.ID != first.ID {
			t.Fatalf("the keyed create again through the other replica: %v, %v; want %s", again, err, first.ID)
		}
	}
	// Identity is the replicas' own: a project deleted with force through the other replica
	// has its sandboxes deleted on the nodes that run them, then goes.
	if err := c2.DeleteProject(ctx, "burst", true); err != nil {
		t.Fatalf("delete project burst with force through a replica: %v", err)
	}
	for _, id := range burst {
		if sb := waitEnded(t, c1, id); sb.State != corral.StateStopped {
			t.Fatalf("sandbox %s of a project deleted with force: %+v", id, sb)
		}
	}
	if _, err := c1.Project(ctx, "burst"); err == nil {
		t.Fatal("project burst is still there after its delete")
	}

	// A project moved through one replica takes its running sandbox with it at once: the
	// edge authorises each request on the project the server read for it (it holds no path of
	// its own that could be stale), and its record names the new path.
	for _, p := range []string{"mv", "mv/run", "mv2"} {
		if _, err := c1.CreateProject(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	moving, err := c1.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: small, Project: "mv/run"})
	if err != nil {
		t.Fatal(err)
	}
	scoped := func(project string) *corral.Client {
		tok, err := c1.CreateToken(ctx, corral.TokenRequest{Project: project, Role: corral.RoleUser, Kind: "agent", Name: "mv-" + randHex(3), TTL: "1h"})
		if err != nil {
			t.Fatal(err)
		}
		return corral.New(s2url, tok.Token)
	}
	oldScope, newScope := scoped("mv"), scoped("mv2")
	if _, _, _, err := oldScope.Run(ctx, moving.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatalf("exec with a token of the sandbox's project before the move: %v", err)
	}
	if _, err := c2.MoveProject(ctx, corral.MoveProjectRequest{From: "mv/run", To: "mv2/run", Force: true}); err != nil {
		t.Fatal(err)
	}
	if got, err := c1.GetSandbox(ctx, moving.ID); err != nil || got.Project != "mv2/run" {
		t.Fatalf("the record of a sandbox whose project moved: %+v, %v; want project mv2/run", got, err)
	}
	if _, _, _, err := oldScope.Run(ctx, moving.ID, corral.ExecRequest{Argv: []string{"true"}}); err == nil {
		t.Fatal("a token scoped to the project's old parent still execs in its sandbox after the move")
	}
	if _, _, _, err := newScope.Run(ctx, moving.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatalf("exec with a token of the project's new parent: %v", err)
	}
	if _, err := c1.DeleteSandbox(ctx, moving.ID); err != nil {
		t.Fatal(err)
	}

	// A service catalog saved through one replica is in the store, which every edge reads
	// within a flush interval. An edge that knows the service compiles a policy naming it and
	// then refuses it for a sandbox created without networking (409); one that does not yet
	// refuses the policy (400).
	if _, err := c1.SetNetworkServices(ctx, []byte(`{"services": {"grader": {"addresses": ["10.9.9.9:80/tcp"]}}}`)); err != nil {
		t.Fatalf("save a service catalog through a replica: %v", err)
	}
	if list, err := c2.NetworkServices(ctx); err != nil || len(list) != 1 || list[0].Name != "grader" {
		t.Fatalf("the service catalog through the other replica: %+v, %v", list, err)
	}
	for node, ids := range byNode {
		if len(ids) == 0 {
			continue
		}
		eventually(t, 30*time.Second, "the service catalog on "+node, func() bool {
			_, err := c2.SetNetwork(ctx, ids[0], corral.NetworkPolicy{Allow: []string{"grader"}})
			return corral.IsConflict(err)
		})
	}

	// Warm pools follow the servers' configuration: an environment saved with warm 1 through a
	// replica gets a pool on every node (the edge that saved it at once, the others when a
	// heartbeat names the new configuration), which fills where there is room (edge3 admits
	// half its CPUs, taken by what it runs), and warm 0 drains every one.
	if _, err := c1.SaveEnvironment(ctx, corral.Environment{Name: "warmed", Base: "base:test", Warm: 1}); err != nil {
		t.Fatalf("save an environment with a warm pool: %v", err)
	}
	warm := func(metric, node string) int {
		text, err := c1.PrometheusMetrics(ctx)
		if err != nil {
			return -1
		}
		m := regexp.MustCompile(`(?m)^` + metric + `\{node="` + node + `",environment="warmed",[^}]*\} (\d+)$`).FindStringSubmatch(text)
		if m == nil {
			return 0
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	for node := range byNode {
		eventually(t, 60*time.Second, "a warm pool of the environment on "+node, func() bool { return warm("corral_warm_target", node) == 1 })
		if node != "edge3" {
			eventually(t, 90*time.Second, "a warm sandbox of the environment on "+node, func() bool { return warm("corral_warm_ready", node) == 1 })
		}
	}
	// A replica reads the environment with the three edges' pool figures, summed (edge3's
	// never fills), as their heartbeats reported them; the list carries them too.
	eventually(t, 90*time.Second, "the environment's figures summed over the edges", func() bool {
		env, err := c2.Environment(ctx, "warmed")
		return err == nil && env.WarmTarget == 3 && env.WarmReady == 2
	})
	eventually(t, 30*time.Second, "the environment list with the figures", func() bool {
		list, err := c1.Environments(ctx)
		i := slices.IndexFunc(list, func(e corral.Environment) bool { return e.Name == "warmed" })
		return err == nil && i >= 0 && list[i].WarmTarget == 3 && list[i].WarmReady == 2
	})
	// edge3's pool says why it does not fill, once (not every second it checks).
	eventually(t, 30*time.Second, "edge3 saying its warm pool waits for room", func() bool {
		return strings.Contains(e3.log(), `msg="warm pool waits for room" node=edge3 environment=warmed`)
	})
	time.Sleep(3 * time.Second)
	if n := strings.Count(e3.log(), `msg="warm pool waits for room" node=edge3 environment=warmed`); n > 2 {
		t.Errorf("edge3 said %d times that its warm pool waits for room", n)
	}
	zero := 0
	if _, err := c2.UpdateEnvironment(ctx, "warmed", corral.EnvironmentPatch{Warm: &zero}); err != nil {
		t.Fatalf("set the warm pool to 0: %v", err)
	}
	for node := range byNode {
		eventually(t, 60*time.Second, "the warm pool drained on "+node, func() bool {
			return warm("corral_warm_target", node) == 0 && warm("corral_warm_ready", node) == 0
		})
	}
	if err := c1.DeleteEnvironment(ctx, "warmed"); err != nil {
		t.Fatal(err)
	}

	// An fncall environment is saved and deleted by the servers; every edge starts its own
	// pool when its configuration names it, so calls through either replica reach one, and
	// some time after the delete none does.
	if _, err := c1.CreateFncallEnv(ctx, corral.FncallEnv{Name: "bad fn", Base: "base:test"}); !corral.IsInvalid(err) {
		t.Errorf("an fncall environment with a bad name through a replica: %v, want invalid", err)
	}
	if _, err := c1.CreateFncallEnv(ctx, corral.FncallEnv{Name: "fn", Base: "base:nope"}); !corral.IsInvalid(err) {
		t.Errorf("an fncall environment of a layer not published: %v, want invalid", err)
	}
	fn, err := c1.CreateFncallEnv(ctx, corral.FncallEnv{Name: "fn", Base: "base:test", PoolMin: 1, PoolMax: 1})
	if err != nil || fn.Limits.MemoryBytes == 0 {
		t.Fatalf("save an fncall environment through a replica: %+v, %v", fn, err)
	}
	if _, err := c2.CreateFncallEnv(ctx, corral.FncallEnv{Name: "fn", Base: "base:test"}); !corral.IsConflict(err) {
		t.Errorf("the same fncall environment again: %v, want a conflict", err)
	}
	for i := range 3 {
		eventually(t, 90*time.Second, fmt.Sprintf("call %d of the fncall environment", i), func() bool {
			res, err := c2.Call(ctx, "fn", corral.CallRequest{Script: "echo called"})
			return err == nil && strings.Contains(string(res.Stdout), "called")
		})
	}
	if err := c2.DeleteFncallEnv(ctx, "fn"); err != nil {
		t.Fatalf("delete the fncall environment through a replica: %v", err)
	}
	// Each edge ends its pool when a heartbeat names the new configuration.
	eventually(t, 60*time.Second, "calls of the deleted fncall environment refused on every edge", func() bool {
		for range 6 {
			if _, err := c1.Call(ctx, "fn", corral.CallRequest{Script: "true"}); !corral.IsNotFound(err) {
				return false
			}
		}
		return true
	})

	// Trajectories are written through the servers: a step with an ID runs once and a call
	// again (through the other replica) replays it; the trajectory lists it with the step-less
	// exec before it.
	for node, ids := range byNode {
		if len(ids) == 0 {
			continue
		}
		if _, _, _, err := c1.Run(ctx, ids[0], corral.ExecRequest{Argv: []string{"true"}}); err != nil {
			t.Fatalf("exec on %s: %v", node, err)
		}
		step := corral.ExecRequest{Argv: []string{"cat", "/proc/sys/kernel/random/uuid"}, StepID: "once-" + node}
		first, _, exit, err := c1.Run(ctx, ids[0], step)
		if err != nil || exit == nil || exit.Code != 0 || len(first) == 0 {
			t.Fatalf("a step on %s: %q, %+v, %v", node, first, exit, err)
		}
		again, _, _, err := c2.Run(ctx, ids[0], step)
		if err != nil || string(again) != string(first) {
			t.Fatalf("the step again on %s: %q, %v; want it replayed (%q)", node, again, err, first)
		}
		steps, err := c2.Trajectory(ctx, ids[0], 0)
		var found bool
		for _, st := range steps {
			found = found || (st.StepID == step.StepID && st.State == corral.StepDone)
		}
		if err != nil || !found || len(steps) < 2 {
			t.Fatalf("the trajectory on %s: %+v, %v; want the step done after the exec", node, steps, err)
		}
	}

	// Layer tags are the servers' to move (the edges' role only reads them); every edge
	// resolves a tag moved through either replica.
	if _, err := c2.TagLayer(ctx, "base", "stable", "test"); err != nil {
		t.Fatalf("tag a layer through a replica: %v", err)
	}
	for i := range 3 {
		sb, err := clients[i%2].CreateSandbox(ctx, corral.CreateRequest{Base: "base:stable", Limits: small})
		if err != nil {
			t.Fatalf("create from a tag moved through a replica: %v", err)
		}
		if _, err := c1.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}

	// The layers an edge makes are published through the servers (the edges' role only reads
	// the catalogue): a snapshot taken on one node through one replica is created from on
	// others, its settings changed and the version deleted through the other replica.
	var snapSrc string
	for _, ids := range byNode {
		if len(ids) > 0 {
			snapSrc = ids[0]
			break
		}
	}
	if out, _, exit, err := c1.Run(ctx, snapSrc, corral.ExecRequest{Argv: []string{"sh", "-c", "mkdir -p /work && echo kept > /work/mark"}}); err != nil || exit.Code != 0 {
		t.Fatalf("write in %s: %v, %+v, %s", snapSrc, err, exit, out)
	}
	snap, err := c2.Snapshot(ctx, snapSrc, corral.SnapshotRequest{Name: "csnap", Version: "1"})
	if err != nil || snap.Kind != corral.KindSnapshot || snap.Project != "/" {
		t.Fatalf("snapshot %s through a replica: %+v, %v", snapSrc, snap, err)
	}
	if _, err := c1.Snapshot(ctx, snapSrc, corral.SnapshotRequest{Name: "csnap", Version: "1"}); !corral.IsConflict(err) {
		t.Errorf("the same snapshot version again: %v, want a conflict", err)
	}
	fromNodes := map[string]bool{}
	for i := range 4 {
		sb, err := clients[i%2].CreateSandbox(ctx, corral.CreateRequest{FromSnapshot: "csnap:1", Limits: small})
		if err != nil {
			t.Fatalf("create from a snapshot published through the servers: %v", err)
		}
		fromNodes[sb.Node] = true
		out, _, exit, err := c2.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"cat", "/work/mark"}})
		if err != nil || exit.Code != 0 || string(out) != "kept\n" {
			t.Errorf("the snapshot's file on %s: %q, %+v, %v", sb.Node, out, exit, err)
		}
		if _, err := c1.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		waitEnded(t, c1, sb.ID)
	}
	if l, err := c1.SetLayerFillRate(ctx, "csnap", "1", 1<<20); err != nil || l.FillRate != 1<<20 {
		t.Errorf("set a snapshot's fill rate through a replica: %+v, %v", l, err)
	}
	if l, err := c2.SetLayerPublic(ctx, "csnap", "1", true); err != nil || !l.Public {
		t.Errorf("make a snapshot public through a replica: %+v, %v", l, err)
	}
	if _, err := c1.DeleteLayer(ctx, "csnap", "1"); err != nil {
		t.Errorf("delete a snapshot through a replica: %v", err)
	}
	if _, err := c2.Layer(ctx, "csnap", "1"); !corral.IsNotFound(err) {
		t.Errorf("the deleted snapshot: %v, want not found", err)
	}
	t.Logf("created from the snapshot on %d nodes", len(fromNodes))
	// What the edges served was audited by the servers (the edges' role writes nothing), in
	// the name of the caller the replica sealed for the edge; an edge sends its entries off the
	// requests' path, within a round trip.
	for _, action := range []string{"sandbox.snapshot", "layer.set", "layer.delete"} {
		var entries []corral.AuditEntry
		deadline := time.Now().Add(10 * time.Second)
		for err = nil; err == nil && len(entries) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			entries, err = c2.Audit(ctx, corral.AuditQuery{Action: action})
		}
		if err != nil || len(entries) == 0 || entries[0].Principal != "root" || entries[0].Target == "" {
			t.Errorf("the audit log's %s entries: %+v, %v; want root's", action, entries, err)
		}
	}

	// A Dockerfile build through one replica runs on one edge, which publishes its layers and
	// saves its environment through the servers; the other replica follows it there by its
	// ID, lists it, and creates from the environment on any node.
	bd, err := c1.StartBuild(ctx, corral.BuildRequest{Name: "cbuilt", Dockerfile: "FROM base:test\nRUN echo built > /built.txt\n"}, nil)
	if err != nil {
		t.Fatalf("start a build through a replica: %v", err)
	}
	logs, err := c2.BuildLogs(ctx, bd.ID, true)
	if err != nil {
		t.Fatalf("follow build %s through the other replica: %v", bd.ID, err)
	}
	var end *corral.Build
	for {
		ev, err := logs.Next()
		if err != nil {
			t.Fatalf("build %s's log: %v (ended %+v)", bd.ID, err, end)
		}
		if ev.Type == "end" {
			end = ev.Build
			break
		}
	}
	logs.Close()
	if end == nil || end.State != corral.BuildSucceeded {
		t.Fatalf("build %s ended %+v", bd.ID, end)
	}
	if got, err := c2.Build(ctx, bd.ID); err != nil || got.State != corral.BuildSucceeded {
		t.Errorf("build %s through the other replica: %+v, %v", bd.ID, got, err)
	}
	if list, err := c2.Builds(ctx); err != nil || !slices.ContainsFunc(list, func(b corral.Build) bool { return b.ID == bd.ID }) {
		t.Errorf("the cluster's builds: %+v, %v; want %s", list, err, bd.ID)
	}
	if _, err := c2.Build(ctx, "bld-nowhere-0123456789abcdef"); !corral.IsNotFound(err) {
		t.Errorf("a build of a node that is not there: %v, want not found", err)
	}
	for i := range 3 {
		sb, err := clients[i%2].CreateSandbox(ctx, corral.CreateRequest{Environment: "cbuilt", Limits: small})
		if err != nil {
			t.Fatalf("create from a build's environment: %v", err)
		}
		if out, _, exit, err := c1.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"cat", "/built.txt"}}); err != nil || exit.Code != 0 || string(out) != "built\n" {
			t.Errorf("the build's file on %s: %q, %+v, %v", sb.Node, out, exit, err)
		}
		if _, err := c2.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		waitEnded(t, c1, sb.ID)
	}
	if err := c1.DeleteEnvironment(ctx, "cbuilt"); err != nil {
		t.Errorf("delete the build's environment: %v", err)
	}

	// Node selectors, and a project's node groups (set by an operator, through the CLI).
	if sb := create(c1, corral.CreateRequest{NodeSelector: map[string]string{"gpu": "fake"}}); sb.Node != "edge3" {
		t.Fatalf("node_selector gpu=fake placed on %s", sb.Node)
	}
	if _, err := c2.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: small, NodeSelector: map[string]string{"gpu": "h100"}}); err == nil || !strings.Contains(err.Error(), "lack") {
		t.Fatalf("a create no node can take: %v", err)
	}
	// The servers resolve limits by the edges' policy before placing: a limit out of its tier's
	// bounds is a 400 naming it, even where no node could take the create (it is not placed).
	for _, req := range []corral.CreateRequest{
		{Base: "base:test", Limits: corral.Limits{MemoryBytes: 8 << 20}, NodeSelector: map[string]string{"gpu": "h100"}},
		{Base: "base:test", Tier: "microvm", Limits: corral.Limits{MemoryBytes: 64 << 20}, NodeSelector: map[string]string{"gpu": "h100"}},
	} {
		_, err := c2.CreateSandbox(ctx, req)
		var ae *corral.APIError
		if !errors.As(err, &ae) || ae.Status != 400 || ae.Field != "limits.memory_bytes" {
			t.Fatalf("a %s create with %d bytes of memory through a server: %v; want a 400 naming limits.memory_bytes", req.Tier, req.Limits.MemoryBytes, err)
		}
	}
	for _, p := range []string{"tenant-a", "tenant-b"} {
		if _, err := c1.CreateProject(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if out, errOut, code := cli(s1url, "project", "placement", "tenant-a", "--pin", "pool=a"); code != 0 || !strings.Contains(out, "pool=a") {
		t.Fatalf("corral project placement --pin: %q %q %d", out, errOut, code)
	}
	if _, err := c2.SetProjectPlacement(ctx, "tenant-b", corral.ProjectPlacement{Avoid: []map[string]string{{"pool": "a"}}}); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if sb := create(clients[i%2], corral.CreateRequest{Project: "tenant-a"}); sb.Node == "edge3" {
			t.Fatalf("a sandbox of tenant-a (pinned to pool=a) on %s", sb.Node)
		}
		if sb := create(clients[i%2], corral.CreateRequest{Project: "tenant-b"}); sb.Node != "edge3" {
			t.Fatalf("a sandbox of tenant-b (kept off pool=a) on %s", sb.Node)
		}
	}
	if _, err := c1.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: small, Project: "tenant-a", NodeSelector: map[string]string{"pool": "b"}}); err == nil {
		t.Fatal("a create outside its project's pin was placed")
	}

	// The edge has the final say: edge3 admits only half its CPUs, the servers would grant four
	// times them. Placement tries it, is refused, has no other node with gpu=fake: 429.
	big := corral.Limits{CPUs: 0.6 * float64(runtime.NumCPU()), MemoryBytes: 64 << 20}
	_, err = c1.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: big, NodeSelector: map[string]string{"gpu": "fake"}})
	var apiErr *corral.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 429 || !strings.Contains(err.Error(), "no room") {
		t.Fatalf("a create over edge3's own capacity: %v", err)
	}

	// Cordon and drain keep new sandboxes off a node; uncordon lets them back.
	if out, errOut, code := cli(s1url, "node", "cordon", "edge1"); code != 0 || !strings.Contains(out, "cordoned") {
		t.Fatalf("corral node cordon: %q %q %d", out, errOut, code)
	}
	if _, err := c2.NodeAction(ctx, "edge2", "drain"); err != nil {
		t.Fatal(err)
	}
	// Each replica rereads the nodes every second, and each edge learns its own state from its
	// next heartbeat (every second here): the change is everywhere within about two.
	time.Sleep(2 * time.Second)
	for range 2 {
		if sb := create(c1, corral.CreateRequest{}); sb.Node != "edge3" {
			t.Fatalf("a create went to a cordoned or draining node: %s", sb.Node)
		}
	}
	var nodes []corral.Node
	out, _, code := cli(s2url, "node", "ls", "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &nodes) != nil || len(nodes) != 3 || nodes[0].State != corral.NodeCordoned || nodes[1].State != corral.NodeDraining {
		t.Fatalf("corral node ls: %q", out)
	}
	for _, n := range []string{"edge1", "edge2"} {
		if _, err := c1.NodeAction(ctx, n, "uncordon"); err != nil {
			t.Fatal(err)
		}
	}
	// As after the cordon: the other replica sees them ready at its next reread of the nodes
	// (every second); until then it places on edge3 alone (seen: an E2B create through server2
	// 0.6 s after the uncordon found edge3 full).
	time.Sleep(2 * time.Second)

	// Layer GC through a replica while every node runs sandboxes of the layer: the edges share
	// one catalogue and see each other's sandboxes, so nothing in use goes, and creates go on.
	if res, err := c2.GCLayers(ctx); err != nil || res.Removed != 0 {
		t.Fatalf("layer gc with the layer in use on every node: %+v, %v", res, err)
	}
	for _, ids := range byNode {
		for _, id := range ids {
			if err := run(c1, id); err != nil {
				t.Fatalf("exec in %s after layer gc: %v", id, err)
			}
		}
	}
	if sb := create(c2, corral.CreateRequest{NodeSelector: map[string]string{"gpu": "fake"}}); sb.Node != "edge3" {
		t.Fatalf("a create after layer gc went to %s", sb.Node)
	}
	// Each edge fetched the base's data into its own cache; a replica asks the node named.
	for _, n := range []string{"edge1", "edge2"} {
		out, errOut, code := cli(s2url, "layer", "stats", "base:test", "--node", n, "-o", "json")
		var st corral.LayerStats
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Node != n || st.Fetch == nil || st.Fetch.CachedBytes == 0 {
			t.Fatalf("corral layer stats base:test --node %s: %s %s", n, out, errOut)
		}
	}

	// The E2B gateway of a replica: the real e2b SDK's control plane and in-sandbox surface
	// through server2, its sandboxes on the edges.
	if _, err := c1.SaveEnvironment(ctx, corral.Environment{Name: "e2benv", Base: "base:test"}); err != nil {
		t.Fatal(err)
	}
	e2bUser := &corralProc{t: t, URL: s2url, Token: token}
	runE2BScript(t, e2bUser, e2bAddr, "control.mjs", "base:test", randHex(4))
	runE2BScript(t, e2bUser, e2bAddr, "sandbox.mjs", "e2benv", randHex(4))

	// A server replica dies mid-stream: the client re-attaches through the other replica from
	// the offset it had, and misses nothing.
	target := byNode["edge1"]
	if len(target) == 0 {
		target = []string{create(c2, corral.CreateRequest{}).ID}
	}
	// First, a connection upgrade (a WebSocket to a sandbox's port, the console's screen)
	// crosses a server replica to the edge and back (HTTP/2 to edges carries no Upgrade).
	upgradeThrough(t, c1, s1url, token, target[0])
	st, err := c1.Exec(ctx, target[0], corral.ExecRequest{Argv: []string{"sh", "-c", "i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo line$i; sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	var offset int64
	for got.Len() < 20 {
		ev, err := st.Next()
		if err != nil {
			t.Fatalf("stream before the replica died: %v", err)
		}
		if ev.Type == corral.EventStdout {
			got.Write(ev.Data)
			offset = ev.Offset + int64(len(ev.Data))
		}
	}
	s1.kill9()
	if _, err := st.Next(); err == nil {
		// One more event may have been in flight; the stream must end soon after.
		for err == nil {
			_, err = st.Next()
		}
	}
	st.Close()
	st, err = c2.Attach(ctx, target[0], st.CommandID(), offset, true)
	if err != nil {
		t.Fatalf("re-attach through the other replica: %v", err)
	}
	if exit, err := st.Copy(&got, io.Discard); err != nil || exit.Code != 0 {
		t.Fatalf("re-attached stream: %+v, %v", exit, err)
	}
	st.Close()
	var want strings.Builder
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&want, "line%d\n", i)
	}
	if got.String() != want.String() {
		t.Fatalf("output across a replica's death:\n%q\nwant\n%q", got.String(), want.String())
	}
	s1.start()

	// PostgreSQL restarts: every replica and edge reconnects; no node is lost for it.
	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "a create after PostgreSQL restarted", func() bool {
		sb, err := c1.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: small})
		if err == nil {
			byNode[sb.Node] = append(byNode[sb.Node], sb.ID)
		}
		return err == nil
	})
	if got := nodeStates(); got["edge1"] != corral.NodeReady || got["edge2"] != corral.NodeReady || got["edge3"] != corral.NodeReady {
		t.Fatalf("nodes after PostgreSQL restarted: %v", got)
	}

	// edge3's host is cut off for a second, less than its lease: nothing happens.
	onEdge3, err := c2.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: small, NodeSelector: map[string]string{"gpu": "fake"}})
	if err != nil {
		t.Fatal(err)
	}
	fleet.partition(2, true)
	time.Sleep(time.Second)
	fleet.partition(2, false)
	eventually(t, 10*time.Second, "exec on edge3 after a short partition", func() bool { return run(c1, onEdge3.ID) == nil })
	if got := nodeStates(); got["edge3"] != corral.NodeReady {
		t.Fatalf("edge3 after a short partition: %v", got)
	}

	// Cut off for long: lost within lease (3 s) + grace (2 s) + a sweep, its sandboxes failed
	// (their quota released); the rest of the fleet does not notice. Healed, the old incarnation
	// finds itself fenced and stops; started again, it removes what the cluster gave up on.
	fleet.partition(2, true)
	eventually(t, 15*time.Second, "edge3 lost after its partition", func() bool { return nodeStates()["edge3"] == corral.NodeLost })
	if sb, err := c2.GetSandbox(ctx, onEdge3.ID); err != nil || sb.State != corral.StateFailed || sb.Reason != corral.ReasonNodeLost {
		t.Fatalf("a sandbox of the partitioned node: %+v, %v", sb, err)
	}
	if err := run(c1, onEdge3.ID); err == nil {
		t.Fatal("exec on a lost node's sandbox worked")
	}
	for _, id := range byNode["edge1"] {
		if err := run(c2, id); err != nil {
			t.Fatalf("edge1's %s while edge3 is cut off: %v", id, err)
		}
	}
	fleet.partition(2, false)
	select {
	case <-e3.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("edge3's old incarnation kept running after the heal:\n%s", e3.log())
	}
	if !strings.Contains(e3.log(), "lost its lease") {
		t.Errorf("edge3 did not say why it stopped:\n%s", e3.log())
	}
	e3.start()
	eventually(t, 10*time.Second, "edge3 back", func() bool { return nodeStates()["edge3"] == corral.NodeReady })
	if !strings.Contains(e3.log(), "removing runtime state of a sandbox the store does not run") {
		t.Errorf("edge3 did not remove the sandboxes the cluster gave up on:\n%s", e3.log())
	}

	// edge1 is killed under load: creates and execs keep going through both replicas; edge1 is
	// lost in bounded time, and once it is, every operation succeeds again (on the others).
	loadCtx, stopLoad := context.WithCancel(ctx)
	var lostAt atomic.Int64
	var afterLost, failedAfterLost atomic.Int64
	var lwg sync.WaitGroup
	for w := range 2 {
		lwg.Go(func() {
			for loadCtx.Err() == nil {
				c := clients[w]
				sb, err := c.CreateSandbox(loadCtx, corral.CreateRequest{Base: "base:test", Limits: small})
				if err == nil {
					err = run(c, sb.ID)
					c.DeleteSandbox(context.Background(), sb.ID)
				}
				if at := lostAt.Load(); at != 0 && loadCtx.Err() == nil {
					afterLost.Add(1)
					if err != nil {
						failedAfterLost.Add(1)
						t.Logf("after edge1 was lost: %v", err)
					}
				}
			}
		})
	}
	time.Sleep(2 * time.Second)
	e1.kill9()
	eventually(t, 15*time.Second, "edge1 lost after kill -9", func() bool { return nodeStates()["edge1"] == corral.NodeLost })
	time.Sleep(time.Second) // operations that were in flight on edge1 end
	lostAt.Store(time.Now().UnixNano())
	time.Sleep(4 * time.Second)
	stopLoad()
	lwg.Wait()
	if afterLost.Load() == 0 || failedAfterLost.Load() != 0 {
		t.Fatalf("after edge1 was lost: %d of %d operations failed", failedAfterLost.Load(), afterLost.Load())
	}
	for _, id := range byNode["edge1"] {
		if sb, err := c1.GetSandbox(ctx, id); err != nil || sb.State != corral.StateFailed || sb.Reason != corral.ReasonNodeLost {
			t.Fatalf("edge1's %s after it died: %+v, %v", id, sb, err)
		}
	}
	for _, id := range byNode["edge2"] {
		if err := run(c1, id); err != nil {
			t.Fatalf("edge2's %s after edge1 died: %v", id, err)
		}
	}
	e1.start()
	eventually(t, 10*time.Second, "edge1 back", func() bool { return nodeStates()["edge1"] == corral.NodeReady })
}

// observeCluster checks observation across a cluster: the creates on every node reach a
// follower of one replica (through the store), each sandbox's samples are read through the
// other replica from its node, and the report counts the sandboxes of every node.
func observeCluster(t *testing.T, ctx context.Context, c1, c2 *corral.Client, created *follower, byNode map[string][]string) {
	t.Helper()
	for _, ids := range byNode {
		for _, id := range ids {
			eventually(t, 30*time.Second, "the follower of server1 sees "+id+" created", func() bool { return len(created.of(id)) == 1 })
		}
	}
	for _, ids := range byNode {
		eventually(t, 30*time.Second, "samples of "+ids[0]+" through server2", func() bool {
			m, err := c2.SandboxMetrics(ctx, ids[0], time.Time{})
			return err == nil && len(m.Samples) > 0 && m.Samples[0].MemoryBytes > 0
		})
	}
	rep, err := c2.Report(ctx, corral.ReportQuery{Since: time.Hour})
	n := 0
	for _, ids := range byNode {
		n += len(ids)
	}
	if err != nil || rep.Sandboxes < n {
		t.Errorf("report through server2: %+v, %v; want at least %d sandboxes", rep, err, n)
	}
	// One scrape of a replica has every node's metrics, each series naming its node, and each
	// family once.
	text, err := c1.PrometheusMetrics(ctx)
	if err != nil {
		t.Fatalf("metrics through server1: %v", err)
	}
	for node := range byNode {
		for _, want := range []string{`corral_node_scrape_ok{node="` + node + `"} 1`, `corral_sandboxes{node="` + node + `",state="running"}`, `go_goroutines{node="` + node + `"}`} {
			if !strings.Contains(text, want) {
				t.Errorf("the cluster's metrics lack %s:\n%s", want, text)
			}
		}
	}
	types := map[string]int{}
	for _, l := range strings.Split(text, "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[0] == "#" && f[1] == "TYPE" {
			if types[f[2]]++; types[f[2]] == 2 {
				t.Errorf("family %s declared twice in the cluster's metrics", f[2])
			}
		}
	}
	if !strings.Contains(text, `corral_cluster_nodes{state="ready"}`) {
		t.Errorf("the cluster's metrics lack the nodes by state:\n%.2000s", text)
	}
}

// clusterHook is a webhook of the root project on a receiver on this host, added through one
// replica.
type clusterHook struct {
	rc   *hookReceiver
	hook *corral.Webhook
}

func clusterWebhook(t *testing.T, c *corral.Client) *clusterHook {
	t.Helper()
	rc := &hookReceiver{seen: map[string]int{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	hook, err := c.CreateWebhook(t.Context(), corral.WebhookRequest{URL: srv.URL + "/fleet", Events: []string{corral.EventCreated}})
	if err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	rc.secret = hook.Secret
	rc.mu.Unlock()
	return &clusterHook{rc: rc, hook: hook}
}

// check: the servers deliver every node's created events, signed, once each however many
// replicas run (one holds the delivery lock), after the receiver's 500; the delivery log is read
// through the other replica.
func (h *clusterHook) check(t *testing.T, ctx context.Context, c *corral.Client, byNode map[string][]string) {
	t.Helper()
	for _, ids := range byNode {
		for _, id := range ids {
			eventually(t, 30*time.Second, "a delivery of "+id+"'s created event", func() bool { return len(h.rc.types(id)) > 0 })
		}
	}
	time.Sleep(time.Second) // a second dispatcher's copies would be on their way
	for _, ids := range byNode {
		for _, id := range ids {
			if got := h.rc.types(id); fmt.Sprint(got) != "[created]" {
				t.Errorf("deliveries of %s's events: %v, want one created", id, got)
			}
		}
	}
	h.rc.mu.Lock()
	if len(h.rc.badSig) > 0 {
		t.Errorf("deliveries with bad signatures: %v", h.rc.badSig)
	}
	h.rc.mu.Unlock()
	log, err := c.WebhookDeliveries(ctx, h.hook.ID)
	results := map[string]int{}
	for _, d := range log {
		results[d.Result]++
	}
	if err != nil || results["ok"] == 0 || results["retry"] == 0 {
		t.Errorf("the delivery log through the other replica: %v, %v (want ok and retry attempts)", results, err)
	}
}

// upgradeThrough starts an echo server behind an HTTP upgrade on port 8090 of sandbox id and
// upgrades a connection to it through the API at url: the 101 and the bytes both ways must
// pass.
func upgradeThrough(t *testing.T, c *corral.Client, url, token, id string) {
	t.Helper()
	ctx := context.Background()
	script := `printf '%s\n' '#!/bin/sh' \
	'while IFS= read -r l; do [ -z "$(printf %s "$l" | tr -d "\r")" ] && break; done' \
	'printf "HTTP/1.1 101 Switching Protocols\r\nUpgrade: corral-echo\r\nConnection: Upgrade\r\n\r\n"' \
	'exec cat' >/tmp/up.sh
chmod +x /tmp/up.sh
exec nc -ll -p 8090 -e /tmp/up.sh`
	if _, err := c.StartCommand(ctx, id, corral.ExecRequest{Argv: []string{"sh", "-c", script}}); err != nil {
		t.Fatalf("start the upgrade echo server: %v", err)
	}
	host := strings.TrimPrefix(strings.TrimPrefix(url, "http://"), "https://")
	var last string
	ok := false
	for deadline := time.Now().Add(30 * time.Second); !ok && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ok, last = upgradeEcho(host, token, id)
	}
	if !ok {
		t.Errorf("an upgraded connection through the server to the sandbox's port: %s", last)
	}
}

// upgradeEcho makes one upgraded connection to port 8090 of sandbox id through the API at host
// and checks that a line comes back; it says what went wrong otherwise.
func upgradeEcho(host, token, id string) (bool, string) {
	conn, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		return false, err.Error()
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /v1/sandboxes/%s/ports/8090/ HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: corral-echo\r\n\r\n", id, host, token)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return false, err.Error()
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return false, fmt.Sprintf("%s: %s", resp.Status, b)
	}
	fmt.Fprint(conn, "ping through the server\n")
	if line, err := br.ReadString('\n'); line != "ping through the server\n" {
		return false, fmt.Sprintf("echo %q, %v", line, err)
	}
	return true, ""
}
