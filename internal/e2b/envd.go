package e2b

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/revproxy"
	corral "github.com/corral-dev/corral/sdk/go"
)

// The in-sandbox surface: what the SDK sends to envd, the daemon an E2B sandbox runs on port
// 49983 — the process and filesystem Connect services, /files and /health — served by
// translating onto Corral's data plane (commands, files). Requests name their sandbox with the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers (the SDK sets them when E2B_SANDBOX_URL points
// here) or with a host name "<port>-<sandbox ID>.<domain>". The SDK never sends its API key
// there: a request proves itself with the sandbox's envd access token (X-Access-Token, or the
// signature of a file URL), and the gateway then acts with its own service token
// (Config.ServiceToken), which may read and use sandboxes but nothing else.

// envdPort is the port the SDK addresses envd on.
const envdPort = 49983

// sandboxTarget is one request of the in-sandbox surface, its access checked.
type sandboxTarget struct {
	id   string
	port int
	// c acts on the sandbox with the gateway's service token.
	c *corral.Client
	// user is the Unix user the request runs as (HTTP Basic user name, or the username query
	// parameter of /files); empty: the sandbox's default.
	user string
}

// envdHandler serves one request of the in-sandbox surface.
type envdHandler func(w http.ResponseWriter, r *http.Request, t *sandboxTarget)

// hostRE matches "<port>-<sandbox ID>." at the start of a host name.
var hostRE = lazyregexp.New(`^([0-9]{1,5})-(sb-[a-z0-9-]+)\.`)

// sandboxOf reports whether r is for the in-sandbox surface, and for which sandbox and port.
func sandboxOf(r *http.Request) (id string, port int, ok bool) {
	if id = r.Header.Get("E2b-Sandbox-Id"); id != "" {
		port = envdPort
		if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 || n > 65535 {
				return id, 0, true // refused by the caller with the port named
			}
			port = n
		}
		return id, port, true
	}
	if m := hostRE.FindStringSubmatch(r.Host); m != nil {
		n, _ := strconv.Atoi(m[1])
		return m[2], n, true
	}
	return "", 0, false
}

// envdRoutes returns the handler of the in-sandbox surface.
func (g *Gateway) envdRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /health", g.sandboxed(g.health))
	mux.Handle("POST /process.Process/{method}", g.sandboxed(func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
		g.processMethod(r.PathValue("method"))(w, r, t)
	}))
	mux.Handle("POST /filesystem.Filesystem/{method}", g.sandboxed(func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
		g.filesystemMethod(r.PathValue("method"))(w, r, t)
	}))
	mux.Handle("/files", g.sandboxed(g.files))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeUnary(w, nil, rpcErrorf(codeNotFound, "%s %s is not a route of envd that Corral serves", r.Method, r.URL.Path))
	})
	return mux
}

// sandboxed checks a request of the in-sandbox surface — its sandbox, its port, its access
// token — and serves it with a client acting on that sandbox.
func (g *Gateway) sandboxed(h envdHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, port, _ := sandboxOf(r)
		if port != envdPort {
			writeUnary(w, nil, rpcErrorf(codeUnavailable, "port %q of sandbox %s: Corral serves envd's port %d only", r.Header.Get("E2b-Sandbox-Port"), id, envdPort))
			return
		}
		if g.cfg.ServiceToken == "" {
			writeUnary(w, nil, rpcErrorf(codeUnavailable, "this gateway serves the control plane only (no service token for the in-sandbox surface)"))
			return
		}
		t := &sandboxTarget{id: id, port: port}
		if !g.accessAllowed(r, t) {
			msg := fmt.Sprintf("missing or wrong envd access token for sandbox %s (X-Access-Token, as create or connect returned it, or a valid signature)", id)
			if r.URL.Path == "/files" {
				writeError(w, errorf(http.StatusUnauthorized, "%s", msg)) // envd's REST shape
			} else {
				writeUnary(w, nil, rpcErrorf(codeUnauthenticated, "%s", msg))
			}
			return
		}
		t.c = g.client(r, g.cfg.ServiceToken)
		t.user = basicUser(r)
		h(w, r, t)
	})
}

// accessAllowed checks the envd access token of the request (the /files handler checks a
// signed URL's signature itself when there is no token).
func (g *Gateway) accessAllowed(r *http.Request, t *sandboxTarget) bool {
	if tok := r.Header.Get("X-Access-Token"); tok != "" {
		return g.CheckEnvdAccessToken(t.id, tok)
	}
	return r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" && g.checkFileSignature(r, t.id)
}

// portProxy serves "<port>-<id>.<domain>" (getHost) and requests whose E2b-Sandbox-Port is not
// envd's: HTTP to that port on the sandbox's own loopback, through Corral's port proxy
// (/v1/sandboxes/{id}/ports/{port}/...) with the gateway's service token. As in E2B, whose
// sandboxes allow public traffic unless created otherwise (which Corral refuses for now), the
// URL is the capability: no token is asked for, and the sandbox ID's 80 random bits keep it
// unguessable. Corral's own `corral port` is authenticated. Corral's refusals (the sandbox is
// gone: 404, nothing listens: 503) pass through as they are.
func (g *Gateway) portProxy(w http.ResponseWriter, r *http.Request, id string, port int) {
	if g.cfg.ServiceToken == "" {
		writePortError(w, id, port, http.StatusServiceUnavailable, "this gateway serves the control plane only (no service token for sandbox ports)")
		return
	}
	target, err := url.Parse(g.cfg.CorralURL)
	if err != nil {
		writePortError(w, id, port, http.StatusInternalServerError, "bad Corral URL")
		return
	}
	prefix := "/v1/sandboxes/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
			pr.Out.URL.Path, pr.Out.URL.RawPath = prefix+pr.In.URL.Path, ""
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set("Authorization", "Bearer "+g.cfg.ServiceToken)
			pr.Out.Header.Del("X-Access-Token")
			pr.Out.Header.Del("E2b-Sandbox-Id")
			pr.Out.Header.Del("E2b-Sandbox-Port")
		},
		Transport:     g.cfg.HTTPClient.Transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writePortError(w, id, port, http.StatusBadGateway, "Corral did not answer: "+err.Error())
		},
	}
	revproxy.Serve(proxy, w, r)
}

// writePortError answers a port request as E2B's proxy does for a closed port.
func writePortError(w http.ResponseWriter, id string, port, status int, msg string) {
	body, _ := json.Marshal(map[string]any{"sandboxId": id, "port": port, "message": msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

// basicUser returns the user name of an "Authorization: Basic base64(user:)" header.
func basicUser(r *http.Request) string {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return ""
	}
	user, _, _ := strings.Cut(string(b), ":")
	return user
}

// health answers envd's /health: 204 while the sandbox runs (the SDK's isRunning), 502 when it
// does not, as E2B's proxy answers for a sandbox that is gone.
func (g *Gateway) health(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	sb, err := t.c.GetSandbox(r.Context(), t.id)
	if err != nil || (sb.State != corral.StateRunning && sb.State != corral.StateCreating) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		w.Write([]byte(`{"message":"sandbox not running","sandboxId":"` + t.id + `"}`))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
