package conformance

import (
	"archive/tar"
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// layerTar returns a tar of one regular file, name, holding content.
func layerTar(name, content string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg, ModTime: time.Unix(1e9, 0)})
	tw.Write([]byte(content))
	tw.Close()
	return buf.Bytes()
}

func layersCase(s *suite) {
	name := "conformance-" + s.uniq
	content := layerTar("conformance.txt", "layer content\n")
	l, err := s.Client.ImportLayer(s.ctx, name, "1", corral.KindToolkit, bytes.NewReader(content))
	if err != nil {
		s.t.Fatalf("import layer: %v", err)
	}
	if l.Name != name || l.Version != "1" || l.Kind != corral.KindToolkit || !strings.HasPrefix(l.Digest, "sha256:") {
		s.t.Errorf("import answered %+v, want %s:1, toolkit, a sha256 digest", l, name)
	}
	again, err := s.Client.ImportLayer(s.ctx, name, "1", corral.KindToolkit, bytes.NewReader(content))
	if err != nil {
		s.t.Fatalf("import the same content again: %v", err)
	}
	if again.Digest != l.Digest {
		s.t.Errorf("import again: digest %s, want %s", again.Digest, l.Digest)
	}
	_, err = s.Client.ImportLayer(s.ctx, name, "1", corral.KindToolkit, bytes.NewReader(layerTar("other.txt", "other\n")))
	s.wantError("import other content as a published version", err, http.StatusConflict, corral.CodeConflict, "")

	got, err := s.Client.Layer(s.ctx, name, "1")
	if err != nil {
		s.t.Fatalf("get layer: %v", err)
	}
	if got.Digest != l.Digest || got.Kind != corral.KindToolkit {
		s.t.Errorf("get layer = %+v, want digest %s, toolkit", got, l.Digest)
	}
	list, err := s.Client.Layers(s.ctx, name)
	if err != nil {
		s.t.Fatalf("list layers: %v", err)
	}
	if len(list) != 1 || list[0].Name != name || list[0].Version != "1" {
		s.t.Errorf("layers named %s = %+v, want only version 1", name, list)
	}

	// A sandbox with the toolkit sees its file; a toolkit is no base.
	ref := name + ":1"
	sb := s.create(corral.CreateRequest{Toolkits: []string{ref}})
	if !slices.Equal(sb.Toolkits, []string{ref}) {
		s.t.Errorf("sandbox toolkits = %v, want [%s]", sb.Toolkits, ref)
	}
	_, err = s.Client.CreateSandbox(s.ctx, corral.CreateRequest{Base: ref})
	s.wantError("create on a toolkit layer as base", err, http.StatusBadRequest, corral.CodeInvalid, "base")
	_, err = s.Client.CreateSandbox(s.ctx, corral.CreateRequest{Base: s.Base, Toolkits: []string{s.Base}})
	s.wantError("create with a base layer as toolkit", err, http.StatusBadRequest, corral.CodeInvalid, "toolkits[0]")
}

func layersInvalid(s *suite) {
	name := "conformance-" + s.uniq
	_, err := s.Client.Layer(s.ctx, name, "1")
	s.wantError("get a missing layer", err, http.StatusNotFound, corral.CodeNotFound, "")
	content := layerTar("x", "x")
	bad := []struct{ what, name, version, kind, field string }{
		{"an unknown kind", name, "1", "firmware", "kind"},
		{"a name with a slash", "a/b", "1", corral.KindToolkit, "name"},
		{"a version with a colon", name, "1:2", corral.KindToolkit, "version"},
		{"no name", "", "1", corral.KindToolkit, "name"},
	}
	for _, b := range bad {
		_, err := s.Client.ImportLayer(s.ctx, b.name, b.version, b.kind, bytes.NewReader(content))
		s.wantError("import with "+b.what, err, http.StatusBadRequest, corral.CodeInvalid, b.field)
	}
	_, err = s.Client.ImportLayer(s.ctx, name, "2", corral.KindToolkit, strings.NewReader("this is not a tar stream, not at all, not even close to one"))
	s.wantError("import content that is no tar", err, http.StatusBadRequest, corral.CodeInvalid, "")
	list, err := s.Client.Layers(s.ctx, name)
	if err != nil {
		s.t.Fatalf("list layers: %v", err)
	}
	if len(list) != 0 {
		s.t.Errorf("refused imports left layers %+v", list)
	}
}

func layerTags(s *suite) {
	name := "conformance-" + s.uniq
	v1, err := s.Client.ImportLayer(s.ctx, name, "1", corral.KindToolkit, bytes.NewReader(layerTar("v", "1")))
	if err != nil {
		s.t.Fatalf("import 1: %v", err)
	}
	v2, err := s.Client.ImportLayer(s.ctx, name, "2", corral.KindToolkit, bytes.NewReader(layerTar("v", "2")))
	if err != nil {
		s.t.Fatalf("import 2: %v", err)
	}
	tagged, err := s.Client.TagLayer(s.ctx, name, "latest", "1")
	if err != nil {
		s.t.Fatalf("tag: %v", err)
	}
	if tagged.Version != "1" || tagged.Digest != v1.Digest || !slices.Equal(tagged.Tags, []string{"latest"}) {
		s.t.Errorf("tag answered %+v, want version 1 carrying tag latest", tagged)
	}
	// A sandbox names the tag; it gets the version the tag points at.
	sb := s.create(corral.CreateRequest{Toolkits: []string{name + ":latest"}})
	if !slices.Equal(sb.Toolkits, []string{name + ":1"}) {
		s.t.Errorf("sandbox of %s:latest has toolkits %v, want the version it pointed at, %s:1", name, sb.Toolkits, name)
	}
	moved, err := s.Client.TagLayer(s.ctx, name, "latest", "2")
	if err != nil {
		s.t.Fatalf("move the tag: %v", err)
	}
	if moved.Version != "2" || moved.Digest != v2.Digest {
		s.t.Errorf("moved tag answered %+v, want version 2", moved)
	}
	got, err := s.Client.Layer(s.ctx, name, "1")
	if err != nil {
		s.t.Fatalf("get 1: %v", err)
	}
	if slices.Contains(got.Tags, "latest") {
		s.t.Errorf("version 1 still carries the moved tag: %v", got.Tags)
	}
	_, err = s.Client.TagLayer(s.ctx, name, "latest", "9")
	s.wantError("tag a missing version", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.DeleteLayer(s.ctx, name, "2")
	s.wantError("delete a tagged version", err, http.StatusConflict, corral.CodeConflict, "")
	if err := s.Client.DeleteTag(s.ctx, name, "latest"); err != nil {
		s.t.Fatalf("delete tag: %v", err)
	}
	err = s.Client.DeleteTag(s.ctx, name, "latest")
	s.wantError("delete a deleted tag", err, http.StatusNotFound, corral.CodeNotFound, "")
	del, err := s.Client.DeleteLayer(s.ctx, name, "2")
	if err != nil {
		s.t.Fatalf("delete version 2: %v", err)
	}
	if del.Version != "2" {
		s.t.Errorf("delete answered %+v, want version 2", del)
	}
	_, err = s.Client.Layer(s.ctx, name, "2")
	s.wantError("get a deleted version", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.DeleteLayer(s.ctx, name, "2")
	s.wantError("delete a deleted version", err, http.StatusNotFound, corral.CodeNotFound, "")

	// A version a saved environment names stays until the environment goes.
	env := corral.Environment{Name: name, Base: s.Base, Toolkits: []string{name + ":1"}}
	if _, err := s.Client.SaveEnvironment(s.ctx, env); err != nil {
		s.t.Fatalf("save environment: %v", err)
	}
	s.t.Cleanup(func() { s.Client.DeleteEnvironment(context.Background(), name) })
	_, err = s.Client.DeleteLayer(s.ctx, name, "1")
	s.wantError("delete a version an environment names", err, http.StatusConflict, corral.CodeConflict, "")
	if err := s.Client.DeleteEnvironment(s.ctx, name); err != nil {
		s.t.Fatalf("delete environment: %v", err)
	}
	if _, err := s.Client.DeleteLayer(s.ctx, name, "1"); err != nil {
		s.t.Errorf("delete version 1 once nothing names it: %v", err)
	}
}

func environments(s *suite) {
	name := "conformance-" + s.uniq
	env, err := s.Client.SaveEnvironment(s.ctx, corral.Environment{Name: name, Base: s.Base})
	if err != nil {
		s.t.Fatalf("save environment: %v", err)
	}
	if env.Name != name || env.Base != s.Base || env.CreatedAt.IsZero() {
		s.t.Errorf("save answered %+v, want %s on %s with a creation time", env, name, s.Base)
	}
	s.t.Cleanup(func() { s.Client.DeleteEnvironment(context.Background(), name) })
	got, err := s.Client.Environment(s.ctx, name)
	if err != nil {
		s.t.Fatalf("get environment: %v", err)
	}
	if got.Name != name || got.Base != s.Base {
		s.t.Errorf("get environment = %+v, want %s on %s", got, name, s.Base)
	}
	list, err := s.Client.Environments(s.ctx)
	if err != nil {
		s.t.Fatalf("list environments: %v", err)
	}
	if !slices.ContainsFunc(list, func(e corral.Environment) bool { return e.Name == name }) {
		s.t.Errorf("environments = %+v, want one named %s", list, name)
	}

	sb := s.create(corral.CreateRequest{Environment: name})
	if sb.Base != s.Base || sb.Environment != name {
		s.t.Errorf("sandbox of environment %s: base %q environment %q, want %s and %s", name, sb.Base, sb.Environment, s.Base, name)
	}
	again, err := s.Client.SaveEnvironment(s.ctx, corral.Environment{Name: name, Base: s.Base})
	if err != nil {
		s.t.Errorf("save the same environment again: %v (want it idempotent)", err)
	} else if !again.CreatedAt.Equal(env.CreatedAt) {
		s.t.Errorf("save the same environment again: created at %v, want the first save's %v", again.CreatedAt, env.CreatedAt)
	}
	tk := name + "-tools:1"
	if _, err := s.Client.ImportLayer(s.ctx, name+"-tools", "1", corral.KindToolkit, bytes.NewReader(layerTar("t", "t"))); err != nil {
		s.t.Fatalf("import toolkit: %v", err)
	}
	_, err = s.Client.SaveEnvironment(s.ctx, corral.Environment{Name: name, Base: s.Base, Toolkits: []string{tk}})
	s.wantError("save another composition under a taken name", err, http.StatusConflict, corral.CodeConflict, "")
	_, err = s.Client.SaveEnvironment(s.ctx, corral.Environment{Name: name + "-kinds", Base: s.Base, Toolkits: []string{s.Base}})
	s.wantError("save an environment with a base layer as toolkit", err, http.StatusBadRequest, corral.CodeInvalid, "toolkits[0]")

	_, err = s.Client.SaveEnvironment(s.ctx, corral.Environment{Name: name + "-bad", Base: "conformance-none-" + s.uniq + ":1"})
	s.wantError("save an environment on a missing layer", err, http.StatusBadRequest, corral.CodeInvalid, "base")
	_, err = s.Client.SaveEnvironment(s.ctx, corral.Environment{Name: "", Base: s.Base})
	s.wantError("save an environment without a name", err, http.StatusBadRequest, corral.CodeInvalid, "name")

	if err := s.Client.DeleteEnvironment(s.ctx, name); err != nil {
		s.t.Fatalf("delete environment: %v", err)
	}
	_, err = s.Client.Environment(s.ctx, name)
	s.wantError("get a deleted environment", err, http.StatusNotFound, corral.CodeNotFound, "")
	err = s.Client.DeleteEnvironment(s.ctx, name)
	s.wantError("delete a deleted environment", err, http.StatusNotFound, corral.CodeNotFound, "")
}
