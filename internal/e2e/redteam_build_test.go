package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestRedTeamBuild attacks Dockerfile builds (issue 27 item 3): a hostile build context (names
// that leave it, links out of it, devices, setuid files), a RUN step that tries to keep
// privilege or reach the network, each on runc and gVisor (builds run on no other runtime).
// Each attack fails; refused contexts make nothing.
func TestRedTeamBuild(t *testing.T) {
	needRoot(t)
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "gvisor" {
				needGVisor(t)
			}
			redTeamBuild(t, rt)
		})
	}
}

func redTeamBuild(t *testing.T, rt string) {
	p := withBase(t)
	ctx := context.Background()
	start := func(name, dockerfile string, entries ...tar.Header) (*corral.Build, error) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			h := h
			if h.Typeflag == tar.TypeReg {
				h.Size = int64(len(h.Linkname)) // content carried in Linkname for brevity
				content := h.Linkname
				h.Linkname = ""
				noErr(t, tw.WriteHeader(&h))
				tw.Write([]byte(content))
				continue
			}
			noErr(t, tw.WriteHeader(&h))
		}
		tw.Close()
		return p.Client.StartBuild(ctx, corral.BuildRequest{Name: name, Dockerfile: dockerfile, Runtime: rt}, &buf)
	}
	wait := func(b *corral.Build) corral.Build {
		var end corral.Build
		eventually(t, 2*time.Minute, "build "+b.ID+" ends", func() bool {
			got, err := p.Client.Build(ctx, b.ID)
			noErr(t, err)
			end = *got
			return got.State != corral.BuildRunning
		})
		return end
	}

	t.Run("context names that leave it", func(t *testing.T) {
		for _, h := range []tar.Header{
			{Name: "../../etc/cron.d/x", Typeflag: tar.TypeReg, Linkname: "* * * * * root id\n", Mode: 0o644},
			{Name: "/etc/passwd", Typeflag: tar.TypeReg, Linkname: "x", Mode: 0o644},
			{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666},
			{Name: "hl", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"},
		} {
			_, err := start("rt-escape", "FROM base:test\nCOPY . /c/\n", h)
			if !corral.IsInvalid(err) {
				t.Errorf("context entry %q (type %c): %v, want a 400", h.Name, h.Typeflag, err)
			}
		}
		for _, df := range []string{"FROM base:test\nCOPY ../../etc/shadow /x\n", "FROM base:test\nCOPY a/../../x /x\n"} {
			if _, err := start("rt-escape", df, tar.Header{Name: "a/f", Typeflag: tar.TypeReg, Linkname: "f", Mode: 0o644}); !corral.IsInvalid(err) {
				t.Errorf("%q: %v, want a 400", df, err)
			}
		}
		if _, err := p.Client.Environment(ctx, "rt-escape"); !corral.IsNotFound(err) {
			t.Errorf("a refused build saved its environment: %v", err)
		}
	})

	t.Run("links in the context are copied, never followed", func(t *testing.T) {
		b, err := start("rt-links", "FROM base:test\nCOPY . /c/\n",
			tar.Header{Name: "etc", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../etc/shadow"})
		noErr(t, err)
		if end := wait(b); end.State != corral.BuildSucceeded {
			t.Fatalf("build: %s", end.Error)
		}
		// COPY through a link of the context names nothing in it.
		if _, err := start("rt-links2", "FROM base:test\nCOPY etc/passwd /x\n", tar.Header{Name: "etc", Typeflag: tar.TypeSymlink, Linkname: "/etc"}); !corral.IsInvalid(err) {
			t.Errorf("COPY through a context link: %v, want a 400", err)
		}
		sb := p.create(corral.CreateRequest{Environment: "rt-links", Runtime: rt})
		defer p.Client.DeleteSandbox(ctx, sb.ID)
		if got := p.sh(sb.ID, "readlink /c/etc; readlink /c/up"); got != "/etc\n../../../../../../etc/shadow\n" {
			t.Errorf("context links in the environment: %q", got)
		}
	})

	t.Run("no setuid from the context or a RUN", func(t *testing.T) {
		b, err := start("rt-suid", "FROM base:test\nCOPY s /c/s\nRUN cp /bin/busybox /r && chmod 4755 /r && chmod 2755 /c/s\n",
			tar.Header{Name: "s", Typeflag: tar.TypeReg, Linkname: "#!/bin/sh\n", Mode: 0o4755})
		noErr(t, err)
		if end := wait(b); end.State != corral.BuildSucceeded {
			t.Fatalf("build: %s", end.Error)
		}
		sb := p.create(corral.CreateRequest{Environment: "rt-suid", Runtime: rt})
		defer p.Client.DeleteSandbox(ctx, sb.ID)
		if got := p.sh(sb.ID, "stat -c '%a' /c/s /r"); got != "755\n755\n" {
			t.Errorf("modes in the built environment: %q, want no setuid/setgid bits", got)
		}
	})

	t.Run("RUN has no network by default", func(t *testing.T) {
		// The interfaces a RUN step sees: loopback only without a policy; with --net-allow, the
		// sandbox's own link too (so this check can tell them apart).
		const df = "FROM base:test\nRUN awk -F: 'NR>2{gsub(/ /,\"\",$1); print $1}' /proc/net/dev | sort | tr '\\n' ' ' > /ifaces\n"
		for _, tc := range []struct {
			name   string
			policy *corral.NetworkPolicy
			want   func(string) bool
		}{
			{"rt-net-none", nil, func(s string) bool { return s == "lo " }},
			{"rt-net-allow", &corral.NetworkPolicy{Allow: []string{"203.0.113.7:80"}}, func(s string) bool { return strings.Contains(s, "lo ") && s != "lo " }},
		} {
			b, err := p.Client.StartBuild(ctx, corral.BuildRequest{Name: tc.name, Dockerfile: df, Runtime: rt, Network: tc.policy}, nil)
			noErr(t, err)
			if end := wait(b); end.State != corral.BuildSucceeded {
				t.Fatalf("build: %s", end.Error)
			}
			sb := p.create(corral.CreateRequest{Environment: tc.name, Runtime: rt})
			got := p.sh(sb.ID, "cat /ifaces")
			p.Client.DeleteSandbox(ctx, sb.ID)
			if !tc.want(got) {
				t.Errorf("%s: a RUN step saw interfaces %q", tc.name, got)
			}
		}
	})

	t.Run("no build sandbox outlives its build", func(t *testing.T) {
		eventually(t, 30*time.Second, "build sandboxes gone", func() bool {
			list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{State: corral.StateRunning})
			noErr(t, err)
			for _, s := range list {
				if s.Labels["corral.build"] != "" {
					return false
				}
			}
			return true
		})
	})
}
