package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/nodeproto"
)

// Bounds of an audit entry an edge sends (the API's own entries are cut to the same).
const (
	maxAuditAction = 64
	maxAuditTarget = 256
	maxAuditDetail = 1024
	maxAuditResult = 32
	// auditSkew bounds how far an entry's time may be from the server's: an edge records an
	// entry when its request ends.
	auditSkew = 10 * time.Minute
)

// nodeAudit records the audit entry of a request an edge served, as its caller's: the
// principal and token are the sealed caller's, never what the edge says, so an edge's entries
// name only callers the servers sent it, and its store role needs no write at all.
func (s *Server) nodeAudit(ctx context.Context, node string, req *nodeproto.AuditRequest) (*struct{}, error) {
	if req.Voucher == nil {
		return nil, fmt.Errorf("an audit entry is recorded for the caller of the request it is of, and the edge sent none: %w", errdefs.ErrDenied)
	}
	c, err := s.sealer.Open(req.Voucher, node, time.Now())
	if err != nil {
		return nil, err
	}
	e := req.Entry
	switch {
	case e.Action == "" || len(e.Action) > maxAuditAction:
		return nil, errdefs.Invalid("entry.action", "1 to %d bytes", maxAuditAction)
	case e.Result == "" || len(e.Result) > maxAuditResult:
		return nil, errdefs.Invalid("entry.result", "1 to %d bytes", maxAuditResult)
	case len(e.Target) > maxAuditTarget:
		return nil, errdefs.Invalid("entry.target", "at most %d bytes", maxAuditTarget)
	case len(e.Detail) > maxAuditDetail:
		return nil, errdefs.Invalid("entry.detail", "at most %d bytes", maxAuditDetail)
	case e.At.Before(time.Now().Add(-auditSkew)) || e.At.After(time.Now().Add(auditSkew)):
		return nil, errdefs.Invalid("entry.at", "%s is more than %s from the server's clock", e.At, auditSkew)
	}
	// A refused request may name a project that does not exist: kept as text (store.AddAudit).
	if len(e.Project) > 1024 {
		return nil, errdefs.Invalid("entry.project", "at most 1024 bytes")
	}
	e.Principal, e.Token, e.At = c.Principal, c.TokenID, e.At.UTC()
	return nil, s.store.AddAudit(ctx, e, canonicalPath(c.ProjectPath))
}

// canonicalPath is a caller's token project as the store keeps paths (canonical).
func canonicalPath(p string) string {
	if canon, err := iam.ParsePath("project", p); err == nil {
		return canon
	}
	return p
}
