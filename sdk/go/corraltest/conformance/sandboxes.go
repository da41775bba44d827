package conformance

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

func sandboxLifecycle(s *suite) {
	label := "conformance-" + s.uniq
	sb := s.create(corral.CreateRequest{
		Labels: map[string]string{"case": label},
		Env:    []string{"CONFORMANCE=1"},
		TTL:    "10m",
	})
	switch {
	case sb.ID == "":
		s.t.Fatal("created sandbox has no id")
	case sb.State != corral.StateRunning:
		s.t.Errorf("created state = %q, want %q", sb.State, corral.StateRunning)
	case sb.Base != s.Base:
		s.t.Errorf("created base = %q, want %q", sb.Base, s.Base)
	case sb.Labels["case"] != label:
		s.t.Errorf("created labels = %v, want case=%s", sb.Labels, label)
	case sb.CreatedAt.IsZero() || !sb.ExpiresAt.After(sb.CreatedAt):
		s.t.Errorf("created at %v, expires at %v: want a creation time and a later expiry", sb.CreatedAt, sb.ExpiresAt)
	case sb.Hostname == "":
		s.t.Errorf("created sandbox has no hostname")
	}

	got, err := s.Client.GetSandbox(s.ctx, sb.ID)
	if err != nil {
		s.t.Fatalf("get sandbox: %v", err)
	}
	if got.ID != sb.ID || got.State != corral.StateRunning || got.Base != s.Base {
		s.t.Errorf("get = %s %s %s, want %s running %s", got.ID, got.State, got.Base, sb.ID, s.Base)
	}

	list, err := s.Client.ListSandboxes(s.ctx, corral.ListOptions{Labels: map[string]string{"case": label}})
	if err != nil {
		s.t.Fatalf("list sandboxes: %v", err)
	}
	if len(list) != 1 || list[0].ID != sb.ID {
		s.t.Errorf("list by label case=%s = %v, want only %s", label, ids(list), sb.ID)
	}
	all, err := s.Client.ListSandboxes(s.ctx, corral.ListOptions{State: corral.StateRunning})
	if err != nil {
		s.t.Fatalf("list running sandboxes: %v", err)
	}
	if !slices.Contains(ids(all), sb.ID) {
		s.t.Errorf("list running = %v, want it to hold %s", ids(all), sb.ID)
	}
	other, err := s.Client.ListSandboxes(s.ctx, corral.ListOptions{Labels: map[string]string{"case": label + "-other"}})
	if err != nil {
		s.t.Fatalf("list sandboxes: %v", err)
	}
	if len(other) != 0 {
		s.t.Errorf("list by an unused label = %v, want none", ids(other))
	}

	ttl, err := s.Client.SetTTL(s.ctx, sb.ID, 20*time.Minute)
	if err != nil {
		s.t.Fatalf("set ttl: %v", err)
	}
	if !ttl.ExpiresAt.After(sb.ExpiresAt) {
		s.t.Errorf("after set ttl 20m, expires at %v, not after %v", ttl.ExpiresAt, sb.ExpiresAt)
	}

	for _, bad := range []string{`{"ttl":"soon"}`, `{"ttl":"-1m"}`, `{}`} {
		status, e := s.raw(http.MethodPost, "/v1/sandboxes/"+sb.ID+"/ttl", s.Token, []byte(bad))
		if status != http.StatusBadRequest || e.Code != corral.CodeInvalid || e.Field != "ttl" {
			s.t.Errorf("set ttl %s: %d %+v, want 400 invalid on ttl", bad, status, e)
		}
	}

	del, err := s.Client.DeleteSandbox(s.ctx, sb.ID)
	if err != nil {
		s.t.Fatalf("delete sandbox: %v", err)
	}
	if del.ID != sb.ID {
		s.t.Errorf("delete answered sandbox %q, want %q", del.ID, sb.ID)
	}
	s.eventually("the deleted sandbox to stop", func() bool {
		got, err := s.Client.GetSandbox(s.ctx, sb.ID)
		return (err == nil && got.State == corral.StateStopped) || corral.IsNotFound(err)
	})
	// state is repeatable, and any may match.
	var both struct{ Sandboxes []corral.Sandbox }
	if err := s.getJSON("/v1/sandboxes?state=running&state=stopped&label=case%3D"+label, &both); err != nil {
		s.t.Fatalf("list running or stopped: %v", err)
	}
	if !slices.Equal(ids(both.Sandboxes), []string{sb.ID}) {
		s.t.Errorf("list running or stopped = %v, want the stopped %s", ids(both.Sandboxes), sb.ID)
	}
	running, err := s.Client.ListSandboxes(s.ctx, corral.ListOptions{State: corral.StateRunning, Labels: map[string]string{"case": label}})
	if err != nil {
		s.t.Fatalf("list sandboxes: %v", err)
	}
	if len(running) != 0 {
		s.t.Errorf("running sandboxes after delete = %v, want none", ids(running))
	}
}

func ids(sbs []corral.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID)
	}
	return out
}

func sandboxCreateInvalid(s *suite) {
	label := "conformance-" + s.uniq
	bad := []struct {
		what  string
		req   corral.CreateRequest
		field string
	}{
		{"no base", corral.CreateRequest{}, "base"},
		{"ttl not a duration", corral.CreateRequest{Base: s.Base, TTL: "soon"}, "ttl"},
		{"negative ttl", corral.CreateRequest{Base: s.Base, TTL: "-1m"}, "ttl"},
		{"idle_ttl not a duration", corral.CreateRequest{Base: s.Base, IdleTTL: "later"}, "idle_ttl"},
		{"unknown runtime", corral.CreateRequest{Base: s.Base, Runtime: "nope"}, "runtime"},
		{"unknown tier", corral.CreateRequest{Base: s.Base, Tier: "mainframe"}, "tier"},
		{"env without =", corral.CreateRequest{Base: s.Base, Env: []string{"A=1", "NOEQUALS"}}, "env[1]"},
		// A missing layer named in the body is invalid input (400), not a missing URL (404).
		{"missing base layer", corral.CreateRequest{Base: "conformance-none-" + s.uniq + ":1"}, "base"},
		{"missing toolkit layer", corral.CreateRequest{Base: s.Base, Toolkits: []string{"conformance-none-" + s.uniq + ":1"}}, "toolkits[0]"},
		{"missing environment", corral.CreateRequest{Environment: "conformance-none-" + s.uniq}, "environment"},
		{"base that is no layer reference", corral.CreateRequest{Base: "no-version"}, "base"},
	}
	for _, b := range bad {
		b.req.Labels = map[string]string{"case": label}
		_, err := s.Client.CreateSandbox(s.ctx, b.req)
		s.wantError("create with "+b.what, err, http.StatusBadRequest, corral.CodeInvalid, b.field)
	}

	status, e := s.raw(http.MethodPost, "/v1/sandboxes", s.Token, []byte(`{"base":"`+s.Base+`","bogus_field":1}`))
	if status != http.StatusBadRequest || e.Code != corral.CodeInvalid {
		s.t.Errorf("create with an unknown field: %d %q, want 400 invalid", status, e.Code)
	}
	status, e = s.raw(http.MethodPost, "/v1/sandboxes", s.Token, []byte(`{"base":`))
	if status != http.StatusBadRequest || e.Code != corral.CodeInvalid {
		s.t.Errorf("create with a truncated body: %d %q, want 400 invalid", status, e.Code)
	}

	// No state changed: no sandbox carries the case's label.
	list, err := s.Client.ListSandboxes(s.ctx, corral.ListOptions{Labels: map[string]string{"case": label}})
	if err != nil {
		s.t.Fatalf("list sandboxes: %v", err)
	}
	if len(list) != 0 {
		s.t.Errorf("refused creates left sandboxes %v", ids(list))
	}
}

// missingID returns an ID of the shape of like, a real sandbox's, that no sandbox has.
func missingID(like string) string {
	if i := strings.LastIndexByte(like, '-'); i > 0 && len(like)-i-1 == 16 {
		tail := "aaaaaaaaaaaaaaaa"
		if like[i+1:] == tail {
			tail = "bbbbbbbbbbbbbbbb"
		}
		return like[:i+1] + tail
	}
	return like + "0000"
}

func sandboxMissing(s *suite) {
	sb := s.create(corral.CreateRequest{})
	id := missingID(sb.ID)
	_, err := s.Client.GetSandbox(s.ctx, id)
	s.wantError("get a missing sandbox", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.DeleteSandbox(s.ctx, id)
	s.wantError("delete a missing sandbox", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, _, _, err = s.Client.Run(s.ctx, id, corral.ExecRequest{Argv: []string{"true"}})
	s.wantError("exec in a missing sandbox", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.SetTTL(s.ctx, id, time.Hour)
	s.wantError("set the ttl of a missing sandbox", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.Stat(s.ctx, id, "/tmp")
	s.wantError("stat in a missing sandbox", err, http.StatusNotFound, corral.CodeNotFound, "")

	// An ID of another shape is refused before any look-up.
	for _, bad := range []string{"not-a-sandbox", "sb-", "sb-NODE-" + strings.Repeat("a", 16)} {
		_, err = s.Client.GetSandbox(s.ctx, bad)
		s.wantError("get sandbox "+bad, err, http.StatusBadRequest, corral.CodeInvalid, "id")
		_, err = s.Client.DeleteSandbox(s.ctx, bad)
		s.wantError("delete sandbox "+bad, err, http.StatusBadRequest, corral.CodeInvalid, "id")
	}
}

func sandboxDeleted(s *suite) {
	sb := s.create(corral.CreateRequest{})
	if _, err := s.Client.DeleteSandbox(s.ctx, sb.ID); err != nil {
		s.t.Fatalf("delete sandbox: %v", err)
	}
	s.eventually("the deleted sandbox to stop", func() bool {
		got, err := s.Client.GetSandbox(s.ctx, sb.ID)
		return (err == nil && got.State == corral.StateStopped) || corral.IsNotFound(err)
	})
	_, _, _, err := s.Client.Run(s.ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}})
	s.wantError("exec in a deleted sandbox", err, http.StatusConflict, corral.CodeConflict, "")
	_, err = s.Client.WriteFile(s.ctx, sb.ID, "/tmp/x", strings.NewReader("x"), corral.WriteFileOptions{})
	s.wantError("write a file in a deleted sandbox", err, http.StatusConflict, corral.CodeConflict, "")
	_, err = s.Client.SetTTL(s.ctx, sb.ID, time.Hour)
	s.wantError("set the ttl of a deleted sandbox", err, http.StatusConflict, corral.CodeConflict, "")
}

func fork(s *suite) {
	sb := s.create(corral.CreateRequest{Labels: map[string]string{"case": "fork-" + s.uniq}})
	if _, err := s.Client.WriteFile(s.ctx, sb.ID, "/tmp/before-fork", strings.NewReader("kept"), corral.WriteFileOptions{}); err != nil {
		s.t.Fatalf("write file: %v", err)
	}
	// runc cannot checkpoint processes: a fork of a running runc sandbox copies its disk only.
	_, err := s.Client.Fork(s.ctx, sb.ID, corral.ForkRequest{})
	s.wantError("fork a runc sandbox with its processes", err, http.StatusConflict, corral.CodeConflict, "")
	forks, err := s.Client.Fork(s.ctx, sb.ID, corral.ForkRequest{Count: 2, DiskOnly: true, Labels: map[string]string{"copy": "yes"}})
	if err != nil {
		s.t.Fatalf("fork: %v", err)
	}
	for _, f := range forks {
		s.t.Cleanup(func() { s.Client.DeleteSandbox(context.Background(), f.ID) })
	}
	if len(forks) != 2 {
		s.t.Fatalf("fork of 2 answered %d sandboxes", len(forks))
	}
	for _, f := range forks {
		if f.ID == sb.ID || f.State != corral.StateRunning || f.Base != s.Base || f.Labels["copy"] != "yes" {
			s.t.Errorf("fork = %s %s base %s labels %v, want a new running sandbox on %s labelled copy=yes", f.ID, f.State, f.Base, f.Labels, s.Base)
		}
		rc, err := s.Client.ReadFile(s.ctx, f.ID, "/tmp/before-fork")
		if err != nil {
			s.t.Errorf("read the parent's file in fork %s: %v", f.ID, err)
			continue
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "kept" {
			s.t.Errorf("fork %s: /tmp/before-fork = %q, want %q", f.ID, b, "kept")
		}
	}
	for _, n := range []int{-1, corral.MaxForkCount + 1} {
		_, err = s.Client.Fork(s.ctx, sb.ID, corral.ForkRequest{Count: n, DiskOnly: true})
		s.wantError(fmt.Sprintf("fork of %d", n), err, http.StatusBadRequest, corral.CodeInvalid, "count")
	}
	_, err = s.Client.Fork(s.ctx, missingID(sb.ID), corral.ForkRequest{DiskOnly: true})
	s.wantError("fork a missing sandbox", err, http.StatusNotFound, corral.CodeNotFound, "")
}
