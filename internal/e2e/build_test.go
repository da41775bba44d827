package e2e

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/layers"
	corral "github.com/corral-dev/corral/sdk/go"
)

// buildDockerfile is the Dockerfile TestBuild builds: every supported kind of instruction, five
// of them writing or configuring the result the test then checks.
const buildDockerfile = `# a comment
ARG BASE=base:test
FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/srv/app \
    MODE=${GREETING}-mode
WORKDIR $APP_HOME
COPY --chown=0:0 app/ ./
LABEL org.example.name="demo app"
RUN echo "$GREETING from run" > built.txt && echo worker:x:1234:1234::/srv/app:/bin/sh >> /etc/passwd && chown 1234 built.txt
USER worker
CMD ["sh", "-c", "cat built.txt"]
`

// TestBuild builds an environment from a Dockerfile with the CLI, runs a sandbox of it, rebuilds
// after a change of the last step (only that step runs again), and checks that bad Dockerfiles
// are refused before anything is made and that a failing step leaves nothing half made.
func TestBuild(t *testing.T) {
	needRoot(t)
	p := withBase(t)
	ctx := context.Background()
	dir := t.TempDir()
	noErr(t, os.MkdirAll(filepath.Join(dir, "app", "sub"), 0o755))
	noErr(t, os.WriteFile(filepath.Join(dir, "app", "hello.txt"), []byte("hello file\n"), 0o644))
	noErr(t, os.WriteFile(filepath.Join(dir, "app", "sub", "deep.txt"), []byte("deep\n"), 0o600))
	noErr(t, os.WriteFile(filepath.Join(dir, "app", "secret.key"), []byte("never copied\n"), 0o600))
	noErr(t, os.WriteFile(filepath.Join(dir, ".dockerignore"), []byte("# keys stay home\napp/*.key\n"), 0o644))
	noErr(t, os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(buildDockerfile), 0o644))

	out, errOut, code := p.cli("", "env", "build", "demo", "--file", filepath.Join(dir, "Dockerfile"), "--context", dir, "--build-arg", "GREETING=hi")
	if code != 0 {
		t.Fatalf("env build: exit %d\nstdout: %s\nstderr: %s\nlogs: %s", code, out, errOut, p.Logs())
	}
	for _, want := range []string{"Step 1/9: FROM ${BASE}", "Step 5/9: COPY --chown=0:0 app/ ./", "Step 7/9: RUN echo"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("build output lacks %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(errOut, "CACHED") {
		t.Errorf("a first build found cached steps:\n%s", errOut)
	}
	sb := p.create(corral.CreateRequest{Environment: "demo"})
	defer p.Client.DeleteSandbox(ctx, sb.ID)
	got := p.sh(sb.ID, `pwd; id -u; echo "$MODE $APP_HOME"; cat hello.txt built.txt; stat -c '%a %u' sub/deep.txt; ls -A`)
	want := "/srv/app\n1234\nhi-mode /srv/app\nhello file\nhi from run\n600 0\nbuilt.txt\nhello.txt\nsub\n"
	if got != want {
		t.Errorf("the built environment shows\n%s\nwant\n%s", got, want)
	}
	env, err := p.Client.Environment(ctx, "demo")
	noErr(t, err)
	l, err := p.Client.Layer(ctx, strings.Split(env.Base, ":")[0], strings.Split(env.Base, ":")[1])
	noErr(t, err)
	if c := l.ImageConfig; c == nil || strings.Join(c.Cmd, " ") != "sh -c cat built.txt" || c.Labels["org.example.name"] != "demo app" || c.User != "worker" {
		t.Errorf("the environment's configuration = %+v", c)
	}

	// The last step changed: only it runs again.
	changed := strings.Replace(buildDockerfile, `CMD ["sh", "-c", "cat built.txt"]`, `RUN echo second > /tmp/second.txt`, 1)
	noErr(t, os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(changed), 0o644))
	out, errOut, code = p.cli("", "env", "build", "demo", "-f", filepath.Join(dir, "Dockerfile"), "--context", dir, "--build-arg", "GREETING=hi", "-o", "json")
	if code != 0 {
		t.Fatalf("rebuild: exit %d\n%s\n%s", code, out, errOut)
	}
	b := decodeBuild(t, out)
	var states []string
	for _, s := range b.Steps {
		states = append(states, s.Kind+":"+s.State)
	}
	wantStates := "config:done config:done config:done config:done copy:cached config:done run:cached config:done run:done"
	if strings.Join(states, " ") != wantStates {
		t.Errorf("rebuild steps = %s\nwant %s", strings.Join(states, " "), wantStates)
	}
	sb2 := p.create(corral.CreateRequest{Environment: "demo"})
	defer p.Client.DeleteSandbox(ctx, sb2.ID)
	if got := p.sh(sb2.ID, "cat /tmp/second.txt built.txt; id -un"); got != "second\nhi from run\nworker\n" {
		t.Errorf("rebuilt environment shows %q", got)
	}

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct{ name, dockerfile, want string }{
			{"healthcheck", "FROM base:test\nHEALTHCHECK CMD true\n", "HEALTHCHECK is not supported"},
			{"onbuild", "FROM base:test\nONBUILD RUN true\n", "ONBUILD is not supported"},
			{"multi-stage", "FROM base:test AS build\nRUN true\n", "multi-stage"},
			{"second from", "FROM base:test\nFROM base:test\n", "multi-stage"},
			{"copy outside", "FROM base:test\nCOPY ../etc/passwd /x\n", "outside the build context"},
			{"copy missing", "FROM base:test\nCOPY nothere /x\n", "not in the build context"},
			{"copy ignored", "FROM base:test\nCOPY app/secret.key /x\n", "not in the build context"},
			{"unknown from", "FROM nosuch:1\n", "not published"},
			{"heredoc", "FROM base:test\nRUN <<EOF\ntrue\nEOF\n", "heredocs"},
			{"no from", "RUN true\n", "before FROM"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(contextTarOf(dir, pw)) }()
				_, err := p.Client.StartBuild(ctx, corral.BuildRequest{Name: "bad", Dockerfile: tc.dockerfile}, pr)
				if !corral.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("build = %v, want invalid naming %q", err, tc.want)
				}
			})
		}
		for _, req := range []corral.BuildRequest{
			{Name: "Bad Name", Dockerfile: "FROM base:test\n"},
			{Name: "ok", Dockerfile: "FROM base:test\n", Project: "nosuch"},
			{Name: "ok", Dockerfile: "FROM base:test\n", Runtime: "qemu"},
			{Name: "ok", Dockerfile: "FROM base:test\n", BuildArgs: []string{"NOT AN ARG"}},
			{Name: "ok", Dockerfile: "FROM base:test\n", Network: &corral.NetworkPolicy{Allow: []string{"not a rule!"}}},
		} {
			if _, err := p.Client.StartBuild(ctx, req, nil); !corral.IsInvalid(err) {
				t.Errorf("build %+v = %v, want invalid", req, err)
			}
		}
		before, err := p.Client.Layers(ctx, "corral.build")
		noErr(t, err)
		// A failing RUN: the build fails naming the step; no environment, no sandbox is left.
		b, err := p.Client.StartBuild(ctx, corral.BuildRequest{Name: "bad", Dockerfile: "FROM base:test\nRUN echo partial > /p\nRUN echo before-fail; exit 3\n"}, nil)
		noErr(t, err)
		var end corral.Build
		eventually(t, 2*time.Minute, "the failing build ends", func() bool {
			got, err := p.Client.Build(ctx, b.ID)
			noErr(t, err)
			end = *got
			return got.State != corral.BuildRunning
		})
		if end.State != corral.BuildFailed || !strings.Contains(end.Error, "step 3 (RUN echo before-fail; exit 3)") || !strings.Contains(end.Error, "exit code 3") {
			t.Errorf("failing build ended %s: %s", end.State, end.Error)
		}
		logs, err := p.Client.BuildLogs(ctx, b.ID, false)
		noErr(t, err)
		var text strings.Builder
		for {
			ev, err := logs.Next()
			if err != nil {
				break
			}
			text.WriteString(ev.Text)
			text.Write(ev.Data)
		}
		logs.Close()
		if !strings.Contains(text.String(), "before-fail") {
			t.Errorf("the failed build's log lacks the command's output:\n%s", text.String())
		}
		if _, err := p.Client.Environment(ctx, "bad"); !corral.IsNotFound(err) {
			t.Errorf("a failed build saved its environment: %v", err)
		}
		eventually(t, 30*time.Second, "no build sandbox is left", func() bool {
			list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{Labels: map[string]string{"corral.build": b.ID}})
			noErr(t, err)
			for _, s := range list {
				if s.State == corral.StateRunning || s.State == corral.StateCreating {
					return false
				}
			}
			return true
		})
		// A cancelled build stops its command and leaves nothing either.
		cb, err := p.Client.StartBuild(ctx, corral.BuildRequest{Name: "bad", Dockerfile: "FROM base:test\nRUN echo started; sleep 600\n"}, nil)
		noErr(t, err)
		eventually(t, time.Minute, "the sleeping step's command runs", func() bool {
			logs, err := p.Client.BuildLogs(ctx, cb.ID, false)
			noErr(t, err)
			defer logs.Close()
			for {
				ev, err := logs.Next()
				if err != nil {
					return false
				}
				if strings.Contains(string(ev.Data), "started") {
					return true
				}
			}
		})
		_, err = p.Client.CancelBuild(ctx, cb.ID)
		noErr(t, err)
		eventually(t, time.Minute, "the cancelled build ends", func() bool {
			got, err := p.Client.Build(ctx, cb.ID)
			noErr(t, err)
			end = *got
			return got.State != corral.BuildRunning
		})
		if end.State != corral.BuildFailed || !strings.Contains(end.Error, "cancelled") {
			t.Errorf("cancelled build ended %s: %s", end.State, end.Error)
		}
		eventually(t, 30*time.Second, "the cancelled build's sandbox is gone", func() bool {
			list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{Labels: map[string]string{"corral.build": cb.ID}})
			noErr(t, err)
			for _, s := range list {
				if s.State == corral.StateRunning || s.State == corral.StateCreating {
					return false
				}
			}
			return len(list) > 0 // it had one
		})
		after, err := p.Client.Layers(ctx, "corral.build")
		noErr(t, err)
		// The step that succeeded stays as the cache of the next build; the failed one made none.
		if len(after) != len(before)+1 {
			t.Errorf("layers corral.build: %d before, %d after a build whose second step failed; want one more", len(before), len(after))
		}
	})
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func decodeBuild(t *testing.T, s string) corral.Build {
	t.Helper()
	var b corral.Build
	if err := json.Unmarshal([]byte(s), &b); err != nil {
		t.Fatalf("decode build %q: %v", s, err)
	}
	return b
}

// contextTarOf writes dir as a build context tar, .dockerignore'd files included (the server
// applies .dockerignore again).
func contextTarOf(dir string, w io.Writer) error {
	return layers.WriteTar(context.Background(), dir, w)
}

// TestBuildFrom builds from each kind of FROM (a local docker archive the CLI imports, an
// environment with a toolkit) and on gVisor.
func TestBuildFrom(t *testing.T) {
	needRoot(t)
	p := withBase(t)
	ctx := context.Background()
	dir := t.TempDir()
	build := func(t *testing.T, name, dockerfile string, extra ...string) {
		t.Helper()
		df := filepath.Join(dir, name+".Dockerfile")
		noErr(t, os.WriteFile(df, []byte(dockerfile), 0o644))
		out, errOut, code := p.cli("", append([]string{"env", "build", name, "-f", df}, extra...)...)
		if code != 0 {
			t.Fatalf("env build %s: exit %d\n%s\n%s", name, code, out, errOut)
		}
	}
	check := func(t *testing.T, env, script, want string) {
		t.Helper()
		sb := p.create(corral.CreateRequest{Environment: env})
		defer p.Client.DeleteSandbox(ctx, sb.ID)
		if got := p.sh(sb.ID, script); got != want {
			t.Errorf("%s: %q, want %q", env, got, want)
		}
	}

	t.Run("docker archive", func(t *testing.T) {
		if _, err := exec.LookPath("podman"); err != nil {
			t.Skip("needs podman")
		}
		store := t.TempDir()
		rootTar := filepath.Join(dir, "rootfs.tar")
		f, err := os.Create(rootTar)
		noErr(t, err)
		noErr(t, layers.WriteTar(ctx, busyboxRootfs(t), f))
		f.Close()
		podmanCmd(t, store, "import", "--change", "ENV FROM_IMAGE=yes", rootTar, "corral-e2e-bb:1")
		archive := filepath.Join(dir, "bb-docker.tar")
		podmanCmd(t, store, "save", "--format", "docker-archive", "-o", archive, "corral-e2e-bb:1")
		build(t, "fromarchive", "FROM docker-archive:"+archive+"\nRUN echo built > /built\n")
		check(t, "fromarchive", "cat /built; echo $FROM_IMAGE", "built\nyes\n")
		// The archive is imported once: a second build finds its layer and the step cached.
		df := filepath.Join(dir, "again.Dockerfile")
		noErr(t, os.WriteFile(df, []byte("FROM docker-archive:"+archive+"\nRUN echo built > /built\n"), 0o644))
		_, errOut, code := p.cli("", "env", "build", "fromarchive", "-f", df)
		if code != 0 || strings.Contains(errOut, "importing") || !strings.Contains(errOut, "CACHED") {
			t.Errorf("second build from the archive: exit %d\n%s", code, errOut)
		}
	})

	t.Run("environment with a toolkit", func(t *testing.T) {
		tk := t.TempDir()
		noErr(t, os.MkdirAll(filepath.Join(tk, "opt", "tk"), 0o755))
		noErr(t, os.WriteFile(filepath.Join(tk, "opt", "tk", "file"), []byte("from the toolkit\n"), 0o644))
		p.importDir("tk", "1", corral.KindToolkit, tk)
		_, err := p.Client.SaveEnvironment(ctx, corral.Environment{Name: "withtk", Base: "base:test", Toolkits: []string{"tk:1"}})
		noErr(t, err)
		build(t, "fromenv", "FROM withtk\nRUN cat /opt/tk/file > /copied\n")
		check(t, "fromenv", "cat /copied /opt/tk/file", "from the toolkit\nfrom the toolkit\n")
	})

	t.Run("gvisor", func(t *testing.T) {
		needGVisor(t)
		build(t, "ongvisor", "FROM base:test\nRUN echo on gvisor > /gv && mkdir -p /d/e && echo deep > /d/e/f\n", "--runtime", "runsc")
		check(t, "ongvisor", "cat /gv /d/e/f", "on gvisor\ndeep\n")
	})
}
