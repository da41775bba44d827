package edge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/nsutil"
	"github.com/corral-dev/corral/internal/revproxy"
	"github.com/corral-dev/corral/internal/store"
)

// Ports: an HTTP proxy to a TCP port inside a sandbox (`corral port`, the code interpreter, the
// E2B gateway's <port>-<id>.<domain> hosts). The connection is made from inside the sandbox to
// its loopback, so the port needs no address reachable from the host, works with networking
// "none", and nothing of the sandbox is exposed on the host's interfaces: for runc the edge
// dials from the sandbox's network namespace; for gVisor (whose network stack lives in its
// sandbox process, not in the namespace), microvm and vm, the agent inside dials and carries the
// stream over its own connection (agentrpc Dial). The egress policy is about traffic leaving
// the sandbox and does not apply to this inbound path; the API's authorisation (sandbox.use on
// the sandbox's project) does.

// portDialTimeout bounds connecting to a port inside a sandbox.
const portDialTimeout = 5 * time.Second

// portDialFunc connects to a port on a sandbox's loopback.
type portDialFunc func(ctx context.Context, port int) (net.Conn, error)

// portDialer returns how to reach the ports of sandbox id (resuming a paused sandbox, as any
// data-plane call does).
func (e *Edge) portDialer(ctx context.Context, id string) (portDialFunc, error) {
	sb, err := e.active(ctx, id)
	if err != nil {
		return nil, err
	}
	rec, err := e.record(ctx, sb.id)
	if err != nil {
		return nil, err
	}
	return e.dialerFor(ctx, sb, rec)
}

// dialerFor returns how to reach the ports of sandbox sb, whose record is rec.
func (e *Edge) dialerFor(ctx context.Context, sb *sandbox, rec *store.Sandbox) (portDialFunc, error) {
	id := sb.id
	if rec.Tier == TierContainer && rec.Runtime != RuntimeGVisor {
		st, err := e.rt.Status(ctx, sb.id)
		if err != nil {
			return nil, err
		}
		if st.Pid <= 0 {
			return nil, errdefs.Conflict("sandbox %s has no running init to reach ports through", id)
		}
		ns := fmt.Sprintf("/proc/%d/ns/net", st.Pid)
		return func(ctx context.Context, port int) (net.Conn, error) { return dialInNetns(ctx, ns, id, port) }, nil
	}
	agent := sb.agent
	return func(ctx context.Context, port int) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, portDialTimeout+time.Second)
		defer cancel()
		conn, err := agent.Dial(ctx, port)
		if errors.Is(err, errdefs.ErrUnavailable) {
			return nil, errdefs.Unavailable("nothing answers on port %d in sandbox %s: %v", port, id, err)
		}
		return conn, err
	}, nil
}

// dialInNetns connects to port on the loopback of the network namespace at nsPath.
func dialInNetns(ctx context.Context, nsPath, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Invalid("port", "%d: want 1-65535", port)
	}
	var conn net.Conn
	err := nsutil.InNetns(nsPath, func() error {
		d := net.Dialer{Timeout: portDialTimeout}
		var err error
		conn, err = d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return errdefs.Unavailable("nothing answers on port %d in sandbox %s: %v", port, id, err)
		}
		return nil
	})
	return conn, err
}

// port proxies /v1/sandboxes/{id}/ports/{port}/{path...} to http://127.0.0.1:PORT/PATH inside
// the sandbox (WebSocket upgrades included).
func (h *dataPlane) port(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		h.fail(w, r, errdefs.Invalid("port", "%q: want 1-65535", r.PathValue("port")))
		return
	}
	// The sandbox is looked up once, before proxying, so that a bad ID is a clear error.
	dial, err := h.e.portDialer(r.Context(), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rest := "/" + r.PathValue("path")
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "127.0.0.1:"+strconv.Itoa(port)
			pr.Out.URL.Path, pr.Out.URL.RawPath = rest, ""
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del("Authorization") // the caller's Corral token stays outside
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx, port) },
			// One connection per request: the transport lives for this request only.
			DisableKeepAlives: true,
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errdefs.Code(err) == "internal" || errdefs.Code(err) == "" {
				err = errdefs.Unavailable("port %d of sandbox %s: %v", port, id, err)
			}
			h.fail(w, r, err)
		},
	}
	revproxy.Serve(proxy, w, r)
}
