package corral

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Client talks to one Corral API server. It is safe for concurrent use.
type Client struct {
	base      *url.URL // without a trailing slash
	baseErr   error    // why base is unusable, returned by every call
	token     string
	hc        *http.Client
	userAgent string
}

// Option configures a [Client].
type Option func(*Client)

// WithHTTPClient makes the client send its requests with hc instead of http.DefaultClient.
// Streaming calls (Exec, Attach, ReadFile, TarOut) hold a response open for as long as the
// caller reads it, so hc should not set an overall Timeout; use contexts instead.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// New returns a client for the server at baseURL ("http://127.0.0.1:7070") that authenticates
// with token. A baseURL that does not parse makes every call fail with that error.
func New(baseURL, token string, opts ...Option) *Client {
	c := &Client{token: token, hc: http.DefaultClient, userAgent: "corral-go"}
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	switch {
	case err != nil:
		c.baseErr = fmt.Errorf("parse server URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		c.baseErr = fmt.Errorf("server URL %q: scheme must be http or https", baseURL)
	case u.Host == "":
		c.baseErr = fmt.Errorf("server URL %q: no host", baseURL)
	}
	c.base = u
	for _, o := range opts {
		o(c)
	}
	return c
}

// request describes one HTTP exchange with the server.
type request struct {
	method string
	// path is already escaped, e.g. "/v1/sandboxes/" + url.PathEscape(id).
	path  string
	query url.Values
	// body is sent as is; json, when non-nil, is marshalled and sent instead.
	body        io.Reader
	json        any
	contentType string
	// noAuth leaves the Authorization header out (health checks).
	noAuth bool
	// closeConn keeps the connection out of the pool after this exchange.
	closeConn bool
	// header holds extra request headers.
	header http.Header
}

// send performs r and returns the response when its status is below 400; otherwise it returns
// the decoded *APIError and closes the body. The caller closes the body of a returned response.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	if c.baseErr != nil {
		return nil, c.baseErr
	}
	target := c.base.String() + r.path
	if len(r.query) > 0 {
		target += "?" + r.query.Encode()
	}

	body, ctype := r.body, r.contentType
	if r.json != nil {
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, r.method, target, body)
	if err != nil {
		return nil, err
	}
	req.Close = r.closeConn
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if !r.noAuth && c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// do performs r and decodes a JSON answer into out (when out is non-nil).
func (c *Client) do(ctx context.Context, r request, out any) error {
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s response: %w", r.method, r.path, err)
	}
	return nil
}

// Health checks GET /healthz, which needs no token. It returns nil when the server answers 200.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, request{method: http.MethodGet, path: "/healthz", noAuth: true}, nil)
}

// Info returns what the server says about itself: version, node, runtime.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	var out Info
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/info"}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// sandboxPath returns the escaped path of a sandbox, followed by the escaped elements of sub.
func sandboxPath(id string, sub ...string) string {
	var b strings.Builder
	b.WriteString("/v1/sandboxes/")
	b.WriteString(url.PathEscape(id))
	for _, s := range sub {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}
