package e2b

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

// procHarness is a gateway with a service token in front of corraltest, and two sandboxes:
// withBash has a /bin/bash file, noBash has none. Both run the fake shell procShell, as bash or
// sh.
type procHarness struct {
	t        *testing.T
	fake     *corraltest.Server
	gw       *Gateway
	url      string
	withBash string
	noBash   string
}

func newProcHarness(t *testing.T) *procHarness {
	t.Helper()
	fake := corraltest.NewServer(t)
	fake.Program("bash", procShell)
	fake.Program("sh", procShell)
	gw, err := New(Config{CorralURL: fake.URL, TokenKey: testKey, ServiceToken: fake.Token},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(srv.Close)
	h := &procHarness{t: t, fake: fake, gw: gw, url: srv.URL}
	ctx := context.Background()
	c := fake.Client()
	for _, id := range []*string{&h.withBash, &h.noBash} {
		sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: corraltest.DefaultBase})
		if err != nil {
			t.Fatal(err)
		}
		*id = sb.ID
	}
	if _, err := c.WriteFile(ctx, h.withBash, "/bin/bash", strings.NewReader("#!"), corral.WriteFileOptions{Mode: 0o755, Parents: true}); err != nil {
		t.Fatal(err)
	}
	return h
}

// procShell plays bash and sh. "-c SCRIPT" runs ';'-separated commands: echo ARGS, err ARGS
// (to stderr), exit N, cat, sleep (until signalled), pwd, env, shell (prints argv[0]). "-i"
// (a PTY) prints its terminal size at the start and on each resize, and echoes its input.
func procShell(ctx context.Context, p *corraltest.Process) corral.Exit {
	if slices.Contains(p.Args, "-i") {
		fmt.Fprintf(p.Stdout, "size %dx%d\n", p.Rows, p.Cols)
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			io.Copy(p.Stdout, p.Stdin)
		}()
		for {
			select {
			case sz := <-p.Resizes:
				fmt.Fprintf(p.Stdout, "size %dx%d\n", sz.Rows, sz.Cols)
			case <-copied:
				return corral.Exit{}
			case <-ctx.Done():
				return corral.Exit{}
			}
		}
	}
	i := slices.Index(p.Args, "-c")
	if i < 0 || i+1 >= len(p.Args) {
		fmt.Fprintln(p.Stderr, "usage: sh -c SCRIPT")
		return corral.Exit{Code: 2}
	}
	for cmd := range strings.SplitSeq(p.Args[i+1], ";") {
		f := strings.Fields(cmd)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "echo":
			fmt.Fprintln(p.Stdout, strings.Join(f[1:], " "))
		case "err":
			fmt.Fprintln(p.Stderr, strings.Join(f[1:], " "))
		case "exit":
			var n int
			fmt.Sscan(f[1], &n)
			return corral.Exit{Code: n}
		case "cat":
			io.Copy(p.Stdout, p.Stdin)
		case "sleep":
			<-ctx.Done()
		case "pwd":
			fmt.Fprintln(p.Stdout, p.Cwd)
		case "env":
			for _, e := range p.Env {
				fmt.Fprintln(p.Stdout, e)
			}
		case "shell":
			fmt.Fprintln(p.Stdout, p.Args[0])
		default:
			fmt.Fprintf(p.Stderr, "%s: command not found\n", f[0])
			return corral.Exit{Code: 127}
		}
	}
	return corral.Exit{}
}

// procRequest builds a request to the in-sandbox surface as the SDK sends it.
func (h *procHarness) procRequest(ctx context.Context, sandbox, method, contentType string, body []byte, hdr map[string]string) *http.Request {
	h.t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", h.url+"/process.Process/"+method, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("E2b-Sandbox-Id", sandbox)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", h.gw.EnvdAccessToken(sandbox))
	req.Header.Set("User-Agent", "e2b-js-sdk/2.51.0")
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	return req
}

// unary makes a unary call and returns the status and body.
func (h *procHarness) unary(sandbox, method, body string, hdr map[string]string) (int, string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(h.procRequest(ctx, sandbox, method, "application/json", []byte(body), hdr))
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// wantUnaryError checks a unary call's Connect error.
func (h *procHarness) wantUnaryError(sandbox, method, body string, status int, code, msg string) {
	h.t.Helper()
	st, got := h.unary(sandbox, method, body, nil)
	var e rpcError
	if err := json.Unmarshal([]byte(got), &e); err != nil || st != status || e.Code != code || !strings.Contains(e.Message, msg) {
		h.t.Errorf("%s %s: %d %s, want %d {code: %s, message: ...%s...}", method, body, st, got, status, code, msg)
	}
}

// procStream is the response of a server-streaming call.
type procStream struct {
	t      *testing.T
	body   io.ReadCloser
	cancel context.CancelFunc
	// trailer is the end-of-stream message, once read.
	trailer string
}

// stream starts a server-streaming call with the headers the SDK sends on Start and Connect.
func (h *procHarness) stream(sandbox, method, body string, hdr map[string]string) *procStream {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	env := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
	env = append(env, body...)
	// No Connect-Timeout-Ms unless asked (the SDK's timeoutMs: 0): corraltest reports every
	// command started with a timeout as killed, however it ended.
	all := map[string]string{"Keepalive-Ping-Interval": "50"}
	for k, v := range hdr {
		all[k] = v
	}
	resp, err := http.DefaultClient.Do(h.procRequest(ctx, sandbox, method, "application/connect+json", env, all))
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/connect+json" {
		b, _ := io.ReadAll(resp.Body)
		cancel()
		h.t.Fatalf("%s: %d %s %s", method, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	s := &procStream{t: h.t, body: resp.Body, cancel: cancel}
	h.t.Cleanup(s.close)
	return s
}

func (s *procStream) close() {
	s.cancel()
	s.body.Close()
}

// nextRaw returns the next message, or "" once the end-of-stream envelope is read (its message
// is then in trailer).
func (s *procStream) nextRaw() string {
	s.t.Helper()
	if s.trailer != "" {
		s.t.Fatalf("read after the end of the stream (%s)", s.trailer)
	}
	var head [5]byte
	if _, err := io.ReadFull(s.body, head[:]); err != nil {
		s.t.Fatalf("read envelope: %v", err)
	}
	b := make([]byte, binary.BigEndian.Uint32(head[1:]))
	if _, err := io.ReadFull(s.body, b); err != nil {
		s.t.Fatalf("read message: %v", err)
	}
	switch head[0] {
	case 0:
		return string(b)
	case 2:
		s.trailer = string(b)
		if n, _ := s.body.Read(make([]byte, 1)); n != 0 {
			s.t.Errorf("bytes after the end-of-stream envelope")
		}
		return ""
	}
	s.t.Fatalf("envelope flag %d", head[0])
	return ""
}

// procEvent is a decoded ProcessEvent.
type procEvent struct {
	Event struct {
		Start *struct {
			PID uint32 `json:"pid"`
		} `json:"start"`
		Data *struct {
			Stdout []byte `json:"stdout"`
			Stderr []byte `json:"stderr"`
			PTY    []byte `json:"pty"`
		} `json:"data"`
		End       *processEndEvent `json:"end"`
		Keepalive *struct{}        `json:"keepalive"`
	} `json:"event"`
}

// next returns the next event; ok is false at the end of the stream.
func (s *procStream) next() (ev procEvent, ok bool) {
	s.t.Helper()
	raw := s.nextRaw()
	if raw == "" {
		return ev, false
	}
	if err := json.Unmarshal([]byte(raw), &ev); err != nil {
		s.t.Fatalf("decode %s: %v", raw, err)
	}
	return ev, true
}

// started reads the start event and returns the pid.
func (s *procStream) started() uint32 {
	s.t.Helper()
	ev, ok := s.next()
	if !ok || ev.Event.Start == nil {
		s.t.Fatalf("first event %+v (trailer %s), want start", ev, s.trailer)
	}
	return ev.Event.Start.PID
}

// procResult is what a stream carried after its start event.
type procResult struct {
	stdout, stderr, pty string
	keepalives          int
	end                 *processEndEvent
}

// rest reads the stream to its end. It fails when the end event is not the last message or the
// stream ends with an error.
func (s *procStream) rest() procResult {
	s.t.Helper()
	var res procResult
	for {
		ev, ok := s.next()
		if !ok {
			break
		}
		if res.end != nil {
			s.t.Fatalf("event after the end event: %+v", ev)
		}
		switch e := ev.Event; {
		case e.Data != nil:
			res.stdout += string(e.Data.Stdout)
			res.stderr += string(e.Data.Stderr)
			res.pty += string(e.Data.PTY)
		case e.Keepalive != nil:
			res.keepalives++
		case e.End != nil:
			res.end = e.End
		default:
			s.t.Fatalf("unexpected event %+v", ev)
		}
	}
	if s.trailer != "{}" || res.end == nil {
		s.t.Fatalf("stream ended with %s, end event %+v", s.trailer, res.end)
	}
	return res
}

// wantError reads the stream to its end and checks it ends with a Connect error.
func (s *procStream) wantError(code, msg string) {
	s.t.Helper()
	for {
		ev, ok := s.next()
		if !ok {
			break
		}
		if ev.Event.Start == nil && ev.Event.Keepalive == nil {
			s.t.Errorf("event %+v before the error", ev)
		}
	}
	var tr struct {
		Error *rpcError `json:"error"`
	}
	if err := json.Unmarshal([]byte(s.trailer), &tr); err != nil || tr.Error == nil || tr.Error.Code != code || !strings.Contains(tr.Error.Message, msg) {
		s.t.Errorf("stream ended with %s, want error %s ...%s...", s.trailer, code, msg)
	}
}

// startBody is the Start request of commands.run(cmd, {stdin}).
func startBody(cmd string, stdin bool) string {
	b, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", cmd}}, "stdin": stdin})
	return string(b)
}

func strp(s string) *string { return &s }

// execRequests returns the bodies of POST /exec (how Start runs a process) Corral received for
// a sandbox.
func (h *procHarness) execRequests(sandbox string) []corral.ExecRequest {
	var out []corral.ExecRequest
	for _, r := range h.fake.Requests() {
		if r.Method == "POST" && r.Path == "/v1/sandboxes/"+sandbox+"/exec" {
			var req corral.ExecRequest
			if err := json.Unmarshal(r.Body, &req); err != nil {
				h.t.Fatal(err)
			}
			out = append(out, req)
		}
	}
	return out
}

func TestProcessStartFraming(t *testing.T) {
	h := newProcHarness(t)
	// What commands.run("echo hello; err oops", {envs}) sends.
	s := h.stream(h.withBash, "Start", `{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hello; err oops"],"envs":{"B":"2","A":"1"}},"stdin":false}`, nil)
	var raws []string
	for raw := s.nextRaw(); raw != ""; raw = s.nextRaw() {
		raws = append(raws, raw)
	}
	want := []string{
		`{"event":{"start":{"pid":101}}}`,
		`{"event":{"data":{"stdout":"` + base64.StdEncoding.EncodeToString([]byte("hello\n")) + `"}}}`,
		`{"event":{"data":{"stderr":"` + base64.StdEncoding.EncodeToString([]byte("oops\n")) + `"}}}`,
		`{"event":{"end":{"exited":true,"status":"exit status 0"}}}`,
	}
	if !slices.Equal(raws, want) || s.trailer != "{}" {
		t.Errorf("stream =\n %s\n %s\nwant\n %s\n {}", strings.Join(raws, "\n "), s.trailer, strings.Join(want, "\n "))
	}
	got := h.execRequests(h.withBash)
	wantReq := corral.ExecRequest{Argv: []string{"/bin/bash", "-l", "-c", "echo hello; err oops"}, Env: []string{"A=1", "B=2"}}
	if len(got) != 1 || fmt.Sprint(got[0]) != fmt.Sprint(wantReq) {
		t.Errorf("Corral got %+v, want %+v", got, wantReq)
	}
	// One call per Start once the sandbox's shell is known (issue 24 item 4): a second Start
	// makes exactly one request to Corral.
	before := len(h.fake.Requests())
	again := h.stream(h.withBash, "Start", startBody("true", false), nil)
	again.started()
	again.rest()
	if calls := h.fake.Requests()[before:]; len(calls) != 1 {
		var paths []string
		for _, c := range calls {
			paths = append(paths, c.Method+" "+c.Path)
		}
		t.Errorf("a Start made %d Corral calls (%s), want 1 (POST exec)", len(calls), strings.Join(paths, ", "))
	}
}

func TestProcessStart(t *testing.T) {
	h := newProcHarness(t)
	tests := []struct {
		name           string
		body           string
		hdr            map[string]string
		stdout, stderr string
		end            processEndEvent
	}{
		{name: "exit 0", body: startBody("echo hi", false), stdout: "hi\n",
			end: processEndEvent{Exited: true, Status: "exit status 0"}},
		{name: "non-zero exit", body: startBody("err bad; exit 3", false), stderr: "bad\n",
			end: processEndEvent{ExitCode: 3, Exited: true, Status: "exit status 3", Error: strp("exit status 3")}},
		{name: "stdin false reads end of file", body: startBody("cat; echo done", false), stdout: "done\n",
			end: processEndEvent{Exited: true, Status: "exit status 0"}},
		{name: "timeout", body: startBody("sleep", false), hdr: map[string]string{"Connect-Timeout-Ms": "100"},
			end: processEndEvent{ExitCode: -1, Status: "signal: killed", Error: strp("signal: killed (the process ran past its timeout, the stream's Connect-Timeout-Ms)")}},
		{name: "envs", body: `{"process":{"cmd":"/bin/bash","args":["-l","-c","env"],"envs":{"K":"v"}},"stdin":false}`, stdout: "K=v\n",
			end: processEndEvent{Exited: true, Status: "exit status 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := h.stream(h.withBash, "Start", tt.body, tt.hdr)
			s.t = t
			if pid := s.started(); pid == 0 {
				t.Errorf("pid 0")
			}
			res := s.rest()
			if got, want := endJSON(res.end), endJSON(&tt.end); res.stdout != tt.stdout || res.stderr != tt.stderr || got != want {
				t.Errorf("got stdout %q stderr %q end %s, want %q %q %s", res.stdout, res.stderr, got, tt.stdout, tt.stderr, want)
			}
		})
	}
	t.Run("timeout header", func(t *testing.T) {
		// The SDK's default timeoutMs: the process lives at most 60 s.
		s := h.stream(h.withBash, "Start", startBody("true", false), map[string]string{"Connect-Timeout-Ms": "60000"})
		s.t = t
		s.started()
		s.rest()
		got := h.execRequests(h.withBash)
		if last := got[len(got)-1]; last.Timeout != "1m0s" {
			t.Errorf("Corral got timeout %q, want 1m0s", last.Timeout)
		}
		if first := got[0]; first.Timeout != "" {
			t.Errorf("Corral got timeout %q without the header, want none", first.Timeout)
		}
	})
	t.Run("cannot start", func(t *testing.T) {
		s := h.stream(h.withBash, "Start", `{"process":{"cmd":"/usr/bin/nope"}}`, nil)
		s.t = t
		s.wantError(codeInvalidArgument, "executable file not found")
	})
	t.Run("no cmd", func(t *testing.T) {
		s := h.stream(h.withBash, "Start", `{"process":{"args":["x"]}}`, nil)
		s.t = t
		s.wantError(codeInvalidArgument, "process.cmd")
	})
	t.Run("tag", func(t *testing.T) {
		s := h.stream(h.withBash, "Start", `{"process":{"cmd":"/bin/bash"},"tag":"t"}`, nil)
		s.t = t
		s.wantError(codeUnimplemented, "tag")
	})
	t.Run("binary protobuf", func(t *testing.T) {
		s := h.stream(h.withBash, "Start", startBody("true", false), map[string]string{"Content-Type": "application/connect+proto"})
		s.t = t
		s.wantError(codeUnimplemented, "protobuf")
	})
	t.Run("sandbox gone", func(t *testing.T) {
		c := h.fake.Client()
		sb, err := c.CreateSandbox(context.Background(), corral.CreateRequest{Base: corraltest.DefaultBase})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.DeleteSandbox(context.Background(), sb.ID); err != nil {
			t.Fatal(err)
		}
		s := h.stream(sb.ID, "Start", startBody("true", false), nil)
		s.t = t
		s.wantError(codeUnavailable, "not running")
	})
}

func endJSON(e *processEndEvent) string {
	b, _ := json.Marshal(e)
	return string(b)
}

func TestProcessStdin(t *testing.T) {
	h := newProcHarness(t)
	// commands.run("cat", {background: true, stdin: true}), sendStdin, closeStdin.
	s := h.stream(h.withBash, "Start", startBody("cat", true), nil)
	pid := s.started()
	sel := fmt.Sprintf(`{"process":{"pid":%d}`, pid)
	for _, in := range []string{"aGVsbG8g", "d29ybGQ"} { // "hello ", "world" (unpadded, as protojson allows)
		if st, body := h.unary(h.withBash, "SendInput", sel+`,"input":{"stdin":"`+in+`"}}`, nil); st != 200 || body != "{}" {
			t.Fatalf("SendInput: %d %s", st, body)
		}
	}
	h.wantUnaryError(h.withBash, "SendInput", sel+`,"input":{"pty":"eA=="}}`, 400, codeFailedPrecond, "input.stdin")
	h.wantUnaryError(h.withBash, "SendInput", sel+`}`, 400, codeInvalidArgument, "input")
	if st, body := h.unary(h.withBash, "CloseStdin", sel+`}`, nil); st != 200 || body != "{}" {
		t.Fatalf("CloseStdin: %d %s", st, body)
	}
	res := s.rest()
	if res.stdout != "hello world" || res.end.ExitCode != 0 || !res.end.Exited {
		t.Errorf("got %q, end %+v", res.stdout, *res.end)
	}
	// The process is gone: envd's not_found.
	h.wantUnaryError(h.withBash, "SendInput", sel+`,"input":{"stdin":"eA=="}}`, 404, codeNotFound, fmt.Sprintf("process with pid %d not found", pid))
	h.wantUnaryError(h.withBash, "CloseStdin", sel+`}`, 404, codeNotFound, "not found")
	h.wantUnaryError(h.withBash, "CloseStdin", `{"process":{"tag":"x"}}`, 404, codeNotFound, "tag")
	h.wantUnaryError(h.withBash, "CloseStdin", `{}`, 400, codeInvalidArgument, "pid")

	t.Run("closed stdin", func(t *testing.T) {
		// Stdin closed twice is fine; input after it is Corral's conflict.
		s := h.stream(h.withBash, "Start", startBody("cat; sleep", true), nil)
		s.t = t
		sel := fmt.Sprintf(`{"process":{"pid":%d}`, s.started())
		for range 2 {
			if st, body := h.unary(h.withBash, "CloseStdin", sel+`}`, nil); st != 200 {
				t.Fatalf("CloseStdin: %d %s", st, body)
			}
		}
		h.wantUnaryError(h.withBash, "SendInput", sel+`,"input":{"stdin":"eA=="}}`, 400, codeFailedPrecond, "closed")
		h.unary(h.withBash, "SendSignal", sel+`,"signal":"SIGNAL_SIGKILL"}`, nil)
		s.rest()
	})
}

func TestProcessSignal(t *testing.T) {
	h := newProcHarness(t)
	for _, tt := range []struct {
		signal, status string
	}{
		{`"SIGNAL_SIGKILL"`, "signal: killed"},
		{`"SIGNAL_SIGTERM"`, "signal: terminated"},
		{`9`, "signal: killed"},
	} {
		s := h.stream(h.withBash, "Start", startBody("sleep", false), nil)
		pid := s.started()
		if st, body := h.unary(h.withBash, "SendSignal", fmt.Sprintf(`{"process":{"pid":%d},"signal":%s}`, pid, tt.signal), nil); st != 200 || body != "{}" {
			t.Fatalf("SendSignal %s: %d %s", tt.signal, st, body)
		}
		want := processEndEvent{ExitCode: -1, Status: tt.status, Error: strp(tt.status)}
		if res := s.rest(); endJSON(res.end) != endJSON(&want) {
			t.Errorf("%s: end %s, want %s", tt.signal, endJSON(res.end), endJSON(&want))
		}
		// Killing it again: the SDK's kill then returns false.
		h.wantUnaryError(h.withBash, "SendSignal", fmt.Sprintf(`{"process":{"pid":%d},"signal":"SIGNAL_SIGKILL"}`, pid), 404, codeNotFound, "not found")
	}
	h.wantUnaryError(h.withBash, "SendSignal", `{"process":{"pid":4242},"signal":"SIGNAL_SIGKILL"}`, 404, codeNotFound, "process with pid 4242 not found")
	h.wantUnaryError(h.withBash, "SendSignal", `{"process":{"pid":4242},"signal":"SIGNAL_UNSPECIFIED"}`, 501, codeUnimplemented, "SIGNAL_UNSPECIFIED")
	h.wantUnaryError(h.withBash, "SendSignal", `{"process":{"pid":4242}}`, 501, codeUnimplemented, "SIGNAL_UNSPECIFIED")
	h.wantUnaryError(h.withBash, "SendSignal", `{"process":{"pid":4242},"signal":"SIGNAL_SIGHUP"}`, 400, codeInvalidArgument, "signal")
}

func TestProcessConnectAndList(t *testing.T) {
	h := newProcHarness(t)
	if st, body := h.unary(h.withBash, "List", `{}`, nil); st != 200 || body != "{}" {
		t.Errorf("List with nothing running: %d %s", st, body)
	}
	first := h.stream(h.withBash, "Start", startBody("cat", true), nil)
	pid := first.started()
	sel := fmt.Sprintf(`{"process":{"pid":%d}`, pid)
	h.unary(h.withBash, "SendInput", sel+`,"input":{"stdin":"YmVmb3Jl"}}`, nil) // "before": not replayed

	st, body := h.unary(h.withBash, "List", `{}`, nil)
	want := fmt.Sprintf(`{"processes":[{"config":{"cmd":"/bin/bash","args":["-l","-c","cat"]},"pid":%d}]}`, pid)
	if st != 200 || body != want {
		t.Errorf("List: %d %s, want %s", st, body, want)
	}

	// Wait until "before" is out, so that Connect starts after it.
	if ev, _ := first.next(); ev.Event.Data == nil || string(ev.Event.Data.Stdout) != "before" {
		t.Fatalf("first stream: %+v", ev)
	}
	second := h.stream(h.withBash, "Connect", sel+`}`, nil)
	if got := second.started(); got != pid {
		t.Errorf("Connect start pid %d, want %d", got, pid)
	}
	h.unary(h.withBash, "SendInput", sel+`,"input":{"stdin":"YWZ0ZXI="}}`, nil) // "after"
	h.unary(h.withBash, "CloseStdin", sel+`}`, nil)
	if res := second.rest(); res.stdout != "after" || !res.end.Exited {
		t.Errorf("Connect got %q, end %+v", res.stdout, *res.end)
	}
	if res := first.rest(); res.stdout != "after" || !res.end.Exited {
		t.Errorf("Start got %q after the first output, end %+v", res.stdout, *res.end)
	}
	if st, body := h.unary(h.withBash, "List", `{}`, nil); st != 200 || body != "{}" {
		t.Errorf("List after the exit: %d %s", st, body)
	}

	s := h.stream(h.withBash, "Connect", `{"process":{"pid":4242}}`, nil)
	s.wantError(codeNotFound, "process with pid 4242 not found")
}

func TestProcessDisconnectKeepsRunning(t *testing.T) {
	h := newProcHarness(t)
	s := h.stream(h.withBash, "Start", startBody("cat", true), nil)
	pid := s.started()
	s.close() // the SDK's handle.disconnect()
	sel := fmt.Sprintf(`{"process":{"pid":%d}`, pid)
	again := h.stream(h.withBash, "Connect", sel+`}`, nil)
	again.started()
	h.unary(h.withBash, "SendInput", sel+`,"input":{"stdin":"c3RpbGwgaGVyZQ=="}}`, nil)
	h.unary(h.withBash, "CloseStdin", sel+`}`, nil)
	if res := again.rest(); res.stdout != "still here" {
		t.Errorf("after a disconnect: %q, end %+v", res.stdout, *res.end)
	}
}

func TestProcessPTY(t *testing.T) {
	h := newProcHarness(t)
	// pty.create({cols: 80, rows: 24}): no stdin field.
	s := h.stream(h.withBash, "Start", `{"process":{"cmd":"/bin/bash","args":["-i","-l"],"envs":{"TERM":"xterm-256color"}},"pty":{"size":{"cols":80,"rows":24}}}`, nil)
	pid := s.started()
	sel := fmt.Sprintf(`{"process":{"pid":%d}`, pid)
	readPTY := func(want string) {
		t.Helper()
		ev, _ := s.next()
		if ev.Event.Data == nil || string(ev.Event.Data.PTY) != want || ev.Event.Data.Stdout != nil {
			t.Fatalf("event %+v, want pty %q", ev, want)
		}
	}
	readPTY("size 24x80\n")
	if st, body := h.unary(h.withBash, "Update", sel+`,"pty":{"size":{"cols":100,"rows":"30"}}}`, nil); st != 200 || body != "{}" {
		t.Fatalf("Update: %d %s", st, body)
	}
	readPTY("size 30x100\n")
	if st, body := h.unary(h.withBash, "SendInput", sel+`,"input":{"pty":"bHMK"}}`, nil); st != 200 {
		t.Fatalf("SendInput: %d %s", st, body)
	}
	readPTY("ls\n")
	h.wantUnaryError(h.withBash, "SendInput", sel+`,"input":{"stdin":"bHMK"}}`, 400, codeFailedPrecond, "input.pty")
	h.wantUnaryError(h.withBash, "CloseStdin", sel+`}`, 400, codeFailedPrecond, "terminal")
	h.wantUnaryError(h.withBash, "Update", sel+`}`, 400, codeInvalidArgument, "pty.size")
	h.wantUnaryError(h.withBash, "Update", sel+`,"pty":{"size":{"cols":0,"rows":3}}}`, 400, codeInvalidArgument, "pty.size")
	h.wantUnaryError(h.withBash, "Update", `{"process":{"pid":4242},"pty":{"size":{"cols":1,"rows":1}}}`, 404, codeNotFound, "4242")
	if reqs := h.execRequests(h.withBash); len(reqs) != 1 || !reqs[0].TTY || reqs[0].Rows != 24 || reqs[0].Cols != 80 {
		t.Errorf("Corral got %+v", reqs)
	}
	h.unary(h.withBash, "SendSignal", sel+`,"signal":"SIGNAL_SIGKILL"}`, nil)
	if res := s.rest(); res.end.ExitCode != -1 {
		t.Errorf("end %+v", *res.end)
	}

	t.Run("resize a pipe", func(t *testing.T) {
		s := h.stream(h.withBash, "Start", startBody("sleep", false), nil)
		s.t = t
		sel := fmt.Sprintf(`{"process":{"pid":%d}`, s.started())
		h.wantUnaryError(h.withBash, "Update", sel+`,"pty":{"size":{"cols":1,"rows":1}}}`, 400, codeFailedPrecond, "terminal")
		h.unary(h.withBash, "SendSignal", sel+`,"signal":"SIGNAL_SIGKILL"}`, nil)
		s.rest()
	})
}

func TestProcessShellSubstitution(t *testing.T) {
	h := newProcHarness(t)
	run := func(sandbox string) string {
		t.Helper()
		s := h.stream(sandbox, "Start", startBody("shell", false), nil)
		s.started()
		return s.rest().stdout
	}
	if got := run(h.withBash); got != "/bin/bash\n" {
		t.Errorf("with bash: ran %q", got)
	}
	for range 2 {
		if got := run(h.noBash); got != "/bin/sh\n" {
			t.Errorf("without bash: ran %q", got)
		}
	}
	stats := 0
	for _, r := range h.fake.Requests() {
		if r.Path == "/v1/sandboxes/"+h.noBash+"/files/stat" {
			stats++
		}
	}
	if stats != 1 {
		t.Errorf("%d stats of /bin/bash, want 1 (remembered)", stats)
	}
	// Other programs run as asked.
	s := h.stream(h.noBash, "Start", `{"process":{"cmd":"/bin/sh","args":["-c","shell"]},"stdin":false}`, nil)
	s.started()
	if got := s.rest().stdout; got != "/bin/sh\n" {
		t.Errorf("sh: ran %q", got)
	}
}

func TestProcessKeepalive(t *testing.T) {
	h := newProcHarness(t)
	s := h.stream(h.withBash, "Start", startBody("cat", true), map[string]string{"Keepalive-Ping-Interval": "1"})
	pid := s.started()
	start := time.Now()
	ev, _ := s.next()
	if ev.Event.Keepalive == nil {
		t.Fatalf("event %+v, want keepalive", ev)
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("keepalive after %s, want about 1s", d)
	}
	h.unary(h.withBash, "CloseStdin", fmt.Sprintf(`{"process":{"pid":%d}}`, pid), nil)
	if res := s.rest(); !res.end.Exited {
		t.Errorf("end %+v", *res.end)
	}
}

func TestProcessCwd(t *testing.T) {
	h := newProcHarness(t)
	ctx := context.Background()
	passwd := "root:x:0:0:root:/root:/bin/sh\n# comment\nalice:x:1000:1000:Alice:/home/alice:/bin/sh\n"
	if _, err := h.fake.Client().WriteFile(ctx, h.withBash, "/etc/passwd", strings.NewReader(passwd), corral.WriteFileOptions{Parents: true}); err != nil {
		t.Fatal(err)
	}
	alice := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"))
	for _, tt := range []struct {
		sandbox, auth, cwd, want string
	}{
		{h.withBash, "", "/srv/../tmp", "/tmp"},
		{h.withBash, "", "proj", "/root/proj"},
		{h.withBash, "", "~", "/root"},
		{h.withBash, "", "~/x", "/root/x"},
		{h.withBash, alice, "proj", "/home/alice/proj"},
		{h.withBash, "Basic " + base64.StdEncoding.EncodeToString([]byte("1000:")), "p", "/home/alice/p"},
		{h.noBash, "", "p", "/root/p"}, // no /etc/passwd: root's home, as the filesystem service

	} {
		body, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", "pwd"}, "cwd": tt.cwd}, "stdin": false})
		s := h.stream(tt.sandbox, "Start", string(body), map[string]string{"Authorization": tt.auth})
		s.started()
		if got := s.rest().stdout; got != tt.want+"\n" {
			t.Errorf("cwd %q as %q: ran in %q, want %q", tt.cwd, tt.auth, got, tt.want)
		}
	}
	reqs := h.execRequests(h.withBash)
	if u := reqs[4].User; u != "alice" {
		t.Errorf("Corral got user %q, want alice", u)
	}
}

func TestProcessAccess(t *testing.T) {
	h := newProcHarness(t)
	for _, tok := range []string{"", "wrong", h.gw.EnvdAccessToken(h.noBash)} {
		hdr := map[string]string{"X-Access-Token": tok}
		st, body := h.unary(h.withBash, "List", `{}`, hdr)
		var e rpcError
		if json.Unmarshal([]byte(body), &e); st != 401 || e.Code != codeUnauthenticated {
			t.Errorf("token %q: %d %s, want 401 unauthenticated", tok, st, body)
		}
	}
	h.wantUnaryError(h.withBash, "StreamInput", `{}`, 501, codeUnimplemented, "SendInput")
	h.wantUnaryError(h.withBash, "Frobnicate", `{}`, 501, codeUnimplemented, "Frobnicate")
	h.wantUnaryError(h.withBash, "List", `{"x":`, 400, codeInvalidArgument, "decode")
}

func TestProcessEnd(t *testing.T) {
	for _, tt := range []struct {
		exit corral.Exit
		want string
	}{
		{corral.Exit{}, `{"exited":true,"status":"exit status 0"}`},
		{corral.Exit{Code: 1}, `{"exitCode":1,"exited":true,"status":"exit status 1","error":"exit status 1"}`},
		{corral.Exit{Code: 126, Error: "permission denied"}, `{"exitCode":126,"exited":true,"status":"exit status 126","error":"permission denied"}`},
		{corral.Exit{Code: -1, Signal: "SIGKILL", OOMKilled: true}, `{"exitCode":-1,"status":"signal: killed","error":"signal: killed (out of memory)"}`},
		{corral.Exit{Code: -1, Signal: "SIGXCPU"}, `{"exitCode":-1,"status":"signal: SIGXCPU","error":"signal: SIGXCPU"}`},
	} {
		b, _ := json.Marshal(processEnd(&tt.exit))
		if string(b) != tt.want {
			t.Errorf("%+v: %s, want %s", tt.exit, b, tt.want)
		}
	}
}

func TestProcessCorralError(t *testing.T) {
	g := &Gateway{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r := httptest.NewRequest("POST", "/process.Process/SendInput", nil)
	tgt := &sandboxTarget{id: "sb-1"}
	for _, tt := range []struct {
		err       error
		onSandbox bool
		code      string
	}{
		{&corral.APIError{Status: 400, Code: corral.CodeInvalid}, false, codeInvalidArgument},
		{&corral.APIError{Status: 401, Code: corral.CodeUnauthorized}, false, codeUnauthenticated},
		{&corral.APIError{Status: 403, Code: corral.CodeDenied}, false, codePermissionDenied},
		{&corral.APIError{Status: 404, Code: corral.CodeNotFound}, false, codeNotFound},
		{&corral.APIError{Status: 404, Code: corral.CodeNotFound}, true, codeUnavailable},
		{&corral.APIError{Status: 409, Code: corral.CodeConflict}, false, codeFailedPrecond},
		{&corral.APIError{Status: 409, Code: corral.CodeConflict}, true, codeUnavailable},
		{&corral.APIError{Status: 413, Code: corral.CodeTooLarge}, false, codeResourceExhaust},
		{&corral.APIError{Status: 429, Code: corral.CodeExhausted}, false, codeResourceExhaust},
		{&corral.APIError{Status: 503, Code: corral.CodeUnavailable}, false, codeUnavailable},
		{&corral.APIError{Status: 500, Code: corral.CodeInternal}, false, codeInternal},
		{context.Canceled, false, codeCanceled},
		{io.ErrUnexpectedEOF, false, codeUnavailable},
	} {
		if got := asRPCError(g.processCorralError(r, tgt, tt.err, tt.onSandbox)); got.Code != tt.code {
			t.Errorf("%v (on sandbox %v): %s, want %s", tt.err, tt.onSandbox, got.Code, tt.code)
		}
	}
}

// FuzzProcessRequests decodes arbitrary bodies as every request of the process service.
func FuzzProcessRequests(f *testing.F) {
	for _, s := range []string{
		startBody("echo hi", false),
		`{"process":{"cmd":"/bin/bash","args":["-i","-l"]},"pty":{"size":{"cols":"80","rows":24.0}}}`,
		`{"process":{"pid":1},"input":{"stdin":"aGk-_w"}}`,
		`{"process":{"pid":1},"signal":"SIGNAL_SIGKILL"}`,
		`{"process":{"pid":1},"signal":15}`,
		`{"process":{"tag":"x"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, v := range []any{&processStartRequest{}, &processSelectRequest{}, &processSendInputRequest{}, &processSendSignalRequest{}, &processUpdateRequest{}} {
			decodeMessage(b, v)
		}
		// A request that decodes translates without Corral (no cwd, no bash to look for).
		var req processStartRequest
		if decodeMessage(b, &req) == nil && req.Process != nil && req.Process.Cmd != "" && req.Process.Cmd != "/bin/bash" && req.Tag == nil {
			p := &processConfig{Cmd: req.Process.Cmd, Args: req.Process.Args, Envs: req.Process.Envs}
			exec, err := (&Gateway{}).processExecRequest(httptest.NewRequest("POST", "/", nil), &sandboxTarget{}, &processStartRequest{Process: p, PTY: req.PTY})
			if err == nil && (exec.Argv[0] != p.Cmd || len(exec.Argv) != 1+len(p.Args) || len(exec.Env) != len(p.Envs) || exec.TTY != (req.PTY != nil)) {
				t.Errorf("%s: exec %+v", b, exec)
			}
		}
	})
}
