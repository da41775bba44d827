// Package corraltest is an in-memory fake of the Corral REST API for tests of the code that
// talks to it: the Go SDK, the CLI, and programs built on them.
//
// The fake speaks the same routes, JSON shapes, NDJSON output streams and full-duplex stdin as
// the real server, and checks the bearer token. Instead of containers it runs [Program]s, small
// Go functions registered by name (a few, such as echo and cat, are built in); files live in a
// map per sandbox; layers are kept as their digests. Projects, principals, grants, tokens,
// quotas and the audit log are kept in memory, with a simpler authorisation than the real
// server's (see iam.go). Every request is recorded, so tests can assert what a client sent.
//
// Lock order: Server.mu is the only lock. Fake programs run on their own goroutines, which
// end when the program returns; a program's context ends when its command is signalled, its
// sandbox deleted, or the server closed.
package corraltest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// DefaultToken is the token a new Server accepts.
const DefaultToken = "test-token"

// DefaultBase is the base layer every new Server has published, so sandboxes can be created
// without importing a layer first.
const DefaultBase = "base:default"

// Server is a running fake Corral API server.
type Server struct {
	// URL is the server's base URL, "http://127.0.0.1:PORT".
	URL string
	// Token is the bearer token of the administrator (principal "admin", owner of the root
	// project). Every route but /healthz requires it or a token minted through POST /v1/tokens.
	Token string

	srv    *httptest.Server
	ctx    context.Context // ends when the server closes; parent of every sandbox's context
	cancel context.CancelFunc

	mu sync.Mutex
	// The fields below are protected by mu.
	sandboxes  map[string]*sandbox
	sbOrder    []string
	layers     map[string]*layer // by "name:version"
	layerOrder []string
	// environments are the saved environments, by name, in envOrder.
	environments map[string]*corral.Environment
	// tags maps a layer name's tags to the versions they point at.
	tags        map[string]map[string]string
	envOrder    []string
	programs    map[string]programEntry
	requests    []Request
	nextSandbox int
	nextCommand int
	iam         iamState
}

// NewServer starts a fake server and arranges for t's cleanup to close it.
func NewServer(t testing.TB) *Server {
	s := Start()
	t.Cleanup(s.Close)
	return s
}

// Start starts a fake server; the caller must Close it. Tests use [NewServer].
func Start() *Server {
	s := &Server{
		Token:        DefaultToken,
		sandboxes:    make(map[string]*sandbox),
		layers:       make(map[string]*layer),
		environments: make(map[string]*corral.Environment),
		tags:         make(map[string]map[string]string),
		programs:     builtinPrograms(),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.initIAMLocked()
	s.addLayerLocked(corral.Layer{Name: "base", Version: "default", Kind: corral.KindBase}, nil)
	s.srv = httptest.NewServer(s.handler())
	s.URL = s.srv.URL
	return s
}

// Close kills every fake program and shuts the server down. It is safe to call twice.
func (s *Server) Close() {
	s.cancel()
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// Client returns an SDK client for this server with its token.
func (s *Server) Client() *corral.Client {
	return corral.New(s.URL, s.Token, corral.WithHTTPClient(s.srv.Client()))
}

// Request is one request the server received.
type Request struct {
	Method string
	// Path is the unescaped URL path, "/v1/sandboxes/sb-1".
	Path   string
	Query  url.Values
	Header http.Header
	// Body is the request body, except for exec with streamed stdin, whose body is consumed
	// as it arrives (nil here).
	Body []byte
}

// String returns "METHOD PATH" followed by "?" and the sorted query when there is one.
func (r Request) String() string {
	if len(r.Query) == 0 {
		return r.Method + " " + r.Path
	}
	return r.Method + " " + r.Path + "?" + r.Query.Encode()
}

// Requests returns the requests received so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// RequestLines returns Requests rendered with Request.String, leaving out GET /healthz.
func (s *Server) RequestLines() []string {
	var out []string
	for _, r := range s.Requests() {
		if r.Path != "/healthz" {
			out = append(out, r.String())
		}
	}
	return out
}

// Sandbox returns the server's current view of a sandbox, and whether it exists.
func (s *Server) Sandbox(id string) (corral.Sandbox, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return corral.Sandbox{}, false
	}
	return sb.view(), true
}

// File returns the content of a regular file in a sandbox, and whether it exists.
func (s *Server) File(id, path string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return nil, false
	}
	n, ok := sb.files[cleanPath(path)]
	if !ok || n.dir {
		return nil, false
	}
	return slices.Clone(n.data), true
}

// handler routes requests and records them.
func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /v1/info", s.info)
	mux.HandleFunc("POST /v1/sandboxes", s.createSandbox)
	mux.HandleFunc("GET /v1/sandboxes", s.listSandboxes)
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.getSandbox)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/ttl", s.setTTL)
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", s.fork)
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", s.exec)
	mux.HandleFunc("POST /v1/sandboxes/{id}/commands", s.startCommand)
	mux.HandleFunc("GET /v1/sandboxes/{id}/commands", s.listCommands)
	mux.HandleFunc("GET /v1/sandboxes/{id}/commands/{cid}", s.getCommand)
	mux.HandleFunc("GET /v1/sandboxes/{id}/commands/{cid}/output", s.output)
	mux.HandleFunc("POST /v1/sandboxes/{id}/commands/{cid}/stdin", s.stdin)
	mux.HandleFunc("POST /v1/sandboxes/{id}/commands/{cid}/signal", s.signal)
	mux.HandleFunc("POST /v1/sandboxes/{id}/commands/{cid}/resize", s.resize)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", s.readFile)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", s.writeFile)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/files", s.removeFile)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", s.stat)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/list", s.list)
	mux.HandleFunc("POST /v1/sandboxes/{id}/files/mkdir", s.mkdir)
	mux.HandleFunc("POST /v1/sandboxes/{id}/files/move", s.move)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/watch", s.watch)
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/tar", s.tarOut)
	mux.HandleFunc("GET /v1/sandboxes/{id}/metrics", s.metrics)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files/tar", s.tarIn)
	mux.HandleFunc("POST /v1/layers", s.importLayer)
	mux.HandleFunc("GET /v1/layers", s.listLayers)
	mux.HandleFunc("GET /v1/layers/{name}/{version}", s.getLayer)
	mux.HandleFunc("DELETE /v1/layers/{name}/{version}", s.deleteLayer)
	mux.HandleFunc("PUT /v1/layers/{name}/tags/{tag}", s.tagLayer)
	mux.HandleFunc("DELETE /v1/layers/{name}/tags/{tag}", s.deleteTag)
	mux.HandleFunc("POST /v1/environments", s.saveEnvironment)
	mux.HandleFunc("GET /v1/environments", s.listEnvironments)
	mux.HandleFunc("GET /v1/environments/{name}", s.getEnvironment)
	mux.HandleFunc("DELETE /v1/environments/{name}", s.deleteEnvironment)
	mux.HandleFunc("GET /v1/whoami", s.whoami)
	mux.HandleFunc("POST /v1/projects", s.createProject)
	mux.HandleFunc("GET /v1/projects", s.listProjects)
	mux.HandleFunc("POST /v1/projects/move", s.moveProject)
	mux.HandleFunc("GET /v1/projects/{path...}", s.getProject)
	mux.HandleFunc("DELETE /v1/projects/{path...}", s.deleteProject)
	mux.HandleFunc("GET /v1/quotas/{path...}", s.getQuota)
	mux.HandleFunc("PUT /v1/quotas/{path...}", s.setQuota)
	mux.HandleFunc("POST /v1/principals", s.createPrincipal)
	mux.HandleFunc("GET /v1/principals", s.listPrincipals)
	mux.HandleFunc("POST /v1/grants", s.createGrant)
	mux.HandleFunc("GET /v1/grants", s.listGrants)
	mux.HandleFunc("DELETE /v1/grants", s.deleteGrant)
	mux.HandleFunc("POST /v1/tokens", s.createToken)
	mux.HandleFunc("GET /v1/tokens", s.listTokens)
	mux.HandleFunc("DELETE /v1/tokens/{id}", s.revokeToken)
	mux.HandleFunc("GET /v1/audit", s.listAudit)
	// As the real server's: any other route is a JSON 404. The real server serves more routes
	// than the fake (pause, snapshots, tags, volumes, ...): those land here too, and the message
	// says so.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, corral.CodeNotFound,
			fmt.Sprintf("no API route %s %s (or one the fake corraltest does not serve)", r.Method, r.URL.Path), "")
	})

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Header: r.Header.Clone()}
		if len(rec.Query) == 0 {
			rec.Query = nil
		}
		if r.URL.Query().Get("stdin") != "stream" {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				writeError(w, http.StatusBadRequest, corral.CodeInvalid, "read body: "+err.Error(), "")
				return
			}
			rec.Body = body
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		s.mu.Lock()
		s.requests = append(s.requests, rec)
		_, authed := s.callerLocked(r)
		s.mu.Unlock()

		if r.URL.Path != "/healthz" && !authed {
			writeError(w, http.StatusUnauthorized, corral.CodeUnauthorized,
				"missing or wrong bearer token: set CORRAL_TOKEN", "")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	n := 0
	for _, sb := range s.sandboxes {
		if sb.state == corral.StateRunning {
			n++
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, corral.Info{
		Version:        "fake",
		Node:           "fake-node",
		Runtime:        "runc",
		RuntimePath:    "/usr/bin/runc",
		RuntimeVersion: "runc version fake",
		DataDir:        "/var/lib/corral",
		Sandboxes:      n,
		CgroupVersion:  "2",
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg, field string) {
	writeJSON(w, status, corral.Error{Code: code, Message: msg, Field: field})
}

// httpError is a failure a handler turns into a JSON error response.
type httpError struct {
	status int
	code   string
	msg    string
	field  string
}

func (e *httpError) Error() string { return e.msg }

func notFound(format string, args ...any) *httpError {
	return &httpError{http.StatusNotFound, corral.CodeNotFound, fmt.Sprintf(format, args...), ""}
}

// invalid is a 400 on field; like the real server's, its message starts with "field: ".
func invalid(field, format string, args ...any) *httpError {
	msg := fmt.Sprintf(format, args...)
	if field != "" {
		msg = field + ": " + msg
	}
	return &httpError{http.StatusBadRequest, corral.CodeInvalid, msg, field}
}

func conflict(format string, args ...any) *httpError {
	return &httpError{http.StatusConflict, corral.CodeConflict, fmt.Sprintf(format, args...), ""}
}

func fail(w http.ResponseWriter, e *httpError) {
	writeError(w, e.status, e.code, e.msg, e.field)
}

// decodeBody decodes a JSON request body into v. It rejects unknown fields so that a client
// sending a misspelt field fails its tests.
func decodeBody(r *http.Request, v any) *httpError {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("", "decode request body: %v", err)
	}
	return nil
}

func cleanPath(p string) string {
	if p == "" {
		return ""
	}
	return pathClean(p)
}

// timeNow is the fake's clock.
var timeNow = func() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }
