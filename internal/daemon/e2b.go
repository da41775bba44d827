package daemon

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/e2b"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/inprocess"
	"github.com/corral-dev/corral/internal/store"
)

// E2BConfig serves E2B's API (internal/e2b) beside Corral's own, on a listener of its own.
type E2BConfig struct {
	// Listen is the address of the E2B listener (empty: off).
	Listen string
	// Domain is what sandboxes' E2B views name as their domain (getHost(port) builds
	// "<port>-<id>.<domain>"); empty: the host the request came to.
	Domain string
}

// e2bKeyFile holds the secret the gateway derives sandboxes' envd access tokens from; it must
// survive restarts, or every token handed out stops working.
const e2bKeyFile = "e2b.key"

// startE2B starts the E2B gateway on its own listener, translating onto the API at apiAddr,
// whose handler api (when not nil) it calls in process. The returned server is shut down with
// the API's.
func startE2B(ctx context.Context, cfg Config, st *store.Store, apiAddr net.Addr, api http.Handler, log *slog.Logger, errc chan<- error) (stop func(), err error) {
	key, err := e2bKey(filepath.Join(cfg.DataDir, e2bKeyFile))
	if err != nil {
		return nil, err
	}
	service, err := e2bServiceToken(ctx, st, filepath.Join(cfg.DataDir, e2bServiceTokenFile), log)
	if err != nil {
		return nil, err
	}
	return ServeE2B(cfg.E2B, apiAddr, api, key, service, log, errc)
}

// ServeE2B serves the E2B gateway on e2bCfg.Listen in front of the Corral API at apiAddr (over
// loopback when that listens on every address), with the envd-token key and the service token
// given, until the returned stop is called. `corral up` and `corral server` both use it. With
// api, the API's handler in this process, the gateway calls it directly (internal/inprocess):
// no loopback connection, no HTTP encoding and parsing per call; only requests that upgrade
// their connection (a sandbox port's WebSocket) go to apiAddr.
func ServeE2B(e2bCfg E2BConfig, apiAddr net.Addr, api http.Handler, key []byte, service string, log *slog.Logger, errc chan<- error) (stop func(), err error) {
	tcp := apiAddr.(*net.TCPAddr)
	host := tcp.IP
	if host.IsUnspecified() {
		host = net.IPv4(127, 0, 0, 1)
	}
	var client *http.Client
	if api != nil {
		client = &http.Client{Transport: &inprocess.Transport{Handler: api, Fallback: http.DefaultTransport}}
	}
	gw, err := e2b.New(e2b.Config{
		CorralURL:    "http://" + net.JoinHostPort(host.String(), fmt.Sprint(tcp.Port)),
		HTTPClient:   client,
		Domain:       e2bCfg.Domain,
		TokenKey:     key,
		ServiceToken: service,
	}, log.With("api", "e2b"))
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", e2bCfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (E2B API): %w", e2bCfg.Listen, err)
	}
	srv := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("serve the E2B API: %w", err)
		}
	}()
	log.Info("E2B API is up", "listen", lis.Addr().String(), "domain", e2bCfg.Domain)
	return func() { srv.Close(); gw.Close() }, nil
}

// The gateway's own principal and the token it acts with on the in-sandbox surface (after a
// request proved itself with a sandbox's envd access token): it may read and use sandboxes
// anywhere, nothing else.
const (
	e2bPrincipal        = "corral-e2b"
	e2bServiceTokenFile = "e2b.service-token"
)

// e2bServiceToken returns the gateway's service token, minting it (and its principal, a
// service granted the user role on the root) the first time or when the saved one is no longer
// valid (revoked by an operator, or a new store).
func e2bServiceToken(ctx context.Context, st *store.Store, path string, log *slog.Logger) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if tok := strings.TrimSpace(string(b)); E2BServiceTokenValid(ctx, st, tok) {
			return tok, nil
		}
		log.Warn("the E2B gateway's service token is not valid in the store; minting a new one", "path", path)
	}
	secret, err := MintE2BServiceToken(ctx, st, log)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write the E2B gateway's service token: %w", err)
	}
	return secret, nil
}

// E2BServiceTokenValid reports whether tok is a live token of the gateway's principal.
func E2BServiceTokenValid(ctx context.Context, st *store.Store, tok string) bool {
	t, err := st.TokenByHash(ctx, apiserver.HashToken(tok))
	return err == nil && t.Principal == e2bPrincipal && t.RevokedAt.IsZero()
}

// MintE2BServiceToken mints a token for the gateway's principal (creating the principal, a
// service granted the user role on the root, the first time) that may read and use sandboxes
// and nothing else, and returns its secret.
func MintE2BServiceToken(ctx context.Context, st *store.Store, log *slog.Logger) (string, error) {
	secret, id := iam.NewToken()
	m := store.MintRequest{
		Token: store.TokenRecord{ID: id, Hash: apiserver.HashToken(secret), Principal: e2bPrincipal, ProjectID: store.RootProjectID,
			Perms: iam.SandboxRead | iam.SandboxUse, Role: iam.RoleUser},
		CreatedBy: store.RootPrincipal,
	}
	if _, err := st.GetPrincipal(ctx, e2bPrincipal); errors.Is(err, errdefs.ErrNotFound) {
		m.NewPrincipalKind, m.GrantRole = iam.KindService, iam.RoleUser
	} else if err != nil {
		return "", err
	}
	if err := st.MintToken(ctx, m); err != nil {
		return "", fmt.Errorf("mint the E2B gateway's service token: %w", err)
	}
	log.Info("minted the E2B gateway's service token", "principal", e2bPrincipal, "token", id)
	return secret, nil
}

// e2bKey reads the gateway's key, making one (32 random bytes, mode 0600) the first time.
func e2bKey(path string) ([]byte, error) {
	if b, err := os.ReadFile(path); err == nil {
		if len(b) < e2b.MinTokenKey {
			return nil, fmt.Errorf("%s holds %d bytes, fewer than %d: remove it to make a new one (E2B access tokens handed out stop working)", path, len(b), e2b.MinTokenKey)
		}
		return b, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read the E2B key: %w", err)
	}
	key := make([]byte, 32)
	rand.Read(key)
	if err := os.WriteFile(path, key, 0o600); err != nil {
		return nil, fmt.Errorf("write the E2B key: %w", err)
	}
	return key, nil
}
