// Package errdefs holds the small set of error kinds Corral classifies failures into. Code wraps
// one of these sentinels with %w and context ("mount layer x: %w"); the API boundary maps the kind
// to an HTTP status and a JSON {code, message} exactly once.
package errdefs

import (
	"errors"
	"fmt"
	"time"
)

// The kinds. Each maps to one HTTP status at the API boundary.
var (
	ErrInvalid      = errors.New("invalid argument")   // 400
	ErrUnauthorized = errors.New("unauthorized")       // 401
	ErrDenied       = errors.New("permission denied")  // 403
	ErrNotFound     = errors.New("not found")          // 404
	ErrConflict     = errors.New("conflict")           // 409
	ErrTooLarge     = errors.New("too large")          // 413
	ErrExhausted    = errors.New("resource exhausted") // 429
	ErrUnavailable  = errors.New("unavailable")        // 503

	// ErrNodeFull is the conflict of a node asked for more than it has left (409 node_full):
	// a cluster's placement takes it as "try another node".
	ErrNodeFull = fmt.Errorf("node full: %w", ErrConflict)
	// ErrStaleEpoch is the unavailability of an edge whose incarnation the cluster has fenced
	// off (a newer one registered, or the node was declared lost): 503, and on the node protocol
	// a refusal that sends a create to another node.
	ErrStaleEpoch = fmt.Errorf("stale node epoch: %w", ErrUnavailable)
	// ErrUnknownSandbox is the not-found of a sandbox ID that names no sandbox here (404).
	ErrUnknownSandbox = fmt.Errorf("unknown sandbox: %w", ErrNotFound)
)

// Invalid returns an ErrInvalid error whose message names the field.
func Invalid(field, format string, args ...any) error {
	return &fieldError{kind: ErrInvalid, field: field, msg: fmt.Sprintf(format, args...)}
}

// NotFound returns an ErrNotFound error naming what was missing.
func NotFound(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrNotFound)
}

// UnknownSandbox returns an ErrUnknownSandbox error for sandbox id, with what follows the ID in
// its message (may be empty).
func UnknownSandbox(id, format string, args ...any) error {
	msg := "sandbox " + id
	if format != "" {
		msg += " " + fmt.Sprintf(format, args...)
	}
	return &kindError{kind: ErrUnknownSandbox, msg: msg}
}

// kindError is an error of a kind whose message does not repeat the kind's text.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg + ": not found" }
func (e *kindError) Unwrap() error { return e.kind }

// Conflict returns an ErrConflict error.
func Conflict(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrConflict)
}

// Unavailable returns an ErrUnavailable error.
func Unavailable(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrUnavailable)
}

type fieldError struct {
	kind  error
	field string
	msg   string
}

func (e *fieldError) Error() string { return e.field + ": " + e.msg }
func (e *fieldError) Unwrap() error { return e.kind }

// Field returns the name of the invalid field carried by err, if any.
func Field(err error) string {
	var fe *fieldError
	if errors.As(err, &fe) {
		return fe.field
	}
	return ""
}

// KindOf returns the kind an HTTP status answers for (the reverse of the API's mapping), for
// errors read back from another Corral's answer; statuses of no kind are internal failures.
func KindOf(status int) error {
	switch status {
	case 400:
		return ErrInvalid
	case 401:
		return ErrUnauthorized
	case 403:
		return ErrDenied
	case 404:
		return ErrNotFound
	case 409:
		return ErrConflict
	case 413:
		return ErrTooLarge
	case 429:
		return ErrExhausted
	case 503:
		return ErrUnavailable
	}
	return fmt.Errorf("status %d", status)
}

// Code returns the short machine-readable code for err's kind ("not_found", "invalid", ...).
func Code(err error) string {
	switch {
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrUnauthorized):
		return "unauthorized"
	case errors.Is(err, ErrDenied):
		return "denied"
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrNodeFull):
		return "node_full"
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, ErrTooLarge):
		return "too_large"
	case errors.Is(err, ErrExhausted):
		return "exhausted"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	}
	return "internal"
}

// Retryable marks err as transient: the same request is expected to succeed after about after
// (a store that is restarting, a busy pool). The API answers it with a Retry-After header, and the
// SDKs retry such answers on calls that are safe to repeat.
func Retryable(err error, after time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryableError{err: err, after: after}
}

// RetryableCause is Retryable for a public err whose cause (a driver's error naming internal
// addresses) belongs in the server's log only: Cause returns it.
func RetryableCause(err, cause error, after time.Duration) error {
	return &retryableError{err: err, after: after, cause: cause}
}

type retryableError struct {
	err   error
	after time.Duration
	cause error
}

func (e *retryableError) Error() string { return e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

// Cause returns what err hides from its message (RetryableCause), or nil.
func Cause(err error) error {
	if re, ok := errors.AsType[*retryableError](err); ok {
		return re.cause
	}
	return nil
}

// RetryAfter returns how long to wait before repeating the request that failed with err, when
// err (or one it wraps) was marked Retryable; 0 otherwise.
func RetryAfter(err error) time.Duration {
	if re, ok := errors.AsType[*retryableError](err); ok {
		return re.after
	}
	return 0
}
