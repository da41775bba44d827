package e2e

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

// podmanCmd runs Debian's podman with storage of the test's own (vfs: it works on any
// filesystem, overlay-on-overlay included), never the host's default store.
func podmanCmd(t *testing.T, store string, args ...string) string {
	t.Helper()
	full := append([]string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run"),
		"--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "none"}, args...)
	cmd := exec.Command("podman", full...)
	cmd.Env = append(os.Environ(), "BUILDAH_ISOLATION=chroot")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestPodmanImages is issue 27 item 4: images built by Debian's podman from a Containerfile that
// uses every instruction Corral's builds will (FROM, ARG, LABEL, ENV, RUN, COPY, ADD, WORKDIR,
// USER, CMD, ENTRYPOINT), saved as docker-archive and oci-archive and imported, run as they do
// under Docker: their environment, user and working directory apply, and a working directory no
// layer contains (buildah writes none for a WORKDIR after which nothing runs) is made at start,
// owned by root, instead of failing every exec. On every runtime.
func TestPodmanImages(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skip("needs podman (scripts/setup.sh installs Debian's)")
	}
	base, err := exec.Command(filepath.Join(repoRoot, "scripts", "debian-base.sh")).Output()
	if err != nil {
		t.Skipf("needs the Debian base tarball (scripts/debian-base.sh): %v", err)
	}
	store := t.TempDir()
	podmanCmd(t, store, "import", strings.TrimSpace(string(base)), "corral-e2e-debian:12")
	ctxDir := t.TempDir()
	files := map[string]string{
		"Containerfile": `FROM corral-e2e-debian:12
ARG GREETING=hello
LABEL org.corral.test="podman"
ENV APP_HOME=/srv/app GREETING_ENV=${GREETING}
RUN mkdir -p /opt/built && echo "built with ${GREETING}" > /opt/built/msg
COPY hello.txt /opt/copied/hello.txt
ADD bundle.tar /opt/added/
USER agent
WORKDIR /srv/app/work
CMD ["-c", "echo from-cmd"]
ENTRYPOINT ["/bin/sh"]
`,
		"hello.txt": "copied\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(ctxDir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bundle := tarOf(t, map[string]string{"inner/added.txt": "added\n"})
	if err := os.WriteFile(filepath.Join(ctxDir, "bundle.tar"), bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	podmanCmd(t, store, "build", "--build-arg", "GREETING=hi", "-t", "corral-e2e-app:1", "-f", filepath.Join(ctxDir, "Containerfile"), ctxDir)
	out := t.TempDir()
	docker, ociTar := filepath.Join(out, "app-docker.tar"), filepath.Join(out, "app-oci.tar")
	podmanCmd(t, store, "save", "--format", "docker-archive", "-o", docker, "corral-e2e-app:1")
	podmanCmd(t, store, "save", "--format", "oci-archive", "-o", ociTar, "corral-e2e-app:1")

	// The case the issue is about: no layer of the saved image has the working directory.
	if archiveHas(t, docker, "srv/app/work") {
		t.Log("podman wrote the WORKDIR into a layer; the missing-directory case is not exercised by this build")
	} else {
		t.Log("no layer has /srv/app/work: the runtime makes it")
	}
	p := withBase(t)
	ctx := context.Background()
	for _, src := range []struct{ version, flag, file string }{{"docker", "--docker-archive", docker}, {"oci", "--oci-archive", ociTar}} {
		if _, stderr, code := p.cli("", "layer", "import", "podman-app:"+src.version, "--kind", "base", src.flag, src.file); code != 0 {
			t.Fatalf("corral layer import %s: %s", src.flag, stderr)
		}
		l, err := p.Client.Layer(ctx, "podman-app", src.version)
		if err != nil || l.ImageConfig == nil {
			t.Fatalf("layer podman-app:%s = %+v, %v", src.version, l, err)
		}
		if c := l.ImageConfig; c.WorkingDir != "/srv/app/work" || c.User != "agent" {
			t.Fatalf("%s: image config %+v", src.flag, c)
		}
	}
	forRuntimes(t, func(t *testing.T, rt string) {
		p.runtime = rt
		for _, v := range []string{"docker", "oci"} {
			sb := p.create(corral.CreateRequest{Base: "podman-app:" + v})
			const script = `pwd; id -un; echo "$APP_HOME $GREETING_ENV"; cat /opt/built/msg /opt/copied/hello.txt /opt/added/inner/added.txt; stat -c '%U %a' /srv/app/work`
			want := "/srv/app/work\nagent\n/srv/app hi\nbuilt with hi\ncopied\nadded\nroot 755\n"
			if got := p.sh(sb.ID, script); got != want {
				t.Fatalf("podman-app:%s on %s:\n got %q\nwant %q", v, rt, got, want)
			}
			if _, err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// archiveHas reports whether a layer of the docker-archive file has an entry at name.
func archiveHas(t *testing.T, file, name string) bool {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg || !strings.HasSuffix(h.Name, ".tar") {
			continue
		}
		lr := tar.NewReader(tr)
		for {
			lh, err := lr.Next()
			if err != nil {
				break // the end of this layer, or not a tar (the config)
			}
			if strings.TrimSuffix(strings.TrimPrefix(lh.Name, "./"), "/") == name {
				return true
			}
		}
	}
}
