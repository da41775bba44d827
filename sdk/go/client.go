package corral

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Client talks to one Corral API server. It is safe for concurrent use.
type Client struct {
	base      *url.URL // without a trailing slash
	baseErr   error    // why base is unusable, returned by every call
	token     string
	hc        *http.Client
	userAgent string
	// retries is how many times a retryable call is tried again (WithRetries).
	retries int
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

// WithRetries sets how many times a call is tried again after a connection error, a 502 or 504,
// or a 503 with Retry-After (a transient failure such as a store restart) (default 4, 0 turns
// retries off). Only calls that are safe to repeat are: GET,
// HEAD, PUT and DELETE whose body can be sent again, and any call with an idempotency key (such
// as a create with CreateRequest.IdempotencyKey). The pause between tries grows from 100 ms to
// 2 s, or is the server's Retry-After (at most 10 s), and ends with the call's context.
func WithRetries(n int) Option {
	return func(c *Client) { c.retries = max(n, 0) }
}

// New returns a client for the server at baseURL ("http://127.0.0.1:7070") that authenticates
// with token. A baseURL that does not parse makes every call fail with that error.
func New(baseURL, token string, opts ...Option) *Client {
	c := &Client{token: token, hc: http.DefaultClient, userAgent: "corral-go", retries: 4}
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
	// once keeps an otherwise idempotent request from being repeated (an append).
	once bool
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
	retry := c.retries > 0 && r.repeatable(body)
	for attempt := 1; ; attempt++ {
		try := body
		var sent *tryBody
		if retry && body != nil {
			sent = newTryBody(body)
			try = sent
		}
		resp, err := c.send1(ctx, r, target, try, ctype)
		wait, again := retryAfter(resp, err)
		if !retry || !again || attempt > c.retries || ctx.Err() != nil {
			return c.answer(resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
		if wait == 0 {
			wait = min(100*time.Millisecond<<(attempt-1), 2*time.Second)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		if s, ok := body.(io.Seeker); ok {
			// The transport may go on reading the last try's body after it answered: rewind
			// only once it let go of it.
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-sent.closed:
			}
			if _, err := s.Seek(0, io.SeekStart); err != nil {
				return nil, fmt.Errorf("rewind request body: %w", err)
			}
		}
	}
}

// repeatable reports whether r may be sent again after a failure: its method is idempotent or it
// carries an idempotency key, and its body (if any) can be rewound.
func (r request) repeatable(body io.Reader) bool {
	if r.once {
		return false
	}
	idem := r.header.Get("Idempotency-Key") != ""
	switch r.method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete:
		idem = true
	}
	if !idem {
		return false
	}
	if body == nil {
		return true
	}
	_, ok := body.(io.Seeker)
	return ok
}

// tryBody is one try's view of a request body that is sent again on failure. The HTTP transport
// closes a request body when it is done with it, which may be after the exchange returned (its
// writer still sending); closed tells the next try when rewinding is safe.
type tryBody struct {
	r      io.Reader
	closed chan struct{}
	once   sync.Once
	// size is the body's remaining length when known (bytes and strings readers), -1 otherwise.
	size int64
}

func newTryBody(r io.Reader) *tryBody {
	b := &tryBody{r: r, closed: make(chan struct{}), size: -1}
	if l, ok := r.(interface{ Len() int }); ok {
		b.size = int64(l.Len())
	}
	return b
}

// Read reads the body on.
func (b *tryBody) Read(p []byte) (int, error) { return b.r.Read(p) }

// Close says the transport is done with this try's body (it does not close the body itself).
func (b *tryBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

// retryAfter reports whether an exchange that ended with resp or err is worth trying again, and
// how long the server asked to wait (0: the client's own backoff).
func retryAfter(resp *http.Response, err error) (time.Duration, bool) {
	if err != nil {
		// A connection that could not be made, or broke before an answer came.
		var op *net.OpError
		return 0, errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
			errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
	}
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		return 0, true
	case http.StatusServiceUnavailable:
		// Only a 503 that says when to come back is transient: others (a tier that is not
		// installed, a lost node) would answer the same again.
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs >= 0 {
			return min(max(time.Duration(secs)*time.Second, 100*time.Millisecond), 10*time.Second), true
		}
	}
	return 0, false
}

// answer turns the outcome of the last try into send's result.
func (c *Client) answer(resp *http.Response, err error) (*http.Response, error) {
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// send1 makes one try of r.
func (c *Client) send1(ctx context.Context, r request, target string, body io.Reader, ctype string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, r.method, target, body)
	if err != nil {
		return nil, err
	}
	if b, ok := body.(*tryBody); ok && b.size >= 0 {
		// What http.NewRequest does for the readers tryBody wraps.
		req.ContentLength = b.size
		if b.size == 0 {
			req.Body, req.GetBody = http.NoBody, nil
			b.Close()
		}
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
	return c.hc.Do(req)
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
	// The decoder stops at the value's end, before the newline after it (and before the body's
	// end whenever the body is longer than its first read): read to the end, or Close drops the
	// connection and the next request dials a new one.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
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
