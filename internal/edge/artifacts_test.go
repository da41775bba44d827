package edge

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

const (
	prjA = "prj-00000000000000aa"
	prjB = "prj-00000000000000bb"
)

// TestArtifactsPerProject: an artifact is found only in the project that kept it, and every
// reference the project cannot use gets the same answer.
func TestArtifactsPerProject(t *testing.T) {
	a, err := openArtifacts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ref, created, err := a.put(prjA, strings.NewReader("answer key"), 0o750, time.Minute, nil)
	if err != nil || !created {
		t.Fatalf("put: %q created=%v %v", ref, created, err)
	}
	f, mode, err := a.open(prjA, ref)
	if err != nil || mode.Perm() != 0o750 {
		t.Fatalf("open in its project: mode %v, %v", mode, err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "answer key" {
		t.Fatalf("content %q", b)
	}
	_, _, other := a.open(prjB, ref)
	_, _, never := a.open(prjB, "sha256:"+strings.Repeat("0", 64))
	_, _, neverA := a.open(prjA, "sha256:"+strings.Repeat("0", 64))
	for _, err := range []error{other, never, neverA} {
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("want not found, got %v", err)
		}
	}
	// The messages differ only by the reference they name.
	if strings.Replace(other.Error(), ref, "REF", 1) != strings.Replace(never.Error(), "sha256:"+strings.Repeat("0", 64), "REF", 1) {
		t.Errorf("another project's artifact and a never-kept one read differently:\n%v\n%v", other, never)
	}
	// Keeping the same content in B stores it apart: B's copy is new, A's untouched.
	if _, created, err := a.put(prjB, strings.NewReader("answer key"), 0o600, time.Minute, nil); err != nil || !created {
		t.Fatalf("same content in another project: created=%v %v; want a copy of its own", created, err)
	}
	if _, created, err := a.put(prjA, strings.NewReader("answer key"), 0o600, time.Minute, nil); err != nil || created {
		t.Fatalf("same content again in its project: created=%v %v; want it stored once", created, err)
	}
	if got := a.used(prjA); got != int64(len("answer key")) {
		t.Errorf("A uses %d bytes, want %d", got, len("answer key"))
	}
	if _, _, err := a.open("../"+prjA, ref); err == nil || errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a project ID that is a path: %v", err)
	}
}

// TestArtifactQuota: a kept file that would take a project or an ancestor past its limit is a
// quota error naming the limit, and nothing is kept.
func TestArtifactQuota(t *testing.T) {
	a, err := openArtifacts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	limits := []store.ArtifactLimit{{Path: "team/a", Limit: 10, Projects: []string{prjA}}, {Path: "team", Limit: 15, Projects: []string{prjA, prjB}}}
	if _, _, err := a.put(prjA, strings.NewReader("12345678"), 0o644, time.Minute, limits); err != nil {
		t.Fatal(err)
	}
	_, _, err = a.put(prjA, strings.NewReader("abc"), 0o644, time.Minute, limits)
	qe, ok := errors.AsType[*iam.QuotaError](err)
	if !ok || !errors.Is(err, errdefs.ErrExhausted) || qe.Resource != "artifact_bytes" || qe.Project != "team/a" || qe.Limit != 10 || qe.Usage != 8 || qe.Request != 3 {
		t.Fatalf("over the project's limit: %v (%+v)", err, qe)
	}
	if _, _, err := a.put(prjB, strings.NewReader("12345678"), 0o644, time.Minute, limits[1:]); !errors.As(err, &qe) || qe.Project != "team" {
		t.Fatalf("over the parent's limit: %v", err)
	}
	if a.used(prjA, prjB) != 8 {
		t.Errorf("refused keeps count: %d bytes used, want 8", a.used(prjA, prjB))
	}
	entries, _ := os.ReadDir(filepath.Join(a.dir, prjA))
	if len(entries) != 1 {
		t.Errorf("a refused keep left files: %v", entries)
	}
}

// TestArtifactExpiry: an artifact is not found once its lifetime ends, even before the reaper
// runs; the reaper removes it, and a reopened store counts what is left.
func TestArtifactExpiry(t *testing.T) {
	dir := t.TempDir()
	a, err := openArtifacts(dir)
	if err != nil {
		t.Fatal(err)
	}
	short, _, err := a.put(prjA, strings.NewReader("short"), 0o644, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	long, _, err := a.put(prjA, strings.NewReader("long-lived"), 0o644, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Second)
	sum, _ := strings.CutPrefix(short, "sha256:")
	if err := os.Chtimes(filepath.Join(dir, prjA, sum), past, past); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.open(prjA, short); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an expired artifact: %v, want not found", err)
	}
	if a.used(prjA) != int64(len("long-lived")) {
		t.Errorf("after expiry A uses %d bytes", a.used(prjA))
	}
	a.expire()
	os.WriteFile(filepath.Join(dir, strings.Repeat("ab", 32)), []byte("legacy"), 0o600)
	b, err := openArtifacts(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b.used(prjA) != int64(len("long-lived")) || b.total != int64(len("long-lived")) {
		t.Errorf("reopened: A uses %d, total %d", b.used(prjA), b.total)
	}
	if _, err := os.Stat(filepath.Join(dir, strings.Repeat("ab", 32))); !os.IsNotExist(err) {
		t.Errorf("an artifact of no project survived the reopen: %v", err)
	}
	if f, _, err := b.open(prjA, long); err != nil {
		t.Fatalf("the long-lived artifact: %v", err)
	} else {
		f.Close()
	}
}

// TestCheckCallKeepTTL: keep_ttl is a duration from 1s to MaxArtifactTTL, only with keep; a
// call's artifacts go to its environment's project.
func TestCheckCallKeepTTL(t *testing.T) {
	a, err := openArtifacts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := &fncallPool{e: &Edge{artifacts: a}, env: model.FncallEnv{FilesBytes: 1 << 20}, projectID: prjA, timeout: time.Minute}
	for _, c := range []struct {
		ttl  string
		keep []string
		want time.Duration // 0: invalid
	}{
		{"", []string{"out"}, model.ArtifactTTL},
		{"1s", []string{"out"}, time.Second},
		{"24h", []string{"out"}, model.MaxArtifactTTL},
		{"24h1s", []string{"out"}, 0},
		{"500ms", []string{"out"}, 0},
		{"-1m", []string{"out"}, 0},
		{"soon", []string{"out"}, 0},
		{"1m", nil, 0},
	} {
		spec, err := p.checkCall(model.CallRequest{Argv: []string{"true"}, Keep: c.keep, KeepTTL: c.ttl})
		switch {
		case c.want == 0 && (!errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != "keep_ttl"):
			t.Errorf("keep_ttl %q keep %v: %v, want invalid keep_ttl", c.ttl, c.keep, err)
		case c.want != 0 && (err != nil || spec.keepTTL != c.want || spec.project != prjA):
			t.Errorf("keep_ttl %q: %+v, %v; want %s in %s", c.ttl, spec, err, c.want, prjA)
		}
	}
}
