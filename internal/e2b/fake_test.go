package e2b

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

// front is a tiny fake, in front of corraltest, of the Corral routes corraltest lacks: pause and
// resume, saved environments (looked up, and used by create), PUT network and the trajectory.
// Everything else goes to corraltest unchanged; answers about sandboxes are patched with what
// front keeps (paused state, environment, network policy).
type front struct {
	t    testing.TB
	fake *corraltest.Server

	mu sync.Mutex
	// The fields below are protected by mu.
	paused     map[string]bool
	envs       map[string]corral.Environment
	envOf      map[string]string // sandbox ID -> environment it was made from
	network    map[string]corral.NetworkPolicy
	trajectory map[string][]corral.TrajectoryEntry
	creates    []corral.CreateRequest // as the gateway sent them
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+f.fake.Token {
		// corraltest knows every other token (minted ones, wrong ones); let it answer.
		f.forward(w, r, nil)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/environments/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		env, ok := f.envs[r.PathValue("name")]
		f.mu.Unlock()
		if !ok {
			writeCorralError(w, http.StatusNotFound, corral.CodeNotFound, "environment "+r.PathValue("name")+" not found", "")
			return
		}
		writeJSON(w, http.StatusOK, env)
	})
	mux.HandleFunc("POST /v1/sandboxes", f.create)
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", func(w http.ResponseWriter, r *http.Request) { f.setPaused(w, r, true) })
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", func(w http.ResponseWriter, r *http.Request) { f.setPaused(w, r, false) })
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", func(w http.ResponseWriter, r *http.Request) {
		var p corral.NetworkPolicy
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			writeCorralError(w, http.StatusBadRequest, corral.CodeInvalid, err.Error(), "")
			return
		}
		sb, ok := f.sandbox(w, r.PathValue("id"))
		if !ok {
			return
		}
		f.mu.Lock()
		f.network[sb.ID] = p
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, f.patch(sb))
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/trajectory", func(w http.ResponseWriter, r *http.Request) {
		sb, ok := f.sandbox(w, r.PathValue("id"))
		if !ok {
			return
		}
		f.mu.Lock()
		steps := f.trajectory[sb.ID]
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, s := range steps {
			_ = enc.Encode(s)
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { f.forward(w, r, nil) })
	mux.ServeHTTP(w, r)
}

// sandbox returns corraltest's view of a sandbox, patched, or answers 404.
func (f *front) sandbox(w http.ResponseWriter, id string) (corral.Sandbox, bool) {
	sb, ok := f.fake.Sandbox(id)
	if !ok {
		writeCorralError(w, http.StatusNotFound, corral.CodeNotFound, "sandbox "+id+" not found", "")
		return sb, false
	}
	return f.patch(sb), true
}

// patch applies what front keeps to a sandbox view.
func (f *front) patch(sb corral.Sandbox) corral.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.paused[sb.ID] && sb.State == corral.StateRunning {
		sb.State = corral.StatePaused
	}
	if env, ok := f.envOf[sb.ID]; ok {
		sb.Environment = env
	}
	if p, ok := f.network[sb.ID]; ok {
		sb.Network = &p
	}
	return sb
}

func (f *front) setPaused(w http.ResponseWriter, r *http.Request, pause bool) {
	sb, ok := f.sandbox(w, r.PathValue("id"))
	if !ok {
		return
	}
	switch {
	case sb.State != corral.StateRunning && sb.State != corral.StatePaused:
		writeCorralError(w, http.StatusConflict, corral.CodeConflict, "sandbox "+sb.ID+" is "+sb.State, "")
		return
	case pause && sb.State == corral.StatePaused:
		writeCorralError(w, http.StatusConflict, corral.CodeConflict, "sandbox "+sb.ID+" is already paused", "")
		return
	case !pause && sb.State == corral.StateRunning:
		writeCorralError(w, http.StatusConflict, corral.CodeConflict, "sandbox "+sb.ID+" is running, not paused", "")
		return
	}
	f.mu.Lock()
	f.paused[sb.ID] = pause
	f.mu.Unlock()
	sb, _ = f.fake.Sandbox(sb.ID)
	writeJSON(w, http.StatusOK, f.patch(sb))
}

// create records the request and turns an environment into its layers, which corraltest needs.
func (f *front) create(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req corral.CreateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeCorralError(w, http.StatusBadRequest, corral.CodeInvalid, err.Error(), "")
		return
	}
	f.mu.Lock()
	f.creates = append(f.creates, req)
	env, hasEnv := f.envs[req.Environment]
	f.mu.Unlock()
	envName := req.Environment
	if envName != "" {
		if !hasEnv {
			writeCorralError(w, http.StatusBadRequest, corral.CodeInvalid, "environment: environment "+envName+" is not saved", "environment")
			return
		}
		req.Environment, req.Base = "", env.Base
		body, _ = json.Marshal(req)
	}
	status, resp := f.forward(nil, r, body)
	var sb corral.Sandbox
	if status == http.StatusCreated && json.Unmarshal(resp, &sb) == nil {
		f.mu.Lock()
		if envName != "" {
			f.envOf[sb.ID] = envName
		}
		if req.Network != nil {
			f.network[sb.ID] = *req.Network
		}
		f.mu.Unlock()
		writeJSON(w, status, f.patch(sb))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(resp)
}

// forward sends r (with body instead of its own when non-nil) to corraltest. With w it copies
// the answer, patching sandbox views; without, it returns it.
func (f *front) forward(w http.ResponseWriter, r *http.Request, body []byte) (int, []byte) {
	if body == nil {
		body, _ = io.ReadAll(r.Body)
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, f.fake.URL+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		f.t.Errorf("front: %v", err)
		return http.StatusInternalServerError, nil
	}
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Errorf("front: %v", err)
		return http.StatusBadGateway, nil
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if w == nil {
		return resp.StatusCode, out
	}
	if resp.StatusCode < 300 && r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/sandboxes") {
		var one corral.Sandbox
		var list struct {
			Sandboxes []corral.Sandbox `json:"sandboxes"`
		}
		if r.URL.Path == "/v1/sandboxes" && json.Unmarshal(out, &list) == nil {
			for i := range list.Sandboxes {
				list.Sandboxes[i] = f.patch(list.Sandboxes[i])
			}
			out, _ = json.Marshal(list)
		} else if strings.Count(r.URL.Path, "/") == 3 && json.Unmarshal(out, &one) == nil {
			out, _ = json.Marshal(f.patch(one))
		}
	}
	for k, v := range resp.Header {
		if k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(out)
	return resp.StatusCode, out
}

func writeCorralError(w http.ResponseWriter, status int, code, msg, field string) {
	if field != "" {
		msg = field + ": " + msg
	}
	writeJSON(w, status, corral.Error{Code: code, Message: msg, Field: field})
}

// harness is a gateway in front of front in front of corraltest, served over HTTP.
type harness struct {
	t     *testing.T
	fake  *corraltest.Server
	front *front
	gw    *Gateway
	url   string
}

// testKey is the gateway's token key in tests.
var testKey = bytes.Repeat([]byte{7}, MinTokenKey)

func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessToken(t, "")
}

// newHarnessToken is newHarness whose fake Corral's admin token is token ("" keeps the default).
func newHarnessToken(t *testing.T, token string) *harness {
	t.Helper()
	fake := corraltest.NewServer(t)
	if token != "" {
		// Set before any server reading it starts.
		fake.Token = token
	}
	f := &front{
		t: t, fake: fake,
		paused:     map[string]bool{},
		envs:       map[string]corral.Environment{},
		envOf:      map[string]string{},
		network:    map[string]corral.NetworkPolicy{},
		trajectory: map[string][]corral.TrajectoryEntry{},
	}
	corralSrv := httptest.NewServer(f)
	t.Cleanup(corralSrv.Close)
	gw, err := New(Config{CorralURL: corralSrv.URL, Domain: "e2b.test", TokenKey: testKey},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(srv.Close)
	return &harness{t: t, fake: fake, front: f, gw: gw, url: srv.URL}
}

// response is one answer of the gateway.
type response struct {
	status int
	header http.Header
	body   []byte
}

// errBody decodes E2B's error body; code is a number.
func (r response) errBody(t *testing.T) (code int, msg string) {
	t.Helper()
	var e struct {
		Code    *int   `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Code == nil {
		t.Fatalf("error body %s: want {\"code\": <number>, \"message\": ...} (%v)", r.body, err)
	}
	return *e.Code, e.Message
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// do sends a request as the SDK does: the key in X-API-KEY, a JSON body.
func (h *harness) do(method, path, body string) response {
	return h.doKey(h.fake.Token, method, path, body)
}

func (h *harness) doKey(key, method, path, body string) response {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.url+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	req.Header.Set("User-Agent", "e2b-js-sdk/2.51.0")
	req.Header.Set("lang_version", "v22")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}
}

// create creates a sandbox through the gateway and returns its answer.
func (h *harness) create(body string) sandboxJSON {
	h.t.Helper()
	resp := h.do("POST", "/v2/sandboxes", body)
	if resp.status != http.StatusCreated {
		h.t.Fatalf("create %s: %d %s", body, resp.status, resp.body)
	}
	var sb sandboxJSON
	resp.decode(h.t, &sb)
	return sb
}

// lastCreate is the last create request Corral received.
func (h *harness) lastCreate() corral.CreateRequest {
	h.t.Helper()
	h.front.mu.Lock()
	defer h.front.mu.Unlock()
	if len(h.front.creates) == 0 {
		h.t.Fatal("Corral received no create")
	}
	return h.front.creates[len(h.front.creates)-1]
}

func (h *harness) createCount() int {
	h.front.mu.Lock()
	defer h.front.mu.Unlock()
	return len(h.front.creates)
}
