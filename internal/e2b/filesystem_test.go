package e2b

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

// fsHarness is a gateway serving the in-sandbox surface (with corraltest's token as its service
// token) in front of corraltest, and one running sandbox. Routes of Corral that a test fakes
// itself go in corralMux; the rest reach corraltest.
type fsHarness struct {
	t         *testing.T
	fake      *corraltest.Server
	corralMux *http.ServeMux
	gw        *Gateway
	url       string
	id        string // the sandbox

	watches atomic.Int32 // watches Corral is serving
	// fakeWatch, when set, serves Corral's watch of /fake (set it before the first watch).
	fakeWatch http.HandlerFunc
}

// watchesEnd waits until Corral serves no watch: the gateway has closed every one.
func (h *fsHarness) watchesEnd() {
	h.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); h.watches.Load() != 0; {
		if time.Now().After(deadline) {
			h.t.Fatalf("%d watches are still open", h.watches.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newFSHarness(t *testing.T) *fsHarness {
	t.Helper()
	fake := corraltest.NewServer(t)
	target, _ := url.Parse(fake.URL)
	mux := http.NewServeMux()
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ErrorLog = log.New(io.Discard, "", 0) // uploads cut short on purpose
	proxy.FlushInterval = -1                    // watch streams flush each event
	mux.Handle("/", proxy)
	h := &fsHarness{t: t, fake: fake, corralMux: mux}
	// Watches are counted while Corral serves them, and the directory /fake is watched by
	// fakeWatch instead of corraltest.
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/watch", func(w http.ResponseWriter, r *http.Request) {
		h.watches.Add(1)
		defer h.watches.Add(-1)
		if r.URL.Query().Get("path") == "/fake" && h.fakeWatch != nil {
			h.fakeWatch(w, r)
			return
		}
		proxy.ServeHTTP(w, r)
	})
	corralSrv := httptest.NewServer(mux)
	t.Cleanup(corralSrv.Close)
	gw, err := New(Config{CorralURL: corralSrv.URL, Domain: "e2b.test", TokenKey: testKey, ServiceToken: fake.Token}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(srv.Close)
	sb, err := fake.Client().CreateSandbox(t.Context(), corral.CreateRequest{Base: "base:default"})
	if err != nil {
		t.Fatal(err)
	}
	h.gw, h.url, h.id = gw, srv.URL, sb.ID
	return h
}

// write puts a file into the sandbox directly.
func (h *fsHarness) write(p, data string) {
	h.t.Helper()
	_, err := h.fake.Client().WriteFile(h.t.Context(), h.id, p, strings.NewReader(data), corral.WriteFileOptions{Parents: true})
	if err != nil {
		h.t.Fatalf("write %s: %v", p, err)
	}
}

// addUser gives the sandbox an /etc/passwd and /etc/group with root and user (uid 1000, home
// /home/user, as E2B's templates have).
func (h *fsHarness) addUser() {
	h.t.Helper()
	h.write("/etc/passwd", "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n")
	h.write("/etc/group", "root:x:0:\nuser:x:1000:\n")
	if _, err := h.fake.Client().Mkdir(h.t.Context(), h.id, corral.MkdirRequest{Path: "/home/user", Parents: true}); err != nil {
		h.t.Fatal(err)
	}
}

// envdRequest builds a request of the in-sandbox surface as the SDK sends it (§4.1, §4.2).
func (h *fsHarness) envdRequest(method, target, ctype string, body io.Reader, user string) *http.Request {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+target, body)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", h.id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", h.gw.EnvdAccessToken(h.id))
	req.Header.Set("User-Agent", "e2b-js-sdk/2.51.0")
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if user != "" {
		req.SetBasicAuth(user, "")
	}
	return req
}

func (h *fsHarness) send(req *http.Request) response {
	h.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}
}

// rpc makes a unary call of the filesystem service as user ("" for none).
func (h *fsHarness) rpc(method, body, user string) response {
	h.t.Helper()
	req := h.envdRequest("POST", "/filesystem.Filesystem/"+method, "application/json", strings.NewReader(body), user)
	req.Header.Set("Connect-Protocol-Version", "1")
	return h.send(req)
}

// rpcOK makes a unary call that must succeed and decodes its answer.
func (h *fsHarness) rpcOK(method, body, user string, out any) {
	h.t.Helper()
	resp := h.rpc(method, body, user)
	if resp.status != http.StatusOK {
		h.t.Fatalf("%s %s: %d %s", method, body, resp.status, resp.body)
	}
	if out != nil {
		resp.decode(h.t, out)
	}
}

// rpcErr makes a unary call that must fail with code (and HTTP status of Connect's table).
func (h *fsHarness) rpcErr(method, body, user, code string) string {
	h.t.Helper()
	resp := h.rpc(method, body, user)
	var e struct{ Code, Message string }
	if err := json.Unmarshal(resp.body, &e); err != nil || e.Code != code || resp.status != connectStatus[code] {
		h.t.Fatalf("%s %s: %d %s, want %d with code %q", method, body, resp.status, resp.body, connectStatus[code], code)
	}
	return e.Message
}

// wireEntry is EntryInfo as the SDK reads it (proto3 JSON).
type wireEntry struct {
	Name          string  `json:"name"`
	Type          string  `json:"type"`
	Path          string  `json:"path"`
	Size          *string `json:"size"`
	Mode          uint32  `json:"mode"`
	Permissions   string  `json:"permissions"`
	Owner         string  `json:"owner"`
	Group         string  `json:"group"`
	ModifiedTime  string  `json:"modifiedTime"`
	SymlinkTarget *string `json:"symlinkTarget"`
}

// protoTimeRE is what the SDK's Timestamp parser accepts.
var protoTimeRE = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{3}|\.[0-9]{6}|\.[0-9]{9})?Z$`)

func TestFSStat(t *testing.T) {
	h := newFSHarness(t)
	h.write("/tmp/a.txt", "hello")

	var got struct{ Entry wireEntry }
	h.rpcOK("Stat", `{"path":"/tmp/a.txt"}`, "", &got)
	e := got.Entry
	if e.Name != "a.txt" || e.Type != "FILE_TYPE_FILE" || e.Path != "/tmp/a.txt" || e.Size == nil || *e.Size != "5" ||
		e.Mode != 0o644 || e.Permissions != "-rw-r--r--" || e.Owner != "root" || e.Group != "root" || e.SymlinkTarget != nil {
		t.Errorf("Stat file = %+v", e)
	}
	if !protoTimeRE.MatchString(e.ModifiedTime) {
		t.Errorf("modifiedTime %q is not a proto3 JSON timestamp", e.ModifiedTime)
	}
	if !bytes.Contains(h.rpc("Stat", `{"path":"/tmp/a.txt"}`, "").body, []byte(`"size":"5"`)) {
		t.Error(`size is not sent as an int64 JSON string ("5")`)
	}

	h.rpcOK("Stat", `{"path":"/tmp"}`, "", &got)
	if got.Entry.Type != "FILE_TYPE_DIRECTORY" || got.Entry.Permissions != "drwxr-xr-x" || got.Entry.Mode != 0o755 {
		t.Errorf("Stat dir = %+v", got.Entry)
	}

	h.rpcErr("Stat", `{"path":"/tmp/missing"}`, "", codeNotFound)
	h.rpcErr("Stat", `{"path":"~other/x"}`, "", codeInvalidArgument)
	h.rpcErr("Stat", `{"path":`, "", codeInvalidArgument)
	if resp := h.rpc("Nope", `{}`, ""); resp.status != http.StatusNotImplemented {
		t.Errorf("unknown method: %d %s", resp.status, resp.body)
	}
	req := h.envdRequest("POST", "/filesystem.Filesystem/Stat", "application/proto", strings.NewReader(""), "")
	if resp := h.send(req); resp.status != http.StatusNotImplemented {
		t.Errorf("binary protobuf: %d %s, want 501", resp.status, resp.body)
	}
}

func TestFSPathsAndUsers(t *testing.T) {
	h := newFSHarness(t)
	h.write("/root/r.txt", "r")

	var got struct{ Entry wireEntry }
	// No user: Corral's default user, root, whose home is /root even without /etc/passwd.
	for _, p := range []string{"r.txt", "~/r.txt", "./r.txt", "/root/../root/r.txt"} {
		h.rpcOK("Stat", `{"path":"`+p+`"}`, "", &got)
		if got.Entry.Path != "/root/r.txt" {
			t.Errorf("Stat %q: path %q, want /root/r.txt", p, got.Entry.Path)
		}
	}
	h.rpcOK("Stat", `{"path":""}`, "root", &got)
	if got.Entry.Path != "/root" {
		t.Errorf("Stat of the empty path as root: %q, want the home /root", got.Entry.Path)
	}
	// A user the sandbox does not have.
	if msg := h.rpcErr("Stat", `{"path":"/tmp"}`, "user", codeUnauthenticated); !strings.Contains(msg, "user") {
		t.Errorf("unknown user: %q", msg)
	}

	// Once /etc/passwd has the user (a fresh read: a user not found reloads the table).
	h.addUser()
	h.write("/home/user/u.txt", "u")
	h.rpcOK("Stat", `{"path":"u.txt"}`, "user", &got)
	if got.Entry.Path != "/home/user/u.txt" {
		t.Errorf("Stat u.txt as user: %q", got.Entry.Path)
	}
	h.rpcOK("Stat", `{"path":"~"}`, "user", &got)
	if got.Entry.Path != "/home/user" {
		t.Errorf("Stat ~ as user: %q", got.Entry.Path)
	}

	// Owner and group names come from the sandbox's tables; files written as user are its.
	resp := h.upload("/files?path=owned.txt&username=user", "application/octet-stream", strings.NewReader("x"), nil)
	if resp.status != http.StatusOK {
		t.Fatalf("upload as user: %d %s", resp.status, resp.body)
	}
	h.rpcOK("Stat", `{"path":"/home/user/owned.txt"}`, "", &got)
	if got.Entry.Owner != "user" || got.Entry.Group != "user" {
		t.Errorf("owner %q group %q, want user user", got.Entry.Owner, got.Entry.Group)
	}
}

func TestFSListDir(t *testing.T) {
	h := newFSHarness(t)
	h.write("/w/b.txt", "bb")
	h.write("/w/a/x.txt", "x")
	h.write("/w/a/deep/y.txt", "y")
	h.write("/w/c/z.txt", "z")

	list := func(body string) []string {
		t.Helper()
		var got struct{ Entries []wireEntry }
		h.rpcOK("ListDir", body, "", &got)
		var out []string
		for _, e := range got.Entries {
			out = append(out, e.Path+" "+strings.TrimPrefix(e.Type, "FILE_TYPE_"))
		}
		return out
	}
	if got, want := strings.Join(list(`{"path":"/w","depth":1}`), ", "), "/w/a DIRECTORY, /w/b.txt FILE, /w/c DIRECTORY"; got != want {
		t.Errorf("depth 1:\n got %s\nwant %s", got, want)
	}
	if got, want := strings.Join(list(`{"path":"/w"}`), ", "), "/w/a DIRECTORY, /w/b.txt FILE, /w/c DIRECTORY"; got != want {
		t.Errorf("no depth (envd: 1):\n got %s\nwant %s", got, want)
	}
	want2 := "/w/a DIRECTORY, /w/a/deep DIRECTORY, /w/a/x.txt FILE, /w/b.txt FILE, /w/c DIRECTORY, /w/c/z.txt FILE"
	if got := strings.Join(list(`{"path":"/w","depth":2}`), ", "); got != want2 {
		t.Errorf("depth 2:\n got %s\nwant %s", got, want2)
	}
	if got := strings.Join(list(`{"path":"/w","depth":"2"}`), ", "); got != want2 {
		t.Errorf("depth as a JSON string:\n got %s\nwant %s", got, want2)
	}
	if got := list(`{"path":"/w/c/../c","depth":1}`); len(got) != 1 || got[0] != "/w/c/z.txt FILE" {
		t.Errorf("list /w/c/../c: %v", got)
	}
	if got := h.rpc("ListDir", `{"path":"/w/c/z.txt/.."}`, ""); got.status != http.StatusOK {
		t.Errorf("list of a cleaned path: %d %s", got.status, got.body)
	}
	var empty struct {
		Entries *[]wireEntry `json:"entries"`
	}
	h.rpcOK("ListDir", `{"path":"/tmp"}`, "", &empty)
	if empty.Entries == nil || len(*empty.Entries) != 0 {
		t.Errorf("empty directory: %+v", empty)
	}
	h.rpcErr("ListDir", `{"path":"/w/b.txt"}`, "", codeInvalidArgument)
	h.rpcErr("ListDir", `{"path":"/nope"}`, "", codeNotFound)
	h.rpcErr("ListDir", `{"path":"/w","depth":-1}`, "", codeInvalidArgument)
}

func TestFSListDirBound(t *testing.T) {
	h := newFSHarness(t)
	for _, d := range []string{"a", "b", "c"} {
		h.write("/big/"+d+"/f", "")
	}
	c := &fsCall{t: &sandboxTarget{id: h.id, c: h.fake.Client()}, users: &userTable{}}
	var out []entryInfo
	if err := c.walk(t.Context(), "/big", 2, true, &out); err != nil || len(out) != 6 {
		t.Fatalf("walk: %d entries, %v", len(out), err)
	}
	out = make([]entryInfo, maxListEntries-6)
	if err := c.walk(t.Context(), "/big", 2, true, &out); err != nil {
		t.Errorf("walk up to the bound: %v", err)
	}
	out = make([]entryInfo, maxListEntries-5)
	err := c.walk(t.Context(), "/big", 2, true, &out)
	if re := asRPCError(err); err == nil || re.Code != codeResourceExhaust {
		t.Errorf("walk past the bound: %v, want resource_exhausted", err)
	}
}

func TestFSMakeDirAndRemove(t *testing.T) {
	h := newFSHarness(t)
	h.write("/tmp/file", "f")

	var got struct{ Entry wireEntry }
	h.rpcOK("MakeDir", `{"path":"/tmp/a/b/c"}`, "", &got)
	if got.Entry.Path != "/tmp/a/b/c" || got.Entry.Type != "FILE_TYPE_DIRECTORY" || got.Entry.Name != "c" {
		t.Errorf("MakeDir = %+v", got.Entry)
	}
	h.rpcOK("Stat", `{"path":"/tmp/a/b"}`, "", &got)
	if got.Entry.Type != "FILE_TYPE_DIRECTORY" {
		t.Errorf("parent of the new directory: %+v", got.Entry)
	}
	h.rpcErr("MakeDir", `{"path":"/tmp/a/b/c"}`, "", codeAlreadyExists) // the SDK's makeDir: false
	h.rpcErr("MakeDir", `{"path":"/tmp/file"}`, "", codeInvalidArgument)
	h.rpcErr("MakeDir", `{"path":"/tmp/file/sub"}`, "", codeFailedPrecond)
	h.rpcOK("MakeDir", `{"path":"rel"}`, "", &got)
	if got.Entry.Path != "/root/rel" {
		t.Errorf("MakeDir rel: %q", got.Entry.Path)
	}

	h.write("/tmp/a/b/c/f.txt", "x")
	var empty map[string]any
	h.rpcOK("Remove", `{"path":"/tmp/a"}`, "", &empty)
	if len(empty) != 0 {
		t.Errorf("Remove answered %v, want {}", empty)
	}
	h.rpcErr("Stat", `{"path":"/tmp/a/b/c/f.txt"}`, "", codeNotFound)
	h.rpcOK("Remove", `{"path":"/tmp/a"}`, "", nil) // envd: a missing path is no error
	h.rpcOK("Remove", `{"path":"/tmp/file"}`, "", nil)
	if _, ok := h.fake.File(h.id, "/tmp/file"); ok {
		t.Error("/tmp/file is still there")
	}
	h.rpcErr("Remove", `{"path":"/"}`, "", codeInvalidArgument)
}

func TestFSErrorMapping(t *testing.T) {
	for status, want := range map[int]string{
		404: codeNotFound, 400: codeInvalidArgument, 409: codeFailedPrecond, 403: codePermissionDenied,
		401: codeUnauthenticated, 503: codeUnavailable, 429: codeResourceExhaust, 413: codeResourceExhaust,
		500: codeInternal, 502: codeInternal,
	} {
		err := fsError(&corral.APIError{Status: status, Code: corral.CodeForStatus(status), Message: "m"}, "stat /x")
		if re := asRPCError(err); re.Code != want || re.Message != "stat /x: m" {
			t.Errorf("Corral %d: %+v, want %s", status, re, want)
		}
	}
	// An error line of a watch stream comes after its 200: the code decides.
	if re := asRPCError(fsError(&corral.APIError{Status: 200, Code: corral.CodeUnavailable}, "x")); re.Code != codeUnavailable {
		t.Errorf("error in a stream: %+v", re)
	}
	if re := asRPCError(fsError(context.DeadlineExceeded, "x")); re.Code != codeDeadlineExceeded {
		t.Errorf("deadline: %+v", re)
	}
	if re := asRPCError(fsError(io.ErrUnexpectedEOF, "x")); re.Code != codeUnavailable {
		t.Errorf("transport: %+v", re)
	}
}

func TestProtoTime(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	for ns, want := range map[int]string{
		0: "2026-01-02T02:04:05Z", 5e8: "2026-01-02T02:04:05.500Z", 123456000: "2026-01-02T02:04:05.123456Z",
		1: "2026-01-02T02:04:05.000000001Z",
	} {
		if got := protoTime(base.Add(time.Duration(ns))); got != want {
			t.Errorf("protoTime +%dns = %s, want %s", ns, got, want)
		}
	}
	if protoTime(time.Time{}) != "" {
		t.Error("the zero time is not left out")
	}
}

// stream is a server-streaming call's response, read envelope by envelope.
type streamReader struct {
	t    *testing.T
	resp *http.Response
	br   *bufio.Reader
}

// openStream starts a server-streaming call as the SDK does (§4.4, §8).
func (h *fsHarness) openStream(ctx context.Context, method, body string, header map[string]string) *streamReader {
	h.t.Helper()
	var env bytes.Buffer
	env.WriteByte(0)
	binary.Write(&env, binary.BigEndian, uint32(len(body)))
	env.WriteString(body)
	req := h.envdRequest("POST", "/filesystem.Filesystem/"+method, "application/connect+json", &env, "")
	req = req.WithContext(ctx)
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Connect-Timeout-Ms", "60000")
	req.Header.Set("Keepalive-Ping-Interval", "50")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/connect+json" {
		b, _ := io.ReadAll(resp.Body)
		h.t.Fatalf("%s: %d %s %s", method, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return &streamReader{t: h.t, resp: resp, br: bufio.NewReader(resp.Body)}
}

// next returns the next envelope's flag and message.
func (s *streamReader) next() (byte, string) {
	s.t.Helper()
	var head [5]byte
	if _, err := io.ReadFull(s.br, head[:]); err != nil {
		s.t.Fatalf("read envelope: %v", err)
	}
	b := make([]byte, binary.BigEndian.Uint32(head[1:]))
	if _, err := io.ReadFull(s.br, b); err != nil {
		s.t.Fatalf("read message: %v", err)
	}
	return head[0], string(b)
}

// message returns the next data message; it fails on the end of the stream.
func (s *streamReader) message() string {
	s.t.Helper()
	flag, msg := s.next()
	if flag != 0 {
		s.t.Fatalf("got end of stream %s, want a message", msg)
	}
	return msg
}

// end returns the end-of-stream message, skipping keepalives; it fails on anything else.
func (s *streamReader) end() string {
	s.t.Helper()
	for {
		flag, msg := s.next()
		if flag == 2 {
			if _, err := s.br.ReadByte(); err != io.EOF {
				s.t.Errorf("bytes after the end-of-stream envelope")
			}
			return msg
		}
		if msg != `{"keepalive":{}}` {
			s.t.Fatalf("got %s, want the end of the stream", msg)
		}
	}
}

func TestFSMove(t *testing.T) {
	h := newFSHarness(t)
	h.write("/tmp/a.txt", "moved")
	h.write("/tmp/d/inner", "i")

	var got struct{ Entry wireEntry }
	h.rpcOK("Move", `{"source":"/tmp/a.txt","destination":"/tmp/new/dir/b.txt"}`, "", &got)
	if got.Entry.Path != "/tmp/new/dir/b.txt" || got.Entry.Name != "b.txt" || got.Entry.Type != "FILE_TYPE_FILE" {
		t.Errorf("Move = %+v", got.Entry)
	}
	if b, ok := h.fake.File(h.id, "/tmp/new/dir/b.txt"); !ok || string(b) != "moved" {
		t.Errorf("destination: %q %v", b, ok)
	}
	h.rpcErr("Stat", `{"path":"/tmp/a.txt"}`, "", codeNotFound)

	h.rpcOK("Move", `{"source":"/tmp/new/dir/b.txt","destination":"c.txt"}`, "", &got)
	if got.Entry.Path != "/root/c.txt" {
		t.Errorf("Move to a relative path: %q", got.Entry.Path)
	}
	h.rpcOK("Move", `{"source":"/tmp/d","destination":"/tmp/e"}`, "", &got)
	if got.Entry.Type != "FILE_TYPE_DIRECTORY" {
		t.Errorf("Move of a directory: %+v", got.Entry)
	}
	if b, ok := h.fake.File(h.id, "/tmp/e/inner"); !ok || string(b) != "i" {
		t.Errorf("moved directory's content: %q %v", b, ok)
	}
	h.rpcErr("Move", `{"source":"/tmp/missing","destination":"/tmp/x"}`, "", codeNotFound)
	h.rpcErr("Move", `{"source":"~x/a","destination":"/tmp/x"}`, "", codeInvalidArgument)
	h.rpcErr("Move", `{"source":"/tmp/e","destination":"/tmp/e/in/itself"}`, "", codeInvalidArgument)
}

// watchEvent is the JSON of one filesystem event message.
func watchEvent(name, typ string) string {
	return `{"filesystem":{"name":"` + name + `","type":"EVENT_TYPE_` + typ + `"}}`
}

// endCode returns the error code the stream ends with ("" for none).
func endCode(t *testing.T, s *streamReader) string {
	t.Helper()
	var e struct{ Error *rpcError }
	end := s.end()
	if err := json.Unmarshal([]byte(end), &e); err != nil {
		t.Fatalf("end %s: %v", end, err)
	}
	if e.Error == nil {
		return ""
	}
	return e.Error.Code
}

func TestFSWatchDir(t *testing.T) {
	h := newFSHarness(t)
	h.write("/w/old.txt", "o")
	c := h.fake.Client()
	ctx := t.Context()

	s := h.openStream(ctx, "WatchDir", `{"path":"/w","recursive":true}`, nil)
	if msg := s.message(); msg != `{"start":{}}` {
		t.Fatalf("first message %s, want the start event", msg)
	}
	expect := func(what string, want ...string) {
		t.Helper()
		for _, w := range want {
			if got := s.message(); got != w {
				t.Errorf("%s: got %s, want %s", what, got, w)
			}
		}
	}
	h.write("/w/a.txt", "a")
	expect("new file", watchEvent("a.txt", "CREATE"), watchEvent("a.txt", "WRITE"))
	h.write("/w/a.txt", "b")
	expect("write", watchEvent("a.txt", "WRITE"))
	if _, err := c.Mkdir(ctx, h.id, corral.MkdirRequest{Path: "/w/sub"}); err != nil {
		t.Fatal(err)
	}
	h.write("/w/sub/deep.txt", "d")
	expect("recursive", watchEvent("sub", "CREATE"), watchEvent("sub/deep.txt", "CREATE"), watchEvent("sub/deep.txt", "WRITE"))
	if _, err := c.Move(ctx, h.id, "/w/a.txt", "/w/b.txt"); err != nil {
		t.Fatal(err)
	}
	expect("rename", watchEvent("a.txt", "RENAME"), watchEvent("b.txt", "RENAME"))
	if err := c.Remove(ctx, h.id, "/w/old.txt", false); err != nil {
		t.Fatal(err)
	}
	expect("remove", watchEvent("old.txt", "REMOVE"))

	// The directory itself goes: its remove is the last event, then the stream ends cleanly.
	if err := c.Remove(ctx, h.id, "/w", true); err != nil {
		t.Fatal(err)
	}
	expect("directory removed", watchEvent("sub/deep.txt", "REMOVE"), watchEvent("sub", "REMOVE"),
		watchEvent("b.txt", "REMOVE"), watchEvent(".", "REMOVE"))
	if code := endCode(t, s); code != "" {
		t.Errorf("end after the directory went: %q, want none", code)
	}
	h.watchesEnd()

	// Not recursive: only the directory's own entries.
	h.write("/v/sub/x", "")
	s = h.openStream(ctx, "WatchDir", `{"path":"/v"}`, nil)
	s.message()
	h.write("/v/sub/y", "")
	h.write("/v/z", "")
	expect("not recursive", watchEvent("z", "CREATE"), watchEvent("z", "WRITE"))
}

func TestFSWatchDirEnds(t *testing.T) {
	h := newFSHarness(t)
	h.write("/w/e.txt", "12")
	h.write("/fake/f", "")
	h.fakeWatch = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"start"}`+"\n"+`{"type":"create","name":"x"}`+"\n"+`{"type":"overflow"}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}

	// Overflow: events were lost, the stream ends as envd's does on inotify's overflow.
	s := h.openStream(t.Context(), "WatchDir", `{"path":"/fake"}`, nil)
	s.message()
	if msg := s.message(); msg != watchEvent("x", "CREATE") {
		t.Errorf("before the overflow: %s", msg)
	}
	if code := endCode(t, s); code != codeInternal {
		t.Errorf("overflow ends with %q, want internal", code)
	}
	h.watchesEnd()

	// Corral ends the watch: the sandbox stopped.
	s = h.openStream(t.Context(), "WatchDir", `{"path":"/w"}`, nil)
	s.message()
	other := h.fake.Client()
	// The client's Connect-Timeout-Ms, with keepalives while idle.
	s2 := h.openStream(t.Context(), "WatchDir", `{"path":"/w"}`, map[string]string{"Connect-Timeout-Ms": "1500", "Keepalive-Ping-Interval": "1"})
	s2.message()
	if msg := s2.message(); msg != `{"keepalive":{}}` {
		t.Errorf("idle: %s, want a keepalive", msg)
	}
	if code := endCode(t, s2); code != codeDeadlineExceeded {
		t.Errorf("deadline ends with %q", code)
	}
	if _, err := other.DeleteSandbox(t.Context(), h.id); err != nil {
		t.Fatal(err)
	}
	if code := endCode(t, s); code != codeUnavailable {
		t.Errorf("the sandbox stopped: %q, want unavailable", code)
	}
	h.watchesEnd()
}

func TestFSWatchDirRefusals(t *testing.T) {
	h := newFSHarness(t)
	h.write("/w/e.txt", "12")

	// The client goes away: the watch ends.
	ctx, cancel := context.WithCancel(t.Context())
	s := h.openStream(ctx, "WatchDir", `{"path":"/w"}`, nil)
	s.message()
	cancel()
	h.watchesEnd()

	// Refused before the watch starts: the stream ends with the error.
	for body, want := range map[string]string{
		`{"path":"/nope"}`:               codeNotFound,
		`{"path":"/w/e.txt"}`:            codeInvalidArgument,
		`{"path":"~someone/x"}`:          codeInvalidArgument,
		`{"path":"/w","recursive":"no"}`: codeInvalidArgument,
	} {
		if code := endCode(t, h.openStream(t.Context(), "WatchDir", body, nil)); code != want {
			t.Errorf("WatchDir %s: %q, want %q", body, code, want)
		}
	}
	req := h.envdRequest("POST", "/filesystem.Filesystem/WatchDir", "application/json", strings.NewReader(`{"path":"/w"}`), "")
	if resp := h.send(req); resp.status != http.StatusBadRequest {
		t.Errorf("WatchDir called as a unary call: %d %s", resp.status, resp.body)
	}

	// include_entry: each event carries the entry while it exists.
	s = h.openStream(t.Context(), "WatchDir", `{"path":"/w","includeEntry":true}`, nil)
	s.message()
	h.write("/w/e.txt", "123")
	var ev struct{ Filesystem struct{ Entry *wireEntry } }
	if err := json.Unmarshal([]byte(s.message()), &ev); err != nil || ev.Filesystem.Entry == nil ||
		ev.Filesystem.Entry.Path != "/w/e.txt" || *ev.Filesystem.Entry.Size != "3" {
		t.Errorf("include_entry: %+v, %v", ev, err)
	}
	if err := h.fake.Client().Remove(t.Context(), h.id, "/w/e.txt", false); err != nil {
		t.Fatal(err)
	}
	if msg := s.message(); msg != watchEvent("e.txt", "REMOVE") {
		t.Errorf("include_entry of a removed file: %s", msg)
	}
}

func TestFSPollingWatcher(t *testing.T) {
	h := newFSHarness(t)
	h.write("/w/old", "")
	h.write("/fake/f", "")
	overflow := make(chan struct{})
	h.fakeWatch = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"start"}`+"\n"+`{"type":"create","name":"y"}`+"\n")
		w.(http.Flusher).Flush()
		<-overflow
		io.WriteString(w, `{"type":"overflow"}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}

	create := func(body string) string {
		t.Helper()
		var created struct{ WatcherID string }
		h.rpcOK("CreateWatcher", body, "", &created)
		if !strings.HasPrefix(created.WatcherID, "w") {
			t.Fatalf("watcherId %q", created.WatcherID)
		}
		return created.WatcherID
	}
	poll := func(id string) string {
		t.Helper()
		resp := h.rpc("GetWatcherEvents", `{"watcherId":"`+id+`"}`, "")
		if resp.status != http.StatusOK {
			t.Fatalf("GetWatcherEvents: %d %s", resp.status, resp.body)
		}
		return string(resp.body)
	}
	// pollFor polls until the events add up to want.
	pollFor := func(id, want string) {
		t.Helper()
		var got []string
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var r struct{ Events []json.RawMessage }
			json.Unmarshal([]byte(poll(id)), &r)
			for _, e := range r.Events {
				got = append(got, string(e))
			}
			if `{"events":[`+strings.Join(got, ",")+`]}` == want {
				return
			}
		}
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}

	id := create(`{"path":"/w","recursive":true}`)
	if got := poll(id); got != `{"events":[]}` {
		t.Errorf("no events yet: %s", got)
	}
	h.write("/w/x", "1")
	pollFor(id, `{"events":[{"name":"x","type":"EVENT_TYPE_CREATE"},{"name":"x","type":"EVENT_TYPE_WRITE"}]}`)
	if got := poll(id); got != `{"events":[]}` {
		t.Errorf("events are taken once: %s", got)
	}

	// The snake_case spelling; another sandbox does not see the watcher.
	h.rpcOK("GetWatcherEvents", `{"watcher_id":"`+id+`"}`, "", nil)
	other, err := h.fake.Client().CreateSandbox(t.Context(), corral.CreateRequest{Base: "base:default"})
	if err != nil {
		t.Fatal(err)
	}
	req := h.envdRequest("POST", "/filesystem.Filesystem/GetWatcherEvents", "application/json", strings.NewReader(`{"watcherId":"`+id+`"}`), "")
	req.Header.Set("E2b-Sandbox-Id", other.ID)
	req.Header.Set("X-Access-Token", h.gw.EnvdAccessToken(other.ID))
	if resp := h.send(req); resp.status != http.StatusNotFound {
		t.Errorf("another sandbox's watcher: %d %s", resp.status, resp.body)
	}

	h.rpcOK("RemoveWatcher", `{"watcherId":"`+id+`"}`, "", nil)
	h.watchesEnd()
	h.rpcErr("GetWatcherEvents", `{"watcherId":"`+id+`"}`, "", codeNotFound)
	h.rpcErr("RemoveWatcher", `{"watcherId":"`+id+`"}`, "", codeNotFound)
	h.rpcErr("CreateWatcher", `{"path":"/nope"}`, "", codeNotFound)

	// Overflow: the events before it, then the error.
	id = create(`{"path":"/fake"}`)
	pollFor(id, `{"events":[{"name":"y","type":"EVENT_TYPE_CREATE"}]}`)
	close(overflow)
	h.watchesEnd() // the gateway ended the watch on the overflow
	h.rpcErr("GetWatcherEvents", `{"watcherId":"`+id+`"}`, "", codeInternal)
	h.rpcOK("RemoveWatcher", `{"watcherId":"`+id+`"}`, "", nil)

	// A watcher nobody polls goes away.
	defer func(d time.Duration) { watcherIdle = d }(watcherIdle)
	watcherIdle = 50 * time.Millisecond
	id = create(`{"path":"/w"}`)
	h.watchesEnd()
	h.rpcErr("GetWatcherEvents", `{"watcherId":"`+id+`"}`, "", codeNotFound)
}
