// Package inprocess carries HTTP requests to a handler of the same process without a network
// hop: an http.RoundTripper that calls the handler directly, so that a component in front of
// Corral's API (the E2B gateway inside `corral up`) pays neither loopback TCP nor HTTP's encoding
// and parsing on every request.
//
// The handler sees a request as a server would: a path-only URL, RequestURI, Host, RemoteAddr
// (Transport.RemoteAddr), the client's headers and body. Its response reaches the client as it
// is written: headers at WriteHeader (or the first Write or Flush), the body through a pipe, in
// pieces at each Flush and at the end, as net/http's server buffers it. What a handler may do
// with a real connection and cannot here, taking the connection over (http.Hijacker), is served
// by Transport.Fallback instead: requests that ask to upgrade the connection go there.
//
// Lifetime: each request's handler runs on a goroutine of its own, with a context that ends when
// the client's request context ends or the client closes the response body; the goroutine ends
// with the handler.
package inprocess

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"
)

// Transport serves requests with Handler. The zero value is not usable: Handler is required.
type Transport struct {
	// Handler serves every request that does not ask to upgrade its connection.
	Handler http.Handler
	// Fallback carries requests with an Upgrade header (WebSocket and the like), which need a
	// connection to take over: a transport to the same handler's listener. Nil: they fail.
	Fallback http.RoundTripper
	// RemoteAddr is the request's remote address as the handler sees it ("127.0.0.1:0" when
	// empty).
	RemoteAddr string
}

// bufferSize is the response buffer a handler writes into between flushes, as net/http's.
const bufferSize = 4 << 10

// RoundTrip serves req with the handler and returns the response once its headers are written.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Upgrade") != "" {
		if t.Fallback == nil {
			closeBody(req)
			return nil, fmt.Errorf("in-process request to %s asks to upgrade its connection: no fallback transport", req.URL)
		}
		return t.Fallback.RoundTrip(req)
	}
	ctx, cancel := context.WithCancel(req.Context())
	sr := req.Clone(ctx)
	sr.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	sr.RequestURI = req.URL.RequestURI()
	if sr.Host == "" {
		sr.Host = req.URL.Host
	}
	sr.RemoteAddr = t.RemoteAddr
	if sr.RemoteAddr == "" {
		sr.RemoteAddr = "127.0.0.1:0"
	}
	sr.Proto, sr.ProtoMajor, sr.ProtoMinor = "HTTP/1.1", 1, 1
	sr.Close = false
	body := &requestBody{rc: req.Body}
	if req.Body == nil {
		body.rc = http.NoBody
	}
	sr.Body = body
	if req.Body != nil && req.Body != http.NoBody && req.ContentLength == 0 {
		// A client's 0 with a body means its length is unknown (net/http sends it chunked);
		// a server's 0 means no body, which a proxy behind the handler would then drop.
		sr.ContentLength = -1
	}
	pr, pw := io.Pipe()
	w := &responseWriter{header: http.Header{}, pw: pw, ready: make(chan struct{}), body: body}
	w.buf = bufio.NewWriterSize(pw, bufferSize)
	go func() {
		defer cancel()
		defer body.Close() // as a server does once its handler returns; RoundTrip's contract
		defer func() {
			// A panic ends this response only, as net/http's server would: the client's read
			// fails with it.
			switch p := recover(); {
			case p == http.ErrAbortHandler:
				w.abort(errors.New("in-process handler aborted the response"))
			case p != nil:
				w.abort(fmt.Errorf("in-process handler of %s panicked: %v", sr.URL.Path, p))
			default:
				w.finish()
			}
		}()
		t.Handler.ServeHTTP(w, sr)
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	resp := &http.Response{
		Status:        strconv.Itoa(w.status) + " " + http.StatusText(w.status),
		StatusCode:    w.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.sent,
		Body:          &responseBody{pr: pr, cancel: cancel},
		ContentLength: -1,
		Request:       req,
	}
	if n, err := strconv.ParseInt(w.sent.Get("Content-Length"), 10, 64); err == nil && n >= 0 {
		resp.ContentLength = n
	}
	if req.Method == http.MethodHead {
		resp.Body = http.NoBody
		pr.Close()
	}
	return resp, nil
}

// closeBody closes a request's body, as a RoundTripper must even when it fails.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// requestBody is the client's request body as the handler reads it; SetReadDeadline closes it,
// which ends a pending Read.
type requestBody struct {
	rc    io.ReadCloser
	once  sync.Once
	mu    sync.Mutex
	timer *time.Timer // protected by mu
}

func (b *requestBody) Read(p []byte) (int, error) { return b.rc.Read(p) }

func (b *requestBody) Close() error {
	var err error
	b.once.Do(func() { err = b.rc.Close() })
	return err
}

// deadline closes the body at t (at once when t has passed; never when t is zero).
func (b *requestBody) deadline(t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if t.IsZero() {
		return
	}
	b.timer = time.AfterFunc(time.Until(t), func() { b.Close() })
}

// responseBody is what the client reads; closing it ends the handler's context.
type responseBody struct {
	pr     *io.PipeReader
	cancel context.CancelFunc
}

func (b *responseBody) Read(p []byte) (int, error) { return b.pr.Read(p) }

func (b *responseBody) Close() error {
	b.cancel()
	return b.pr.CloseWithError(errors.New("in-process response body closed by the client"))
}

// responseWriter is the handler's side of a response. A handler writes from one goroutine at a
// time, as with net/http; mu orders that with the deadline timer's abort.
type responseWriter struct {
	header http.Header
	pw     *io.PipeWriter
	body   *requestBody

	mu          sync.Mutex
	buf         *bufio.Writer // protected by mu
	wroteHeader bool          // protected by mu
	status      int           // set before ready is closed
	sent        http.Header   // the headers as WriteHeader saw them; set before ready is closed
	ready       chan struct{} // closed once the headers are written
	wtimer      *time.Timer   // write deadline; protected by mu
}

func (w *responseWriter) Header() http.Header { return w.header }

func (w *responseWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writeHeaderLocked(code)
}

func (w *responseWriter) writeHeaderLocked(code int) {
	if w.wroteHeader || (code >= 100 && code < 200) {
		return // informational responses are not passed on
	}
	w.wroteHeader = true
	w.status, w.sent = code, w.header.Clone()
	close(w.ready)
}

func (w *responseWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.wroteHeader {
		if w.header.Get("Content-Type") == "" && w.header.Get("Transfer-Encoding") == "" {
			w.header.Set("Content-Type", http.DetectContentType(p))
		}
		w.writeHeaderLocked(http.StatusOK)
	}
	return w.buf.Write(p)
}

// Flush sends what was written so far (http.Flusher).
func (w *responseWriter) Flush() { w.FlushError() }

// FlushError is Flush with its error (http.ResponseController).
func (w *responseWriter) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writeHeaderLocked(http.StatusOK)
	return w.buf.Flush()
}

// EnableFullDuplex lets the handler read the body while it writes: always so here
// (http.ResponseController).
func (w *responseWriter) EnableFullDuplex() error { return nil }

// SetReadDeadline makes reads of the request body fail from t on: the body is closed then
// (http.ResponseController).
func (w *responseWriter) SetReadDeadline(t time.Time) error {
	w.body.deadline(t)
	return nil
}

// SetWriteDeadline makes the response fail from t on, if it has not ended by then
// (http.ResponseController).
func (w *responseWriter) SetWriteDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wtimer != nil {
		w.wtimer.Stop()
		w.wtimer = nil
	}
	if !t.IsZero() {
		w.wtimer = time.AfterFunc(time.Until(t), func() { w.pw.CloseWithError(os.ErrDeadlineExceeded) })
	}
	return nil
}

// finish ends a response whose handler returned: headers (200 if none were written) and what
// is buffered go out, then the end of the body.
func (w *responseWriter) finish() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopTimersLocked()
	w.writeHeaderLocked(http.StatusOK)
	if err := w.buf.Flush(); err != nil {
		return // the client is gone
	}
	w.pw.Close()
}

// abort ends a response whose handler did not return normally: the client's read fails with err.
func (w *responseWriter) abort(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopTimersLocked()
	if !w.wroteHeader {
		w.writeHeaderLocked(http.StatusInternalServerError)
	}
	w.pw.CloseWithError(err)
}

func (w *responseWriter) stopTimersLocked() {
	if w.wtimer != nil {
		w.wtimer.Stop()
	}
	w.body.deadline(time.Time{})
}
