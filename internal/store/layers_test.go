package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

// TestLayerVisibility: a layer's private and public settings are stored in columns (not in its
// document), survive reads through versions, tags and lists, and change only through
// SetLayerPublic; a layer cannot be both.
func TestLayerVisibility(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		mustProject(t, s, "a")
		base := model.Layer{Name: "snap", Version: "1", Kind: model.KindSnapshot, Digest: "sha256:aa", Project: "a", CreatedAt: time.Now()}
		got, created, err := s.PublishLayer(ctx, base)
		if err != nil || !created || got.Public || got.Private || got.Project != "a" {
			t.Fatalf("publish: %+v created=%v err=%v; want a new layer of a, neither public nor private", got, created, err)
		}
		both := base
		both.Version, both.Private, both.Public = "2", true, true
		if _, _, err := s.PublishLayer(ctx, both); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("private and public: %v, want invalid", err)
		}
		if _, err := s.GetLayer(ctx, "snap", "2"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("a refused publish left a layer: %v", err)
		}
		pub := base
		pub.Version, pub.Public = "3", true
		if got, _, err := s.PublishLayer(ctx, pub); err != nil || !got.Public {
			t.Fatalf("publish public: %+v, %v", got, err)
		}
		// Publishing the same content again answers with the stored visibility, not the request's.
		if got, created, err := s.PublishLayer(ctx, base); err != nil || created || got.Public {
			t.Fatalf("republish: %+v created=%v err=%v", got, created, err)
		}
		if got, created, err := s.PublishLayer(ctx, model.Layer{Name: "snap", Version: "3", Kind: model.KindSnapshot, Digest: "sha256:aa", Project: "a"}); err != nil || created || !got.Public {
			t.Fatalf("republish of a public version: %+v created=%v err=%v", got, created, err)
		}
		priv := base
		priv.Version, priv.Private = "4", true
		if _, _, err := s.PublishLayer(ctx, priv); err != nil {
			t.Fatal(err)
		}
		if l, err := s.SetLayerPublic(ctx, "snap", "4", true); err != nil || !l.Public || l.Private {
			t.Fatalf("make a private layer public: %+v, %v; want public and no longer private", l, err)
		}
		if l, err := s.SetLayerPublic(ctx, "snap", "4", false); err != nil || l.Public || l.Private {
			t.Fatalf("unpublish: %+v, %v; want the default visibility", l, err)
		}
		if l, err := s.SetLayerPublic(ctx, "snap", "4", false); err != nil || l.Public {
			t.Fatalf("unpublish again: %+v, %v; want a no-op", l, err)
		}
		if _, err := s.SetLayerPublic(ctx, "snap", "9", true); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("an unknown version: %v, want not found", err)
		}
		if _, err := s.TagLayer(ctx, "snap", "latest", "3"); err != nil {
			t.Fatal(err)
		}
		if l, err := s.GetLayer(ctx, "snap", "latest"); err != nil || !l.Public || l.Version != "3" {
			t.Fatalf("through a tag: %+v, %v", l, err)
		}
		ls, err := s.ListLayers(ctx, "snap")
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{"1": false, "3": true, "4": false}
		if len(ls) != len(want) {
			t.Fatalf("list: %d layers, want %d", len(ls), len(want))
		}
		for _, l := range ls {
			if l.Public != want[l.Version] {
				t.Errorf("list: snap:%s public = %v, want %v", l.Version, l.Public, want[l.Version])
			}
		}
	})
}
