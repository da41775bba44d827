package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"github.com/corral-dev/corral/internal/errdefs"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/clusterauth"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
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
// joining needs the join token and yields a certificate for the node, servers reach edges over
// mutual TLS that checks the node's name, nodes need an operator, and requests with nowhere to
// go say why.
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
		if err := bootstrapTokens(ctx, Config{DataDir: d, Store: dsn}, st, log); err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
	if _, err := os.Stat(filepath.Join(dirs[1], "join.token")); err == nil {
		t.Fatal("a second replica bootstrapped the store again")
	}
	joinFile := filepath.Join(dirs[0], "join.token")
	admin, _ := os.ReadFile(filepath.Join(dirs[0], "admin.token"))
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := testServer(t, st, Config{DataDir: dirs[0], Store: dsn, BlobStore: "dir:/shared"}, log)
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()

	// A wrong token: refused, and the edge learns nothing.
	wrong := filepath.Join(t.TempDir(), "wrong.token")
	other, _ := iam.NewToken()
	os.WriteFile(wrong, []byte(other), 0o600)
	if _, err := Join(ctx, hs.URL, wrong, "edge1"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("join with a wrong token: %v", err)
	}
	j, err := Join(ctx, hs.URL, joinFile, "edge1")
	if err != nil || j.BlobStore != "dir:/shared" || j.TLS == nil {
		t.Fatalf("join: %+v, %v", j, err)
	}
	// The exchange never carries the token, and its answer is sealed.
	tok, _ := os.ReadFile(joinFile)
	body, _ := json.Marshal(JoinRequest{Node: "edge1", CSR: "x"})
	resp, err := http.Post(hs.URL+"/v1/cluster/join", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("join without a proof: %d", resp.StatusCode)
	}
	_ = tok

	// With no edge, a create has nowhere to go, and a sandbox of an unknown node is not found.
	c := corral.New(hs.URL, strings.TrimSpace(string(admin)))
	if _, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:x"}); err == nil || !strings.Contains(err.Error(), "no node") {
		t.Errorf("create without edges: %v", err)
	}
	if _, err := c.GetSandbox(ctx, "sb-nowhere-aaaaaaaaaaaaaaaa"); !corral.IsNotFound(err) {
		t.Errorf("a sandbox of an unknown node: %v", err)
	}
	if _, err := corral.New(hs.URL, "crl_nobody").CreateSandbox(ctx, corral.CreateRequest{Base: "base:x"}); err == nil || !strings.Contains(err.Error(), "401") && !strings.Contains(err.Error(), "invalid token") {
		t.Errorf("a create with an unknown token: %v", err)
	}

	// An edge serving with the joined certificate: servers reach it; a client without the
	// cluster's certificate does not; a node registered under another name is refused.
	edge := httptest.NewUnstartedServer(clusterauth.RequireServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"id":"` + r.PathValue("id") + `","state":"running"}`))
	}), "/healthz"))
	edge.TLS = j.TLS
	edge.StartTLS()
	defer edge.Close()
	edgeURL := "https://" + edge.Listener.Addr().String()
	for _, name := range []string{"edge1", "edge2"} {
		if _, err := st.Register(ctx, store.Node{Name: name, URL: edgeURL}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if sb, err := c.GetSandbox(ctx, "sb-edge1-aaaaaaaaaaaaaaaa"); err != nil || sb.State != "running" {
		t.Fatalf("a sandbox of edge1 through the server: %+v, %v", sb, err)
	}
	if _, err := c.GetSandbox(ctx, "sb-edge2-aaaaaaaaaaaaaaaa"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("edge1's certificate accepted for edge2: %v", err)
	}
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := insecure.Get(edgeURL + "/v1/sandboxes/sb-edge1-aaaaaaaaaaaaaaaa"); err != nil || resp.StatusCode != 401 {
		t.Errorf("the edge served a client without the servers' certificate: %v %v", resp, err)
	}
	if resp, err := insecure.Get(edgeURL + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Errorf("the edge's probe path: %v %v", resp, err)
	}

	// Only an operator sees or changes nodes.
	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 2 || nodes[0].State != model.NodeReady {
		t.Fatalf("nodes: %+v, %v", nodes, err)
	}
	if n, err := c.NodeAction(ctx, "edge1", "drain"); err != nil || n.State != model.NodeDraining {
		t.Fatalf("drain: %+v, %v", n, err)
	}
	if _, err := c.NodeAction(ctx, "edge1", "reboot"); err == nil {
		t.Error("an unknown node action was accepted")
	}
	if _, err := corral.New(hs.URL, "crl_nobody").Nodes(ctx); err == nil {
		t.Error("an unknown token listed the nodes")
	}
	// The node it routes to does not answer: a clear 503, not a hang.
	if _, err := st.Register(ctx, store.Node{Name: "edge3", URL: "https://127.0.0.1:1"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteSandbox(ctx, "sb-edge3-aaaaaaaaaaaaaaaa"); err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Errorf("a delete on an unreachable node: %v", err)
	}
	// A record is read from the store instead, as it was last written: this one has none.
	var apiErr *corral.APIError
	if _, err := c.GetSandbox(ctx, "sb-edge3-aaaaaaaaaaaaaaaa"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		t.Errorf("the record of a sandbox on an unreachable node that has none: %v, want 404 from the store", err)
	}
	// Reads that any edge can serve go on to the next edge until one answers: with two of three
	// unreachable, every one of them is served.
	if _, err := st.Register(ctx, store.Node{Name: "edge2", URL: "https://127.0.0.1:2"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	s.refresh(ctx, true)
	for range 6 {
		req, _ := http.NewRequest("GET", hs.URL+"/v1/layers", nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(admin)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("a read with two of three edges unreachable: %d", resp.StatusCode)
		}
	}
	// A create naming only a microvm environment is placed as a microvm: no node offers one.
	if _, err := st.PutEnvironment(ctx, model.Environment{Name: "vmenv", Base: "base:x", Tier: "microvm", CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, corral.CreateRequest{Environment: "vmenv"}); err == nil || !strings.Contains(err.Error(), "microvm") {
		t.Errorf("a create of a microvm environment with no microvm node: %v", err)
	}
	// Volumes are the replica's own: made and deleted in the store, their quota charged and
	// given back there, whatever the edges answer (their blobs go with the next start of one).
	if _, err := c.CreateVolume(ctx, corral.CreateVolumeRequest{Name: "Bad Name", SizeBytes: 32 << 20}); !corral.IsInvalid(err) {
		t.Errorf("a volume with a bad name: %v, want invalid", err)
	}
	vol, err := c.CreateVolume(ctx, corral.CreateVolumeRequest{Name: "data", SizeBytes: 32<<20 + 1})
	if err != nil || vol.SizeBytes != 32<<20+4096 || vol.Node != "" {
		t.Fatalf("create a volume through the replica: %+v, %v", vol, err)
	}
	if got, err := c.Volume(ctx, "", "data"); err != nil || got.Name != "data" {
		t.Errorf("the volume through the replica: %+v, %v", got, err)
	}
	if q, err := c.Quota(ctx, ""); err != nil || q.Usage.DiskBytes != vol.SizeBytes {
		t.Errorf("the root's usage with the volume: %+v, %v; want %d disk bytes", q, err, vol.SizeBytes)
	}
	if err := c.DeleteVolume(ctx, "", "data"); err != nil {
		t.Fatalf("delete the volume through the replica: %v", err)
	}
	if _, err := c.Volume(ctx, "", "data"); !corral.IsNotFound(err) {
		t.Errorf("the deleted volume: %v, want not found", err)
	}
	if q, err := c.Quota(ctx, ""); err != nil || q.Usage.DiskBytes != 0 {
		t.Errorf("the root's usage after the delete: %+v, %v; want 0 disk bytes", q, err)
	}
	// Environments are saved, resized and deleted by the replica, checked as corral up checks
	// them (the edges follow the configuration).
	if _, _, err := st.PublishLayer(ctx, model.Layer{Name: "envbase", Version: "1", Kind: model.KindBase, Digest: "sha256:envbase"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		env   corral.Environment
		field string
	}{
		{corral.Environment{Name: "web", Base: "missing:1"}, "base"},
		{corral.Environment{Name: "Web", Base: "envbase:1"}, "name"},
		{corral.Environment{Name: "web", Base: "envbase:1", Tier: "vm"}, "tier"},
		{corral.Environment{Name: "web", Base: "envbase:1", Warm: 100000}, "warm"},
		{corral.Environment{Name: "web", Base: "envbase:1", Network: &corral.NetworkPolicy{Mode: "sideways"}}, "network.mode"},
		{corral.Environment{Name: "web", Base: "envbase:1", Network: &corral.NetworkPolicy{Allow: []string{"nosuchservice"}}}, "nosuchservice"},
	} {
		if _, err := c.SaveEnvironment(ctx, bad.env); !corral.IsInvalid(err) || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("save %+v through the replica: %v, want invalid %s", bad.env, err, bad.field)
		}
	}
	env, err := c.SaveEnvironment(ctx, corral.Environment{Name: "web", Base: "envbase:1", Tier: "container", Warm: 2,
		Network: &corral.NetworkPolicy{Mode: model.NetworkNone}})
	if err != nil || env.Tier != "" || env.CreatedAt.IsZero() || env.Warm != 2 || env.Network == nil {
		t.Fatalf("save an environment through the replica: %+v, %v", env, err)
	}
	if _, err := c.UpdateEnvironment(ctx, "web", corral.EnvironmentPatch{Warm: new(-1)}); !corral.IsInvalid(err) {
		t.Errorf("a negative pool through the replica: %v, want invalid", err)
	}
	if env, err := c.UpdateEnvironment(ctx, "web", corral.EnvironmentPatch{Warm: new(3)}); err != nil || env.Warm != 3 {
		t.Errorf("resize the pool through the replica: %+v, %v", env, err)
	}
	if got, err := st.GetEnvironment(ctx, "web"); err != nil || got.Warm != 3 {
		t.Errorf("the stored environment: %+v, %v", got, err)
	}
	if err := c.DeleteEnvironment(ctx, "web"); err != nil {
		t.Fatalf("delete the environment through the replica: %v", err)
	}
	if _, err := st.GetEnvironment(ctx, "web"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the deleted environment: %v, want not found", err)
	}
	// So are fncall environments: checked as an edge checks them, their containers' limits by
	// the servers' policy.
	for _, bad := range []struct {
		env   corral.FncallEnv
		field string
	}{
		{corral.FncallEnv{Name: "fn", Base: "missing:1"}, "base"},
		{corral.FncallEnv{Name: "Fn", Base: "envbase:1"}, "name"},
		{corral.FncallEnv{Name: "fn", Base: "envbase:1", PoolMax: 100000}, "pool_max"},
		{corral.FncallEnv{Name: "fn", Base: "envbase:1", Timeout: "100000h"}, "timeout"},
		{corral.FncallEnv{Name: "fn", Base: "envbase:1", Limits: corral.Limits{MemoryBytes: 1}}, "memory"},
		{corral.FncallEnv{Name: "fn", Base: "envbase:1", FilesBytes: 1 << 30, Limits: corral.Limits{MemoryBytes: 64 << 20}}, "files_bytes"},
	} {
		if _, err := c.CreateFncallEnv(ctx, bad.env); !corral.IsInvalid(err) || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("save %+v through the replica: %v, want invalid %s", bad.env, err, bad.field)
		}
	}
	fn, err := c.CreateFncallEnv(ctx, corral.FncallEnv{Name: "fn", Base: "envbase:1"})
	if err != nil || fn.PoolMax != 4 || fn.PoolMin != 1 || fn.Timeout != "30s" || fn.Limits.MemoryBytes == 0 || fn.CreatedAt.IsZero() {
		t.Fatalf("save an fncall environment through the replica: %+v, %v", fn, err)
	}
	if _, err := c.CreateFncallEnv(ctx, corral.FncallEnv{Name: "fn", Base: "envbase:1"}); !corral.IsConflict(err) {
		t.Errorf("the same fncall environment again: %v, want a conflict", err)
	}
	if err := c.DeleteFncallEnv(ctx, "fn"); err != nil {
		t.Fatalf("delete the fncall environment through the replica: %v", err)
	}
	if envs, err := st.ListFncallEnvs(ctx); err != nil || len(envs) != 0 {
		t.Errorf("fncall environments after the delete: %+v, %v", envs, err)
	}
}

// TestBootstrapWithGivenTokens checks that tokens placed in the data dir before the first start
// (a Kubernetes Secret) are the cluster's, and that a token too short to be one is refused.
func TestBootstrapWithGivenTokens(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the throwaway PostgreSQL cluster runs as the postgres user")
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "join.token"), []byte("short\n"), 0o400)
	st, err := store.Open(ctx, pgtest.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := bootstrapTokens(ctx, Config{DataDir: dir}, st, log); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Fatalf("a short join token: %v", err)
	}
	join, _ := iam.NewToken()
	admin, _ := iam.NewToken()
	os.WriteFile(filepath.Join(dir, "join.token"), []byte(join+"\n"), 0o400)
	os.WriteFile(filepath.Join(dir, "admin.token"), []byte(admin+"\n"), 0o400)
	if err := bootstrapTokens(ctx, Config{DataDir: dir}, st, log); err != nil {
		t.Fatal(err)
	}
	if got, err := joinToken(ctx, st); err != nil || got != join {
		t.Fatalf("join token: %q, %v", got, err)
	}
	if tok, err := st.TokenByHash(ctx, apiserver.HashToken(admin)); err != nil || tok.Principal != store.RootPrincipal {
		t.Fatalf("the given admin token: %+v, %v", tok, err)
	}
}

// testServer returns a replica on st without starting its watcher.
func testServer(t *testing.T, st *store.Store, cfg Config, log *slog.Logger) *Server {
	t.Helper()
	cfg.setDefaults()
	placer, err := placement.New(placement.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := loadCA(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := loadSealer(context.Background(), st)
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(cfg, log, st, placer, ca, sealer, "test")
	if s.tls, s.nodeTLS, err = s.tlsConfigs(); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestE2BSecretsShared checks that every replica gets the same E2B key and service token from
// the store, and that a revoked service token is replaced.
func TestE2BSecretsShared(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the throwaway PostgreSQL cluster runs as the postgres user")
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(ctx, pgtest.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key1, tok1, err := e2bSecrets(ctx, st, log)
	if err != nil || len(key1) != 32 || tok1 == "" {
		t.Fatalf("first replica: %d-byte key, %v", len(key1), err)
	}
	key2, tok2, err := e2bSecrets(ctx, st, log)
	if err != nil || string(key2) != string(key1) || tok2 != tok1 {
		t.Fatalf("second replica got other secrets: %v", err)
	}
	rec, err := st.TokenByHash(ctx, apiserver.HashToken(tok1))
	if err != nil || rec.Perms != iam.SandboxRead|iam.SandboxUse {
		t.Fatalf("the service token: %+v, %v", rec, err)
	}
	if _, err := st.RevokeToken(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	_, tok3, err := e2bSecrets(ctx, st, log)
	if err != nil || tok3 == tok1 {
		t.Fatalf("after revoking the service token: %v", err)
	}
}

// bootstrapped returns a store on a throwaway PostgreSQL database, bootstrapped as a replica
// would (tokens in dir), and the admin token. It skips the test unless root.
func bootstrapped(t *testing.T, log *slog.Logger) (st *store.Store, dsn, dir, admin string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the throwaway PostgreSQL cluster runs as the postgres user")
	}
	ctx := context.Background()
	dsn, dir = pgtest.NewDB(t), t.TempDir()
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := bootstrapTokens(ctx, Config{DataDir: dir, Store: dsn}, st, log); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	return st, dsn, dir, strings.TrimSpace(string(b))
}
