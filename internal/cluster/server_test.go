package cluster

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/store/pgtest"
	corral "github.com/corral-dev/corral/sdk/go"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	os.Exit(code)
}

// TestServerWithoutEdges checks a replica's own behaviour: only the first replica bootstraps,
// joining needs the join token, nodes need an operator, and requests with nowhere to go say why.
func TestServerWithoutEdges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the throwaway PostgreSQL cluster runs as the postgres user")
	}
	dsn := pgtest.NewDB(t)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dirs := []string{t.TempDir(), t.TempDir()}
	for _, d := range dirs {
		st, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		if err := bootstrap(ctx, Config{DataDir: d, Store: dsn}, st, log); err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
	if _, err := os.Stat(filepath.Join(dirs[1], "join.token")); err == nil {
		t.Fatal("a second replica bootstrapped the store again")
	}
	join, err := os.ReadFile(filepath.Join(dirs[0], "join.token"))
	if err != nil {
		t.Fatal(err)
	}
	admin, _ := os.ReadFile(filepath.Join(dirs[0], "admin.token"))
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := Config{DataDir: dirs[0], Store: dsn, BlobStore: "dir:/shared"}
	cfg.setDefaults()
	placer, err := placement.New(placement.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: cfg, log: log, store: st, placer: placer, api: apiserver.New(log, st, nil, nil, corral.Info{}),
		client: &http.Client{Timeout: 5 * time.Second}, proxies: map[string]*httputil.ReverseProxy{}}
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	post := func(path, token string) (int, string) {
		req, _ := http.NewRequest("POST", hs.URL+path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := post("/v1/cluster/join", "crl_wrong"); code != 401 {
		t.Errorf("join with a wrong token: %d", code)
	}
	code, body := post("/v1/cluster/join", strings.TrimSpace(string(join)))
	var j JoinResponse
	if code != 200 || json.Unmarshal([]byte(body), &j) != nil || j.Store != dsn || j.BlobStore != "dir:/shared" {
		t.Fatalf("join: %d %s", code, body)
	}
	_ = admin
	// With no edge, a create has nowhere to go, and a sandbox of an unknown node is not found.
	if code, body := post("/v1/sandboxes", strings.TrimSpace(string(admin))); code != 503 || !strings.Contains(body, "no node") {
		t.Errorf("create without edges: %d %s", code, body)
	}
	c := corral.New(hs.URL, strings.TrimSpace(string(admin)))
	if _, err := c.GetSandbox(ctx, "sb-nowhere-aaaaaaaaaaaaaaaa"); !corral.IsNotFound(err) {
		t.Errorf("a sandbox of an unknown node: %v", err)
	}
	// A registered node is listed; only an operator sees or changes nodes.
	if _, err := st.RegisterNode(ctx, corral.Node{Name: "edge1", URL: "http://127.0.0.1:1"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].State != corral.NodeReady {
		t.Fatalf("nodes: %+v, %v", nodes, err)
	}
	if n, err := c.NodeAction(ctx, "edge1", "drain"); err != nil || n.State != corral.NodeDraining {
		t.Fatalf("drain: %+v, %v", n, err)
	}
	if _, err := c.NodeAction(ctx, "edge1", "reboot"); err == nil {
		t.Error("an unknown node action was accepted")
	}
	if _, err := corral.New(hs.URL, "crl_nobody").Nodes(ctx); err == nil {
		t.Error("an unknown token listed the nodes")
	}
	// The node it routes to does not answer: a clear 503, not a hang.
	if _, err := c.GetSandbox(ctx, "sb-edge1-aaaaaaaaaaaaaaaa"); err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Errorf("a sandbox on an unreachable node: %v", err)
	}
}
