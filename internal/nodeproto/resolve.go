package nodeproto

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/model"
)

// HeaderResolution carries, on a create a replica forwards to an edge, the replica's resolution
// of it (Forwarded, JSON in base64): the edge uses it instead of asking (PathResolve), which
// saves a create its round trip on the node channel. Only a replica sets it (a client's is
// stripped, Strip); a resolution over MaxForwardedResolution is not sent, and the edge asks.
const HeaderResolution = "Corral-Node-Resolution"

// MaxForwardedResolution bounds HeaderResolution's value.
const MaxForwardedResolution = 64 << 10

// Forwarded is a resolution a replica made of the create it forwards: For is the digest
// (RequestDigest) of the request it resolved, after the API filled in the project.
type Forwarded struct {
	For string `json:"for"`
	catalog.Resolution
}

// RequestDigest is a create request's digest: a forwarded resolution is used only for the
// request it was made of.
func RequestDigest(req model.CreateRequest) string {
	b, _ := json.Marshal(req)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// SetResolution sets h's HeaderResolution to res, the resolution of req; a resolution too large
// for a header is left out.
func SetResolution(h http.Header, req model.CreateRequest, res *catalog.Resolution) {
	b, err := json.Marshal(Forwarded{For: RequestDigest(req), Resolution: *res})
	if err != nil || base64.StdEncoding.EncodedLen(len(b)) > MaxForwardedResolution {
		return
	}
	h.Set(HeaderResolution, base64.StdEncoding.EncodeToString(b))
}

// ResolutionOf returns the resolution h carries, or nil (none, or not decodable: the edge then
// asks).
func ResolutionOf(h http.Header) *Forwarded {
	v := h.Get(HeaderResolution)
	if v == "" || len(v) > MaxForwardedResolution {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return nil
	}
	var f Forwarded
	if json.Unmarshal(b, &f) != nil || f.For == "" {
		return nil
	}
	return &f
}

type resolutionKey struct{}

// WithResolution returns ctx carrying f (nil: none), the resolution the replica forwarded with
// the request an edge serves.
func WithResolution(ctx context.Context, f *Forwarded) context.Context {
	if f == nil {
		return ctx
	}
	return context.WithValue(ctx, resolutionKey{}, f)
}

// ResolveRequest asks the servers to resolve what a create of the caller's node names in the
// catalogue (catalog.Resolver.Resolve): its project, environment, layers and volumes. The
// edge then checks what depends on the node (its tiers, labels, limits policy, network) and
// admits the record (PathAdmit).
//
// Voucher is the sealed caller of the request that makes the sandbox: the servers resolve
// only where it may create sandboxes. Without one, they resolve only what the edge starts on
// its own: the containers of an fncall environment's pool (Calls, in the project of an fncall
// environment), and the sandboxes of a warm environment's pool (naming that environment, in
// its project).
type ResolveRequest struct {
	Request model.CreateRequest `json:"request"`
	Calls   bool                `json:"calls,omitempty"`
	Voucher *Voucher            `json:"voucher,omitempty"`
}

// Catalog returns what resolves an edge's creates: the servers, over the node channel
// (edge.Catalog).
func (s *Servers) Catalog() Catalog { return Catalog{s} }

// Catalog asks the servers to resolve creates.
type Catalog struct{ s *Servers }

// Resolve resolves req (calls: an fncall pool's container) for the caller ctx carries
// (WithVoucher). A refusal of the request is the error the store's resolution gives (invalid,
// with its field).
//
// A create whose replica forwarded its resolution (WithResolution) takes that one, when it was
// made of this very request.
func (c Catalog) Resolve(ctx context.Context, req model.CreateRequest, calls bool) (*catalog.Resolution, error) {
	if f, _ := ctx.Value(resolutionKey{}).(*Forwarded); f != nil && !calls && f.For == RequestDigest(req) {
		res := f.Resolution
		return &res, nil
	}
	var res catalog.Resolution
	if err := c.s.call(ctx, PathResolve, ResolveRequest{Request: req, Calls: calls, Voucher: VoucherFrom(ctx)}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
