package corral_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

// testContext returns a context that ends with the test or after a deadline, so a broken
// stream fails the test instead of hanging it.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newSandbox(t *testing.T, srv *corraltest.Server, c *corral.Client) string {
	t.Helper()
	sb, err := c.CreateSandbox(testContext(t), corral.CreateRequest{Base: corraltest.DefaultBase})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	return sb.ID
}

func lastBody(t *testing.T, srv *corraltest.Server) map[string]any {
	t.Helper()
	reqs := srv.Requests()
	var m map[string]any
	if err := json.Unmarshal(reqs[len(reqs)-1].Body, &m); err != nil {
		t.Fatalf("last request body %q is not JSON: %v", reqs[len(reqs)-1].Body, err)
	}
	return m
}

func TestSandboxLifecycle(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)

	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{
		Base:   corraltest.DefaultBase,
		Limits: corral.Limits{CPUs: 0.5, MemoryBytes: 256 << 20},
		Env:    []string{"A=1"},
		Labels: map[string]string{"team": "x", "run": "7"},
		TTL:    "10m",
	})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	if sb.ID == "" || sb.State != corral.StateRunning {
		t.Fatalf("CreateSandbox = %+v, want an ID and state running", sb)
	}
	body := lastBody(t, srv)
	want := map[string]any{
		"base":   "base:default",
		"limits": map[string]any{"cpus": 0.5, "memory_bytes": float64(256 << 20)},
		"env":    []any{"A=1"},
		"labels": map[string]any{"team": "x", "run": "7"},
		"ttl":    "10m",
	}
	if got, _ := json.Marshal(body); string(got) != mustJSON(t, want) {
		t.Errorf("create body = %s, want %s", got, mustJSON(t, want))
	}
	if _, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: corraltest.DefaultBase, Labels: map[string]string{"team": "y"}}); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}

	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.ID != sb.ID || got.Labels["team"] != "x" {
		t.Fatalf("GetSandbox = %+v, %v; want the created sandbox", got, err)
	}

	list, err := c.ListSandboxes(ctx, corral.ListOptions{State: corral.StateRunning, Labels: map[string]string{"team": "x", "run": "7"}})
	if err != nil {
		t.Fatalf("ListSandboxes: %v", err)
	}
	if len(list) != 1 || list[0].ID != sb.ID {
		t.Errorf("ListSandboxes(team=x) = %v, want only %s", list, sb.ID)
	}
	all, err := c.ListSandboxes(ctx, corral.ListOptions{})
	if err != nil || len(all) != 2 {
		t.Errorf("ListSandboxes() = %d sandboxes, %v; want 2", len(all), err)
	}

	ttl, err := c.SetTTL(ctx, sb.ID, 90*time.Minute)
	if err != nil {
		t.Fatalf("SetTTL: %v", err)
	}
	if left := time.Until(ttl.ExpiresAt); left < 80*time.Minute {
		t.Errorf("after SetTTL(90m) the sandbox expires in %v", left)
	}
	if b := lastBody(t, srv); b["ttl"] != "1h30m0s" {
		t.Errorf("ttl body = %v, want ttl 1h30m0s", b)
	}

	del, err := c.DeleteSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	if del.State != corral.StateStopped || del.Reason != corral.ReasonDeleted {
		t.Errorf("DeleteSandbox = state %q reason %q, want stopped/deleted", del.State, del.Reason)
	}

	wantLines := []string{
		"POST /v1/sandboxes",
		"POST /v1/sandboxes",
		"GET /v1/sandboxes/sb-1",
		"GET /v1/sandboxes?label=run%3D7&label=team%3Dx&state=running",
		"GET /v1/sandboxes",
		"POST /v1/sandboxes/sb-1/ttl",
		"DELETE /v1/sandboxes/sb-1",
	}
	if got := srv.RequestLines(); !slices.Equal(got, wantLines) {
		t.Errorf("requests:\n got %q\nwant %q", got, wantLines)
	}
	for _, r := range srv.Requests() {
		if got := r.Header.Get("Authorization"); got != "Bearer "+corraltest.DefaultToken {
			t.Errorf("%s: Authorization = %q", r, got)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestErrors(t *testing.T) {
	srv := corraltest.NewServer(t)
	ctx := testContext(t)

	_, err := srv.Client().GetSandbox(ctx, "sb-999")
	var apiErr *corral.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound || !corral.IsNotFound(err) {
		t.Fatalf("GetSandbox(sb-999) error = %#v, want a 404 *APIError", err)
	}
	if corral.IsConflict(err) || corral.IsInvalid(err) {
		t.Errorf("a not-found error also classifies as conflict or invalid")
	}

	_, err = srv.Client().CreateSandbox(ctx, corral.CreateRequest{Base: corraltest.DefaultBase, TTL: "forever"})
	if !corral.IsInvalid(err) || !errors.As(err, &apiErr) || apiErr.Field != "ttl" {
		t.Fatalf("CreateSandbox(ttl=forever) error = %#v, want invalid on field ttl", err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "ttl: ") || !strings.Contains(msg, "forever") {
		t.Errorf("error text %q should carry the message, which names the field", msg)
	}
	// A message that does not name its field gets it appended.
	if got := (&corral.APIError{Status: 400, Message: "too big", Field: "size"}).Error(); got != `too big (field "size")` {
		t.Errorf("APIError.Error() = %q", got)
	}

	bad := corral.New(srv.URL, "wrong")
	if _, err := bad.Info(ctx); !corral.IsUnauthorized(err) {
		t.Errorf("Info with a wrong token: %v, want unauthorized", err)
	}
	if err := bad.Health(ctx); err != nil {
		t.Errorf("Health needs no token, got %v", err)
	}

	// A proxy's error page is not a Corral error body; the status still classifies it.
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "<html>upstream down</html>", http.StatusServiceUnavailable)
	}))
	defer proxy.Close()
	_, err = corral.New(proxy.URL, "t").Info(ctx)
	if !corral.IsUnavailable(err) || !strings.Contains(err.Error(), "upstream down") {
		t.Errorf("error from a proxy page = %v, want unavailable with the page text", err)
	}

	for _, u := range []string{"127.0.0.1:7070", "ftp://x", "http://"} {
		if _, err := corral.New(u, "t").Info(ctx); err == nil || corral.IsNotFound(err) {
			t.Errorf("New(%q).Info: %v, want a URL error", u, err)
		}
	}
}

func TestRun(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	id := newSandbox(t, srv, c)

	tests := []struct {
		name       string
		req        corral.ExecRequest
		stdout     string
		stderr     string
		exit       corral.Exit
		wantErrMsg bool
	}{
		{name: "echo", req: corral.ExecRequest{Argv: []string{"echo", "hi", "there"}}, stdout: "hi there\n"},
		{name: "stderr", req: corral.ExecRequest{Argv: []string{"stderr", "oops"}}, stderr: "oops\n"},
		{name: "stdin", req: corral.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("in\x00bin")}, stdout: "in\x00bin"},
		{name: "exit code", req: corral.ExecRequest{Argv: []string{"exit", "3"}}, exit: corral.Exit{Code: 3}},
		{name: "shell", req: corral.ExecRequest{Argv: []string{"echo a  b"}, Shell: true}, stdout: "a b\n"},
		{name: "tty merges stderr", req: corral.ExecRequest{Argv: []string{"stderr", "x"}, TTY: true}, stdout: "x\n"},
		{name: "timeout", req: corral.ExecRequest{Argv: []string{"sleep", "1h"}, Timeout: "10ms"},
			exit: corral.Exit{Code: -1, Signal: "SIGKILL", TimedOut: true}},
		{name: "cannot run", req: corral.ExecRequest{Argv: []string{"noexec"}}, exit: corral.Exit{Code: 126}, wantErrMsg: true},
	}
	srv.StartFailure("noexec", corral.Exit{Code: 126, Error: "exec /noexec: permission denied"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, exit, err := c.Run(ctx, id, tt.req)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if string(stdout) != tt.stdout || string(stderr) != tt.stderr {
				t.Errorf("output = %q, %q; want %q, %q", stdout, stderr, tt.stdout, tt.stderr)
			}
			if exit == nil {
				t.Fatal("exit = nil")
			}
			if gotMsg := exit.Error != ""; gotMsg != tt.wantErrMsg {
				t.Errorf("exit.Error = %q, want a message: %v", exit.Error, tt.wantErrMsg)
			}
			exit.Error = ""
			if *exit != tt.exit {
				t.Errorf("exit = %+v, want %+v", *exit, tt.exit)
			}
		})
	}

	_, _, _, err := c.Run(ctx, id, corral.ExecRequest{Argv: []string{"nosuch"}})
	if apiErr, ok := errors.AsType[*corral.APIError](err); !ok || apiErr.Code != corral.CodeInvalid || apiErr.Field != "argv" {
		t.Errorf("Run of a missing program: %v, want invalid on field argv", err)
	}
	if _, _, _, err := c.Run(ctx, "sb-999", corral.ExecRequest{Argv: []string{"true"}}); !corral.IsNotFound(err) {
		t.Errorf("Run in a missing sandbox: %v, want not found", err)
	}
	if _, _, _, err := c.Run(ctx, id, corral.ExecRequest{}); !corral.IsInvalid(err) {
		t.Errorf("Run with no argv: %v, want invalid", err)
	}
}

func TestExecEvents(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	id := newSandbox(t, srv, c)

	s, err := c.Exec(ctx, id, corral.ExecRequest{Argv: []string{"echo", "x"}})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	defer s.Close()
	if s.CommandID() == "" {
		t.Error("CommandID is empty right after Exec")
	}
	var types []string
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		types = append(types, ev.Type)
	}
	if want := []string{"start", "stdout", "exit"}; !slices.Equal(types, want) {
		t.Errorf("event types = %v, want %v", types, want)
	}
	if s.Exit() == nil || s.Exit().Code != 0 {
		t.Errorf("Exit() = %+v, want code 0", s.Exit())
	}
	if _, err := s.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("Next after the end = %v, want io.EOF", err)
	}
}

// TestExecStreamFullDuplex checks that stdin is sent while output streams back: the second
// line is only written after the echo of the first came back.
func TestExecStreamFullDuplex(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	id := newSandbox(t, srv, c)

	pr, pw := io.Pipe()
	s, err := c.ExecStream(ctx, id, corral.ExecRequest{Argv: []string{"cat"}}, pr)
	if err != nil {
		t.Fatalf("ExecStream: %v", err)
	}
	defer s.Close()
	if want := "POST /v1/sandboxes/" + id + "/exec?stdin=stream"; !slices.Contains(srv.RequestLines(), want) {
		t.Errorf("requests %q lack %q", srv.RequestLines(), want)
	}

	expect := func(want string) {
		t.Helper()
		var got string
		for len(got) < len(want) {
			ev, err := s.Next()
			if err != nil {
				t.Fatalf("Next while waiting for %q: %v", want, err)
			}
			if ev.Type == corral.EventStdout {
				got += string(ev.Data)
			}
		}
		if got != want {
			t.Fatalf("stdout = %q, want %q", got, want)
		}
	}
	if _, err := pw.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	expect("ping\n")
	if _, err := pw.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	expect("pong\n")
	pw.Close()
	exit, err := s.Copy(io.Discard, io.Discard)
	if err != nil || exit == nil || exit.Code != 0 {
		t.Fatalf("after closing stdin: exit %+v, err %v; want code 0", exit, err)
	}

	if _, err := c.ExecStream(ctx, id, corral.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("x")}, strings.NewReader("")); err == nil {
		t.Error("ExecStream with both Stdin and a reader succeeded")
	}
	if _, err := c.ExecStream(ctx, "sb-999", corral.ExecRequest{Argv: []string{"cat"}}, strings.NewReader("")); !corral.IsNotFound(err) {
		t.Errorf("ExecStream in a missing sandbox: %v, want not found", err)
	}
}

// TestExecStreamCommandOutlivesStdin checks that a command that exits while the client keeps
// stdin open ends the stream.
func TestExecStreamCommandOutlivesStdin(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	id := newSandbox(t, srv, c)

	pr, pw := io.Pipe()
	defer pw.Close()
	s, err := c.ExecStream(ctx, id, corral.ExecRequest{Argv: []string{"echo", "done"}}, pr)
	if err != nil {
		t.Fatalf("ExecStream: %v", err)
	}
	var out bytes.Buffer
	exit, err := s.Copy(&out, io.Discard)
	if err != nil || exit == nil || out.String() != "done\n" {
		t.Fatalf("Copy = %q, %+v, %v", out.String(), exit, err)
	}
	s.Close()
}

// errServerStream stands for the error an "error" event becomes; matched by message.
var errServerStream = errors.New("output stream failed on the server: agent gone")

// TestStreamDecoding feeds hand-written NDJSON to the client.
func TestStreamDecoding(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		stdout  string
		dropped int64
		exit    *corral.Exit
		wantErr error
	}{
		{
			name: "base64 data and truncation",
			body: `{"type":"start","command_id":"c-9"}` + "\n" +
				`{"type":"truncated","offset":10,"dropped":10}` + "\n" +
				`{"type":"stdout","offset":10,"data":"aGVsbG8="}` + "\n" +
				`{"type":"exit","exit":{"code":0}}` + "\n",
			stdout: "hello", dropped: 10, exit: &corral.Exit{},
		},
		{
			name:   "stream cut before exit",
			body:   `{"type":"start","command_id":"c-9"}` + "\n" + `{"type":"stdout","data":"aGk="}` + "\n",
			stdout: "hi", wantErr: io.ErrUnexpectedEOF,
		},
		{
			name:    "error event from the server",
			body:    `{"type":"start","command_id":"c-9"}` + "\n" + `{"type":"error","data":"YWdlbnQgZ29uZQ=="}` + "\n",
			wantErr: errServerStream,
		},
		{
			name: "exit without details",
			body: `{"type":"start","command_id":"c-9"}` + "\n" + `{"type":"exit"}` + "\n",
			exit: &corral.Exit{},
		},
		{
			name: "unknown event types are passed over",
			body: `{"type":"start","command_id":"c-9"}` + "\n" + `{"type":"progress"}` + "\n" +
				`{"type":"exit","exit":{"code":2,"signal":"SIGTERM"}}` + "\n",
			exit: &corral.Exit{Code: 2, Signal: "SIGTERM"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/x-ndjson")
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			s, err := corral.New(srv.URL, "t").Exec(testContext(t), "sb", corral.ExecRequest{Argv: []string{"x"}})
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			defer s.Close()
			if s.CommandID() != "c-9" {
				t.Errorf("CommandID = %q, want c-9", s.CommandID())
			}
			var out bytes.Buffer
			exit, err := s.Copy(&out, nil)
			if tt.wantErr == errServerStream {
				if err == nil || err.Error() != errServerStream.Error() {
					t.Fatalf("Copy error = %v, want %v", err, errServerStream)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Copy error = %v, want %v", err, tt.wantErr)
			}
			if out.String() != tt.stdout || s.Dropped() != tt.dropped {
				t.Errorf("stdout %q dropped %d, want %q and %d", out.String(), s.Dropped(), tt.stdout, tt.dropped)
			}
			if (exit == nil) != (tt.exit == nil) || (exit != nil && *exit != *tt.exit) {
				t.Errorf("exit = %+v, want %+v", exit, tt.exit)
			}
		})
	}
}

func TestBackgroundCommands(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	id := newSandbox(t, srv, c)

	cmd, err := c.StartCommand(ctx, id, corral.ExecRequest{Argv: []string{"cat"}, OpenStdin: true})
	if err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	if cmd.ID == "" || cmd.State != "running" {
		t.Fatalf("StartCommand = %+v", cmd)
	}
	if err := c.WriteStdin(ctx, id, cmd.ID, strings.NewReader("ab"), false); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	if err := c.WriteStdin(ctx, id, cmd.ID, strings.NewReader("cd"), true); err != nil {
		t.Fatalf("WriteStdin(eof): %v", err)
	}
	s, err := c.Attach(ctx, id, cmd.ID, 0, true)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	var out bytes.Buffer
	exit, err := s.Copy(&out, nil)
	s.Close()
	if err != nil || exit == nil || exit.Code != 0 || out.String() != "abcd" {
		t.Fatalf("Attach(follow) = %q, %+v, %v; want abcd and exit 0", out.String(), exit, err)
	}

	// Without follow, from an offset inside the output.
	s, err = c.Attach(ctx, id, cmd.ID, 3, false)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	out.Reset()
	exit, err = s.Copy(&out, nil)
	s.Close()
	if err != nil || exit == nil || out.String() != "d" {
		t.Errorf("Attach(offset 3) = %q, %+v, %v; want d and the exit", out.String(), exit, err)
	}

	got, err := c.Command(ctx, id, cmd.ID)
	if err != nil || got.State != "exited" || got.OutputEnd != 4 {
		t.Errorf("Command = %+v, %v; want exited with 4 output bytes", got, err)
	}

	sleeper, err := c.StartCommand(ctx, id, corral.ExecRequest{Argv: []string{"sleep", "1h"}, TTY: true})
	if err != nil {
		t.Fatalf("StartCommand(sleep): %v", err)
	}
	// A running command attached without follow ends without an exit.
	s, err = c.Attach(ctx, id, sleeper.ID, 0, false)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if exit, err := s.Copy(io.Discard, nil); exit != nil || err != nil {
		t.Errorf("Attach(no follow) of a running command = %+v, %v; want no exit, no error", exit, err)
	}
	s.Close()

	if err := c.Resize(ctx, id, sleeper.ID, 40, 120); err != nil {
		t.Errorf("Resize: %v", err)
	}
	if err := c.Resize(ctx, id, cmd.ID, 40, 120); !corral.IsConflict(err) {
		t.Errorf("Resize of an exited command without a TTY: %v, want conflict", err)
	}
	s, err = c.Attach(ctx, id, sleeper.ID, 0, true)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	defer s.Close()
	if err := c.Signal(ctx, id, sleeper.ID, "TERM"); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	exit, err = s.Copy(io.Discard, nil)
	if err != nil || exit == nil || exit.Signal != "SIGTERM" {
		t.Errorf("after SIGTERM: exit %+v, %v", exit, err)
	}
	if err := c.Signal(ctx, id, sleeper.ID, "KILL"); !corral.IsConflict(err) {
		t.Errorf("Signal to an exited command: %v, want conflict", err)
	}

	cmds, err := c.Commands(ctx, id)
	if err != nil || len(cmds) != 2 {
		t.Fatalf("Commands = %v, %v; want 2", cmds, err)
	}

	wantBodies := map[string]string{
		"POST /v1/sandboxes/" + id + "/commands/" + sleeper.ID + "/resize":                  `{"rows":40,"cols":120}`,
		"POST /v1/sandboxes/" + id + "/commands/" + sleeper.ID + "/signal":                  `{"signal":"TERM"}`,
		"POST /v1/sandboxes/" + id + "/commands/" + cmd.ID + "/stdin?eof=true":              "cd",
		"POST /v1/sandboxes/" + id + "/commands/" + cmd.ID + "/stdin?eof=false":             "ab",
		"GET /v1/sandboxes/" + id + "/commands/" + cmd.ID + "/output?follow=false&offset=3": "",
	}
	for _, r := range srv.Requests() {
		if want, ok := wantBodies[r.String()]; ok {
			if got := strings.TrimSpace(string(r.Body)); got != want {
				t.Errorf("%s body = %q, want %q", r, got, want)
			}
			delete(wantBodies, r.String())
		}
	}
	for r := range wantBodies {
		t.Errorf("no request %s", r)
	}
}

// TestStreamClose checks that Close unblocks a Next waiting for output.
func TestStreamClose(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	id := newSandbox(t, srv, c)

	s, err := c.Exec(ctx, id, corral.ExecRequest{Argv: []string{"sleep", "1h"}})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if _, err := s.Next(); err != nil { // start
		t.Fatalf("Next: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Next()
		done <- err
	}()
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, corral.ErrStreamClosed) {
			t.Errorf("Next after Close = %v, want ErrStreamClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("Next still blocked after Close")
	}
	// The command keeps running after the client went away.
	cmds, err := c.Commands(ctx, id)
	if err != nil || len(cmds) != 1 || cmds[0].State != "running" {
		t.Errorf("Commands after closing the stream = %+v, %v; want it running", cmds, err)
	}
}

func TestFiles(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	id := newSandbox(t, srv, c)

	fi, err := c.WriteFile(ctx, id, "/work/bin/run.sh", strings.NewReader("#!/bin/sh\n"),
		corral.WriteFileOptions{Mode: 0o755, User: "agent", Parents: true})
	if err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if fi.Path != "/work/bin/run.sh" || fi.Size != 10 || fi.Mode.Perm() != 0o755 {
		t.Errorf("WriteFile = %+v", fi)
	}
	if _, err := c.WriteFile(ctx, id, "/work/bin/run.sh", strings.NewReader("exit 0\n"), corral.WriteFileOptions{Append: true}); err != nil {
		t.Fatalf("WriteFile(append): %v", err)
	}
	if _, err := c.WriteFile(ctx, id, "/missing/x", strings.NewReader(""), corral.WriteFileOptions{}); !corral.IsNotFound(err) {
		t.Errorf("WriteFile without parents: %v, want not found", err)
	}

	rc, err := c.ReadFile(ctx, id, "/work/bin/run.sh")
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	data, _ := io.ReadAll(rc)
	rc.Close()
	if string(data) != "#!/bin/sh\nexit 0\n" {
		t.Errorf("ReadFile = %q", data)
	}
	if _, err := c.ReadFile(ctx, id, "/nope"); !corral.IsNotFound(err) {
		t.Errorf("ReadFile(/nope): %v, want not found", err)
	}

	if _, err := c.Mkdir(ctx, id, corral.MkdirRequest{Path: "/work/data/x", Parents: true, Mode: 0o700}); err != nil {
		t.Fatalf("Mkdir: %v", err)
	}
	st, err := c.Stat(ctx, id, "/work/data/x")
	if err != nil || !st.IsDir || st.Mode.Perm() != 0o700 {
		t.Errorf("Stat = %+v, %v; want a 0700 directory", st, err)
	}
	ls, err := c.List(ctx, id, "/work")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var names []string
	for _, f := range ls {
		names = append(names, f.Name)
	}
	if want := []string{"bin", "data"}; !slices.Equal(names, want) {
		t.Errorf("List(/work) = %v, want %v", names, want)
	}

	// Round trip a tree through the tar endpoints.
	tarball, err := c.TarOut(ctx, id, "/work")
	if err != nil {
		t.Fatalf("TarOut: %v", err)
	}
	raw, _ := io.ReadAll(tarball)
	tarball.Close()
	var entries []string
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		entries = append(entries, h.Name)
	}
	if want := []string{"bin/", "bin/run.sh", "data/", "data/x/"}; !slices.Equal(entries, want) {
		t.Errorf("TarOut entries = %v, want %v", entries, want)
	}
	if _, err := c.Mkdir(ctx, id, corral.MkdirRequest{Path: "/copy"}); err != nil {
		t.Fatalf("Mkdir: %v", err)
	}
	if err := c.TarIn(ctx, id, "/copy", bytes.NewReader(raw)); err != nil {
		t.Fatalf("TarIn: %v", err)
	}
	if got, ok := srv.File(id, "/copy/bin/run.sh"); !ok || string(got) != "#!/bin/sh\nexit 0\n" {
		t.Errorf("after TarIn, /copy/bin/run.sh = %q, %v", got, ok)
	}

	if err := c.Remove(ctx, id, "/work", false); !corral.IsConflict(err) {
		t.Errorf("Remove of a non-empty directory: %v, want conflict", err)
	}
	if err := c.Remove(ctx, id, "/work", true); err != nil {
		t.Errorf("Remove(recursive): %v", err)
	}
	if _, err := c.Stat(ctx, id, "/work/bin/run.sh"); !corral.IsNotFound(err) {
		t.Errorf("Stat after Remove: %v, want not found", err)
	}

	want := []string{
		"PUT /v1/sandboxes/" + id + "/files?mode=0755&parents=true&path=%2Fwork%2Fbin%2Frun.sh&user=agent",
		"PUT /v1/sandboxes/" + id + "/files?append=true&path=%2Fwork%2Fbin%2Frun.sh",
		"DELETE /v1/sandboxes/" + id + "/files?path=%2Fwork&recursive=true",
		"PUT /v1/sandboxes/" + id + "/files/tar?path=%2Fcopy",
	}
	lines := srv.RequestLines()
	for _, w := range want {
		if !slices.Contains(lines, w) {
			t.Errorf("no request %s in\n%s", w, strings.Join(lines, "\n"))
		}
	}
}

func TestLayers(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "bin/tool", Typeflag: tar.TypeReg, Mode: 0o755, Size: 2})
	tw.Write([]byte("hi"))
	tw.Close()

	l, err := c.ImportLayer(ctx, "tools", "1", corral.KindToolkit, bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("ImportLayer: %v", err)
	}
	if l.Name != "tools" || l.Version != "1" || l.Kind != corral.KindToolkit || l.Files != 2 || !strings.HasPrefix(l.Digest, "sha256:") {
		t.Errorf("ImportLayer = %+v", l)
	}
	again, err := c.ImportLayer(ctx, "tools", "1", corral.KindToolkit, bytes.NewReader(buf.Bytes()))
	if err != nil || again.Digest != l.Digest {
		t.Errorf("re-importing the same content = %+v, %v; want the same layer", again, err)
	}
	if _, err := c.ImportLayer(ctx, "tools", "1", corral.KindToolkit, strings.NewReader("")); !corral.IsConflict(err) {
		t.Errorf("importing other content under tools:1: %v, want conflict", err)
	}
	if _, err := c.ImportLayer(ctx, "tools", "2", "nope", bytes.NewReader(buf.Bytes())); !corral.IsInvalid(err) {
		t.Errorf("importing with kind nope: %v, want invalid", err)
	}

	ls, err := c.Layers(ctx, "tools")
	if err != nil || len(ls) != 1 || ls[0].Digest != l.Digest {
		t.Errorf("Layers(tools) = %+v, %v", ls, err)
	}
	all, err := c.Layers(ctx, "")
	if err != nil || len(all) != 2 {
		t.Errorf("Layers() = %d layers, %v; want 2 (with the default base)", len(all), err)
	}
	got, err := c.Layer(ctx, "tools", "1")
	if err != nil || got.Digest != l.Digest {
		t.Errorf("Layer(tools, 1) = %+v, %v", got, err)
	}
	if _, err := c.Layer(ctx, "tools", "9"); !corral.IsNotFound(err) {
		t.Errorf("Layer(tools, 9): %v, want not found", err)
	}
	if first := srv.RequestLines()[0]; first != "POST /v1/layers?kind=toolkit&name=tools&version=1" {
		t.Errorf("first request = %s", first)
	}

	// A sandbox may use the toolkit; naming one that is not published is an error on that field.
	if _, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: corraltest.DefaultBase, Toolkits: []string{"tools:1"}}); err != nil {
		t.Errorf("CreateSandbox with toolkit tools:1: %v", err)
	}
	_, err = c.CreateSandbox(ctx, corral.CreateRequest{Base: "nope:1"})
	var apiErr *corral.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != corral.CodeInvalid || apiErr.Field != "base" {
		t.Errorf("CreateSandbox with base nope:1: %v, want invalid on field base", err)
	}
}

func TestInfoAndHealth(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	if err := c.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.Runtime != "runc" {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	if h := srv.Requests()[0].Header.Get("Authorization"); h != "" {
		t.Errorf("Health sent Authorization %q; it needs no token", h)
	}
}

func TestBaseURLWithPath(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.EscapedPath()
		io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	if _, err := corral.New(srv.URL+"/corral/", "t").GetSandbox(testContext(t), "a/b c"); err != nil {
		t.Fatal(err)
	}
	if want := "/corral/v1/sandboxes/a%2Fb%20c"; got != want {
		t.Errorf("path = %s, want %s", got, want)
	}
}

// TestExecStreamThenReuse runs streamed execs whose command exits before the server has read
// all of stdin, each followed by an ordinary request on the same client: the abandoned body
// must not leak into the next request on a reused connection.
func TestExecStreamThenReuse(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	id := newSandbox(t, srv, c)
	for i := range 50 {
		s, err := c.ExecStream(ctx, id, corral.ExecRequest{Argv: []string{"true"}}, strings.NewReader(strings.Repeat("x", i*100)))
		if err != nil {
			t.Fatalf("ExecStream %d: %v", i, err)
		}
		if _, err := s.Copy(io.Discard, io.Discard); err != nil {
			t.Fatalf("Copy %d: %v", i, err)
		}
		s.Close()
		if _, err := c.GetSandbox(ctx, id); err != nil {
			t.Fatalf("GetSandbox after streamed exec %d: %v", i, err)
		}
	}
}

func TestExclusiveCommand(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: corraltest.DefaultBase})
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"sleep", "1h"}})
	if err != nil {
		t.Fatal(err)
	}
	x, err := c.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"sleep", "1h"}, Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	if body := lastBody(t, srv); body["exclusive"] != true {
		t.Errorf("request body %v lacks exclusive: true", body)
	}
	if !x.Exclusive || other.Exclusive {
		t.Errorf("exclusive marks %v (exclusive) and %v (plain)", x.Exclusive, other.Exclusive)
	}
	if _, err := c.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"echo"}}); !corral.IsConflict(err) {
		t.Errorf("start during an exclusive command: %v, want a conflict", err)
	}
	if err := c.Signal(ctx, sb.ID, other.ID, "SIGTERM"); !corral.IsConflict(err) {
		t.Errorf("signal to another command during an exclusive one: %v, want a conflict", err)
	}
	if err := c.Signal(ctx, sb.ID, x.ID, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	// The kill ends it on its goroutine; then starts are admitted again.
	for {
		_, err := c.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"echo"}})
		if err == nil {
			break
		}
		if !corral.IsConflict(err) || ctx.Err() != nil {
			t.Fatalf("start after the exclusive command was killed: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestResponsesKeepTheConnection makes calls whose JSON answers end at and around the
// decoder's reads, sent with a length and chunked: every call after the first reuses the
// connection (a body closed before its end takes the connection down, and the next call, a
// create's first exec say, pays for a new one).
func TestResponsesKeepTheConnection(t *testing.T) {
	var conns atomic.Int32
	var size, chunked atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pad := strings.Repeat("x", int(size.Load()))
		body := `{"id":"sb-1","hostname":"` + pad + `"}` + "\n"
		if chunked.Load() == 1 {
			io.WriteString(w, body[:len(body)/2])
			w.(http.Flusher).Flush()
			io.WriteString(w, body[len(body)/2:])
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := corral.New(srv.URL, "t")
	ctx := testContext(t)
	for _, ch := range []int32{0, 1} {
		chunked.Store(ch)
		// Bodies ending at and around the decoder's first reads (512 bytes, then 1024 more).
		var sizes []int32
		for n := int32(470); n < 540; n++ {
			sizes = append(sizes, n, n+1024, n+3072)
		}
		for _, n := range append(sizes, 0, 70000) {
			size.Store(n)
			sb, err := c.GetSandbox(ctx, "sb-1")
			if err != nil || len(sb.Hostname) != int(n) {
				t.Fatalf("GetSandbox (%d bytes, chunked %d): %v", n, ch, err)
			}
			if got := conns.Load(); got != 1 {
				t.Fatalf("after an answer of %d bytes (chunked %d): %d connections, want 1", n, ch, got)
			}
		}
	}
}
