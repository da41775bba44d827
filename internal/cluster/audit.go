package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/apiserver"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
)

// Bounds of an audit entry an edge sends (the API's own free text is cut to the same:
// apiserver.MaxAuditDetail, MaxAuditTarget).
const (
	maxAuditAction = 64
	maxAuditResult = 32
	// auditPast and auditFuture bound an entry's time against the server's clock: an edge
	// sends an entry when its request ends, or after an outage of the replicas.
	auditPast   = time.Hour
	auditFuture = time.Minute
)

// nodeAudit records the audit entries of requests an edge served, each as its caller's: the
// principal and token are the sealed caller's, never what the edge says, and an entry names a
// project the caller holds something in (or is filed under its token's project), so an edge's
// entries speak only for callers the servers sent it, where they act, and its store role needs
// no write at all. An entry without such a caller, or out of bounds, is left out, logged and
// counted in the answer; the others are written in one transaction, so the edge may send a
// batch again when the store fails.
func (s *Server) nodeAudit(ctx context.Context, node string, req *nodeproto.AuditRequest) (*nodeproto.AuditResponse, error) {
	if n := len(req.Entries); n == 0 || n > nodeproto.MaxAuditBatch {
		return nil, errdefs.Invalid("entries", "%d entries: a batch is of 1 to %d", n, nodeproto.MaxAuditBatch)
	}
	ans := &nodeproto.AuditResponse{}
	writes := make([]store.AuditWrite, 0, len(req.Entries))
	for i, it := range req.Entries {
		w, err := s.auditEntry(node, it)
		if err != nil {
			s.log.Warn("audit entry of an edge refused", "node", node, "entry", i, "action", it.Entry.Action, "err", err)
			ans.Refused++
			continue
		}
		writes = append(writes, w)
	}
	if len(writes) > 0 {
		if err := s.store.AddAudits(ctx, writes); err != nil {
			// Nothing of the batch was written: the edge sends it again.
			return nil, errdefs.Unavailable("write %d audit entries: %v", len(writes), err)
		}
	}
	return ans, nil
}

// auditEntry checks an entry an edge sends and returns it as its sealed caller's, with the
// caller's token's project as the fallback.
func (s *Server) auditEntry(node string, it nodeproto.AuditItem) (store.AuditWrite, error) {
	e := it.Entry
	if it.Voucher == nil {
		return store.AuditWrite{}, fmt.Errorf("an audit entry is recorded for the caller of the request it is of, and the edge sent none: %w", errdefs.ErrDenied)
	}
	c, err := s.sealer.Open(it.Voucher, node, time.Now())
	if err != nil {
		return store.AuditWrite{}, err
	}
	now := time.Now()
	switch {
	case e.Action == "" || len(e.Action) > maxAuditAction:
		return store.AuditWrite{}, errdefs.Invalid("entry.action", "1 to %d bytes", maxAuditAction)
	case e.Result == "" || len(e.Result) > maxAuditResult:
		return store.AuditWrite{}, errdefs.Invalid("entry.result", "1 to %d bytes", maxAuditResult)
	case e.At.Before(now.Add(-auditPast)) || e.At.After(now.Add(auditFuture)):
		return store.AuditWrite{}, errdefs.Invalid("entry.at", "%s: want within %s before and %s after the server's clock", e.At, auditPast, auditFuture)
	}
	fallback, err := iam.ParsePath("project", c.ProjectPath)
	if err != nil {
		return store.AuditWrite{}, err
	}
	// A refused request may name a project that does not exist (kept as text), but only one
	// the caller holds something above or in; any other entry goes to the caller's own.
	if p, err := iam.ParsePath("entry.project", e.Project); err != nil || !holdsAt(c, p) {
		e.Project = fallback
	}
	e.Detail, e.Target = apiserver.CutAudit(e.Detail, apiserver.MaxAuditDetail), apiserver.CutAudit(e.Target, apiserver.MaxAuditTarget)
	e.Principal, e.Token, e.At = c.Principal, c.TokenID, e.At.UTC()
	return store.AuditWrite{Entry: e, Fallback: fallback}, nil
}

// holdsAt reports whether c holds a permission at project p (canonical) or above it.
func holdsAt(c *nodeproto.Caller, p string) bool {
	for scope, perms := range c.Held {
		if perms != 0 && iam.Within(p, scope) {
			return true
		}
	}
	return false
}
