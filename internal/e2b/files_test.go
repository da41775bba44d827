package e2b

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// upload POSTs /files with the SDK's headers; header adds to them.
func (h *fsHarness) upload(target, ctype string, body io.Reader, header http.Header) response {
	h.t.Helper()
	req := h.envdRequest("POST", target, ctype, body, "")
	for k, v := range header {
		req.Header[k] = v
	}
	return h.send(req)
}

// multipartBody builds a multipart/form-data body as the SDK does: every part named "file",
// its filename the full destination path (§7.1). Extra parts named otherwise are added when
// other is set.
func multipartBody(t *testing.T, files [][2]string, other bool) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if other {
		mw.WriteField("note", "ignored")
	}
	for _, f := range files {
		hdr := textproto.MIMEHeader{}
		hdr.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, f[0]))
		hdr.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(hdr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, f[1])
	}
	mw.Close()
	return mw.FormDataContentType(), &buf
}

// written is the answer of an upload.
type written []struct{ Name, Type, Path string }

func (w written) String() string {
	var out []string
	for _, f := range w {
		out = append(out, f.Name+" "+f.Type+" "+f.Path)
	}
	return strings.Join(out, ", ")
}

// filesErr checks an error of /files: status and envd's body {"code": <status>, "message"}.
func filesErr(t *testing.T, what string, resp response, status int) string {
	t.Helper()
	if resp.status != status {
		t.Fatalf("%s: %d %s, want %d", what, resp.status, resp.body, status)
	}
	code, msg := resp.errBody(t)
	if code != status {
		t.Errorf("%s: body code %d, want %d", what, code, status)
	}
	return msg
}

func TestFilesUploadMultipart(t *testing.T) {
	h := newFSHarness(t)

	// files.write([{path, data}, ...]): no path query, each part's filename is its path; one
	// lands in directories that do not exist yet.
	ctype, body := multipartBody(t, [][2]string{
		{"/home/user/a.txt", "alpha"},
		{"/tmp/new/dir/b.txt", "beta"},
		{"rel.txt", "gamma"},
	}, true)
	resp := h.upload("/files", ctype, body, nil)
	if resp.status != http.StatusOK {
		t.Fatalf("upload: %d %s", resp.status, resp.body)
	}
	var got written
	resp.decode(t, &got)
	if want := "a.txt file /home/user/a.txt, b.txt file /tmp/new/dir/b.txt, rel.txt file /root/rel.txt"; got.String() != want {
		t.Errorf("answer:\n got %s\nwant %s", got, want)
	}
	for p, want := range map[string]string{"/home/user/a.txt": "alpha", "/tmp/new/dir/b.txt": "beta", "/root/rel.txt": "gamma"} {
		if b, ok := h.fake.File(h.id, p); !ok || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, ok, want)
		}
	}

	// files.write(path, data): the path query names the destination.
	ctype, body = multipartBody(t, [][2]string{{"ignored-name", "one"}}, false)
	resp = h.upload("/files?path="+url.QueryEscape("/tmp/one.txt"), ctype, body, nil)
	resp.decode(t, &got)
	if resp.status != http.StatusOK || got.String() != "one.txt file /tmp/one.txt" {
		t.Errorf("single upload: %d %s", resp.status, resp.body)
	}

	// Overwrite.
	ctype, body = multipartBody(t, [][2]string{{"/tmp/one.txt", "two"}}, false)
	if resp = h.upload("/files", ctype, body, nil); resp.status != http.StatusOK {
		t.Errorf("overwrite: %d %s", resp.status, resp.body)
	}
	if b, _ := h.fake.File(h.id, "/tmp/one.txt"); string(b) != "two" {
		t.Errorf("after overwrite: %q", b)
	}

	// The same path twice in one request.
	ctype, body = multipartBody(t, [][2]string{{"/tmp/d.txt", "1"}, {"/tmp/../tmp/d.txt", "2"}}, false)
	filesErr(t, "same path twice", h.upload("/files", ctype, body, nil), http.StatusBadRequest)

	// A part without a filename and no path query.
	ctype, body = multipartBody(t, [][2]string{{"", "x"}}, false)
	filesErr(t, "no filename", h.upload("/files", ctype, body, nil), http.StatusBadRequest)

	// Onto a directory.
	ctype, body = multipartBody(t, [][2]string{{"/tmp", "x"}}, false)
	filesErr(t, "onto a directory", h.upload("/files", ctype, body, nil), http.StatusBadRequest)

	// Neither multipart nor octet-stream.
	filesErr(t, "text/plain", h.upload("/files?path=/tmp/x", "text/plain", strings.NewReader("x"), nil), http.StatusBadRequest)
}

func TestFilesUploadOctetStream(t *testing.T) {
	h := newFSHarness(t)
	resp := h.upload("/files?path=/tmp/deep/o.bin", "application/octet-stream", strings.NewReader("octets"), nil)
	var got written
	resp.decode(t, &got)
	if resp.status != http.StatusOK || got.String() != "o.bin file /tmp/deep/o.bin" {
		t.Fatalf("octet upload: %d %s", resp.status, resp.body)
	}
	if b, _ := h.fake.File(h.id, "/tmp/deep/o.bin"); string(b) != "octets" {
		t.Errorf("content %q", b)
	}

	// gzip: true adds Content-Encoding: gzip.
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write([]byte("unzipped"))
	zw.Close()
	resp = h.upload("/files?path=/tmp/z.txt", "application/octet-stream", &z, http.Header{"Content-Encoding": {"gzip"}})
	if resp.status != http.StatusOK {
		t.Fatalf("gzip upload: %d %s", resp.status, resp.body)
	}
	if b, _ := h.fake.File(h.id, "/tmp/z.txt"); string(b) != "unzipped" {
		t.Errorf("gzip content %q", b)
	}
	filesErr(t, "bad gzip", h.upload("/files?path=/tmp/z.txt", "application/octet-stream", strings.NewReader("nope"),
		http.Header{"Content-Encoding": {"gzip"}}), http.StatusBadRequest)
	filesErr(t, "br", h.upload("/files?path=/tmp/z.txt", "application/octet-stream", strings.NewReader("x"),
		http.Header{"Content-Encoding": {"br"}}), http.StatusBadRequest)
	filesErr(t, "no path", h.upload("/files", "application/octet-stream", strings.NewReader("x"), nil), http.StatusBadRequest)
	filesErr(t, "unknown user", h.upload("/files?path=/tmp/u&username=nobody", "application/octet-stream", strings.NewReader("x"), nil), http.StatusUnauthorized)
}

func TestFilesUploadLimit(t *testing.T) {
	h := newFSHarness(t)
	defer func(n int64) { maxUpload = n }(maxUpload)
	maxUpload = 10
	if resp := h.upload("/files?path=/tmp/ok", "application/octet-stream", strings.NewReader("0123456789"), nil); resp.status != http.StatusOK {
		t.Errorf("exactly the limit: %d %s", resp.status, resp.body)
	}
	filesErr(t, "octet over the limit", h.upload("/files?path=/tmp/big", "application/octet-stream", strings.NewReader("0123456789A"), nil), http.StatusRequestEntityTooLarge)
	ctype, body := multipartBody(t, [][2]string{{"/tmp/m", "0123456789A"}}, false)
	filesErr(t, "multipart over the limit", h.upload("/files", ctype, body, nil), http.StatusRequestEntityTooLarge)

	// A small gzip body that expands past the limit.
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(bytes.Repeat([]byte{'a'}, 1000))
	zw.Close()
	maxUpload = int64(z.Len()) + 1
	filesErr(t, "gzip bomb", h.upload("/files?path=/tmp/zb", "application/octet-stream", &z, http.Header{"Content-Encoding": {"gzip"}}), http.StatusRequestEntityTooLarge)
}

func TestFilesDownload(t *testing.T) {
	h := newFSHarness(t)
	h.write("/tmp/a.txt", "hello")
	h.write("/tmp/empty", "")
	big := strings.Repeat("0123456789", 10_000)
	h.write("/root/big.bin", big)

	get := func(target string) response {
		t.Helper()
		return h.send(h.envdRequest("GET", target, "", nil, ""))
	}
	resp := get("/files?path=/tmp/a.txt")
	if resp.status != http.StatusOK || string(resp.body) != "hello" || resp.header.Get("Content-Length") != "5" ||
		!strings.HasPrefix(resp.header.Get("Content-Type"), "text/plain") {
		t.Errorf("download: %d %v %q", resp.status, resp.header, resp.body)
	}
	resp = get("/files?path=/tmp/empty")
	if resp.status != http.StatusOK || len(resp.body) != 0 || resp.header.Get("Content-Length") != "0" ||
		resp.header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("empty file: %d %v %q", resp.status, resp.header, resp.body)
	}
	resp = get("/files?path=big.bin") // relative to root's home
	if resp.status != http.StatusOK || string(resp.body) != big {
		t.Errorf("big file: %d, %d bytes", resp.status, len(resp.body))
	}
	if msg := filesErr(t, "missing", get("/files?path=/tmp/missing"), http.StatusNotFound); !strings.Contains(msg, "/tmp/missing") {
		t.Errorf("missing: message %q", msg)
	}
	filesErr(t, "directory", get("/files?path=/tmp"), http.StatusBadRequest)
	filesErr(t, "unknown user", get("/files?path=/tmp/a.txt&username=ghost"), http.StatusUnauthorized)
	filesErr(t, "PUT", h.send(h.envdRequest("PUT", "/files?path=/tmp/a.txt", "", nil, "")), http.StatusMethodNotAllowed)

	req := h.envdRequest("GET", "/files?path=/tmp/a.txt", "", nil, "")
	req.Header.Del("X-Access-Token")
	if resp := h.send(req); resp.status != http.StatusUnauthorized {
		t.Errorf("no token, no signature: %d %s", resp.status, resp.body)
	}
}

func TestFileSignatureScheme(t *testing.T) {
	// The worked examples of docs/e2b-protocol.md §7.2, from the SDK's own output.
	for _, c := range []struct {
		parts []string
		want  string
	}{
		{[]string{"/home/user/a.txt", "write", "", "tok123"}, "v1_0Hi825hc98GSYIE1rg1hKYt5QuzguY2QeakyJLpEALg"},
		{[]string{"/home/user/a.txt", "read", "", "tok123", "1796024759"}, "v1_QBUQ8WxCMNQTNRpHjyQbvrh8VlPT2SQQPWJt0Ojtlgg"},
	} {
		if got := fileSignature(c.parts); got != c.want {
			t.Errorf("fileSignature(%q) = %s, want %s", c.parts, got, c.want)
		}
	}
}

func TestFilesSignedURLs(t *testing.T) {
	h := newFSHarness(t)
	h.write("/tmp/s.txt", "signed")
	tok := h.gw.EnvdAccessToken(h.id)

	// signed builds a URL as the SDK's downloadUrl/uploadUrl does.
	signed := func(p, op, user string, exp int64) string {
		q := url.Values{}
		if user != "" {
			q.Set("username", user)
		}
		q.Set("path", p)
		parts := []string{p, op, user, tok}
		if exp != 0 {
			parts = append(parts, strconv.FormatInt(exp, 10))
			q.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		q.Set("signature", fileSignature(parts))
		return "/files?" + q.Encode()
	}
	// do sends a request the way a third party fetching a signed URL does: no access token.
	do := func(method, target, ctype string, body io.Reader) response {
		t.Helper()
		req := h.envdRequest(method, target, ctype, body, "")
		req.Header.Del("X-Access-Token")
		return h.send(req)
	}
	future := time.Now().Add(time.Hour).Unix()

	if resp := do("GET", signed("/tmp/s.txt", "read", "", 0), "", nil); resp.status != http.StatusOK || string(resp.body) != "signed" {
		t.Errorf("signed download: %d %s", resp.status, resp.body)
	}
	if resp := do("GET", signed("/tmp/s.txt", "read", "root", future), "", nil); resp.status != http.StatusOK {
		t.Errorf("signed download with user and expiration: %d %s", resp.status, resp.body)
	}
	resp := do("POST", signed("/tmp/up.txt", "write", "", future), "application/octet-stream", strings.NewReader("up"))
	if resp.status != http.StatusOK {
		t.Errorf("signed upload: %d %s", resp.status, resp.body)
	}
	if b, _ := h.fake.File(h.id, "/tmp/up.txt"); string(b) != "up" {
		t.Errorf("signed upload wrote %q", b)
	}

	refused := map[string]func() response{
		"expired": func() response {
			return do("GET", signed("/tmp/s.txt", "read", "", time.Now().Add(-time.Minute).Unix()), "", nil)
		},
		"other path": func() response {
			return do("GET", strings.Replace(signed("/tmp/s.txt", "read", "", 0), "s.txt", "t.txt", 1), "", nil)
		},
		"other user": func() response {
			return do("GET", signed("/tmp/s.txt", "read", "", 0)+"&username=root", "", nil)
		},
		"expiration changed": func() response {
			return do("GET", strings.Replace(signed("/tmp/s.txt", "read", "", future), strconv.FormatInt(future, 10), strconv.FormatInt(future+1, 10), 1), "", nil)
		},
		"expiration dropped": func() response {
			u := signed("/tmp/s.txt", "read", "", future)
			return do("GET", strings.Replace(u, "signature_expiration="+strconv.FormatInt(future, 10), "x=1", 1), "", nil)
		},
		"read signature used to write": func() response {
			return do("POST", signed("/tmp/s.txt", "read", "", 0), "application/octet-stream", strings.NewReader("x"))
		},
		"signature of another sandbox": func() response {
			u := signed("/tmp/s.txt", "read", "", 0)
			q, _ := url.ParseQuery(strings.TrimPrefix(u, "/files?"))
			q.Set("signature", fileSignature([]string{"/tmp/s.txt", "read", "", h.gw.EnvdAccessToken("sb-other")}))
			return do("GET", "/files?"+q.Encode(), "", nil)
		},
		"garbage signature": func() response { return do("GET", "/files?path=/tmp/s.txt&signature=v1_x", "", nil) },
	}
	for name, f := range refused {
		if resp := f(); resp.status != http.StatusUnauthorized {
			t.Errorf("%s: %d %s, want 401", name, resp.status, resp.body)
		}
	}
	if b, _ := h.fake.File(h.id, "/tmp/s.txt"); string(b) != "signed" {
		t.Errorf("a refused upload changed the file: %q", b)
	}
}
