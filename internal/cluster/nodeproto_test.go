package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/clusterauth"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
)

// standIn is an edge that answers over the real mutual TLS with a handler of the test's, and
// keeps the headers of what it was sent.
type standIn struct {
	name string
	srv  *httptest.Server
	mu   sync.Mutex
	seen []http.Header
}

func (e *standIn) headers() []http.Header {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]http.Header(nil), e.seen...)
}

// TestNodeProtocol: a replica authenticates each request once and sends the edge the caller
// (never the token, never a caller a client made up); the edge's typed refusals send a create
// elsewhere (node_full, stale_epoch, version), while any other answer, and an unknown sandbox,
// is the client's; the protocol's headers never reach the client.
func TestNodeProtocol(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, dsn, dir, token := bootstrapped(t, log)
	// K -1: the least loaded node is tried first, so "full" (the larger) always is.
	s := testServer(t, st, Config{DataDir: dir, Store: dsn, K: -1}, log)
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()

	var refuseWith error // what "full" answers a create with
	var refuseMu sync.Mutex
	start := func(name string, capacity store.Resources, h http.HandlerFunc) *standIn {
		return startStandIn(t, st, hs.URL, dir, name, nodeproto.Version, capacity, h)
	}
	big := store.Resources{CPUs: 64, MemoryBytes: 64 << 30, DiskBytes: 1 << 40, Sandboxes: 100}
	small := store.Resources{CPUs: 8, MemoryBytes: 8 << 30, DiskBytes: 1 << 40, Sandboxes: 10}
	full := start("full", big, func(w http.ResponseWriter, r *http.Request) {
		refuseMu.Lock()
		err := refuseWith
		refuseMu.Unlock()
		if r.URL.Path == "/v1/sandboxes/sb-full-aaaaaaaaaaaaaaaa" {
			err = errdefs.UnknownSandbox("sb-full-aaaaaaaaaaaaaaaa", "")
		}
		httpjson.Error(w, r, log, err)
	})
	const id = "sb-roomy-aaaaaaaaaaaaaaaa"
	roomy := start("roomy", small, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(model.Sandbox{ID: id, State: model.StateRunning})
	})
	s.refresh(ctx, true)

	post := func(extra http.Header) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", hs.URL+"/v1/sandboxes", strings.NewReader(`{"base":"base:x"}`))
		req.Header.Set("Authorization", "Bearer "+token)
		for k, v := range extra {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	noProtocolHeaders := func(what string, h http.Header) {
		t.Helper()
		for _, k := range nodeproto.Headers {
			if h.Get(k) != "" {
				t.Errorf("%s: the client got %s: %s", what, k, h.Get(k))
			}
		}
	}

	// Each refusal sends the create on to the other node.
	for _, refusal := range []error{
		fmt.Errorf("node full has no room: %w", errdefs.ErrNodeFull),
		fmt.Errorf("record: %w", store.ErrFenced),
		fmt.Errorf("talk: %w", nodeproto.ErrVersion),
	} {
		refuseMu.Lock()
		refuseWith = refusal
		refuseMu.Unlock()
		before := len(full.headers())
		resp, body := post(nil)
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Corral-Node") != "roomy" {
			t.Errorf("%v: the create came back %s from %q: %s (want 201 from roomy)", refusal, resp.Status, resp.Header.Get("Corral-Node"), body)
		}
		if len(full.headers()) == before {
			t.Errorf("%v: the create never went to node full first", refusal)
		}
		noProtocolHeaders(fmt.Sprint(refusal), resp.Header)
	}

	// A conflict that is no refusal is the client's: not tried elsewhere.
	refuseMu.Lock()
	refuseWith = errdefs.Conflict("an idempotency key in use with another body")
	refuseMu.Unlock()
	before := len(roomy.headers())
	if resp, body := post(nil); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "idempotency key") {
		t.Errorf("a plain conflict: %s %s (want the edge's 409)", resp.Status, body)
	}
	if len(roomy.headers()) != before {
		t.Errorf("a plain conflict was tried on another node")
	}

	// A caller a client makes up is replaced by the one the replica authenticated.
	forged := http.Header{}
	nodeproto.SetCaller(forged, &nodeproto.Caller{TokenID: "tok-forged", Principal: "mallory", ProjectPath: ""})
	refuseMu.Lock()
	refuseWith = fmt.Errorf("no room: %w", errdefs.ErrNodeFull)
	refuseMu.Unlock()
	if resp, body := post(forged); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create with a forged caller header: %s %s", resp.Status, body)
	}

	// Every request either edge got carries the replica's caller, never a token.
	for _, e := range []*standIn{full, roomy} {
		for _, h := range e.headers() {
			if h.Get("Authorization") != "" {
				t.Errorf("edge %s was sent the user's token", e.name)
			}
			c, err := nodeproto.CallerOf(&http.Request{Header: h})
			if err != nil {
				t.Errorf("edge %s: %v", e.name, err)
				continue
			}
			if c.Principal != store.RootPrincipal || c.TokenID == "tok-forged" {
				t.Errorf("edge %s was told the caller is %s (token %s), want the admin's", e.name, c.Principal, c.TokenID)
			}
		}
	}

	// Until base:x is published the replica cannot resolve the create, and sends none; once it
	// is, the edge gets the replica's resolution (never one a client made up).
	for _, h := range roomy.headers() {
		if h.Get(nodeproto.HeaderResolution) != "" {
			t.Errorf("a resolution was sent with a create the replica could not resolve")
		}
	}
	if _, _, err := st.PublishLayer(ctx, model.Layer{Name: "base", Version: "x", Kind: model.KindBase, Digest: "sha256:basex"}); err != nil {
		t.Fatal(err)
	}
	made := http.Header{}
	nodeproto.SetResolution(made, model.CreateRequest{Base: "base:x"}, &catalog.Resolution{Digests: []string{"sha256:forged"}})
	if resp, body := post(made); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create with a resolution header of the client's: %s %s", resp.Status, body)
	}
	sent := roomy.headers()
	f := nodeproto.ResolutionOf(sent[len(sent)-1])
	if f == nil || len(f.Digests) != 1 || f.Digests[0] != "sha256:basex" || f.For != nodeproto.RequestDigest(model.CreateRequest{Base: "base:x", Project: ""}) {
		t.Errorf("the resolution sent with a create: %+v, want the replica's of base:x", f)
	}

	// Routed requests: an unknown sandbox is the client's 404, without the refusal header; a
	// request without a token never reaches an edge.
	get := func(tok, path string) *http.Response {
		req, _ := http.NewRequest("GET", hs.URL+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := get(token, "/v1/sandboxes/sb-full-aaaaaaaaaaaaaaaa")
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown sandbox: %s, want 404", resp.Status)
	}
	noProtocolHeaders("an unknown sandbox", resp.Header)
	before = len(full.headers()) + len(roomy.headers())
	if resp := get("", "/v1/sandboxes/sb-full-aaaaaaaaaaaaaaaa"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: %s, want 401", resp.Status)
	}
	if resp := get("not-a-token", "/v1/layers"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a bad token: %s, want 401", resp.Status)
	}
	if after := len(full.headers()) + len(roomy.headers()); after != before {
		t.Errorf("%d unauthenticated requests reached an edge", after-before)
	}
}

// startStandIn joins a stand-in edge named name through the replica at serverURL (the join token
// in dir), serves h over the real mutual TLS, and registers the node with the protocol version
// and capacity given.
func startStandIn(t *testing.T, st *store.Store, serverURL, dir, name string, protocol int, capacity store.Resources, h http.HandlerFunc) *standIn {
	t.Helper()
	ctx := context.Background()
	j, err := Join(ctx, serverURL, filepath.Join(dir, "join.token"), name)
	if err != nil {
		t.Fatal(err)
	}
	e := &standIn{name: name}
	e.srv = httptest.NewUnstartedServer(clusterauth.RequireServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.seen = append(e.seen, r.Header.Clone())
		e.mu.Unlock()
		h(w, r)
	}), "/healthz"))
	e.srv.TLS = j.TLS
	e.srv.StartTLS()
	t.Cleanup(e.srv.Close)
	if _, err := st.Register(ctx, store.Node{Name: name, URL: "https://" + e.srv.Listener.Addr().String(), Protocol: protocol,
		Tiers: []string{"container"}, Runtimes: []string{"runc"}, Capacity: capacity}, time.Minute); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestNodeProtocolOldEdge: during a rolling upgrade (servers first), an edge registered without
// a protocol version still gets the user's token, as before, and no caller, and its node_full,
// said only in its body's code, still sends a create elsewhere; an upgraded edge beside it gets
// the caller and no token.
func TestNodeProtocolOldEdge(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, dsn, dir, token := bootstrapped(t, log)
	s := testServer(t, st, Config{DataDir: dir, Store: dsn, K: -1}, log) // the larger, "old", first
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	old := startStandIn(t, st, hs.URL, dir, "old", 0, store.Resources{CPUs: 64, MemoryBytes: 64 << 30, DiskBytes: 1 << 40, Sandboxes: 100},
		func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				// An old edge's refusal: the code in the body, no protocol header (the
				// request speaks none, so httpjson adds none).
				httpjson.Error(w, r, log, fmt.Errorf("no room: %w", errdefs.ErrNodeFull))
				return
			}
			json.NewEncoder(w).Encode(model.Sandbox{ID: "sb-old-aaaaaaaaaaaaaaaa", State: model.StateRunning})
		})
	upgraded := startStandIn(t, st, hs.URL, dir, "upgraded", nodeproto.Version, store.Resources{CPUs: 8, MemoryBytes: 8 << 30, DiskBytes: 1 << 40, Sandboxes: 10},
		func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(model.Sandbox{ID: "sb-upgraded-aaaaaaaaaaaaaaaa", State: model.StateRunning})
		})
	s.refresh(ctx, true)
	c := corral.New(hs.URL, token)
	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:x"})
	if err != nil || sb.ID != "sb-upgraded-aaaaaaaaaaaaaaaa" {
		t.Fatalf("a create the old edge refuses: %+v, %v (want it on the upgraded edge)", sb, err)
	}
	if _, err := c.GetSandbox(ctx, "sb-old-aaaaaaaaaaaaaaaa"); err != nil {
		t.Fatalf("a read routed to the old edge: %v", err)
	}
	if got := old.headers(); len(got) != 2 {
		t.Fatalf("the old edge got %d requests, want the create and the read", len(got))
	}
	for _, h := range old.headers() {
		if h.Get("Authorization") != "Bearer "+token || h.Get(nodeproto.HeaderCaller) != "" || h.Get(nodeproto.HeaderVersion) != "" {
			t.Errorf("the old edge got Authorization %q, caller %q, version %q; want the token and nothing of the protocol",
				h.Get("Authorization"), h.Get(nodeproto.HeaderCaller), h.Get(nodeproto.HeaderVersion))
		}
	}
	for _, h := range upgraded.headers() {
		if _, err := nodeproto.CallerOf(&http.Request{Header: h}); err != nil || h.Get("Authorization") != "" {
			t.Errorf("the upgraded edge: caller %v, Authorization %q; want the caller and no token", err, h.Get("Authorization"))
		}
	}
}

// TestVolumeDeleteBlackHoledEdge: a volume's delete does not wait on an edge that never answers
// the removal of its blobs: past its first try the delete answers, and another edge removes them.
// Two deletes: the replica takes the edges in turn, so one of them asks the silent edge first.
func TestVolumeDeleteBlackHoledEdge(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, dsn, dir, token := bootstrapped(t, log)
	s := testServer(t, st, Config{DataDir: dir, Store: dsn, BlobStore: "s3://bucket"}, log)
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	old := firstBlobTry
	firstBlobTry = 300 * time.Millisecond
	defer func() { firstBlobTry = old }()

	release := make(chan struct{})
	defer close(release)
	var silentAsked atomic.Int32
	removals := make(chan string, 4)
	roomy := store.Resources{CPUs: 8, MemoryBytes: 8 << 30, DiskBytes: 1 << 40, Sandboxes: 10}
	startStandIn(t, st, hs.URL, dir, "hole", nodeproto.Version, roomy, func(w http.ResponseWriter, r *http.Request) {
		silentAsked.Add(1)
		<-release // never answers while the test runs
	})
	startStandIn(t, st, hs.URL, dir, "good", nodeproto.Version, roomy, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/volume-blobs/") {
			removals <- r.URL.Path
		}
		w.WriteHeader(http.StatusNoContent)
	})
	s.refresh(ctx, true)

	c := corral.New(hs.URL, token)
	for _, name := range []string{"one", "two"} {
		if _, err := c.CreateVolume(ctx, corral.CreateVolumeRequest{Name: name, SizeBytes: 32 << 20}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := c.DeleteVolume(ctx, "", name); err != nil {
			t.Fatalf("delete volume %s: %v", name, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the delete of %s took %v: it waited on the edge that does not answer", name, took)
		}
	}
	for range 2 {
		select {
		case <-removals:
		case <-time.After(30 * time.Second):
			t.Fatal("the answering edge was not asked to remove both deleted volumes' blobs")
		}
	}
	if silentAsked.Load() == 0 {
		t.Error("neither delete asked the silent edge first: the test proved nothing")
	}
}
