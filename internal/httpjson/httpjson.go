// Package httpjson reads and writes the JSON bodies of Corral's HTTP APIs: strict request decoding
// (unknown fields, trailing data and oversized bodies are errors naming the problem) and the one
// place where an error's kind becomes an HTTP status and a {code, message, field} body.
package httpjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/trace"
)

// MaxBody bounds a JSON request body.
const MaxBody = 1 << 20

// Decode reads one JSON object from r's body into v. Unknown fields, a second value, malformed
// JSON and bodies over MaxBody are ErrInvalid or ErrTooLarge errors whose message says why.
func Decode(r *http.Request, v any) error {
	return DecodeLimit(r, v, MaxBody)
}

// DecodeLimit is Decode for bodies of up to limit bytes (requests that carry files).
func DecodeLimit(r *http.Request, v any, limit int64) error {
	body := http.MaxBytesReader(nil, r.Body, limit)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if dec.More() {
		return fmt.Errorf("request body: more than one JSON value: %w", errdefs.ErrInvalid)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("request body: trailing data after the JSON object: %w", errdefs.ErrInvalid)
	}
	return nil
}

// DecodeStream reads one JSON object from the start of body into v, with the same checks as
// Decode, and returns a reader for the bytes after the object and the single newline that must
// follow it.
func DecodeStream(body io.Reader, v any) (io.Reader, error) {
	dec := json.NewDecoder(io.LimitReader(body, MaxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, decodeError(err)
	}
	rest := io.MultiReader(dec.Buffered(), body)
	var nl [1]byte
	if _, err := io.ReadFull(rest, nl[:]); err != nil && err != io.EOF {
		return nil, fmt.Errorf("request body: %w", err)
	} else if err == nil && nl[0] != '\n' {
		return nil, fmt.Errorf("request body: the JSON object must be followed by a newline before the stream: %w", errdefs.ErrInvalid)
	}
	return rest, nil
}

func decodeError(err error) error {
	var tooBig *http.MaxBytesError
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooBig):
		return fmt.Errorf("request body is larger than %d bytes: %w", tooBig.Limit, errdefs.ErrTooLarge)
	case errors.As(err, &syn):
		return fmt.Errorf("request body: malformed JSON at byte %d: %w", syn.Offset, errdefs.ErrInvalid)
	case errors.As(err, &typ):
		return errdefs.Invalid(typ.Field, "must be a JSON %s, not %s", typ.Type, typ.Value)
	case errors.Is(err, io.EOF):
		return fmt.Errorf("request body: empty, expected a JSON object: %w", errdefs.ErrInvalid)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return errdefs.Invalid(field, "unknown field")
	}
	return fmt.Errorf("request body: %v: %w", err, errdefs.ErrInvalid)
}

// Write answers with status and v as JSON.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.Encode(v)
}

// Status maps an error's kind to its HTTP status.
func Status(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrDenied):
		return http.StatusForbidden
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errdefs.ErrExhausted):
		return http.StatusTooManyRequests
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// Error answers with err's status and a JSON error body. Internal errors are logged with the request
// and answered with a generic message, so internals stay in the log.
func Error(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status := Status(err)
	trace.Fail(r.Context(), err)
	body := model.Error{Code: errdefs.Code(err), Message: err.Error(), Field: errdefs.Field(err)}
	if qe, ok := errors.AsType[*iam.QuotaError](err); ok {
		q := model.QuotaExceeded(qe.QuotaExceeded) // the same fields: iam stays off the SDK
		body.Quota = &q
	}
	var denied interface{ Permission() string }
	if errors.As(err, &denied) {
		body.Permission = denied.Permission()
	}
	switch status {
	case http.StatusInternalServerError:
		log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		body.Message = "internal error; the server log has the details"
	}
	// A transient failure (errdefs.Retryable: a store that stays unreachable) says when to come
	// back, unless the handler already did; clients retry only answers that carry it.
	if d := errdefs.RetryAfter(err); d > 0 && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
		log.Warn("request failed on a transient error", "method", r.Method, "path", r.URL.Path, "err", err, "cause", errdefs.Cause(err))
	}
	nodeproto.Annotate(w, r, err) // a cluster server acts on an edge's refusals by their type
	Write(w, status, body)
}
