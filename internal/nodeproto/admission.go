package nodeproto

import (
	"context"
	"fmt"

	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// AdmitRequest admits new sandboxes of the caller's node, records in state creating: one
// (store.AdmitNodeSandbox, with its create's idempotency key when it has one) or the copies of
// a fork, all or none (store.AdmitNodeSandboxes: at most corral.MaxForkCount, no key). The
// servers check the epoch, the quotas of the sandboxes' project and its ancestors, the creation
// rate and the volumes in one transaction. Asked again after an answer that broke off, the
// same admission is answered as admitted.
//
// Voucher is the sealed caller of the request that made the edge admit them (seal.go): the
// servers admit only where it may create sandboxes. Without one, only the containers of an
// fncall environment's pool (tier fncall, in the environment's project) are admitted.
type AdmitRequest struct {
	Epoch     int64              `json:"epoch"`
	Sandboxes []*store.Sandbox   `json:"sandboxes"`
	Key       *store.Idempotency `json:"key,omitempty"`
	Voucher   *Voucher           `json:"voucher,omitempty"`
}

// AdmitResponse is how an admission ended, when not with an error: admitted (both fields
// empty), refused by a quota (Quota: the limit, as *iam.QuotaError says it), or a replay of an
// earlier create with the same idempotency key (ReplayOf: the sandbox that one made).
//
// Replay is the record of the sandbox a replay names when it is another node's (whose record
// the edge does not hold), answered only for a caller the servers sealed for the node whose
// principal the key is of.
type AdmitResponse struct {
	Quota    *iam.QuotaExceeded `json:"quota,omitempty"`
	ReplayOf string             `json:"replay_of,omitempty"`
	Replay   *store.Sandbox     `json:"replay,omitempty"`
}

// IdempotencyRequest asks whether a create's key made a sandbox already (PathIdempotency), or
// forgets the key if it still names Sandbox, one of the caller's whose create never answered
// (PathReleaseKey).
// Voucher, the sealed caller of the create, lets the answer carry the record of another
// node's sandbox (IdempotencyResponse.Replay).
type IdempotencyRequest struct {
	Key     *store.Idempotency `json:"key"`
	Sandbox string             `json:"sandbox,omitempty"`
	Voucher *Voucher           `json:"voucher,omitempty"`
}

// IdempotencyResponse answers PathIdempotency: the sandbox an earlier create with the key made,
// or empty when the key is new; and its record when it is another node's (as in
// AdmitResponse).
type IdempotencyResponse struct {
	ReplayOf string         `json:"replay_of,omitempty"`
	Replay   *store.Sandbox `json:"replay,omitempty"`
}

// Admissions returns what admits incarnation epoch's new sandboxes: the servers, over the node
// channel. Its methods are the store's (AdmitSandbox, AdmitSandboxes, CheckIdempotency,
// ReleaseIdempotency), so the edge uses either.
func (s *Servers) Admissions(epoch int64) Admissions { return Admissions{s, epoch} }

// Admissions sends an incarnation's admissions to the servers.
type Admissions struct {
	s     *Servers
	epoch int64
}

// AdmitSandbox admits sb (state creating) with key (nil: none), for the caller ctx carries
// (WithVoucher): a *iam.QuotaError when a quota refuses it, a *store.ReplayError when key made
// a sandbox already.
func (a Admissions) AdmitSandbox(ctx context.Context, sb *store.Sandbox, key *store.Idempotency) error {
	return a.admit(ctx, AdmitRequest{Epoch: a.epoch, Sandboxes: []*store.Sandbox{sb}, Key: key, Voucher: VoucherFrom(ctx)}, sb.ID)
}

// AdmitSandboxes admits the copies of a fork, all or none.
func (a Admissions) AdmitSandboxes(ctx context.Context, sbs []*store.Sandbox) error {
	if len(sbs) == 0 {
		return nil
	}
	if len(sbs) > model.MaxForkCount {
		return fmt.Errorf("admit %d sandboxes: at most %d at once", len(sbs), model.MaxForkCount)
	}
	return a.admit(ctx, AdmitRequest{Epoch: a.epoch, Sandboxes: sbs, Voucher: VoucherFrom(ctx)}, fmt.Sprintf("%s and %d more", sbs[0].ID, len(sbs)-1))
}

// admit runs to its end even when ctx ends (each try bounded by the channel's own timeout), as
// the store's admission does: a server commits what it was asked whatever becomes of the
// edge's request, and an edge that gave up on the answer would leave a record being created
// that nobody makes. The edge fails at its next step instead, and records the failure.
func (a Admissions) admit(ctx context.Context, req AdmitRequest, what string) error {
	ctx = context.WithoutCancel(ctx)
	var ans AdmitResponse
	if err := a.s.call(ctx, PathAdmit, req, &ans); err != nil {
		return fmt.Errorf("admit sandbox %s through the servers: %w", what, err)
	}
	switch {
	case ans.Quota != nil:
		return &iam.QuotaError{QuotaExceeded: *ans.Quota}
	case ans.ReplayOf != "":
		return &store.ReplayError{SandboxID: ans.ReplayOf, Record: ans.Replay}
	}
	return nil
}

// CheckIdempotency answers a create before any work, as the store's does: a *store.ReplayError
// when key made a sandbox already, a conflict when it came with another request, nil when it
// is new.
func (a Admissions) CheckIdempotency(ctx context.Context, key *store.Idempotency) error {
	var ans IdempotencyResponse
	if err := a.s.call(ctx, PathIdempotency, IdempotencyRequest{Key: key, Voucher: VoucherFrom(ctx)}, &ans); err != nil {
		return fmt.Errorf("look idempotency key %q up through the servers: %w", key.Key, err)
	}
	if ans.ReplayOf != "" {
		return &store.ReplayError{SandboxID: ans.ReplayOf, Record: ans.Replay}
	}
	return nil
}

// ReleaseIdempotency forgets key if it still names sandboxID, one of the node's sandboxes.
func (a Admissions) ReleaseIdempotency(ctx context.Context, key *store.Idempotency, sandboxID string) error {
	if err := a.s.call(ctx, PathReleaseKey, IdempotencyRequest{Key: key, Sandbox: sandboxID}, nil); err != nil {
		return fmt.Errorf("release the idempotency key of %s through the servers: %w", sandboxID, err)
	}
	return nil
}
