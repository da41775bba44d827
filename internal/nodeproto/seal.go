package nodeproto

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Vouchers. A server seals the caller it sends an edge (HeaderSeal: an HMAC-SHA256 of
// HeaderCaller's value under a key the servers share and the edges never see), naming the node
// it sends it to and until when it holds (VoucherTTLFor the request, at most the token's own
// expiry). When the
// request makes the edge admit sandboxes, the edge hands the sealed caller back with the
// admission (a Voucher), and the servers admit only in a project where that caller may create
// sandboxes. An edge, stolen or not, can therefore admit sandboxes only for callers the servers
// sent it, recently, and only where they may; what it starts on its own (an fncall
// environment's pool) is admitted only in the environment's project.

// HeaderSeal carries the servers' seal on the request's caller.
const HeaderSeal = "Corral-Node-Seal"

// VoucherTTL is how long the caller sealed for a request that starts long work on an edge
// holds: long enough for the slowest (a Dockerfile build's last step, hours after its request;
// a large image's upload, published at its end), short enough that one a stolen edge kept
// lapses. RequestVoucherTTL is every other request's: its work ends with it, and what the
// edge sends later in the caller's name (its audit entry) goes within seconds.
const (
	VoucherTTL        = 24 * time.Hour
	RequestVoucherTTL = time.Hour
)

// VoucherTTLFor returns how long the caller sealed for a request of method on path holds:
// VoucherTTL for a build (POST /v1/builds), a layer import (POST /v1/layers) and a snapshot
// (POST /v1/sandboxes/{id}/snapshot, published once a large disk is copied),
// RequestVoucherTTL for any other. A stolen edge thus acts for the callers of its last hour,
// and of its builds, imports and snapshots.
func VoucherTTLFor(method, path string) time.Duration {
	if method != http.MethodPost {
		return RequestVoucherTTL
	}
	if path == "/v1/builds" || path == "/v1/layers" ||
		(strings.HasPrefix(path, "/v1/sandboxes/") && strings.HasSuffix(path, "/snapshot") && strings.Count(path, "/") == 4) {
		return VoucherTTL
	}
	return RequestVoucherTTL
}

// minSealKey is the shortest key a Sealer takes.
const minSealKey = 32

// Sealer seals and opens callers with the servers' shared key.
type Sealer struct{ key []byte }

// NewSealer returns a Sealer with key (at least 32 bytes).
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) < minSealKey {
		return nil, fmt.Errorf("a seal key of %d bytes: at least %d", len(key), minSealKey)
	}
	return &Sealer{key: key}, nil
}

func (s *Sealer) seal(enc string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(enc))
	return hex.EncodeToString(m.Sum(nil))
}

// Voucher is a caller as a server sealed it for an edge: HeaderCaller's value and its seal.
type Voucher struct {
	Caller string `json:"caller"`
	Seal   string `json:"seal"`
}

// SetSealedCaller is SetCaller for a request to node's edge, with c sealed by s (nil: unsealed)
// and holding until ttl from now (VoucherTTLFor the request), or c's token's expiry if sooner.
func SetSealedCaller(h http.Header, c *Caller, node string, s *Sealer, ttl time.Duration) error {
	if s != nil {
		c.Node, c.Until = node, time.Now().Add(ttl).UTC()
		if !c.ExpiresAt.IsZero() && c.ExpiresAt.Before(c.Until) {
			c.Until = c.ExpiresAt
		}
	}
	if err := SetCaller(h, c); err != nil {
		return err
	}
	if s != nil {
		h.Set(HeaderSeal, s.seal(h.Get(HeaderCaller)))
	}
	return nil
}

// VoucherOf returns the sealed caller h carries, or nil when it carries none.
func VoucherOf(h http.Header) *Voucher {
	enc, seal := h.Get(HeaderCaller), h.Get(HeaderSeal)
	if enc == "" || seal == "" {
		return nil
	}
	return &Voucher{Caller: enc, Seal: seal}
}

// Open returns the caller v vouches for to node's edge at now: ErrDenied unless s sealed it for
// node and it still holds.
func (s *Sealer) Open(v *Voucher, node string, now time.Time) (*Caller, error) {
	switch {
	case v == nil:
		return nil, fmt.Errorf("no caller the servers vouched for: %w", errdefs.ErrDenied)
	case len(v.Caller) > maxCaller:
		return nil, fmt.Errorf("a vouched caller of %d bytes, over the %d allowed: %w", len(v.Caller), maxCaller, errdefs.ErrDenied)
	case !hmac.Equal([]byte(s.seal(v.Caller)), []byte(v.Seal)):
		return nil, fmt.Errorf("the caller's seal is not the servers': %w", errdefs.ErrDenied)
	}
	b, err := base64.RawURLEncoding.DecodeString(v.Caller)
	if err != nil {
		return nil, fmt.Errorf("a sealed caller that is not base64url: %v: %w", err, errdefs.ErrDenied)
	}
	var c Caller
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("a sealed caller that is not one: %v: %w", err, errdefs.ErrDenied)
	}
	switch {
	case c.Node != node:
		return nil, fmt.Errorf("the caller was sealed for node %q, not %s: %w", c.Node, node, errdefs.ErrDenied)
	case !now.Before(c.Until):
		return nil, fmt.Errorf("the caller's seal lapsed at %s: %w", c.Until.Format(time.RFC3339), errdefs.ErrDenied)
	}
	return &c, nil
}

type voucherKey struct{}

// WithVoucher returns ctx carrying v (nil: none), the caller of the request an edge serves,
// which an admission it makes hands back to the servers.
func WithVoucher(ctx context.Context, v *Voucher) context.Context {
	if v == nil {
		return ctx
	}
	return context.WithValue(ctx, voucherKey{}, v)
}

// VoucherFrom returns the voucher ctx carries, or nil.
func VoucherFrom(ctx context.Context) *Voucher {
	v, _ := ctx.Value(voucherKey{}).(*Voucher)
	return v
}
