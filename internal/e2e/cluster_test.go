package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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

func startProc(t *testing.T, name, url string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, args: args, url: url}
	p.start()
	return p
}

func (p *proc) start() {
	p.t.Helper()
	p.cmd = exec.Command(filepath.Join(binDir, "corral"), p.args...)
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

// TestCluster runs a cluster on this machine: PostgreSQL, two server replicas and two edges as
// separate processes (loopback addresses, own data dirs and cgroups). Creates are placed on
// both edges and served through either replica; a quota holds exactly across replicas; a
// cordoned node takes nothing new; a node killed with -9 is declared lost in bounded time, its
// sandboxes fail with node_lost while the other node's keep working; restarted, it registers a
// new incarnation and removes what the cluster gave up on.
func TestCluster(t *testing.T) {
	needRoot(t)
	dsn := pgtest.NewDB(t)
	ctx := t.Context()
	shared := t.TempDir() // the cluster's blob store: a directory every edge reaches
	sdir := t.TempDir()
	s1url, s2url := "http://"+freePort(t), "http://"+freePort(t)
	server := func(name, url, dir string) *proc {
		return startProc(t, name, url, "server", "--store", dsn, "--data-dir", dir, "--listen", strings.TrimPrefix(url, "http://"),
			"--blob-store", "dir:"+shared, "--lease-grace", "2s", "--log-level", "debug")
	}
	s1 := server("server1", s1url, sdir)
	s2 := server("server2", s2url, t.TempDir())
	t.Cleanup(s1.stop) // after the edges' cleanups (last in, first out), which go through s1
	t.Cleanup(s2.stop)
	var procs []*proc
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range procs {
				t.Logf("%s log:\n%s", p.name, p.log())
			}
		}
	})
	procs = append(procs, s1, s2)
	admin, err := os.ReadFile(filepath.Join(sdir, "admin.token"))
	if err != nil {
		t.Fatalf("the first replica wrote no admin token: %v", err)
	}
	if _, err := os.Stat(filepath.Join(sdir, "join.token")); err != nil {
		t.Fatalf("the first replica wrote no join token: %v", err)
	}
	c1 := corral.New(s1url, strings.TrimSpace(string(admin)))
	c2 := corral.New(s2url, strings.TrimSpace(string(admin)))

	edge := func(name string) *proc {
		dir, err := os.MkdirTemp("", "crl-")
		if err != nil {
			t.Fatal(err)
		}
		listen := freePort(t)
		tag := randHex(2)
		p := startProc(t, name, "https://"+listen, "edge", "--server", s1url, "--join-token", filepath.Join(sdir, "join.token"),
			"--name", name, "--data-dir", dir, "--listen", listen, "--cgroup-parent", "/corral-e2e-"+tag, "--runc", runcPath(),
			"--disk-pool", "1", "--net-tag", tag, "--net-pool", fmt.Sprintf("10.%d.%d.0/24", 200+int(tag[0])%50, tag[1]),
			"--lease-ttl", "3s", "--log-level", "debug")
		p.cgroup = "/corral-e2e-" + tag
		t.Cleanup(func() {
			// An edge the test left dead starts again first: its reconcile removes what the
			// cluster gave up on and re-adopts the rest, which the server can then delete.
			select {
			case <-p.done:
				p.start()
			default:
			}
			// Sandboxes first (through a server, like any client), then the edge, then its cgroups.
			cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if list, err := c1.ListSandboxes(cctx, corral.ListOptions{}); err == nil {
				for _, sb := range list {
					if sb.Node == name && (sb.State == corral.StateRunning || sb.State == corral.StatePaused) {
						c1.DeleteSandbox(cctx, sb.ID)
					}
				}
			}
			p.stop()
			dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + p.cgroup)
			more, _ := filepath.Glob("/sys/fs/cgroup/*/*" + p.cgroup)
			for _, d := range append(dirs, more...) {
				os.Remove(d)
			}
			os.RemoveAll(dir)
		})
		procs = append(procs, p)
		return p
	}
	e1 := edge("edge1")
	e2 := edge("edge2")
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
	if got := nodeStates(); got["edge1"] != corral.NodeReady || got["edge2"] != corral.NodeReady {
		t.Fatalf("nodes after joining: %v", got)
	}

	// A layer published through one replica is usable on every node.
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(layers.WriteTar(context.Background(), busyboxRootfs(t), pw)) }()
	if _, err := c2.ImportLayer(ctx, "base", "test", corral.KindBase, pr); err != nil {
		t.Fatal(err)
	}
	// Small sandboxes: what is under test is where they go, not how many a 2-CPU node holds
	// (8 of 1 CPU with the default CPU overcommit, counting deleted ones until the next heartbeat).
	small := corral.Limits{CPUs: 0.1, MemoryBytes: 64 << 20}
	// Placement spreads creates over both nodes; either replica serves each sandbox.
	byNode := map[string][]string{}
	for i := range 4 {
		c := []*corral.Client{c1, c2}[i%2]
		sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: small})
		if err != nil {
			t.Fatal(err)
		}
		byNode[sb.Node] = append(byNode[sb.Node], sb.ID)
	}
	if len(byNode["edge1"]) == 0 || len(byNode["edge2"]) == 0 {
		t.Fatalf("placement used one node only: %v", byNode)
	}
	for _, ids := range byNode {
		for _, id := range ids {
			for _, c := range []*corral.Client{c1, c2} {
				out, _, exit, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"hostname"}})
				if err != nil || exit.Code != 0 || strings.TrimSpace(string(out)) != id {
					t.Fatalf("exec in %s through a replica: %q %+v %v", id, out, exit, err)
				}
			}
		}
	}
	if list, err := c2.ListSandboxes(ctx, corral.ListOptions{}); err != nil || len(list) != 4 {
		t.Fatalf("list through a replica: %d, %v", len(list), err)
	}

	// A quota holds exactly across both replicas and both nodes.
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
			c := []*corral.Client{c1, c2}[i%2]
			sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: small, Project: "burst"})
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
	for _, id := range burst {
		if _, err := c1.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	// A cordoned node takes nothing new.
	out, errOut, code := (&corralProc{t: t, URL: s1url, Token: strings.TrimSpace(string(admin))}).cli("", "node", "cordon", "edge1")
	if code != 0 || !strings.Contains(out, "cordoned") {
		t.Fatalf("corral node cordon: %q %q %d", out, errOut, code)
	}
	for range 2 {
		sb, err := c1.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: small})
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != "edge2" {
			t.Fatalf("a create went to the cordoned node: %s", sb.Node)
		}
		byNode["edge2"] = append(byNode["edge2"], sb.ID)
	}
	var nodes []corral.Node
	out, _, code = (&corralProc{t: t, URL: s2url, Token: strings.TrimSpace(string(admin))}).cli("", "node", "ls", "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &nodes) != nil || len(nodes) != 2 || nodes[0].Name != "edge1" || nodes[0].State != corral.NodeCordoned {
		t.Fatalf("corral node ls: %q", out)
	}
	if _, err := c1.NodeAction(ctx, "edge1", "uncordon"); err != nil {
		t.Fatal(err)
	}

	// edge2 dies: within its lease (3 s) plus the grace (2 s) and a sweep, it is lost and its
	// sandboxes failed; edge1's keep working.
	e2.kill9()
	lostBy := time.Now().Add(15 * time.Second)
	for nodeStates()["edge2"] != corral.NodeLost {
		if time.Now().After(lostBy) {
			t.Fatalf("edge2 not declared lost 15 s after it died: %v", nodeStates())
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, id := range byNode["edge2"] {
		sb, err := c2.GetSandbox(ctx, id)
		if err != nil || sb.State != corral.StateFailed || sb.Reason != corral.ReasonNodeLost {
			t.Fatalf("sandbox %s of the lost node: %+v, %v", id, sb, err)
		}
		if _, _, _, err := c1.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}}); err == nil {
			t.Fatalf("exec in %s on a lost node worked", id)
		}
	}
	for _, id := range byNode["edge1"] {
		if _, _, exit, err := c2.Run(ctx, id, corral.ExecRequest{Argv: []string{"true"}}); err != nil || exit.Code != 0 {
			t.Fatalf("edge1's sandbox %s after edge2 died: %v", id, err)
		}
	}
	// New creates go to the node that is left.
	sb, err := c2.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: small})
	if err != nil || sb.Node != "edge1" {
		t.Fatalf("create with edge2 lost: %+v, %v", sb, err)
	}

	// edge2 comes back: a new incarnation, and the sandboxes the cluster gave up on are removed
	// from the host rather than re-adopted.
	e2.start()
	var back corral.Node
	list, err := c1.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list {
		if n.Name == "edge2" {
			back = n
		}
	}
	if back.State != corral.NodeReady || back.Epoch < 3 {
		t.Fatalf("edge2 after its restart: %+v", back)
	}
	if !strings.Contains(e2.log(), "removing runtime state of a sandbox the store does not run") {
		t.Errorf("edge2 did not remove the sandboxes it lost:\n%s", e2.log())
	}
	_ = e1
}
