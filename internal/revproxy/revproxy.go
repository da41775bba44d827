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
package revproxy

import (
	"net/http"
	"net/http/httputil"
)

// Serve proxies r through p in full duplex (where the connection is HTTP/1; HTTP/2 always is).
func Serve(p *httputil.ReverseProxy, w http.ResponseWriter, r *http.Request) {
	_ = http.NewResponseController(w).EnableFullDuplex() // HTTP/2 writers do not support it: they need not
	p.ServeHTTP(w, r)
}

// Handler returns p as a handler that serves in full duplex.
func Handler(p *httputil.ReverseProxy) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { Serve(p, w, r) })
}
