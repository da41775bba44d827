package inprocess

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /echo/{name}", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Name", r.PathValue("name"))
		w.Header().Set("X-Seen", r.Host+" "+r.RequestURI+" "+r.RemoteAddr+" "+r.Header.Get("X-Client"))
		w.WriteHeader(http.StatusCreated)
		w.Header().Set("X-Late", "not sent") // after WriteHeader: not part of the response
		w.Write(b)
	})
	mux.HandleFunc("GET /plain", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>hi</html>") })
	mux.HandleFunc("GET /panic", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	c := &http.Client{Transport: &Transport{Handler: mux}}

	req, _ := http.NewRequest("POST", "http://corral.test:7070/echo/x%2Fy?q=1", strings.NewReader("body"))
	req.Header.Set("X-Client", "c")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(b) != "body" || resp.Header.Get("X-Name") != "x/y" || resp.Header.Get("X-Late") != "" {
		t.Errorf("echo: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	// The request body is closed once the handler is done, as a RoundTripper must.
	closed := &closeRecorder{Reader: strings.NewReader("x"), closed: make(chan struct{})}
	req2, _ := http.NewRequest("POST", "http://corral.test/echo/z", closed)
	resp2, err := c.Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp2.Body)
	resp2.Body.Close()
	select {
	case <-closed.closed:
	case <-time.After(10 * time.Second):
		t.Error("the request body was not closed")
	}
	if got, want := resp.Header.Get("X-Seen"), "corral.test:7070 /echo/x%2Fy?q=1 127.0.0.1:0 c"; got != want {
		t.Errorf("the handler saw %q, want %q", got, want)
	}

	resp, err = c.Get("http://corral.test/plain")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "<html>hi</html>" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Errorf("plain: %d %q %v", resp.StatusCode, b, resp.Header)
	}

	resp, err = c.Get("http://corral.test/panic")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("a handler's panic: %v, want the panic as the error", err)
	}
}

// TestStreaming: flushed pieces reach the client while the handler runs; the client closing
// the body, or its context ending, ends the handler's context.
func TestStreaming(t *testing.T) {
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		rc := http.NewResponseController(w)
		for i := 0; ; i++ {
			if _, err := io.WriteString(w, "line\n"); err != nil {
				ended <- err
				return
			}
			if err := rc.Flush(); err != nil {
				ended <- err
				return
			}
			select {
			case <-r.Context().Done():
				ended <- r.Context().Err()
				return
			case <-time.After(time.Millisecond):
			}
		}
	})
	c := &http.Client{Transport: &Transport{Handler: h}}
	for _, how := range []string{"close", "cancel"} {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://corral.test/", nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		for range 3 {
			if l, err := br.ReadString('\n'); err != nil || l != "line\n" {
				t.Fatalf("%s: read %q, %v", how, l, err)
			}
		}
		if how == "close" {
			resp.Body.Close()
		} else {
			cancel()
		}
		select {
		case err := <-ended:
			if err == nil {
				t.Errorf("%s: the handler ended without an error", how)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the handler did not end", how)
		}
		cancel()
		resp.Body.Close()
	}
}

// TestFullDuplex: the handler reads the request body while it writes the response, and a read
// deadline ends a pending read.
func TestFullDuplex(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			t.Error(err)
		}
		br := bufio.NewReader(r.Body)
		l, _ := br.ReadString('\n')
		io.WriteString(w, "got "+l)
		rc.Flush()
		rc.SetReadDeadline(time.Now())
		if _, err := br.ReadString('\n'); err == nil {
			io.WriteString(w, "read past the deadline\n")
		}
	})
	c := &http.Client{Transport: &Transport{Handler: h}}
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequest("POST", "http://corral.test/", pr)
	go io.WriteString(pw, "one\n")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "got one\n" {
		t.Errorf("full duplex: %q, %v", b, err)
	}
}

// TestUpgradeFallback: a request that asks to upgrade its connection goes to the fallback.
func TestUpgradeFallback(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "over tcp") }))
	defer srv.Close()
	inproc := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "in process") })
	for _, tt := range []struct {
		fallback http.RoundTripper
		want     string
	}{{http.DefaultTransport, "over tcp"}, {nil, ""}} {
		c := &http.Client{Transport: &Transport{Handler: inproc, Fallback: tt.fallback}}
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("Upgrade", "websocket")
		resp, err := c.Do(req)
		if tt.fallback == nil {
			if err == nil || !strings.Contains(err.Error(), "no fallback") {
				t.Errorf("upgrade without a fallback: %v", err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != tt.want {
			t.Errorf("upgrade went to %q, want %q", b, tt.want)
		}
	}
	// Anything else is served in process.
	c := &http.Client{Transport: &Transport{Handler: inproc, Fallback: http.DefaultTransport}}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "in process" {
		t.Errorf("plain request went to %q", b)
	}
}

type closeRecorder struct {
	io.Reader
	closed chan struct{}
}

func (c *closeRecorder) Close() error { close(c.closed); return nil }

// TestUnknownLengthBody: a body whose length the client does not know (ContentLength 0 with a
// body, sent chunked over a network) reaches a handler that proxies it on, as it would through
// a server (the cluster's server forwards requests to edges with a ReverseProxy).
func TestUnknownLengthBody(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }}
	c := &http.Client{Transport: &Transport{Handler: proxy}}
	pr, pw := io.Pipe()
	go func() {
		io.WriteString(pw, "hello")
		pw.Close()
	}()
	req, _ := http.NewRequest("PUT", "http://corral.test/files", pr) // a pipe: length unknown
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hello" {
		t.Fatalf("the upstream got %q, want the body", b)
	}
}
