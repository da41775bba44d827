package apiserver

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
)

// TestNodeCallers: a cluster server authenticates a token once and sends the edge the caller it
// found (ForwardCaller); an edge's API (ServeClusterServers) serves that caller with the same
// permissions and never looks a token up; any other API ignores a caller header, so a client
// cannot name itself someone else.
func TestNodeCallers(t *testing.T) {
	h := newIAMServer(t) // the server's side: authenticates tokens
	viewer := h.mint(h.root, model.TokenRequest{Project: "/", Role: "viewer"})

	edgeAPI := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil)), store: h.store, auditor: h.store}
	edgeAPI.ServeClusterServers()
	mux := http.NewServeMux()
	edgeAPI.iamRoutes(mux)
	edge := httptest.NewServer(edgeAPI.authenticate(mux))
	defer edge.Close()

	// forwarded returns the headers a server would send the edge for token's request.
	forwarded := func(token string) http.Header {
		t.Helper()
		var out http.Header
		front := h.srv.authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			out = r.Header.Clone()
			if err := ForwardCaller(r, out, "", nil); err != nil {
				t.Fatal(err)
			}
		}))
		r := httptest.NewRequest("GET", "/v1/whoami", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		front.ServeHTTP(w, r)
		if w.Code != http.StatusOK || out == nil {
			t.Fatalf("the server's authentication: %d %s", w.Code, w.Body)
		}
		if out.Get("Authorization") != "" {
			t.Fatalf("the token would travel to the edge: %v", out)
		}
		return out
	}
	call := func(base string, h http.Header, method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b) + " refusal=" + resp.Header.Get(nodeproto.HeaderRefusal)
	}

	// The root's caller, forwarded, is the root on the edge; a viewer's is a viewer there.
	if code, body := call(edge.URL, forwarded(h.root), "GET", "/v1/whoami"); code != http.StatusOK {
		t.Errorf("root's forwarded whoami: %d %s", code, body)
	}
	vh := forwarded(viewer.Token)
	if code, body := call(edge.URL, vh, "GET", "/v1/whoami"); code != http.StatusOK {
		t.Errorf("viewer's forwarded whoami: %d %s", code, body)
	}
	if code, body := call(edge.URL, vh, "GET", "/v1/audit"); code != http.StatusForbidden {
		t.Errorf("a viewer's audit read on the edge: %d %s (want 403: the caller's permissions hold there)", code, body)
	}
	if code, body := call(edge.URL, forwarded(h.root), "GET", "/v1/audit"); code != http.StatusOK {
		t.Errorf("root's audit read on the edge: %d %s", code, body)
	}

	// The edge looks no token up: a token alone speaks no protocol; the protocol without a
	// caller is unauthorised; another version is refused as such.
	tokenOnly := http.Header{"Authorization": {"Bearer " + h.root}}
	if code, body := call(edge.URL, tokenOnly, "GET", "/v1/whoami"); code != http.StatusServiceUnavailable {
		t.Errorf("a token without the node protocol on an edge: %d %s (want 503, refusal version)", code, body)
	}
	versionOnly := http.Header{nodeproto.HeaderVersion: {strconv.Itoa(nodeproto.Version)}, "Authorization": {"Bearer " + h.root}}
	if code, body := call(edge.URL, versionOnly, "GET", "/v1/whoami"); code != http.StatusUnauthorized {
		t.Errorf("the protocol without a caller: %d %s (want 401)", code, body)
	}
	other := forwarded(h.root)
	other.Set(nodeproto.HeaderVersion, strconv.Itoa(nodeproto.Version+1))
	if code, body := call(edge.URL, other, "GET", "/v1/whoami"); code != http.StatusServiceUnavailable {
		t.Errorf("another protocol version: %d %s (want 503)", code, body)
	}

	// Anywhere else the caller header counts for nothing: no token, no caller.
	if code, body := call(h.url, forwarded(h.root), "GET", "/v1/whoami"); code != http.StatusUnauthorized {
		t.Errorf("a forged caller on an API that authenticates tokens: %d %s (want 401)", code, body)
	}
	forged := forwarded(h.root)
	forged.Set("Authorization", "Bearer "+viewer.Token)
	if code, body := call(h.url, forged, "GET", "/v1/audit"); code != http.StatusForbidden {
		t.Errorf("a viewer's token with root's caller header, on a token API: %d %s (want 403: the token decides)", code, body)
	}
}

// TestSandboxProjectFromServer: on an edge, a request about a sandbox is authorised on the
// project the server read for it and sent with the caller (a project moved binds at once, with
// no read on the edge), but only for the sandbox the caller names: a caller naming another
// sandbox is authorised on the store's project of the one in the path.
func TestSandboxProjectFromServer(t *testing.T) {
	h := newIAMServer(t)
	for _, p := range []string{"a", "b"} {
		h.must(http.StatusCreated, h.root, "POST", "/v1/projects", model.ProjectRequest{Path: p}, nil)
	}
	ctx := t.Context()
	inB := "sb-local-bbbbbbbbbbbbbbbb"
	pb, err := h.store.GetProject(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.store.PutSandbox(ctx, &store.Sandbox{Sandbox: model.Sandbox{ID: inB, Node: "local", State: model.StateRunning}, ProjectID: pb.ID}); err != nil {
		t.Fatal(err)
	}
	userA := h.mint(h.root, model.TokenRequest{Project: "a", Role: "viewer"})

	edgeAPI := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil)), store: h.store, auditor: h.store}
	edgeAPI.ServeClusterServers()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}", edgeAPI.guard(iam.SandboxRead, "", edgeAPI.onSandbox, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	edge := httptest.NewServer(edgeAPI.authenticate(mux))
	defer edge.Close()
	get := func(path string, sandbox *nodeproto.SandboxProject) int {
		t.Helper()
		var fwd http.Header
		front := h.srv.authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if sandbox != nil {
				r = OnSandbox(r, sandbox.ID, sandbox.Project)
			}
			fwd = r.Header.Clone()
			if err := ForwardCaller(r, fwd, "", nil); err != nil {
				t.Fatal(err)
			}
		}))
		r := httptest.NewRequest("GET", "/v1/whoami", nil)
		r.Header.Set("Authorization", "Bearer "+userA.Token)
		front.ServeHTTP(httptest.NewRecorder(), r)
		req, _ := http.NewRequest("GET", edge.URL+path, nil)
		req.Header = fwd
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/v1/sandboxes/"+inB, nil); code != http.StatusForbidden {
		t.Errorf("a's viewer on b's sandbox, no project from the server: %d (want 403 from the store's project)", code)
	}
	if code := get("/v1/sandboxes/"+inB, &nodeproto.SandboxProject{ID: inB, Project: "a"}); code != http.StatusOK {
		t.Errorf("the server says the sandbox is a's now (moved): %d (want 200)", code)
	}
	if code := get("/v1/sandboxes/"+inB, &nodeproto.SandboxProject{ID: "sb-local-aaaaaaaaaaaaaaaa", Project: "a"}); code != http.StatusForbidden {
		t.Errorf("a caller naming another sandbox's project: %d (want 403: the path's sandbox is b's)", code)
	}
}
