package revproxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"
)

// lateEOF passes a body through, but holds its final read (the one that finds the end) for a
// while: the window in which an upstream that answers at once has the server close the body.
type lateEOF struct {
	io.ReadCloser
	n, left int
}

func (b *lateEOF) Read(p []byte) (int, error) {
	if b.left == 0 {
		time.Sleep(200 * time.Millisecond)
		return b.ReadCloser.Read(p)
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= n
	return n, err
}

// TestUpstreamAnswersBeforeBodyEnds: an upstream that starts its response as soon as it has the
// request body, while the proxy's transport has yet to read the body's end, streams its whole
// response to the client.
func TestUpstreamAnswersBeforeBodyEnds(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, io.LimitReader(r.Body, r.ContentLength))
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		time.Sleep(400 * time.Millisecond)
		io.WriteString(w, "second\n")
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Body = &lateEOF{ReadCloser: pr.Out.Body, left: int(pr.Out.ContentLength)}
		},
		Transport:     &http.Transport{DisableKeepAlives: true},
		FlushInterval: -1,
	}
	proxy := httptest.NewServer(Handler(p))
	defer proxy.Close()
	for i := range 3 {
		resp, err := http.Post(proxy.URL, "application/json", strings.NewReader(`{"code":"1+1"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "first\nsecond\n" {
			t.Fatalf("request %d: %q, %v; want the whole stream", i, body, err)
		}
	}
}
