package revproxy

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
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

// TestBodyEndsAfterHandler: an upstream that answers without waiting for the request's body,
// while the client sends the body's end only after it has the whole response, leaves the proxy's
// transport reading the body when the handler returns. That read must not reach the connection
// after the handler: the server would panic ("invalid concurrent Body.Read call") and drop it.
func TestBodyEndsAfterHandler(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex() // answers before it has the body
		w.Header().Set("Content-Length", "2")
		io.WriteString(w, "ok")
		w.(http.Flusher).Flush()
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	p := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		Transport:     &http.Transport{},
		FlushInterval: -1,
	}
	var errs strings.Builder
	var errsMu sync.Mutex
	proxy := httptest.NewUnstartedServer(Handler(p))
	proxy.Config.ErrorLog = log.New(writerFunc(func(b []byte) (int, error) {
		errsMu.Lock()
		defer errsMu.Unlock()
		return errs.Write(b)
	}), "", 0)
	proxy.Start()
	defer proxy.Close()

	for i := range 3 {
		conn, err := net.Dial("tcp", proxy.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil || string(got) != "ok" {
			t.Fatalf("request %d: %q, %v; want the upstream's answer", i, got, err)
		}
		if !resp.Close {
			t.Errorf("request %d: the response keeps the connection, whose body's rest would be read as a request", i)
		}
		conn.Write([]byte("67890"))
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, br); err != nil {
			t.Errorf("request %d: the proxy did not close the connection: %v", i, err)
		}
		conn.Close()
	}
	time.Sleep(100 * time.Millisecond)
	errsMu.Lock()
	defer errsMu.Unlock()
	if strings.Contains(errs.String(), "panic") {
		t.Fatalf("the proxy's server panicked:\n%s", errs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// TestKeepAlive: a request whose body the upstream read whole leaves the client's connection
// open for its next request.
func TestKeepAlive(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	p := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }}
	proxy := httptest.NewServer(Handler(p))
	defer proxy.Close()
	conn, err := net.Dial("tcp", proxy.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i := range 3 {
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on one connection: %v", i, err)
		}
		got, _ := io.ReadAll(resp.Body)
		if string(got) != "hello" || resp.Close {
			t.Fatalf("request %d: %q (close %v); want the body echoed and the connection kept", i, got, resp.Close)
		}
	}
}
