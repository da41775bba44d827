package nodeproto

import (
	"context"
	"fmt"

	corral "github.com/corral-dev/corral/sdk/go"
)

// AuditRequest records the audit entry of a request an edge served (PathAudit), for Voucher,
// the request's caller as the servers sealed it for the node: the servers write the entry with
// that caller's principal and token, whatever Entry says, and its token's project as the
// fallback (store.AddAudit).
type AuditRequest struct {
	Entry   corral.AuditEntry `json:"entry"`
	Voucher *Voucher          `json:"voucher,omitempty"`
}

// Auditor returns what records an edge's audit entries: the servers, over the node channel
// (apiserver.Auditor).
func (s *Servers) Auditor() Auditor { return Auditor{s} }

// Auditor sends an edge's audit entries to the servers, each for the caller ctx carries
// (WithVoucher).
type Auditor struct{ s *Servers }

// AddAudit records e; fallback is the servers' to know (the sealed caller's token's project).
func (a Auditor) AddAudit(ctx context.Context, e corral.AuditEntry, _ string) error {
	if err := a.s.call(ctx, PathAudit, AuditRequest{Entry: e, Voucher: VoucherFrom(ctx)}, nil); err != nil {
		return fmt.Errorf("record the audit entry %s through the servers: %w", e.Action, err)
	}
	return nil
}
