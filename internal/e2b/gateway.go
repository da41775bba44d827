package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// Defaults of [Config].
const (
	// DefaultEnvdVersion is the envd version the gateway reports unless told otherwise. The E2B
	// SDK gates features on it (docs/e2b-protocol.md §4.3): 0.5.7 is the highest version whose
	// gated features all map onto Corral's data plane — closeStdin (≥ 0.5.2) onto closing a
	// command's stdin, octet-stream uploads (≥ 0.5.7) onto a plain file write, recursive
	// watches (≥ 0.1.4) and metrics (≥ 0.1.5) — and it is ≥ 0.4.0, so the SDK does not force the
	// user "user" on every call. 0.6.2 and above would let the SDK send file metadata (extended
	// attributes), watches with entries and network-mount watches, which Corral does not offer;
	// at 0.5.7 the SDK refuses those itself, with a clear error, before anything is sent.
	DefaultEnvdVersion = "0.5.7"
	// DefaultSandboxTimeout is the lifetime of a sandbox created without a timeout, as E2B's
	// v2 create gives it.
	DefaultSandboxTimeout = 300 * time.Second
	// DefaultTemplate is what the E2B template "base" (the SDK's default) stands for when no
	// Corral environment is called "base": Corral's default base layer tag.
	DefaultTemplate = "base:default"
)

// v1DefaultTimeout is the lifetime the v1 routes (create, resume) give when the body has none,
// as E2B's published API does.
const v1DefaultTimeout = 15 * time.Second

// MinTokenKey is the shortest [Config.TokenKey] accepted, in bytes.
const MinTokenKey = 32

// Config configures a [Gateway].
type Config struct {
	// CorralURL is the Corral API the gateway translates to ("http://127.0.0.1:7070"): corral
	// up's listener or a cluster's corral server.
	CorralURL string
	// HTTPClient sends the requests to Corral (nil: http.DefaultClient). An in-process
	// transport lets the gateway share a listener with the Corral API without a network hop.
	HTTPClient *http.Client
	// Domain is what create and connect answer as "domain". The SDK's getHost(port) builds
	// "<port>-<sandboxID>.<domain>" from it, so it should be a name whose wildcard resolves to
	// the gateway ("e2b.corral.example.com" with DNS for "*.e2b.corral.example.com"). Empty: the
	// Host the request came to, so the SDK never falls back to e2b.app.
	Domain string
	// EnvdVersion is the envd version reported for every sandbox; see [DefaultEnvdVersion].
	EnvdVersion string
	// DefaultTimeout is the lifetime of a sandbox whose v2 create has no timeout, and the least
	// lifetime a connect without one leaves (connect only extends).
	DefaultTimeout time.Duration
	// DefaultTemplate is what template "base" means when no Corral environment is called
	// "base": an environment name or a layer NAME:VERSION.
	DefaultTemplate string
	// TokenKey is the secret the per-sandbox envd access tokens are derived from (HMAC-SHA256
	// of the sandbox ID); at least [MinTokenKey] bytes. Every gateway in front of the same
	// Corral must share it, and it must survive restarts: a new key invalidates every token
	// handed out.
	TokenKey []byte
	// ServiceToken is the Corral token the in-sandbox surface acts with, once a request has
	// proved itself with a sandbox's envd access token (the SDK never sends its API key there).
	// It needs sandbox.read and sandbox.use on the sandboxes' projects, and nothing more. Empty:
	// the in-sandbox surface answers unavailable.
	ServiceToken string
	// SpoolDir is where the files template builds upload wait for their build (a directory of
	// the gateway's own is made in it and removed by Close); empty: the system's temporary
	// directory.
	SpoolDir string
}

// withDefaults returns c with empty fields filled in.
func (c Config) withDefaults() Config {
	if c.EnvdVersion == "" {
		c.EnvdVersion = DefaultEnvdVersion
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = DefaultSandboxTimeout
	}
	if c.DefaultTemplate == "" {
		c.DefaultTemplate = DefaultTemplate
	}
	if c.HTTPClient == nil {
		c.HTTPClient = http.DefaultClient
	}
	return c
}

// Validate checks c after its defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	u, err := url.Parse(c.CorralURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("e2b gateway: corral URL %q: want http(s)://HOST[:PORT]", c.CorralURL)
	}
	if strings.ContainsAny(c.Domain, "/ ") || strings.HasPrefix(c.Domain, ".") {
		return fmt.Errorf("e2b gateway: domain %q: want a host name such as e2b.example.com", c.Domain)
	}
	if v, ok := parseVersion(c.EnvdVersion); !ok || v[0] == 0 && v[1] < 1 {
		return fmt.Errorf("e2b gateway: envd version %q: want MAJOR.MINOR.PATCH, at least 0.1.0 (the SDK refuses older)", c.EnvdVersion)
	}
	if c.DefaultTimeout < time.Second {
		return fmt.Errorf("e2b gateway: default timeout %s: want at least 1s", c.DefaultTimeout)
	}
	if len(c.TokenKey) < MinTokenKey {
		return fmt.Errorf("e2b gateway: token key has %d bytes: want at least %d", len(c.TokenKey), MinTokenKey)
	}
	return nil
}

// parseVersion parses "MAJOR.MINOR.PATCH".
func parseVersion(s string) ([3]int, bool) {
	var v [3]int
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return v, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || strconv.Itoa(n) != p {
			return v, false
		}
		v[i] = n
	}
	return v, true
}

// Gateway serves E2B's control-plane REST API by translating each call into calls of the Corral
// API, made with the caller's own token. Its only state is what E2B's template builds need
// between calls (pending builds and their uploads, templates.go), and per-sandbox caches; it
// is safe for concurrent use.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	envd    http.Handler // the in-sandbox surface (envd.go)
	fs      *fsState     // users per sandbox and polling watchers (filesystem.go)
	shells  processShells
	tpl     *templateBuilds // pending template builds and their uploads (templates.go)
}

// New returns a gateway for cfg, or the error [Config.Validate] finds. A nil log discards.
func New(cfg Config, log *slog.Logger) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{cfg: cfg.withDefaults(), log: log, fs: newFSState(), shells: processShells{m: map[string]processShellEntry{}},
		tpl: newTemplateBuilds(cfg.SpoolDir)}
	g.handler, g.envd = g.routes(), g.envdRoutes()
	return g, nil
}

// Handler returns the HTTP handler of E2B's API: the control plane, and the in-sandbox surface
// for requests that name a sandbox (E2b-Sandbox-Id header, or a "<port>-<id>." host). Mount it
// at the root of a listener: the SDK's E2B_API_URL and E2B_SANDBOX_URL can both be its URL.
func (g *Gateway) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, port, ok := sandboxOf(r); ok {
			if port != envdPort && port != 0 {
				g.portProxy(w, r, id, port)
				return
			}
			g.envd.ServeHTTP(w, r)
			return
		}
		g.handler.ServeHTTP(w, r)
	})
}

// Close ends the gateway's polling watchers (their Corral watch streams) and removes the files
// template builds uploaded; requests still being served end with their connections.
func (g *Gateway) Close() {
	g.fs.closeWatchers()
	g.tpl.close()
}

// EnvdAccessToken returns the envd access token of a sandbox: the secret create and connect
// hand to the SDK, which sends it as X-Access-Token to the in-sandbox surface and signs file
// URLs with it. It is derived from the sandbox ID and [Config.TokenKey], so any gateway sharing
// the key can check it without storing anything.
func (g *Gateway) EnvdAccessToken(sandboxID string) string {
	m := hmac.New(sha256.New, g.cfg.TokenKey)
	m.Write([]byte("corral e2b envd access token\x00"))
	m.Write([]byte(sandboxID))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckEnvdAccessToken reports whether token is the envd access token of the sandbox, in
// constant time.
func (g *Gateway) CheckEnvdAccessToken(sandboxID, token string) bool {
	return hmac.Equal([]byte(token), []byte(g.EnvdAccessToken(sandboxID)))
}

// maxBody bounds a request body.
const maxBody = 1 << 20

func (g *Gateway) routes() http.Handler {
	mux := http.NewServeMux()
	h := func(pattern string, fn handlerFunc) { mux.Handle(pattern, g.authed(fn)) }

	h("POST /v2/sandboxes", g.createV2)
	h("POST /sandboxes", g.createV1)
	h("GET /v2/sandboxes", g.listV2)
	h("GET /sandboxes", g.listV1)
	h("GET /sandboxes/metrics", g.metricsMany)
	h("GET /sandboxes/{sandboxID}", g.get)
	h("DELETE /sandboxes/{sandboxID}", g.kill)
	h("POST /sandboxes/{sandboxID}/timeout", g.setTimeout)
	h("POST /sandboxes/{sandboxID}/refreshes", g.refresh)
	h("POST /sandboxes/{sandboxID}/pause", g.pause)
	h("POST /sandboxes/{sandboxID}/resume", g.resumeV1)
	h("POST /sandboxes/{sandboxID}/connect", g.connectV1)
	h("POST /v2/sandboxes/{sandboxID}/connect", g.connectV2)
	h("GET /sandboxes/{sandboxID}/metrics", g.metrics)
	h("GET /sandboxes/{sandboxID}/logs", g.logsV1)
	h("GET /v2/sandboxes/{sandboxID}/logs", g.logsV2)
	h("PUT /sandboxes/{sandboxID}/network", g.updateNetwork)
	h("POST /sandboxes/{sandboxID}/fork", g.fork)
	h("POST /v3/templates", g.requestBuild)
	h("GET /templates/{templateID}/files/{hash}", g.fileUploadLink)
	h("POST /v2/templates/{templateID}/builds/{buildID}", g.triggerBuild)
	h("GET /templates/{templateID}/builds/{buildID}/status", g.buildStatus)
	h("GET /templates/aliases/{alias}", g.templateExists)
	h("DELETE /templates/{templateID}", g.deleteTemplate)
	// The upload URL fileUploadLink hands out: signed, as the SDK sends no API key there.
	mux.HandleFunc("PUT /templates/{templateID}/files/{hash}/upload", g.uploadFiles)

	// Calls of the SDK that Corral has no counterpart for yet: an explicit refusal, so that no
	// client reads a 404 as "no such sandbox" or "no such snapshot".
	for _, p := range []string{
		"POST /sandboxes/{sandboxID}/snapshots",
		"GET /snapshots",
		"POST /templates/tags",
		"DELETE /templates/tags",
	} {
		what := p
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, errorf(http.StatusNotImplemented, "%s is not supported by Corral's E2B gateway", what))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errorf(http.StatusNotFound, "%s %s is not a route of the E2B API that Corral serves", r.Method, r.URL.Path))
	})
	return mux
}

// handlerFunc serves one authenticated request with a Corral client acting as the caller; an
// error it returns becomes the E2B error response.
type handlerFunc func(w http.ResponseWriter, r *http.Request, c *corral.Client) error

// authed takes the caller's API key — the X-API-Key header the SDK sends, or an
// "Authorization: Bearer" header — and serves fn with a Corral client that presents it as the
// Corral bearer token. Corral alone decides what the key may do.
func (g *Gateway) authed(fn handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// E2B's SDKs accept only e2b_<hex> keys: a token's alias of that shape stands for it.
		key := apiKey(r)
		if key == "" {
			writeError(w, errorf(http.StatusUnauthorized, "no API key: send a Corral token or its e2b_ alias (corral token e2b-key) in the X-API-Key header (E2B_API_KEY)"))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if err := fn(w, r, g.client(r, key)); err != nil {
			writeError(w, g.toAPIError(r, err))
		}
	})
}

// client returns a Corral client presenting token, its user agent naming the SDK that called.
func (g *Gateway) client(r *http.Request, token string) *corral.Client {
	ua := "corral-e2b-gateway"
	if sdk := r.Header.Get("User-Agent"); sdk != "" {
		ua += " (" + sdk + ")"
	}
	return corral.New(g.cfg.CorralURL, token, corral.WithHTTPClient(g.cfg.HTTPClient), corral.WithUserAgent(ua))
}

// domain is the "domain" create and connect answer.
func (g *Gateway) domain(r *http.Request) string {
	if g.cfg.Domain != "" {
		return g.cfg.Domain
	}
	return r.Host
}

// apiError is a failure answered with E2B's error body: {"code": status, "message": ...}. The
// SDK tests the body's numeric code (404, 409), not only the HTTP status.
type apiError struct {
	status int
	msg    string
}

// Error returns the message the caller sees.
func (e *apiError) Error() string { return e.msg }

func errorf(status int, format string, args ...any) *apiError {
	return &apiError{status: status, msg: fmt.Sprintf(format, args...)}
}

// invalid is a 400 whose message starts with the E2B field it concerns.
func invalid(field, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: field + ": " + fmt.Sprintf(format, args...)}
}

func notFound(id string) *apiError {
	return errorf(http.StatusNotFound, "sandbox %s not found", id)
}

// toAPIError turns an error of a handler into the E2B error to answer.
func (g *Gateway) toAPIError(r *http.Request, err error) *apiError {
	if ae, ok := errors.AsType[*apiError](err); ok {
		return ae
	}
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return errorf(http.StatusRequestEntityTooLarge, "request body is larger than %d bytes", maxBody)
	}
	if ce, ok := errors.AsType[*corral.APIError](err); ok {
		switch ce.Status {
		case http.StatusUnauthorized:
			return errorf(ce.Status, "Corral refused the API key (E2B_API_KEY must be a Corral token or its e2b_ alias): %s", ce.Error())
		case http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound,
			http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusTooManyRequests, http.StatusServiceUnavailable:
			return &apiError{status: ce.Status, msg: ce.Error()}
		}
		g.log.Error("corral API failed", "method", r.Method, "path", r.URL.Path, "status", ce.Status, "err", ce.Message)
		return errorf(http.StatusInternalServerError, "the Corral API failed (status %d); see Corral's log", ce.Status)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return errorf(http.StatusGatewayTimeout, "request cancelled before Corral answered")
	}
	g.log.Error("reach corral API", "method", r.Method, "path", r.URL.Path, "err", err)
	return errorf(http.StatusBadGateway, "the Corral API is unreachable from the E2B gateway")
}
