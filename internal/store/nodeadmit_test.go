package store

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

// TestAdmitNodeSandbox: what a node's edge asks to admit (through the servers) is admitted only
// for the incarnation that holds the node, only as a record of that node being created, with
// limits a quota can count and volumes of the sandbox's own project; quotas and idempotency keys
// answer as for any admission; and an admission asked again after an answer that broke off is
// admitted once.
func TestAdmitNodeSandbox(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		team, other := mustProject(t, s, "team"), mustProject(t, s, "other")
		n1, err := s.Register(ctx, Node{Name: "test", URL: "https://127.0.0.1:1"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		usage := func(p *ProjectRecord) model.Usage { return projectUsage(t, s, p) }

		rec := newRecord(team.ID, 1)
		if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, rec, nil); err != nil {
			t.Fatalf("admit a sandbox of the node: %v", err)
		}
		// The same admission again (its answer broke off and the edge asked another replica):
		// admitted, counted once.
		again := *rec
		if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, &again, nil); err != nil {
			t.Errorf("the same admission asked again: %v", err)
		}
		if u := usage(team); u.Sandboxes != 1 || u.CPUs != 1 {
			t.Errorf("team's usage after one admission asked twice: %+v, want 1 sandbox, 1 CPU", u)
		}
		// A record another node has, or one that moved on: no admission takes its ID.
		running := newRecord(team.ID, 0)
		if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, running, nil); err != nil {
			t.Fatal(err)
		}
		running.State = model.StateRunning
		if err := s.PutNodeSandbox(ctx, "test", n1.Epoch, running); err != nil {
			t.Fatal(err)
		}
		running.State = model.StateCreating
		if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, running, nil); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("admit a record that runs already: %v, want a conflict", err)
		}

		// What the edge may not ask for.
		for name, bad := range map[string]func(*Sandbox){
			"another node's record": func(sb *Sandbox) { sb.Node = "other" },
			"a running record":      func(sb *Sandbox) { sb.State = model.StateRunning },
			"no tier":               func(sb *Sandbox) { sb.Tier = "" },
			"negative CPUs":         func(sb *Sandbox) { sb.Limits.CPUs = -4 },
			"NaN CPUs":              func(sb *Sandbox) { sb.Limits.CPUs = math.NaN() },
			"negative memory":       func(sb *Sandbox) { sb.Limits.MemoryBytes = -1 },
			"a volume without ID":   func(sb *Sandbox) { sb.Volumes = []model.VolumeMount{{Name: "v", Path: "/v"}} },
		} {
			sb := newRecord(team.ID, 1)
			bad(sb)
			if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, sb, nil); !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrDenied) {
				t.Errorf("%s: %v, want invalid or denied", name, err)
			}
			if _, err := s.GetSandbox(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("%s left a record: %v", name, err)
			}
		}
		// A volume of another project than the sandbox's.
		theirs := newVolume(other, "theirs", 16<<20)
		if err := s.CreateVolume(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, withVolumes(newRecord(team.ID, 0), theirs, false), nil); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("attach another project's volume: %v, want denied", err)
		}
		if vs, err := s.ListVolumes(ctx, "other", ""); err != nil || len(vs) != 1 || len(vs[0].AttachedTo) != 0 {
			t.Errorf("the other project's volume after the refusal: %+v, %v; want attached nowhere", vs, err)
		}

		// Quotas and keys answer as for any admission.
		if _, err := s.SetQuota(ctx, "team", model.Quota{Sandboxes: ptr[int64](3)}); err != nil {
			t.Fatal(err)
		}
		key := &Idempotency{Principal: "root", Key: "k1", RequestHash: "h1"}
		keyed := newRecord(team.ID, 0)
		if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, keyed, key); err != nil {
			t.Fatal(err)
		}
		var re *ReplayError
		if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, newRecord(team.ID, 0), key); !errors.As(err, &re) || re.SandboxID != keyed.ID {
			t.Errorf("a second create with the key: %v, want a replay of %s", err, keyed.ID)
		}
		if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, keyed, key); err != nil {
			t.Errorf("the keyed admission asked again: %v", err)
		}
		var qe *iam.QuotaError
		if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, newRecord(team.ID, 0), nil); !errors.As(err, &qe) || qe.Resource != "sandboxes" {
			t.Errorf("admission over the quota: %v, want a quota error on sandboxes", err)
		}
		if err := s.AdmitNodeSandboxes(ctx, "test", n1.Epoch, []*Sandbox{newRecord(other.ID, 0), newRecord(other.ID, 0)}); err != nil {
			t.Errorf("a fork's copies: %v", err)
		}

		// A new incarnation fences the old one off: nothing it asks for is admitted.
		n2, err := s.Register(ctx, Node{Name: "test", URL: "https://127.0.0.1:1"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		late := newRecord(other.ID, 0)
		if err := s.AdmitNodeSandbox(ctx, "test", n1.Epoch, late, nil); !errors.Is(err, ErrFenced) {
			t.Errorf("admission by a fenced incarnation: %v, want ErrFenced", err)
		}
		if err := s.AdmitNodeSandboxes(ctx, "test", n1.Epoch, []*Sandbox{newRecord(other.ID, 0)}); !errors.Is(err, ErrFenced) {
			t.Errorf("a fork's admission by a fenced incarnation: %v, want ErrFenced", err)
		}
		if err := s.AdmitNodeSandbox(ctx, "test", n2.Epoch, late, nil); err != nil {
			t.Errorf("admission by the current incarnation: %v", err)
		}
		if u := usage(other); u.Sandboxes != 3 {
			t.Errorf("other's usage: %d sandboxes, want 3 (two copies and one create)", u.Sandboxes)
		}
	})
}
