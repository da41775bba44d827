package conformance

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"slices"
	"strings"

	corral "github.com/corral-dev/corral/sdk/go"
)

func files(s *suite) {
	sb := s.create(corral.CreateRequest{})
	dir := "/tmp/conformance"
	if _, err := s.Client.Mkdir(s.ctx, sb.ID, corral.MkdirRequest{Path: dir + "/sub", Parents: true}); err != nil {
		s.t.Fatalf("mkdir -p: %v", err)
	}
	content := "hello, files\n"
	fi, err := s.Client.WriteFile(s.ctx, sb.ID, dir+"/a.txt", strings.NewReader(content), corral.WriteFileOptions{})
	if err != nil {
		s.t.Fatalf("write file: %v", err)
	}
	if fi.Size != int64(len(content)) || fi.IsDir || fi.Name != "a.txt" || fi.Path != dir+"/a.txt" {
		s.t.Errorf("write answered %+v, want a.txt of %d bytes at %s/a.txt", fi, len(content), dir)
	}
	rc, err := s.Client.ReadFile(s.ctx, sb.ID, dir+"/a.txt")
	if err != nil {
		s.t.Fatalf("read file: %v", err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != content {
		s.t.Errorf("read back %q, want %q", got, content)
	}

	st, err := s.Client.Stat(s.ctx, sb.ID, dir)
	if err != nil {
		s.t.Fatalf("stat: %v", err)
	}
	if !st.IsDir || st.Name != "conformance" {
		s.t.Errorf("stat %s = %+v, want the directory conformance", dir, st)
	}
	list, err := s.Client.List(s.ctx, sb.ID, dir)
	if err != nil {
		s.t.Fatalf("list: %v", err)
	}
	var names []string
	for _, f := range list {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"a.txt", "sub"}) {
		s.t.Errorf("list %s = %v, want [a.txt sub]", dir, names)
	}

	moved, err := s.Client.Move(s.ctx, sb.ID, dir+"/a.txt", dir+"/sub/b.txt")
	if err != nil {
		s.t.Fatalf("move: %v", err)
	}
	if moved.Path != dir+"/sub/b.txt" || moved.Size != int64(len(content)) {
		s.t.Errorf("move answered %+v, want %s/sub/b.txt of %d bytes", moved, dir, len(content))
	}
	_, err = s.Client.Stat(s.ctx, sb.ID, dir+"/a.txt")
	s.wantError("stat the moved file's old path", err, http.StatusNotFound, corral.CodeNotFound, "")

	err = s.Client.Remove(s.ctx, sb.ID, dir, false)
	s.wantError("remove a non-empty directory without recursive", err, http.StatusConflict, corral.CodeConflict, "")
	if err := s.Client.Remove(s.ctx, sb.ID, dir, true); err != nil {
		s.t.Fatalf("remove -r: %v", err)
	}
	_, err = s.Client.Stat(s.ctx, sb.ID, dir)
	s.wantError("stat a removed directory", err, http.StatusNotFound, corral.CodeNotFound, "")
}

func filesMissing(s *suite) {
	sb := s.create(corral.CreateRequest{})
	_, err := s.Client.ReadFile(s.ctx, sb.ID, "/tmp/conformance-missing")
	s.wantError("read a missing file", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.Stat(s.ctx, sb.ID, "/tmp/conformance-missing")
	s.wantError("stat a missing file", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.List(s.ctx, sb.ID, "/tmp/conformance-missing")
	s.wantError("list a missing directory", err, http.StatusNotFound, corral.CodeNotFound, "")
	err = s.Client.Remove(s.ctx, sb.ID, "/tmp/conformance-missing", false)
	s.wantError("remove a missing file", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.ReadFile(s.ctx, sb.ID, "")
	s.wantError("read without a path", err, http.StatusBadRequest, corral.CodeInvalid, "path")
	_, err = s.Client.ReadFile(s.ctx, sb.ID, "relative/path")
	s.wantError("read a relative path", err, http.StatusBadRequest, corral.CodeInvalid, "path")
	_, err = s.Client.WriteFile(s.ctx, sb.ID, "/tmp/conformance-no-dir/x", strings.NewReader("x"), corral.WriteFileOptions{})
	s.wantError("write into a missing directory", err, http.StatusNotFound, corral.CodeNotFound, "")
}

func filesTar(s *suite) {
	sb := s.create(corral.CreateRequest{})
	in := layerTar("from-tar.txt", "tarred\n")
	if _, err := s.Client.Mkdir(s.ctx, sb.ID, corral.MkdirRequest{Path: "/tmp/tar-in"}); err != nil {
		s.t.Fatalf("mkdir: %v", err)
	}
	_, err := s.Client.Mkdir(s.ctx, sb.ID, corral.MkdirRequest{Path: "/tmp/tar-in"})
	s.wantError("mkdir of an existing directory", err, http.StatusConflict, corral.CodeConflict, "")
	if err := s.Client.TarIn(s.ctx, sb.ID, "/tmp/tar-in", bytes.NewReader(in)); err != nil {
		s.t.Fatalf("tar in: %v", err)
	}
	rc, err := s.Client.ReadFile(s.ctx, sb.ID, "/tmp/tar-in/from-tar.txt")
	if err != nil {
		s.t.Fatalf("read a file from the tar: %v", err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "tarred\n" {
		s.t.Errorf("file from the tar = %q, want %q", got, "tarred\n")
	}
	out, err := s.Client.TarOut(s.ctx, sb.ID, "/tmp/tar-in")
	if err != nil {
		s.t.Fatalf("tar out: %v", err)
	}
	defer out.Close()
	tr := tar.NewReader(out)
	found := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			s.t.Fatalf("read the tar out: %v", err)
		}
		if strings.TrimPrefix(h.Name, "./") == "from-tar.txt" {
			b, _ := io.ReadAll(tr)
			found = string(b) == "tarred\n"
		}
	}
	if !found {
		s.t.Errorf("tar out of /tmp/tar-in lacks from-tar.txt with its content")
	}
	_, err = s.Client.TarOut(s.ctx, sb.ID, "/tmp/conformance-missing")
	s.wantError("tar out of a missing directory", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.Move(s.ctx, sb.ID, "/tmp/conformance-missing", "/tmp/elsewhere")
	s.wantError("move a missing file", err, http.StatusNotFound, corral.CodeNotFound, "")
}
