// Package revproxy serves Corral's reverse proxies (a sandbox's ports, the E2B gateway's port
// hosts, a cluster server's forwarding to edges, `corral port`) with the request body and the
// response flowing both ways at once.
//
// Go's HTTP/1 server, by default, reads what is left of a request body and closes it when a
// handler starts its response. A proxy's transport may still be reading that body then: after
// the last byte it reads once more to see the end. When the upstream answers that quickly (a code
// server that starts streaming as soon as it has the request; an error), the server closes the
// body under the transport's last read, the transport fails the request's write ("http: invalid
// Read on closed Body"), closes the upstream connection, and the response, already begun, breaks
// off: the client sees a truncated stream (undici's "terminated", Python's IncompleteRead). Full
// duplex leaves the body to the proxy, which reads and closes it itself.
//
// Full duplex has a hazard of its own: the transport's goroutine that sends the body can outlive
// the handler. A read of it that finds the body's end after the handler returned starts the
// server's watch for the next request under the server's own read of it, and the server panics
// ("invalid concurrent Body.Read call") and drops the connection. Serve therefore ends the body
// before it returns: it waits for a read in flight (a client still sending gets a moment to
// finish, then the read is cut short), and any later read fails without touching the
// connection. A response that begins before the client's body is whole closes the connection
// after it, as Go's server does when it cannot read a body's rest: what the client sends after
// must not be read as its next request.
package revproxy

import (
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"time"
)

// finishGrace is how long a client still sending its body after the response gets to finish it.
const finishGrace = 2 * time.Second

// Serve proxies r through p in full duplex (where the connection is HTTP/1; HTTP/2 always is).
func Serve(p *httputil.ReverseProxy, w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex() // HTTP/2 writers do not support it: they need not
	if r.ProtoMajor != 1 || r.Body == nil || r.Body == http.NoBody {
		p.ServeHTTP(w, r) // an HTTP/2 server reads no body after its handler
		return
	}
	b := NewBody(r.Body)
	defer b.endWithin(finishGrace, func() {
		// The connection's read deadline wakes the read; the server sets its own deadline
		// before it reads a next request (and closes this connection: below).
		_ = rc.SetReadDeadline(time.Now())
	})
	q := *p
	q.ModifyResponse = func(resp *http.Response) error {
		if !b.eof.Load() && (r.ContentLength < 0 || b.Consumed() < r.ContentLength) {
			resp.Header.Set("Connection", "close") // the body's rest must not be read as a request
		}
		if p.ModifyResponse != nil {
			return p.ModifyResponse(resp)
		}
		return nil
	}
	r2 := *r // a shallow copy: the server keeps its own request and body
	r2.Body = b
	q.ServeHTTP(w, &r2)
}

// Handler returns p as a handler that serves in full duplex.
func Handler(p *httputil.ReverseProxy) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { Serve(p, w, r) })
}

// errEnded is what a read of a Body gets once it was ended.
var errEnded = errors.New("revproxy: the request body was ended (its handler returned, or the try that sent it)")

// Body is a request body whose reader (a proxy's transport, which may outlive its handler) can
// be stopped: after End, no read of it is in flight and none reaches what it wraps. It counts
// what was read. Close does nothing: the body belongs to whoever handed it over.
type Body struct {
	mu    sync.Mutex // held through each read
	r     io.Reader
	ended bool

	n   atomic.Int64 // bytes read
	eof atomic.Bool
}

// NewBody returns r as a Body.
func NewBody(r io.Reader) *Body { return &Body{r: r} }

func (b *Body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return 0, errEnded
	}
	n, err := b.r.Read(p)
	b.n.Add(int64(n))
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

// Close does nothing.
func (b *Body) Close() error { return nil }

// Consumed is how many bytes were read.
func (b *Body) Consumed() int64 { return b.n.Load() }

// End waits for a read in flight and fails every later one.
func (b *Body) End() {
	b.mu.Lock()
	b.ended = true
	b.mu.Unlock()
}

// endWithin is End that, when a read in flight has not returned within grace (a client still
// sending), calls cut to wake it.
func (b *Body) endWithin(grace time.Duration, cut func()) {
	if !b.mu.TryLock() {
		locked := make(chan struct{})
		go func() {
			b.mu.Lock()
			close(locked)
		}()
		select {
		case <-locked:
		case <-time.After(grace):
			cut()
			<-locked
		}
	}
	b.ended = true
	b.mu.Unlock()
}
