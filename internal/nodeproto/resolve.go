package nodeproto

import (
	"context"

	"github.com/corral-dev/corral/internal/catalog"
	corral "github.com/corral-dev/corral/sdk/go"
)

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
	Request corral.CreateRequest `json:"request"`
	Calls   bool                 `json:"calls,omitempty"`
	Voucher *Voucher             `json:"voucher,omitempty"`
}

// Catalog returns what resolves an edge's creates: the servers, over the node channel
// (edge.Catalog).
func (s *Servers) Catalog() Catalog { return Catalog{s} }

// Catalog asks the servers to resolve creates.
type Catalog struct{ s *Servers }

// Resolve resolves req (calls: an fncall pool's container) for the caller ctx carries
// (WithVoucher). A refusal of the request is the error the store's resolution gives (invalid,
// with its field).
func (c Catalog) Resolve(ctx context.Context, req corral.CreateRequest, calls bool) (*catalog.Resolution, error) {
	var res catalog.Resolution
	if err := c.s.call(ctx, PathResolve, ResolveRequest{Request: req, Calls: calls, Voucher: VoucherFrom(ctx)}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
