package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/nodeproto"
	corral "github.com/corral-dev/corral/sdk/go"
)

// Bounds of an audit entry an edge sends (the API's own entries are cut to the same).
const (
	maxAuditAction = 64
	maxAuditTarget = 256
	maxAuditDetail = 1024
	maxAuditResult = 32
	// auditPast and auditFuture bound an entry's time against the server's clock: an edge
	// sends an entry when its request ends, or after an outage of the replicas.
	auditPast   = time.Hour
	auditFuture = time.Minute
)

// nodeAudit records the audit entries of requests an edge served, each as its caller's: the
// principal and token are the sealed caller's, never what the edge says, so an edge's entries
// name only callers the servers sent it, and its store role needs no write at all. An entry
// without such a caller, or out of bounds, is left out, logged and counted in the answer.
func (s *Server) nodeAudit(ctx context.Context, node string, req *nodeproto.AuditRequest) (*nodeproto.AuditResponse, error) {
	if n := len(req.Entries); n == 0 || n > nodeproto.MaxAuditBatch {
		return nil, errdefs.Invalid("entries", "%d entries: a batch is of 1 to %d", n, nodeproto.MaxAuditBatch)
	}
	ans := &nodeproto.AuditResponse{}
	for i, it := range req.Entries {
		e, fallback, err := s.auditEntry(node, it)
		if err == nil {
			err = s.store.AddAudit(ctx, e, fallback)
		}
		switch {
		case errors.Is(err, errdefs.ErrDenied) || errors.Is(err, errdefs.ErrInvalid):
			s.log.Warn("audit entry of an edge refused", "node", node, "entry", i, "action", it.Entry.Action, "err", err)
			ans.Refused++
		case err != nil:
			return nil, err // the store: the edge sends the batch again
		}
	}
	return ans, nil
}

// auditEntry checks an entry an edge sends and returns it as its sealed caller's, with the
// caller's token's project as the fallback.
func (s *Server) auditEntry(node string, it nodeproto.AuditItem) (corral.AuditEntry, string, error) {
	e := it.Entry
	if it.Voucher == nil {
		return e, "", fmt.Errorf("an audit entry is recorded for the caller of the request it is of, and the edge sent none: %w", errdefs.ErrDenied)
	}
	c, err := s.sealer.Open(it.Voucher, node, time.Now())
	if err != nil {
		return e, "", err
	}
	now := time.Now()
	switch {
	case e.Action == "" || len(e.Action) > maxAuditAction:
		return e, "", errdefs.Invalid("entry.action", "1 to %d bytes", maxAuditAction)
	case e.Result == "" || len(e.Result) > maxAuditResult:
		return e, "", errdefs.Invalid("entry.result", "1 to %d bytes", maxAuditResult)
	case len(e.Target) > maxAuditTarget:
		return e, "", errdefs.Invalid("entry.target", "at most %d bytes", maxAuditTarget)
	case len(e.Detail) > maxAuditDetail:
		return e, "", errdefs.Invalid("entry.detail", "at most %d bytes", maxAuditDetail)
	case len(e.Project) > 1024: // a refused request's may name no project: kept as text
		return e, "", errdefs.Invalid("entry.project", "at most 1024 bytes")
	case e.At.Before(now.Add(-auditPast)) || e.At.After(now.Add(auditFuture)):
		return e, "", errdefs.Invalid("entry.at", "%s: want within %s before and %s after the server's clock", e.At, auditPast, auditFuture)
	}
	e.Principal, e.Token, e.At = c.Principal, c.TokenID, e.At.UTC()
	return e, canonicalPath(c.ProjectPath), nil
}

// canonicalPath is a caller's token project as the store keeps paths (canonical).
func canonicalPath(p string) string {
	if canon, err := iam.ParsePath("project", p); err == nil {
		return canon
	}
	return p
}
