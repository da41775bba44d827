// Package conformance is the API conformance suite: cases written once against the Go SDK that
// run both against the SDK's fake server (corraltest, in this module's tests) and against a real
// `corral up` (internal/e2e's TestAPIConformance), so the fake cannot drift from the server
// without a test failing.
//
// The real server is the reference. A case asserts what a client can rely on: the HTTP status
// and error code of each failure (and the field it names, where the server names one), the
// fields a response echoes back, and the state a request leaves behind. Cases use only programs
// both sides run (echo, cat, true, false, env, pwd, sleep), names of their own (so they may share
// a server with other tests), and no timings. The cases are grouped by topic: sandboxes.go,
// exec.go, files.go, layers.go (with environments) and iam.go.
package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
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
