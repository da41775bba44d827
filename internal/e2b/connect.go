package e2b

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// The Connect protocol, JSON codec only: what the e2b JS SDK speaks to envd
// (docs/e2b-protocol.md §4.4). Unary calls are a JSON body each way; server streams are
// envelopes (a flag byte, a 4-byte big-endian length, a JSON message) ending with an
// end-of-stream envelope (flag 2) that carries the error, if any. Binary protobuf (older Python
// SDKs) is refused with a clear error.

// Connect error codes (lower snake case on the wire).
const (
	codeCanceled         = "canceled"
	codeUnknown          = "unknown"
	codeInvalidArgument  = "invalid_argument"
	codeDeadlineExceeded = "deadline_exceeded"
	codeNotFound         = "not_found"
	codeAlreadyExists    = "already_exists"
	codePermissionDenied = "permission_denied"
	codeResourceExhaust  = "resource_exhausted"
	codeFailedPrecond    = "failed_precondition"
	codeUnimplemented    = "unimplemented"
	codeInternal         = "internal"
	codeUnavailable      = "unavailable"
	codeUnauthenticated  = "unauthenticated"
)

// connectStatus is the HTTP status of a unary error with that code (the Connect protocol's
// table).
var connectStatus = map[string]int{
	codeCanceled: 499, codeUnknown: 500, codeInvalidArgument: 400, codeDeadlineExceeded: 504,
	codeNotFound: 404, codeAlreadyExists: 409, codePermissionDenied: 403, codeResourceExhaust: 429,
	codeFailedPrecond: 400, codeUnimplemented: 501, codeInternal: 500, codeUnavailable: 503,
	codeUnauthenticated: 401,
}

// rpcError is an error answered in Connect's shape.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// Error returns the code and message.
func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

func rpcErrorf(code, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// maxMessage bounds one request message (a file write goes through /files, not an RPC).
const maxMessage = 4 << 20

// readUnary decodes a unary request's JSON body into v.
func readUnary(r *http.Request, v any) error {
	if err := checkContentType(r, "application/json"); err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxMessage+1))
	if err != nil {
		return rpcErrorf(codeInvalidArgument, "read the request: %v", err)
	}
	return decodeMessage(b, v)
}

// readStreamRequest decodes the one envelope a server-streaming call's body holds.
func readStreamRequest(r *http.Request, v any) error {
	if err := checkContentType(r, "application/connect+json"); err != nil {
		return err
	}
	var head [5]byte
	if _, err := io.ReadFull(r.Body, head[:]); err != nil {
		return rpcErrorf(codeInvalidArgument, "read the request envelope: %v", err)
	}
	if head[0]&1 != 0 {
		return rpcErrorf(codeUnimplemented, "compressed messages are not supported")
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > maxMessage {
		return rpcErrorf(codeResourceExhaust, "request message of %d bytes (at most %d)", n, maxMessage)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.Body, b); err != nil {
		return rpcErrorf(codeInvalidArgument, "read the request message: %v", err)
	}
	return decodeMessage(b, v)
}

func checkContentType(r *http.Request, want string) error {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case ct == want:
		return nil
	case ct == "application/proto" || ct == "application/connect+proto" || ct == "application/grpc":
		return rpcErrorf(codeUnimplemented, "the binary protobuf codec is not supported: use the Connect protocol with JSON (%s)", want)
	}
	return rpcErrorf(codeInvalidArgument, "content type %q: want %s", r.Header.Get("Content-Type"), want)
}

func decodeMessage(b []byte, v any) error {
	if len(b) > maxMessage {
		return rpcErrorf(codeResourceExhaust, "request message larger than %d bytes", maxMessage)
	}
	if len(b) == 0 {
		return nil // an empty message
	}
	if err := json.Unmarshal(b, v); err != nil {
		return rpcErrorf(codeInvalidArgument, "decode the request: %v", err)
	}
	return nil
}

// writeUnary answers a unary call with v, or with err in Connect's error shape.
func writeUnary(w http.ResponseWriter, v any, err error) {
	if err != nil {
		re := asRPCError(err)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(connectStatus[re.Code])
		json.NewEncoder(w).Encode(re)
		return
	}
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// asRPCError maps any error onto a Connect error.
func asRPCError(err error) *rpcError {
	if re, ok := errors.AsType[*rpcError](err); ok {
		return re
	}
	return &rpcError{Code: codeInternal, Message: err.Error()}
}

// stream is the response of a server-streaming call. Send and End may be called from several
// goroutines (a keepalive ticker beside the data).
type stream struct {
	mu    sync.Mutex
	w     http.ResponseWriter
	f     *http.ResponseController
	ended bool
	last  time.Time // when a message was last sent
}

// startStream begins a server stream's response.
func startStream(w http.ResponseWriter) *stream {
	w.Header().Set("Content-Type", "application/connect+json")
	w.WriteHeader(http.StatusOK)
	s := &stream{w: w, f: http.NewResponseController(w), last: time.Now()}
	s.f.Flush()
	return s
}

// Send writes one message and flushes it.
func (s *stream) Send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return errors.New("stream ended")
	}
	return s.write(0, b)
}

func (s *stream) write(flag byte, b []byte) error {
	var head [5]byte
	head[0] = flag
	binary.BigEndian.PutUint32(head[1:], uint32(len(b)))
	if _, err := s.w.Write(head[:]); err != nil {
		return err
	}
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	s.last = time.Now()
	return s.f.Flush()
}

// End writes the end-of-stream envelope, with err when the call failed.
func (s *stream) End(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.ended = true
	body := []byte("{}")
	if err != nil {
		body, _ = json.Marshal(struct {
			Error *rpcError `json:"error"`
		}{asRPCError(err)})
	}
	s.write(2, body)
}

// idleFor reports how long the stream has sent nothing.
func (s *stream) idleFor() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Since(s.last)
}

// keepaliveEvery is the interval the client asked for (Keepalive-Ping-Interval, seconds), or
// envd's 90 s default.
func keepaliveEvery(r *http.Request) time.Duration {
	if n, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && n > 0 && n <= 3600 {
		return time.Duration(n) * time.Second
	}
	return 90 * time.Second
}

// streamTimeout is the deadline the client set for a stream (Connect-Timeout-Ms), or 0 for none.
func streamTimeout(r *http.Request) time.Duration {
	if n, err := strconv.ParseInt(r.Header.Get("Connect-Timeout-Ms"), 10, 64); err == nil && n > 0 {
		return time.Duration(n) * time.Millisecond
	}
	return 0
}

// connectCode maps an error of Corral's API onto a Connect code (internal, and false, for a kind
// it has none for). It goes by Corral's code, not the HTTP status: an error that ends a stream
// comes after its 200.
func connectCode(ce *corral.APIError) (string, bool) {
	switch ce.Code {
	case corral.CodeNotFound:
		return codeNotFound, true
	case corral.CodeInvalid:
		return codeInvalidArgument, true
	case corral.CodeConflict:
		return codeFailedPrecond, true
	case corral.CodeDenied:
		return codePermissionDenied, true
	case corral.CodeUnauthorized:
		return codeUnauthenticated, true
	case corral.CodeTooLarge, corral.CodeExhausted:
		return codeResourceExhaust, true
	case corral.CodeUnavailable:
		return codeUnavailable, true
	}
	return codeInternal, false
}
