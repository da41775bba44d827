package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

// result is what one CLI invocation produced.
type result struct {
	code           int
	stdout, stderr string
}

// cli runs the CLI in-process against srv with the given stdin (nil: none) and extra
// environment.
func cli(t *testing.T, srv *corraltest.Server, stdin io.Reader, env map[string]string, args ...string) result {
	t.Helper()
	return cliContext(t.Context(), t, srv, stdin, env, args...)
}

func cliContext(ctx context.Context, t *testing.T, srv *corraltest.Server, stdin io.Reader, env map[string]string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	full := map[string]string{"CORRAL_URL": srv.URL, "CORRAL_TOKEN": srv.Token}
	for k, v := range env {
		full[k] = v
	}
	var stdout, stderr bytes.Buffer
	a := &app{
		stdin:     stdin,
		stdout:    &stdout,
		stderr:    &stderr,
		getenv:    func(k string) string { return full[k] },
		tokenFile: filepath.Join(t.TempDir(), "no-token"),
		now:       time.Now,
	}
	code := a.run(ctx, args)
	return result{code, stdout.String(), stderr.String()}
}

// mustCreate creates a sandbox through the SDK and returns its ID.
func mustCreate(t *testing.T, srv *corraltest.Server) string {
	t.Helper()
	sb, err := srv.Client().CreateSandbox(t.Context(), corral.CreateRequest{Base: corraltest.DefaultBase})
	if err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

func checkResult(t *testing.T, got result, code int, stdout, stderrSub string) {
	t.Helper()
	if got.code != code {
		t.Errorf("exit code = %d, want %d (stderr %q)", got.code, code, got.stderr)
	}
	if stdout != "*" && got.stdout != stdout {
		t.Errorf("stdout = %q, want %q", got.stdout, stdout)
	}
	if !strings.Contains(got.stderr, stderrSub) {
		t.Errorf("stderr = %q, want it to contain %q", got.stderr, stderrSub)
	}
	if stderrSub == "" && got.stderr != "" {
		t.Errorf("stderr = %q, want nothing", got.stderr)
	}
}

// lastRequest returns the last request other than GET /healthz.
func lastRequest(t *testing.T, srv *corraltest.Server) corraltest.Request {
	t.Helper()
	reqs := srv.Requests()
	if len(reqs) == 0 {
		t.Fatal("no request reached the server")
	}
	return reqs[len(reqs)-1]
}

func TestCreate(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		code     int
		wantBody string // JSON of the create request, when the request is sent
		stderr   string
	}{
		{
			name:     "defaults",
			args:     []string{"create"},
			wantBody: `{"base":"base:default"}`,
		},
		{
			name: "every flag",
			args: []string{"create", "--base", "base:default", "--workspace", "ws:1", "--toolkit", "go:1.26", "--toolkit", "node:22",
				"--cpus", "1.5", "--memory", "512M", "--pids", "100", "--disk", "1GiB", "--open-files", "4096",
				"--output-limit", "1000000", "--env", "A=1,2", "--env", "B=", "--label", "team=infra", "--ttl", "2h",
				"--idle-ttl", "10m", "--hostname", "box", "--runtime", "gvisor"},
			wantBody: `{"runtime":"gvisor","base":"base:default","workspace":"ws:1","toolkits":["go:1.26","node:22"],` +
				`"limits":{"cpus":1.5,"memory_bytes":536870912,"pids":100,"disk_bytes":1073741824,"open_files":4096,"output_bytes":1000000},` +
				`"env":["A=1,2","B="],"labels":{"team":"infra"},"ttl":"2h","idle_ttl":"10m","hostname":"box"}`,
		},
		{
			name:     "base from CORRAL_BASE",
			args:     []string{"create"},
			env:      map[string]string{"CORRAL_BASE": "ubuntu:24.04"},
			code:     1,
			wantBody: `{"base":"ubuntu:24.04"}`,
			stderr:   "corral: base: layer ubuntu:24.04 is not published (see `corral layer ls`)",
		},
		{name: "bad size", args: []string{"create", "--memory", "12X"}, code: 2, stderr: "--memory"},
		{name: "bad label", args: []string{"create", "--label", "novalue"}, code: 2, stderr: `--label "novalue": want KEY=VALUE`},
		{name: "bad ref", args: []string{"create", "--base", "busybox"}, code: 2, stderr: "NAME:VERSION"},
		{name: "bad ttl", args: []string{"create", "--ttl", "soon"}, code: 2, stderr: "--ttl"},
		{name: "bad runtime", args: []string{"create", "--runtime", "kata"}, code: 2, stderr: `--runtime: "kata": want runc or gvisor`},
		{name: "unknown flag", args: []string{"create", "--nope"}, code: 2, stderr: "unknown flag: --nope"},
		{name: "extra argument", args: []string{"create", "x"}, code: 2, stderr: "Run 'corral create --help' for usage."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := corraltest.NewServer(t)
			srv.AddLayer("ws", "1", corral.KindWorkspace)
			srv.AddLayer("go", "1.26", corral.KindToolkit)
			srv.AddLayer("node", "22", corral.KindToolkit)
			got := cli(t, srv, nil, tt.env, tt.args...)
			if got.code != tt.code {
				t.Fatalf("exit code = %d, want %d (stderr %q)", got.code, tt.code, got.stderr)
			}
			if !strings.Contains(got.stderr, tt.stderr) {
				t.Errorf("stderr = %q, want it to contain %q", got.stderr, tt.stderr)
			}
			if tt.wantBody == "" {
				if lines := srv.RequestLines(); len(lines) != 0 {
					t.Errorf("a usage error sent requests: %v", lines)
				}
				return
			}
			r := lastRequest(t, srv)
			if r.String() != "POST /v1/sandboxes" || strings.TrimSpace(string(r.Body)) != tt.wantBody {
				t.Errorf("request = %s %s\nwant body %s", r, r.Body, tt.wantBody)
			}
			if tt.code == 0 && got.stdout != "sb-1\n" {
				t.Errorf("stdout = %q, want the ID", got.stdout)
			}
		})
	}
}

func TestJSONOutput(t *testing.T) {
	srv := corraltest.NewServer(t)

	got := cli(t, srv, nil, nil, "ls", "-o", "json")
	checkResult(t, got, 0, "[]\n", "")

	got = cli(t, srv, nil, nil, "create", "--label", "k=v", "-o", "json")
	checkResult(t, got, 0, "*", "")
	var sb corral.Sandbox
	if err := json.Unmarshal([]byte(got.stdout), &sb); err != nil || sb.ID == "" || sb.Labels["k"] != "v" {
		t.Fatalf("create -o json printed %q (%v); want a sandbox with an id", got.stdout, err)
	}
	if !strings.Contains(got.stdout, `"id": "`+sb.ID+`"`) {
		t.Errorf("create -o json lacks the id key: %s", got.stdout)
	}

	var one corral.Sandbox
	got = cli(t, srv, nil, nil, "get", sb.ID, "-o", "json")
	if err := json.Unmarshal([]byte(got.stdout), &one); err != nil || one.ID != sb.ID {
		t.Errorf("get -o json = %q (%v)", got.stdout, err)
	}

	var list []corral.Sandbox
	got = cli(t, srv, nil, nil, "-o", "json", "ls", "--label", "k=v", "--state", "running")
	if err := json.Unmarshal([]byte(got.stdout), &list); err != nil || len(list) != 1 || list[0].ID != sb.ID {
		t.Errorf("ls -o json = %q (%v); want an array of one sandbox", got.stdout, err)
	}
	if r := lastRequest(t, srv); r.String() != "GET /v1/sandboxes?label=k%3Dv&state=running" {
		t.Errorf("ls sent %s", r)
	}

	got = cli(t, srv, nil, nil, "ttl", sb.ID, "90m", "-o", "json")
	if err := json.Unmarshal([]byte(got.stdout), &one); err != nil || time.Until(one.ExpiresAt) < 80*time.Minute {
		t.Errorf("ttl -o json = %q (%v)", got.stdout, err)
	}
	if b := strings.TrimSpace(string(lastRequest(t, srv).Body)); b != `{"ttl":"1h30m0s"}` {
		t.Errorf("ttl body = %s", b)
	}

	var info corral.Info
	got = cli(t, srv, nil, nil, "info", "-o", "json")
	if err := json.Unmarshal([]byte(got.stdout), &info); err != nil || info.Runtime != "runc" {
		t.Errorf("info -o json = %q (%v)", got.stdout, err)
	}

	var removed []corral.Sandbox
	got = cli(t, srv, nil, nil, "rm", sb.ID, "-o", "json")
	if err := json.Unmarshal([]byte(got.stdout), &removed); err != nil || len(removed) != 1 || removed[0].Reason != corral.ReasonDeleted {
		t.Errorf("rm -o json = %q (%v)", got.stdout, err)
	}

	var layers []corral.Layer
	got = cli(t, srv, nil, nil, "layer", "ls", "-o", "json")
	if err := json.Unmarshal([]byte(got.stdout), &layers); err != nil || len(layers) != 1 || layers[0].Name != "base" {
		t.Errorf("layer ls -o json = %q (%v)", got.stdout, err)
	}
	var layer corral.Layer
	got = cli(t, srv, nil, nil, "layer", "get", "base:default", "-o", "json")
	if err := json.Unmarshal([]byte(got.stdout), &layer); err != nil || layer.Kind != corral.KindBase {
		t.Errorf("layer get -o json = %q (%v)", got.stdout, err)
	}

	checkResult(t, cli(t, srv, nil, nil, "ls", "-o", "yaml"), 2, "", "-o/--output must be table or json")
}

func TestTables(t *testing.T) {
	srv := corraltest.NewServer(t)
	id := mustCreate(t, srv)
	if _, err := srv.Client().CreateSandbox(t.Context(), corral.CreateRequest{
		Base: corraltest.DefaultBase, Labels: map[string]string{"b": "2", "a": "1"}, Limits: corral.Limits{MemoryBytes: 1 << 30},
	}); err != nil {
		t.Fatal(err)
	}

	got := cli(t, srv, nil, nil, "ls")
	checkResult(t, got, 0, "*", "")
	lines := strings.Split(strings.TrimSpace(got.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID    STATE    BASE          CREATED") {
		t.Fatalf("ls table:\n%s", got.stdout)
	}
	if !strings.Contains(lines[2], "a=1,b=2") || !strings.Contains(lines[1], "in 59m") {
		t.Errorf("ls rows lack labels or expiry:\n%s", got.stdout)
	}

	got = cli(t, srv, nil, nil, "get", "sb-2")
	for _, want := range []string{"ID:             sb-2\n", "State:          running\n", "Memory:         1GiB\n", "Labels:         a=1,b=2\n"} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("get table lacks %q:\n%s", want, got.stdout)
		}
	}

	got = cli(t, srv, nil, nil, "rm", id, "sb-99", "sb-2")
	checkResult(t, got, 1, id+"\nsb-2\n", "corral: sb-99: sandbox sb-99 not found")
	for _, id := range []string{id, "sb-2"} {
		if sb, _ := srv.Sandbox(id); sb.State != corral.StateStopped {
			t.Errorf("after rm, %s is %s", id, sb.State)
		}
	}
	got = cli(t, srv, nil, nil, "ls")
	if !strings.Contains(got.stdout, "stopped (deleted)") {
		t.Errorf("ls of deleted sandboxes:\n%s", got.stdout)
	}

	got = cli(t, srv, nil, nil, "info")
	if !strings.Contains(got.stdout, "Runtime:          runc\n") || !strings.Contains(got.stdout, "Server:           "+srv.URL) {
		t.Errorf("info table:\n%s", got.stdout)
	}
	got = cli(t, srv, nil, nil, "layer", "ls")
	if !strings.HasPrefix(got.stdout, "NAME  VERSION  KIND  SIZE  FILES  DIGEST") || !strings.Contains(got.stdout, "base  default  base") {
		t.Errorf("layer ls table:\n%s", got.stdout)
	}
}

func TestErrorsAndUsage(t *testing.T) {
	srv := corraltest.NewServer(t)
	id := mustCreate(t, srv)
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		code   int
		stderr string
	}{
		{name: "not found", args: []string{"get", "sb-404"}, code: 1, stderr: "corral: sandbox sb-404 not found\n"},
		{name: "invalid field", args: []string{"ttl", id, "0s"}, code: 2, stderr: "positive duration"},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, stderr: `unknown command "frobnicate"`},
		{name: "missing argument", args: []string{"get"}, code: 2, stderr: "get wants a sandbox ID"},
		{name: "no token", args: []string{"ls"}, env: map[string]string{"CORRAL_TOKEN": ""}, code: 1,
			stderr: "missing or wrong bearer token: set CORRAL_TOKEN (no token: set CORRAL_TOKEN or --token-file)"},
		{name: "wrong token", args: []string{"ls"}, env: map[string]string{"CORRAL_TOKEN": "x"}, code: 1,
			stderr: "corral: missing or wrong bearer token"},
		{name: "unreachable", args: []string{"ls"}, env: map[string]string{"CORRAL_URL": "http://127.0.0.1:1"}, code: 1,
			stderr: "corral: cannot reach the Corral server at http://127.0.0.1:1 (set CORRAL_URL or --url)"},
		{name: "token file missing", args: []string{"ls", "--token-file", "/nonexistent/token"}, code: 1, stderr: "read token"},
		{name: "help", args: []string{"--help"}, code: 0},
		{name: "layer without subcommand", args: []string{"layer"}, code: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := cli(t, srv, nil, tt.env, tt.args...)
			checkResult(t, got, tt.code, "*", tt.stderr)
		})
	}

	// --token-file and --url override the environment.
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte(srv.Token+"\n"), 0o600)
	got := cli(t, srv, nil, map[string]string{"CORRAL_TOKEN": "wrong", "CORRAL_URL": "http://127.0.0.1:1"},
		"ls", "--token-file", tok, "--url", srv.URL)
	checkResult(t, got, 0, "*", "")

	got = cli(t, srv, nil, nil, "--help")
	for _, c := range []string{"create", "exec", "run", "cp", "layer", "up", "ttl", "info"} {
		if !strings.Contains(got.stdout, "\n  "+c+" ") {
			t.Errorf("help lacks command %s:\n%s", c, got.stdout)
		}
	}
}

func TestExec(t *testing.T) {
	srv := corraltest.NewServer(t)
	id := mustCreate(t, srv)
	srv.StartFailure("noexec", corral.Exit{Error: "exec /noexec: permission denied"})
	tests := []struct {
		name     string
		args     []string
		stdin    io.Reader
		code     int
		stdout   string
		stderr   string // exact
		wantReq  string // request line of the exec
		wantBody string // exec request JSON, when not streamed
	}{
		{name: "stdout", args: []string{"exec", id, "--", "echo", "hi", "-n"}, stdout: "hi -n\n",
			wantReq: "POST /v1/sandboxes/sb-1/exec", wantBody: `{"argv":["echo","hi","-n"]}`},
		{name: "stderr and code", args: []string{"exec", id, "--", "stderr", "oops"}, stderr: "oops\n"},
		{name: "exit code passes through", args: []string{"exec", id, "--", "exit", "5"}, code: 5},
		{name: "not found is 127", args: []string{"exec", id, "--", "/no/such"}, code: 127,
			stderr: "corral: exec: \"/no/such\": executable file not found in $PATH\n"},
		{name: "permission denied is 126", args: []string{"exec", id, "--", "noexec"}, code: 126,
			stderr: "corral: exec /noexec: permission denied\n"},
		{name: "timeout is a kill", args: []string{"exec", "--timeout", "10ms", id, "--", "sleep", "1h"}, code: 137,
			stderr: "corral: command timed out (--timeout)\n"},
		{name: "flags", args: []string{"exec", id, "-e", "A=1", "--cwd", "/tmp", "-u", "agent", "--", "pwd"}, stdout: "/tmp\n",
			wantBody: `{"argv":["pwd"],"env":["A=1"],"cwd":"/tmp","user":"agent"}`},
		{name: "shell", args: []string{"exec", id, "--shell", "--", "echo a b"}, stdout: "a b\n",
			wantBody: `{"argv":["echo a b"],"shell":true}`},
		{name: "without --", args: []string{"exec", id, "whoami"}, stdout: "root\n"},
		{name: "exclusive", args: []string{"exec", "--exclusive", id, "--", "echo", "mine"}, stdout: "mine\n",
			wantBody: `{"argv":["echo","mine"],"exclusive":true}`},
		{name: "piped stdin is streamed", args: []string{"exec", id, "--", "cat"}, stdin: strings.NewReader("piped\x00data"),
			stdout: "piped\x00data", wantReq: "POST /v1/sandboxes/sb-1/exec?stdin=stream"},
		{name: "tty", args: []string{"exec", "-t", id, "--", "stderr", "x"}, stdin: strings.NewReader(""), stdout: "x\n",
			wantReq: "POST /v1/sandboxes/sb-1/exec?stdin=stream"},
		{name: "missing sandbox", args: []string{"exec", "sb-9", "--", "true"}, code: 1, stderr: "corral: sandbox sb-9 not found\n"},
		{name: "no command", args: []string{"exec", id}, code: 2, stderr: "corral: no command given: put it after --, e.g. -- ls -l\nRun 'corral exec --help' for usage.\n"},
		{name: "two args before --", args: []string{"exec", id, "x", "--", "true"}, code: 2,
			stderr: "corral: corral exec wants a sandbox ID before --, got 2 argument(s)\nRun 'corral exec --help' for usage.\n"},
		{name: "shell with many args", args: []string{"exec", "--shell", id, "--", "a", "b"}, code: 2,
			stderr: "corral: --shell wants the command as one argument, e.g. --shell -- 'ls | wc -l'\nRun 'corral exec --help' for usage.\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := cli(t, srv, tt.stdin, nil, tt.args...)
			if got.code != tt.code || got.stdout != tt.stdout || got.stderr != tt.stderr {
				t.Errorf("got exit %d, stdout %q, stderr %q\nwant exit %d, stdout %q, stderr %q",
					got.code, got.stdout, got.stderr, tt.code, tt.stdout, tt.stderr)
			}
			if tt.code == 2 {
				return
			}
			r := lastExec(t, srv)
			if tt.wantReq != "" && r.String() != tt.wantReq {
				t.Errorf("exec request = %s, want %s", r, tt.wantReq)
			}
			if tt.wantBody != "" && strings.TrimSpace(string(r.Body)) != tt.wantBody {
				t.Errorf("exec body = %s, want %s", r.Body, tt.wantBody)
			}
		})
	}
}

// lastExec returns the last exec request the server received.
func lastExec(t *testing.T, srv *corraltest.Server) corraltest.Request {
	t.Helper()
	reqs := srv.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if strings.HasSuffix(reqs[i].Path, "/exec") {
			return reqs[i]
		}
	}
	t.Fatal("no exec request")
	return corraltest.Request{}
}

func TestExitStatus(t *testing.T) {
	tests := []struct {
		exit corral.Exit
		code int
		msg  string
	}{
		{corral.Exit{}, 0, ""},
		{corral.Exit{Code: 3}, 3, ""},
		{corral.Exit{Code: -1, Signal: "SIGTERM"}, 143, ""},
		{corral.Exit{Code: 137, Signal: "KILL"}, 137, ""},
		{corral.Exit{Signal: "2"}, 130, ""},
		{corral.Exit{Code: -1, Signal: "SIGWEIRD"}, 137, ""},
		{corral.Exit{Code: -1}, 1, ""},
		{corral.Exit{Code: 300}, 255, ""},
		{corral.Exit{Code: 137, Signal: "SIGKILL", OOMKilled: true}, 137, "out of memory"},
		{corral.Exit{Code: 127, Error: "not found"}, 127, "not found"},
		{corral.Exit{Code: -1, Error: "chdir /x: no such file or directory"}, 127, "chdir"},
		{corral.Exit{Error: "fork/exec /bin/x: exec format error"}, 126, "exec format"},
	}
	for _, tt := range tests {
		code, msg := exitStatus(&tt.exit)
		if code != tt.code || !strings.Contains(msg, tt.msg) || (tt.msg == "" && msg != "") {
			t.Errorf("exitStatus(%+v) = %d, %q; want %d, %q", tt.exit, code, msg, tt.code, tt.msg)
		}
	}
}

func TestStartRefusal(t *testing.T) {
	tests := []struct {
		err  error
		code int
	}{
		{&corral.APIError{Status: 400, Code: corral.CodeInvalid, Field: "argv", Message: "not found"}, 127},
		{&corral.APIError{Status: 400, Code: corral.CodeInvalid, Field: "cwd", Message: "no such directory"}, 126},
		{&corral.APIError{Status: 400, Code: corral.CodeInvalid, Field: "user", Message: "no such user"}, 126},
		{&corral.APIError{Status: 400, Code: corral.CodeInvalid, Field: "timeout", Message: "too long"}, 0},
		{&corral.APIError{Status: 404, Code: corral.CodeNotFound, Message: "no sandbox"}, 0},
	}
	for _, tt := range tests {
		exit, err := startRefusal(tt.err)
		switch {
		case tt.code == 0 && (exit != nil || err != tt.err):
			t.Errorf("startRefusal(%v) = %+v, %v; want the error back", tt.err, exit, err)
		case tt.code != 0 && (err != nil || exit == nil || exit.Code != tt.code || exit.Error == ""):
			t.Errorf("startRefusal(%v) = %+v, %v; want exit %d with a message", tt.err, exit, err, tt.code)
		}
	}
}

// TestExecInterrupt checks that an interrupt is forwarded to the command as SIGINT and the CLI
// exits with the command's status.
func TestExecInterrupt(t *testing.T) {
	srv := corraltest.NewServer(t)
	id := mustCreate(t, srv)
	started := make(chan struct{})
	srv.Program("block", func(ctx context.Context, p *corraltest.Process) corral.Exit {
		close(started)
		<-ctx.Done()
		return corral.Exit{}
	})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-started
		cancel()
	}()
	got := cliContext(ctx, t, srv, nil, nil, "exec", id, "--", "block")
	checkResult(t, got, 130, "", "")
	if !slices.Contains(srv.RequestLines(), "POST /v1/sandboxes/sb-1/commands/c-1/signal") {
		t.Errorf("no signal request in %q", srv.RequestLines())
	}
}

func TestRun(t *testing.T) {
	srv := corraltest.NewServer(t)
	got := cli(t, srv, nil, nil, "run", "--memory", "1G", "--label", "k=v", "--cwd", "/root", "--", "pwd")
	checkResult(t, got, 0, "/root\n", "")
	want := []string{"POST /v1/sandboxes", "POST /v1/sandboxes/sb-1/exec", "DELETE /v1/sandboxes/sb-1"}
	if lines := srv.RequestLines(); !slices.Equal(lines, want) {
		t.Errorf("requests = %q, want %q", lines, want)
	}
	r := srv.Requests()[0]
	if b := strings.TrimSpace(string(r.Body)); b != `{"base":"base:default","limits":{"memory_bytes":1073741824},"labels":{"k":"v"}}` {
		t.Errorf("create body = %s", b)
	}

	// The sandbox is deleted when the command fails, and when it cannot start.
	got = cli(t, srv, strings.NewReader("in"), nil, "run", "--", "exit", "3")
	checkResult(t, got, 3, "", "")
	got = cli(t, srv, nil, nil, "run", "--", "nosuch")
	checkResult(t, got, 127, "", "executable file not found")
	for _, id := range []string{"sb-1", "sb-2", "sb-3"} {
		if sb, _ := srv.Sandbox(id); sb.State != corral.StateStopped {
			t.Errorf("after run, %s is %s, want stopped", id, sb.State)
		}
	}

	// And when corral is interrupted.
	started := make(chan struct{})
	srv.Program("block", func(ctx context.Context, p *corraltest.Process) corral.Exit {
		close(started)
		<-ctx.Done()
		return corral.Exit{}
	})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-started
		cancel()
	}()
	got = cliContext(ctx, t, srv, nil, nil, "run", "--", "block")
	checkResult(t, got, 130, "", "")
	if sb, _ := srv.Sandbox("sb-4"); sb.State != corral.StateStopped {
		t.Errorf("after an interrupted run, sb-4 is %s, want stopped", sb.State)
	}

	// Usage errors create nothing.
	before := len(srv.RequestLines())
	checkResult(t, cli(t, srv, nil, nil, "run", "x", "--", "true"), 2, "", "run wants no arguments before --")
	checkResult(t, cli(t, srv, nil, nil, "run", "--memory", "lots", "--", "true"), 2, "", "--memory")
	if after := len(srv.RequestLines()); after != before {
		t.Errorf("usage errors sent %d requests", after-before)
	}
}

func TestCp(t *testing.T) {
	srv := corraltest.NewServer(t)
	id := mustCreate(t, srv)
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "in.txt"), []byte("payload"), 0o640)
	os.MkdirAll(filepath.Join(local, "tree", "sub"), 0o755)
	os.WriteFile(filepath.Join(local, "tree", "sub", "f"), []byte("deep"), 0o644)
	os.Symlink("sub/f", filepath.Join(local, "tree", "link"))

	steps := []struct {
		args   []string
		stdin  string
		stdout string
		code   int
		stderr string
	}{
		{args: []string{"cp", filepath.Join(local, "in.txt"), id + ":/root/in.txt"}},
		{args: []string{"cp", filepath.Join(local, "in.txt"), id + ":/root/"}},
		{args: []string{"cp", filepath.Join(local, "tree"), id + ":/root/tree"}},
		{args: []string{"cp", filepath.Join(local, "tree"), id + ":/root/tree"}}, // again: into it, as tree/tree
		{args: []string{"cp", id + ":/root/in.txt", filepath.Join(local, "out.txt")}},
		{args: []string{"cp", id + ":/root/tree", filepath.Join(local, "tree2")}},
		{args: []string{"cp", id + ":/root/in.txt", local}},
		{args: []string{"cp", id + ":/root/in.txt", "-"}, stdout: "payload"},
		{args: []string{"cp", "-", id + ":/tmp/stdin.txt"}, stdin: "from stdin"},
		{args: []string{"cp", id + ":/root/missing", local}, code: 1, stderr: "corral: file /root/missing not found"},
		{args: []string{"cp", "a", "b"}, code: 2, stderr: "exactly one of SRC and DST"},
		{args: []string{"cp", id + ":relative", "."}, code: 2, stderr: "must be absolute"},
		{args: []string{"cp", "x"}, code: 2, stderr: "cp wants SRC and DST"},
	}
	for _, s := range steps {
		got := cli(t, srv, strings.NewReader(s.stdin), nil, s.args...)
		if got.code != s.code || got.stdout != s.stdout || !strings.Contains(got.stderr, s.stderr) {
			t.Errorf("corral %v: exit %d, stdout %q, stderr %q; want %d, %q, %q", s.args, got.code, got.stdout, got.stderr, s.code, s.stdout, s.stderr)
		}
	}

	remote := map[string]string{
		"/root/in.txt":          "payload",
		"/root/tree/sub/f":      "deep",
		"/root/tree/tree/sub/f": "deep",
		"/tmp/stdin.txt":        "from stdin",
	}
	for p, want := range remote {
		if got, ok := srv.File(id, p); !ok || string(got) != want {
			t.Errorf("in the sandbox, %s = %q, %v; want %q", p, got, ok, want)
		}
	}
	for p, want := range map[string]string{"out.txt": "payload", "tree2/sub/f": "deep", "tree2/link": "deep"} {
		if got, err := os.ReadFile(filepath.Join(local, p)); err != nil || string(got) != want {
			t.Errorf("locally, %s = %q, %v; want %q", p, got, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(local, "out.txt")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("out.txt mode = %v, %v; want 0640 as the source", fi.Mode(), err)
	}
	if target, err := os.Readlink(filepath.Join(local, "tree2", "link")); err != nil || target != "sub/f" {
		t.Errorf("tree2/link = %q, %v; want a symlink to sub/f", target, err)
	}
	if !slices.Contains(srv.RequestLines(), "PUT /v1/sandboxes/sb-1/files?mode=0640&parents=true&path=%2Froot%2Fin.txt") {
		t.Errorf("no file upload with the source's mode in %q", srv.RequestLines())
	}
}

func TestLayerImport(t *testing.T) {
	srv := corraltest.NewServer(t)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "root", "bin"), 0o755)
	os.WriteFile(filepath.Join(dir, "root", "bin", "tool"), []byte("#!/bin/sh\n"), 0o755)

	var tarball bytes.Buffer
	if err := writeTree(t.Context(), filepath.Join(dir, "root"), &tarball); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "layer.tar"), tarball.Bytes(), 0o644)

	got := cli(t, srv, nil, nil, "layer", "import", "tools:1", "--kind", "toolkit", "--dir", filepath.Join(dir, "root"), "-o", "json")
	checkResult(t, got, 0, "*", "")
	var l corral.Layer
	if err := json.Unmarshal([]byte(got.stdout), &l); err != nil || l.Name != "tools" || l.Kind != corral.KindToolkit || l.Files < 2 {
		t.Errorf("layer import --dir -o json = %q (%v)", got.stdout, err)
	}
	if r := lastRequest(t, srv); r.String() != "POST /v1/layers?kind=toolkit&name=tools&version=1" {
		t.Errorf("import request = %s", r)
	}

	got = cli(t, srv, nil, nil, "layer", "import", "tools:2", "--kind", "toolkit", "--tar", filepath.Join(dir, "layer.tar"))
	checkResult(t, got, 0, "*", "")
	if !strings.HasPrefix(got.stdout, "tools:2 sha256:") || !strings.HasSuffix(got.stdout, " 2 files\n") {
		t.Errorf("layer import table output = %q", got.stdout)
	}
	got = cli(t, srv, bytes.NewReader(tarball.Bytes()), nil, "layer", "import", "tools:2", "--kind", "toolkit", "--tar", "-")
	checkResult(t, got, 0, "*", "")
	var other bytes.Buffer
	if err := writeTree(t.Context(), dir, &other); err != nil {
		t.Fatal(err)
	}
	got = cli(t, srv, &other, nil, "layer", "import", "tools:2", "--kind", "toolkit", "--tar", "-")
	checkResult(t, got, 1, "", "already exists with other content")

	for _, tt := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"layer", "import", "tools:3", "--dir", dir}, `required flag(s) "kind" not set`},
		{[]string{"layer", "import", "tools:3", "--kind", "toolkit"}, "at least one of the flags in the group [dir tar image oci-layout oci-archive docker-archive] is required"},
		{[]string{"layer", "import", "tools:3", "--kind", "toolkit", "--dir", dir, "--tar", "x"}, "none of the others can be"},
		{[]string{"layer", "import", "tools", "--kind", "toolkit", "--dir", dir}, "want NAME:VERSION"},
		{[]string{"layer", "import", "tools:3", "--kind", "os", "--dir", dir}, "--kind must be base, workspace or toolkit"},
	} {
		checkResult(t, cli(t, srv, nil, nil, tt.args...), 2, "", tt.stderr)
	}
	checkResult(t, cli(t, srv, nil, nil, "layer", "get", "tools:9"), 1, "", "corral: layer tools:9 not found")
}
