package store

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

func newVolume(p *ProjectRecord, name string, size int64) *VolumeRecord {
	return &VolumeRecord{
		Volume: model.Volume{Name: name, Project: iam.Display(p.Path), SizeBytes: size, Node: "test", CreatedAt: time.Now().UTC()},
		ID:     NewVolumeID(), ProjectID: p.ID, State: VolumeReady,
	}
}

func withVolumes(sb *Sandbox, vols ...any) *Sandbox {
	for i := 0; i < len(vols); i += 2 {
		v := vols[i].(*VolumeRecord)
		sb.Volumes = append(sb.Volumes, model.VolumeMount{Name: v.Name, Path: "/data", ReadOnly: vols[i+1].(bool)})
		sb.VolumeIDs = append(sb.VolumeIDs, v.ID)
	}
	return sb
}

// TestVolumes is the volumes' conformance: names, the disk quota, the attachment rule, and
// that an attachment ends with its sandbox and blocks the volume's deletion while it lasts.
func TestVolumes(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		p := mustProject(t, s, "p")
		if _, err := s.SetQuota(ctx, "p", model.Quota{DiskBytes: ptr[int64](100 << 20)}); err != nil {
			t.Fatal(err)
		}
		v := newVolume(p, "data", 40<<20)
		if err := s.CreateVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateVolume(ctx, newVolume(p, "data", 1<<20)); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("a taken name: %v, want a conflict", err)
		}
		var qe *iam.QuotaError
		if err := s.CreateVolume(ctx, newVolume(p, "big", 70<<20)); !errors.As(err, &qe) || qe.Resource != "disk_bytes" || qe.Project != "p" {
			t.Fatalf("over the disk quota: %v", err)
		}
		if vs, err := s.ListVolumes(ctx, "p", ""); err != nil || len(vs) != 1 {
			t.Fatalf("a refused volume was recorded: %v, %v", vs, err)
		}
		if q, err := s.GetQuota(ctx, "p"); err != nil || q.Usage.DiskBytes != 40<<20 {
			t.Fatalf("usage %+v, %v; want the volume's 40 MiB", q, err)
		}
		// The volume's bytes count against sandboxes too.
		sb := newRecord(p.ID, 0)
		sb.Limits.DiskBytes = 70 << 20
		if err := s.AdmitSandbox(ctx, sb, nil); !errors.As(err, &qe) || qe.Resource != "disk_bytes" {
			t.Fatalf("a sandbox over the disk left by the volume: %v", err)
		}

		// One writer, or many readers.
		w := withVolumes(newRecord(p.ID, 0), v, false)
		if err := s.AdmitSandbox(ctx, w, nil); err != nil {
			t.Fatal(err)
		}
		w2 := withVolumes(newRecord(p.ID, 0), v, false)
		if err := s.AdmitSandbox(ctx, w2, nil); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("a second writer: %v, want a conflict", err)
		}
		if _, err := s.GetSandbox(ctx, w2.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("the refused sandbox was recorded: %v", err)
		}
		if err := s.AdmitSandbox(ctx, withVolumes(newRecord(p.ID, 0), v, true), nil); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("a reader beside the writer: %v, want a conflict", err)
		}
		if _, err := s.DeleteVolume(ctx, v.ID); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("delete an attached volume: %v, want a conflict", err)
		}
		got, err := s.GetVolume(ctx, p.ID, "data")
		if err != nil || len(got.AttachedTo) != 1 || got.AttachedTo[0].Sandbox != w.ID || got.AttachedTo[0].ReadOnly {
			t.Fatalf("GetVolume = %+v, %v", got, err)
		}
		// A paused sandbox keeps it; a stopped one lets it go.
		w.State = model.StatePaused
		if err := s.PutSandbox(ctx, w); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetVolume(ctx, p.ID, "data"); len(got.AttachedTo) != 1 {
			t.Fatalf("a paused sandbox lost its attachment: %+v", got)
		}
		w.State = model.StateStopped
		if err := s.PutSandbox(ctx, w); err != nil {
			t.Fatal(err)
		}
		readers := []*Sandbox{withVolumes(newRecord(p.ID, 0), v, true), withVolumes(newRecord(p.ID, 0), v, true)}
		for _, r := range readers {
			if err := s.AdmitSandbox(ctx, r, nil); err != nil {
				t.Fatalf("a reader: %v", err)
			}
		}
		if err := s.AdmitSandbox(ctx, withVolumes(newRecord(p.ID, 0), v, false), nil); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("a writer beside readers: %v, want a conflict", err)
		}
		for _, r := range readers {
			r.State = model.StateFailed
			if err := s.PutSandbox(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.DeleteProject(ctx, "p"); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("delete a project that owns a volume: %v, want a conflict", err)
		}
		if err := s.RecountUsage(ctx); err != nil {
			t.Fatal(err)
		}
		if q, err := s.GetQuota(ctx, "p"); err != nil || q.Usage.DiskBytes != 40<<20 {
			t.Fatalf("usage after a recount %+v, %v; want the volume's 40 MiB", q, err)
		}
		if _, err := s.DeleteVolume(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
		if q, err := s.GetQuota(ctx, "p"); err != nil || q.Usage.DiskBytes != 0 {
			t.Fatalf("usage after delete %+v, %v", q, err)
		}
		if err := s.AdmitSandbox(ctx, withVolumes(newRecord(p.ID, 0), v, true), nil); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("attach a deleted volume: %v, want a conflict", err)
		}
		if err := s.DeleteProject(ctx, "p"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestVolumeWritersRace: of many concurrent read-write attachments of one volume, exactly one
// is admitted.
func TestVolumeWritersRace(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		p := mustProject(t, s, "p")
		v := newVolume(p, "data", 1<<20)
		if err := s.CreateVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
		var ok, conflict atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 32 {
			wg.Go(func() {
				<-start
				err := s.AdmitSandbox(ctx, withVolumes(newRecord(p.ID, 0), v, false), nil)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, errdefs.ErrConflict):
					conflict.Add(1)
				default:
					t.Errorf("admit: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		if ok.Load() != 1 || conflict.Load() != 31 {
			t.Fatalf("admitted %d writers, refused %d; want 1 and 31", ok.Load(), conflict.Load())
		}
	})
}

// TestVolumeVersions: only the sandbox holding a volume's read-write attachment moves its
// version on, one step from the current one; a writer whose attachment was released (its node
// declared lost) is fenced off. The nodes caching the current version are found by name.
func TestVolumeVersions(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		p := mustProject(t, s, "p")
		v := newVolume(p, "data", 16<<20)
		if err := s.CreateVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
		r := withVolumes(newRecord(p.ID, 0), v, true)
		if err := s.AdmitSandbox(ctx, r, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.CommitVolumeVersion(ctx, v.ID, r.ID, "n1", 1, "d1"); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("a reader committed a version: %v, want a conflict", err)
		}
		r.State = model.StateStopped
		if err := s.PutSandbox(ctx, r); err != nil {
			t.Fatal(err)
		}
		w := withVolumes(newRecord(p.ID, 0), v, false)
		if err := s.AdmitSandbox(ctx, w, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.CommitVolumeVersion(ctx, v.ID, w.ID, "n1", 2, "d2"); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("a version skipped: %v, want a conflict", err)
		}
		if err := s.CommitVolumeVersion(ctx, v.ID, w.ID, "n1", 1, "d1"); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetVolumeByID(ctx, v.ID); err != nil || got.Version != 1 || got.Digest != "d1" {
			t.Fatalf("volume %+v, %v; want version 1, d1", got, err)
		}
		if err := s.SetVolumeCopy(ctx, v.ID, "n2", 0); err != nil {
			t.Fatal(err)
		}
		if nodes, err := s.VolumeCopyNodes(ctx, "p", []string{"data", "other"}); err != nil || len(nodes) != 1 || nodes[0] != "n1" {
			t.Fatalf("nodes caching the current version: %v, %v; want n1 (n2's copy is old)", nodes, err)
		}
		w.State = model.StateFailed
		if err := s.PutSandbox(ctx, w); err != nil {
			t.Fatal(err)
		}
		if err := s.CommitVolumeVersion(ctx, v.ID, w.ID, "n1", 2, "d2"); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("a writer whose attachment was released committed: %v, want a conflict", err)
		}
		if _, err := s.DeleteVolume(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
		if nodes, err := s.VolumeCopyNodes(ctx, "p", []string{"data"}); err != nil || len(nodes) != 0 {
			t.Fatalf("a deleted volume's copies: %v, %v", nodes, err)
		}
	})
}

// TestNodeVolumes: what a cluster's edge does with its sandboxes' volumes through the node
// channel acts only for a sandbox of its node that has the volume attached (read-write for a
// commit), and a fenced incarnation records nothing.
func TestNodeVolumes(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		p := mustProject(t, s, "p")
		for _, n := range []string{"test", "other"} {
			if _, err := s.Register(ctx, Node{Name: n, URL: "https://127.0.0.1:1"}, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		v, ro := newVolume(p, "data", 16<<20), newVolume(p, "shared", 16<<20)
		for _, vol := range []*VolumeRecord{v, ro} {
			if err := s.CreateVolume(ctx, vol); err != nil {
				t.Fatal(err)
			}
		}
		reader := withVolumes(newRecord(p.ID, 0), ro, true)
		writer := withVolumes(newRecord(p.ID, 0), v, false)
		for _, r := range []*Sandbox{reader, writer} {
			if err := s.AdmitSandbox(ctx, r, nil); err != nil {
				t.Fatal(err)
			}
		}
		digest := strings.Repeat("ab", 32)

		if got, err := s.NodeVolume(ctx, "test", reader.ID, ro.ID); err != nil || got.Version != 0 || got.SizeBytes != ro.SizeBytes {
			t.Fatalf("a reader's volume: %+v, %v", got, err)
		}
		if _, err := s.NodeVolume(ctx, "other", reader.ID, ro.ID); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("another node's sandbox's volume: %v, want denied", err)
		}
		if _, err := s.NodeVolume(ctx, "test", reader.ID, v.ID); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("a volume the sandbox has not attached: %v, want a conflict", err)
		}
		if err := s.CommitNodeVolume(ctx, "test", 1, reader.ID, ro.ID, 1, digest); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("a reader's commit: %v, want a conflict", err)
		}
		if err := s.CommitNodeVolume(ctx, "other", 1, writer.ID, v.ID, 1, digest); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("a commit for another node's writer: %v, want denied", err)
		}
		if err := s.CommitNodeVolume(ctx, "test", 2, writer.ID, v.ID, 1, digest); !errors.Is(err, ErrFenced) {
			t.Errorf("a commit of a fenced incarnation: %v, want ErrFenced", err)
		}
		if err := s.CommitNodeVolume(ctx, "test", 1, writer.ID, v.ID, 1, digest); err != nil {
			t.Fatal(err)
		}
		if got, err := s.NodeVolume(ctx, "test", writer.ID, v.ID); err != nil || got.Version != 1 || got.Digest != digest || len(got.AttachedTo) != 0 {
			t.Fatalf("after the commit: %+v, %v; want version 1, its digest, no attachments", got, err)
		}
		if err := s.SetNodeVolumeCopy(ctx, "test", 2, writer.ID, v.ID, 1); !errors.Is(err, ErrFenced) {
			t.Errorf("a copy recorded by a fenced incarnation: %v, want ErrFenced", err)
		}
		if err := s.SetNodeVolumeCopy(ctx, "other", 1, writer.ID, v.ID, 1); !errors.Is(err, errdefs.ErrDenied) {
			t.Errorf("a copy recorded for another node's sandbox: %v, want denied", err)
		}
		if err := s.SetNodeVolumeCopy(ctx, "test", 1, reader.ID, ro.ID, 0); err != nil {
			t.Fatal(err)
		}
		if nodes, err := s.VolumeCopyNodes(ctx, "p", []string{"data", "shared"}); err != nil || len(nodes) != 1 || nodes[0] != "test" {
			t.Fatalf("nodes caching the current version: %v, %v", nodes, err)
		}

		got, err := s.VolumeVersions(ctx, []string{v.ID, ro.ID, "vol-gone"})
		if err != nil || len(got) != 2 || got[v.ID] != 1 || got[ro.ID] != 0 {
			t.Fatalf("volume versions: %v, %v; want data at 1, shared at 0, nothing for a deleted one", got, err)
		}
		if _, err := s.VolumeVersions(ctx, make([]string, MaxVolumeVersions+1)); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%d IDs at once: %v, want invalid", MaxVolumeVersions+1, err)
		}
	})
}
