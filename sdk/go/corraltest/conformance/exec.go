package conformance

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

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
