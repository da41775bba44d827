// Package conformance is the API conformance suite: cases written once against the Go SDK that
// run both against the SDK's fake server (corraltest, in this module's tests) and against a real
// `corral up` (internal/e2e's TestAPIConformance), so the fake cannot drift from the server
// without a test failing.
//
// The real server is the reference. A case asserts what a client can rely on: the HTTP status
// and error code of each failure (and the field it names, where the server names one), the
// fields a response echoes back, and the state a request leaves behind. Cases use only programs
// both sides run (echo, cat, true, false, env), names of their own (so they may share a server
// with other tests), and no timings.
package conformance

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// Target is the server a run talks to.
type Target struct {
	// URL is the server's base URL and Token an administrator's token for it (the suite sends a
	// few malformed requests the SDK cannot).
	URL, Token string
	// Client is a client of URL with Token.
	Client *corral.Client
	// Base is a published base layer ("NAME:VERSION") sandboxes are created on.
	Base string
}

// Run runs every case against target, each as a subtest.
func Run(t *testing.T, target Target) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &suite{Target: target, t: t, ctx: t.Context(), uniq: randHex(4)}
			c.run(s)
		})
	}
}

// cases lists the suite's cases in the order they run.
var cases = []struct {
	name string
	run  func(s *suite)
}{
	{"SandboxLifecycle", sandboxLifecycle},
	{"SandboxCreateInvalid", sandboxCreateInvalid},
	{"SandboxMissing", sandboxMissing},
	{"SandboxDeleted", sandboxDeleted},
	{"Exec", execCase},
	{"ExecInvalid", execInvalid},
	{"Commands", commands},
	{"Fork", fork},
	{"Files", files},
	{"FilesMissing", filesMissing},
	{"FilesTar", filesTar},
	{"Layers", layersCase},
	{"LayersInvalid", layersInvalid},
	{"LayerTags", layerTags},
	{"Environments", environments},
	{"Unauthorized", unauthorized},
	{"Projects", projects},
	{"Tokens", tokens},
	{"Quota", quota},
	{"AuditPaging", auditPaging},
	{"Info", info},
}

// suite is one case's view of the target.
type suite struct {
	Target
	t   *testing.T
	ctx context.Context
	// uniq makes the case's names its own.
	uniq string
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// create makes a sandbox on the target's base with req's other fields; it is deleted when the
// case ends.
func (s *suite) create(req corral.CreateRequest) *corral.Sandbox {
	s.t.Helper()
	if req.Base == "" && req.Environment == "" {
		req.Base = s.Base
	}
	sb, err := s.Client.CreateSandbox(s.ctx, req)
	if err != nil {
		s.t.Fatalf("create sandbox: %v", err)
	}
	s.t.Cleanup(func() { s.Client.DeleteSandbox(context.Background(), sb.ID) })
	return sb
}

// wantError fails the case unless err is an API error with this status and code, and (when
// field is not empty) names field.
func (s *suite) wantError(what string, err error, status int, code, field string) {
	s.t.Helper()
	var e *corral.APIError
	if !errors.As(err, &e) {
		s.t.Errorf("%s: err = %v, want an API error %d %s", what, err, status, code)
		return
	}
	if e.Status != status || e.Code != code {
		s.t.Errorf("%s: got %d %s (%q), want %d %s", what, e.Status, e.Code, e.Message, status, code)
	}
	if field != "" && e.Field != field {
		s.t.Errorf("%s: field = %q, want %q (message %q)", what, e.Field, field, e.Message)
	}
	if e.Message == "" {
		s.t.Errorf("%s: the error has no message", what)
	}
}

// raw sends a request the SDK would not, and returns the response's status and decoded error.
func (s *suite) raw(method, path, token string, body []byte) (int, corral.Error) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.ctx, method, s.URL+path, bytes.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var e corral.Error
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &e)
	return resp.StatusCode, e
}

// getJSON GETs path with the target's token and decodes the JSON answer into v.
func (s *suite) getJSON(path string, v any) error {
	req, err := http.NewRequestWithContext(s.ctx, http.MethodGet, s.URL+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// run executes argv in sandbox id with stdin and returns stdout, stderr and the exit code.
func (s *suite) run(id string, stdin string, env []string, argv ...string) (string, string, int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	st, err := s.Client.ExecStream(ctx, id, corral.ExecRequest{Argv: argv, Env: env}, strings.NewReader(stdin))
	if err != nil {
		s.t.Fatalf("exec %q: %v", argv, err)
	}
	defer st.Close()
	var stdout, stderr bytes.Buffer
	exit, err := st.Copy(&stdout, &stderr)
	if err != nil {
		s.t.Fatalf("exec %q: %v", argv, err)
	}
	return stdout.String(), stderr.String(), exit.Code
}

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

// eventually polls cond until it holds, failing the case after a minute.
func (s *suite) eventually(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
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

func execCase(s *suite) {
	sb := s.create(corral.CreateRequest{Env: []string{"FROM_CREATE=yes"}})
	if out, _, code := s.run(sb.ID, "", nil, "echo", "hello", "world"); out != "hello world\n" || code != 0 {
		s.t.Errorf("echo hello world: %q exit %d, want %q exit 0", out, code, "hello world\n")
	}
	if out, _, code := s.run(sb.ID, "from stdin\n", nil, "cat"); out != "from stdin\n" || code != 0 {
		s.t.Errorf("cat: %q exit %d, want %q exit 0", out, code, "from stdin\n")
	}
	if _, _, code := s.run(sb.ID, "", nil, "false"); code != 1 {
		s.t.Errorf("false: exit %d, want 1", code)
	}
	out, _, _ := s.run(sb.ID, "", []string{"FROM_EXEC=also"}, "env")
	for _, want := range []string{"FROM_CREATE=yes", "FROM_EXEC=also"} {
		if !slices.Contains(strings.Split(out, "\n"), want) {
			s.t.Errorf("env: %q lacks %s", out, want)
		}
	}

	_, _, _, err := s.Client.Run(s.ctx, sb.ID, corral.ExecRequest{})
	s.wantError("exec without argv", err, http.StatusBadRequest, corral.CodeInvalid, "argv")

	cmd, err := s.Client.StartCommand(s.ctx, sb.ID, corral.ExecRequest{Argv: []string{"echo", "detached"}})
	if err != nil {
		s.t.Fatalf("start command: %v", err)
	}
	st, err := s.Client.Attach(s.ctx, sb.ID, cmd.ID, 0, true)
	if err != nil {
		s.t.Fatalf("attach: %v", err)
	}
	var stdout bytes.Buffer
	exit, err := st.Copy(&stdout, io.Discard)
	st.Close()
	if err != nil || exit.Code != 0 || stdout.String() != "detached\n" {
		s.t.Errorf("attach to echo detached: %q exit %+v err %v", stdout.String(), exit, err)
	}
	got, err := s.Client.Command(s.ctx, sb.ID, cmd.ID)
	if err != nil {
		s.t.Fatalf("get command: %v", err)
	}
	if got.ID != cmd.ID || got.Exit == nil || got.Exit.Code != 0 {
		s.t.Errorf("finished command = %+v, want %s with exit 0", got, cmd.ID)
	}
	cmds, err := s.Client.Commands(s.ctx, sb.ID)
	if err != nil {
		s.t.Fatalf("list commands: %v", err)
	}
	if !slices.ContainsFunc(cmds, func(c corral.Command) bool { return c.ID == cmd.ID }) {
		s.t.Errorf("commands = %+v, want one with id %s", cmds, cmd.ID)
	}
	_, err = s.Client.Command(s.ctx, sb.ID, "cmd-conformance-missing")
	s.wantError("get a missing command", err, http.StatusNotFound, corral.CodeNotFound, "")
}

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
		// The real server names field "name" for a bad version too (issue 29 item 5's report), so
		// the field is not checked here.
		{"a version with a colon", name, "1:2", corral.KindToolkit, ""},
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

func unauthorized(s *suite) {
	for _, token := range []string{"", "not-a-token"} {
		c := corral.New(s.URL, token)
		_, err := c.ListSandboxes(s.ctx, corral.ListOptions{})
		s.wantError("list sandboxes with token "+token, err, http.StatusUnauthorized, corral.CodeUnauthorized, "")
		_, err = c.CreateSandbox(s.ctx, corral.CreateRequest{Base: s.Base})
		s.wantError("create with token "+token, err, http.StatusUnauthorized, corral.CodeUnauthorized, "")
	}
}

func execInvalid(s *suite) {
	sb := s.create(corral.CreateRequest{})
	if out, _, code := s.run(sb.ID, "", nil, "pwd"); code != 0 || out == "" {
		s.t.Errorf("pwd: %q exit %d, want a directory and exit 0", out, code)
	}
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	out, _, exit, err := s.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp"})
	if err != nil || exit.Code != 0 || string(out) != "/tmp\n" {
		s.t.Errorf("pwd in /tmp: %q exit %+v err %v, want /tmp", out, exit, err)
	}
	_, _, _, err = s.Client.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"conformance-no-such-program"}})
	s.wantError("exec of a missing program", err, http.StatusBadRequest, corral.CodeInvalid, "argv")
	for _, b := range []struct {
		what  string
		req   corral.ExecRequest
		field string
	}{
		{"a timeout that is no duration", corral.ExecRequest{Argv: []string{"true"}, Timeout: "a while"}, "timeout"},
		{"a relative cwd", corral.ExecRequest{Argv: []string{"true"}, Cwd: "tmp"}, "cwd"},
		{"env without =", corral.ExecRequest{Argv: []string{"true"}, Env: []string{"NOEQUALS"}}, "env[0]"},
	} {
		_, _, _, err := s.Client.Run(ctx, sb.ID, b.req)
		s.wantError("exec with "+b.what, err, http.StatusBadRequest, corral.CodeInvalid, b.field)
	}
	status, e := s.raw(http.MethodPost, "/v1/sandboxes/"+sb.ID+"/exec", s.Token, []byte(`{"argv":["true"],"bogus_field":1}`))
	if status != http.StatusBadRequest || e.Code != corral.CodeInvalid {
		s.t.Errorf("exec with an unknown field: %d %q, want 400 invalid", status, e.Code)
	}
}

func commands(s *suite) {
	sb := s.create(corral.CreateRequest{})
	cmd, err := s.Client.StartCommand(s.ctx, sb.ID, corral.ExecRequest{Argv: []string{"sleep", "600"}})
	if err != nil {
		s.t.Fatalf("start sleep: %v", err)
	}
	got, err := s.Client.Command(s.ctx, sb.ID, cmd.ID)
	if err != nil {
		s.t.Fatalf("get command: %v", err)
	}
	if got.State != "running" || got.Exit != nil {
		s.t.Errorf("sleeping command = state %q exit %+v, want running without an exit", got.State, got.Exit)
	}
	err = s.Client.Signal(s.ctx, sb.ID, cmd.ID, "NOSUCHSIGNAL")
	s.wantError("signal with an unknown signal", err, http.StatusBadRequest, corral.CodeInvalid, "signal")
	if err := s.Client.Signal(s.ctx, sb.ID, cmd.ID, "SIGKILL"); err != nil {
		s.t.Fatalf("signal SIGKILL: %v", err)
	}
	s.eventually("the killed command to exit", func() bool {
		got, err = s.Client.Command(s.ctx, sb.ID, cmd.ID)
		return err == nil && got.Exit != nil
	})
	if got.State != "exited" || got.Exit.Signal == "" {
		s.t.Errorf("killed command = state %q exit %+v, want exited by a signal", got.State, got.Exit)
	}
	err = s.Client.Signal(s.ctx, sb.ID, cmd.ID, "SIGTERM")
	s.wantError("signal an exited command", err, http.StatusConflict, corral.CodeConflict, "")
	err = s.Client.Signal(s.ctx, sb.ID, "cmd-conformance-missing", "SIGTERM")
	s.wantError("signal a missing command", err, http.StatusNotFound, corral.CodeNotFound, "")

	// Stdin of a started command, then end of input.
	cat, err := s.Client.StartCommand(s.ctx, sb.ID, corral.ExecRequest{Argv: []string{"cat"}, OpenStdin: true})
	if err != nil {
		s.t.Fatalf("start cat: %v", err)
	}
	if err := s.Client.WriteStdin(s.ctx, sb.ID, cat.ID, strings.NewReader("to stdin\n"), true); err != nil {
		s.t.Fatalf("write stdin: %v", err)
	}
	st, err := s.Client.Attach(s.ctx, sb.ID, cat.ID, 0, true)
	if err != nil {
		s.t.Fatalf("attach: %v", err)
	}
	var stdout bytes.Buffer
	exit, err := st.Copy(&stdout, io.Discard)
	st.Close()
	if err != nil || exit.Code != 0 || stdout.String() != "to stdin\n" {
		s.t.Errorf("cat of written stdin: %q exit %+v err %v, want %q exit 0", stdout.String(), exit, err, "to stdin\n")
	}
	err = s.Client.WriteStdin(s.ctx, sb.ID, cat.ID, strings.NewReader("late"), false)
	s.wantError("write stdin of an exited command", err, http.StatusConflict, corral.CodeConflict, "")
}

func info(s *suite) {
	if err := s.Client.Health(s.ctx); err != nil {
		s.t.Errorf("health: %v", err)
	}
	if err := corral.New(s.URL, "").Health(s.ctx); err != nil {
		s.t.Errorf("health without a token: %v (want it open)", err)
	}
	in, err := s.Client.Info(s.ctx)
	if err != nil {
		s.t.Fatalf("info: %v", err)
	}
	if in.Version == "" || in.Node == "" || in.Runtime == "" {
		s.t.Errorf("info = %+v, want a version, a node and a runtime", in)
	}
	_, err = s.Client.ListSandboxes(s.ctx, corral.ListOptions{Labels: map[string]string{"": "x"}})
	s.wantError("list with an empty label key", err, http.StatusBadRequest, corral.CodeInvalid, "label")
	status, e := s.raw(http.MethodGet, "/v1/conformance-no-such-route", s.Token, nil)
	if status != http.StatusNotFound || e.Code != corral.CodeNotFound || e.Message == "" {
		s.t.Errorf("an unknown route: %d %+v, want a JSON 404 not_found", status, e)
	}
	_, err = s.Client.ListSandboxes(s.ctx, corral.ListOptions{State: "sideways"})
	s.wantError("list with an unknown state", err, http.StatusBadRequest, corral.CodeInvalid, "state")
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

// project creates the case's own project, conformance-UNIQ (a path as the server shows it: no
// leading slash), deleted with its sandboxes when the case ends.
func (s *suite) project() string {
	s.t.Helper()
	path := "conformance-" + s.uniq
	p, err := s.Client.CreateProject(s.ctx, path)
	if err != nil {
		s.t.Fatalf("create project: %v", err)
	}
	if p.Path != path {
		s.t.Errorf("created project path = %q, want %q", p.Path, path)
	}
	s.t.Cleanup(func() { s.Client.DeleteProject(context.Background(), path, true) })
	return path
}

func projects(s *suite) {
	path := s.project()
	_, err := s.Client.CreateProject(s.ctx, path)
	s.wantError("create a project that exists", err, http.StatusConflict, corral.CodeConflict, "")
	_, err = s.Client.CreateProject(s.ctx, path+"-none/child")
	s.wantError("create a project under a missing parent", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.CreateProject(s.ctx, "/Not A Name")
	s.wantError("create a project with a bad name", err, http.StatusBadRequest, corral.CodeInvalid, "path")
	child, err := s.Client.CreateProject(s.ctx, path+"/child")
	if err != nil {
		s.t.Fatalf("create a child project: %v", err)
	}
	if child.Parent != path {
		s.t.Errorf("child's parent = %q, want %q", child.Parent, path)
	}
	got, err := s.Client.Project(s.ctx, path)
	if err != nil {
		s.t.Fatalf("get project: %v", err)
	}
	if got.Path != path || got.Sandboxes != 0 {
		s.t.Errorf("project = %+v, want %s without sandboxes", got, path)
	}
	under, err := s.Client.Projects(s.ctx, path)
	if err != nil {
		s.t.Fatalf("list projects: %v", err)
	}
	var paths []string
	for _, p := range under {
		paths = append(paths, p.Path)
	}
	if !slices.Equal(paths, []string{path, path + "/child"}) {
		s.t.Errorf("projects under %s = %v, want it and its child, parent first", path, paths)
	}
	_, err = s.Client.Project(s.ctx, path+"-none")
	s.wantError("get a missing project", err, http.StatusNotFound, corral.CodeNotFound, "")

	sb := s.create(corral.CreateRequest{Project: path})
	if sb.Project != path {
		s.t.Errorf("sandbox project = %q, want %q", sb.Project, path)
	}
	in, err := s.Client.ListSandboxes(s.ctx, corral.ListOptions{Project: path})
	if err != nil {
		s.t.Fatalf("list sandboxes of the project: %v", err)
	}
	if !slices.Equal(ids(in), []string{sb.ID}) {
		s.t.Errorf("sandboxes of %s = %v, want [%s]", path, ids(in), sb.ID)
	}
	err = s.Client.DeleteProject(s.ctx, path, false)
	s.wantError("delete a project with a live sandbox", err, http.StatusConflict, corral.CodeConflict, "")
	if err := s.Client.DeleteProject(s.ctx, path, true); err != nil {
		s.t.Fatalf("delete a project with force: %v", err)
	}
	_, err = s.Client.Project(s.ctx, path+"/child")
	s.wantError("get a deleted project's child", err, http.StatusNotFound, corral.CodeNotFound, "")
}

func tokens(s *suite) {
	path := s.project()
	tok, err := s.Client.CreateToken(s.ctx, corral.TokenRequest{Project: path, Role: corral.RoleViewer, Kind: "agent", Name: "viewer-" + s.uniq})
	if err != nil {
		s.t.Fatalf("mint a viewer token: %v", err)
	}
	if tok.Token == "" || tok.ID == "" || tok.Project != path || tok.Principal == "" {
		s.t.Errorf("minted token = %+v, want a secret, an id, project %s and a principal", tok, path)
	}
	viewer := corral.New(s.URL, tok.Token)
	who, err := viewer.Whoami(s.ctx)
	if err != nil {
		s.t.Fatalf("whoami: %v", err)
	}
	if who.Token.ID != tok.ID || who.Principal.Name != tok.Principal || !slices.Contains(who.Permissions, corral.PermSandboxRead) ||
		slices.Contains(who.Permissions, corral.PermSandboxCreate) {
		s.t.Errorf("whoami = %+v, want token %s of %s, reading but not creating sandboxes", who, tok.ID, tok.Principal)
	}
	if _, err := viewer.ListSandboxes(s.ctx, corral.ListOptions{}); err != nil {
		s.t.Errorf("a viewer lists sandboxes: %v", err)
	}
	_, err = viewer.CreateSandbox(s.ctx, corral.CreateRequest{Base: s.Base})
	s.wantError("a viewer creates a sandbox", err, http.StatusForbidden, corral.CodeDenied, "")
	if e, ok := errors.AsType[*corral.APIError](err); ok && e.Permission != corral.PermSandboxCreate {
		s.t.Errorf("a viewer's refused create names permission %q, want %q", e.Permission, corral.PermSandboxCreate)
	}
	_, err = viewer.CreateToken(s.ctx, corral.TokenRequest{Project: path, Role: corral.RoleAdmin})
	s.wantError("a viewer mints an admin token", err, http.StatusForbidden, corral.CodeDenied, "")
	_, err = s.Client.CreateToken(s.ctx, corral.TokenRequest{Project: path, Role: "emperor"})
	s.wantError("mint a token of an unknown role", err, http.StatusBadRequest, corral.CodeInvalid, "role")

	if _, err := s.Client.RevokeToken(s.ctx, tok.ID); err != nil {
		s.t.Fatalf("revoke token: %v", err)
	}
	_, err = viewer.ListSandboxes(s.ctx, corral.ListOptions{})
	s.wantError("a revoked token lists sandboxes", err, http.StatusUnauthorized, corral.CodeUnauthorized, "")
	_, err = s.Client.RevokeToken(s.ctx, "tok-conformance-missing")
	s.wantError("revoke a missing token", err, http.StatusNotFound, corral.CodeNotFound, "")
}

func quota(s *suite) {
	path := s.project()
	one := int64(1)
	q, err := s.Client.SetQuota(s.ctx, path, corral.Quota{Sandboxes: &one})
	if err != nil {
		s.t.Fatalf("set quota: %v", err)
	}
	if q.Limit.Sandboxes == nil || *q.Limit.Sandboxes != 1 {
		s.t.Errorf("quota limit = %+v, want sandboxes 1", q.Limit)
	}
	s.create(corral.CreateRequest{Project: path})
	_, err = s.Client.CreateSandbox(s.ctx, corral.CreateRequest{Base: s.Base, Project: path})
	s.wantError("create beyond the sandboxes quota", err, http.StatusTooManyRequests, corral.CodeExhausted, "")
	if e, ok := errors.AsType[*corral.APIError](err); ok && (e.Quota == nil || e.Quota.Resource != "sandboxes" || e.Quota.Project != path) {
		s.t.Errorf("refusal's quota = %+v, want resource sandboxes of %s", e.Quota, path)
	}
	got, err := s.Client.Quota(s.ctx, path)
	if err != nil {
		s.t.Fatalf("get quota: %v", err)
	}
	if got.Usage.Sandboxes != 1 {
		s.t.Errorf("quota usage = %+v, want 1 sandbox", got.Usage)
	}
	neg := int64(-1)
	_, err = s.Client.SetQuota(s.ctx, path, corral.Quota{Sandboxes: &neg})
	s.wantError("set a negative quota", err, http.StatusBadRequest, corral.CodeInvalid, "sandboxes")
	_, err = s.Client.SetQuota(s.ctx, path, corral.Quota{Tiers: map[string]int64{"mainframe": 1}})
	s.wantError("set a quota of an unknown tier", err, http.StatusBadRequest, corral.CodeInvalid, "tiers")
}

func auditPaging(s *suite) {
	path := s.project()
	for i := range 3 {
		if _, err := s.Client.CreateProject(s.ctx, path+"/p"+string(rune('a'+i))); err != nil {
			s.t.Fatalf("create project: %v", err)
		}
	}
	first, err := s.Client.Audit(s.ctx, corral.AuditQuery{Project: path, Action: "project.", Limit: 2})
	if err != nil {
		s.t.Fatalf("audit: %v", err)
	}
	if len(first) != 2 || first[0].ID <= first[1].ID {
		s.t.Fatalf("audit page of 2 = %+v, want 2 entries, newest first", first)
	}
	rest, err := s.Client.Audit(s.ctx, corral.AuditQuery{Project: path, Action: "project.", Before: first[1].ID})
	if err != nil {
		s.t.Fatalf("audit: %v", err)
	}
	if len(rest) == 0 || rest[0].ID >= first[1].ID {
		s.t.Errorf("audit page before %d = %+v, want older entries", first[1].ID, rest)
	}
	for _, e := range append(first, rest...) {
		if e.Result != "ok" || !strings.HasPrefix(e.Action, "project.") {
			s.t.Errorf("audit entry %+v: want an ok project action", e)
		}
	}
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
