package corral

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Error codes the server puts in [Error.Code]. They mirror the server's error kinds.
const (
	CodeInvalid      = "invalid"
	CodeUnauthorized = "unauthorized"
	CodeDenied       = "denied"
	CodeNotFound     = "not_found"
	CodeConflict     = "conflict"
	CodeTooLarge     = "too_large"
	CodeExhausted    = "exhausted"
	CodeUnavailable  = "unavailable"
	CodeInternal     = "internal"
)

// APIError is a failure reported by the server: an HTTP status of 400 or above and the JSON
// [Error] body that came with it.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Code is the machine-readable kind ("not_found", "invalid", ...). When the body was not a
	// Corral error (a proxy's page), Code is derived from Status.
	Code string
	// Message is what the server said went wrong, meant for a person.
	Message string
	// Field names the request field that was invalid, when there is one.
	Field string
	// Quota is the limit that refused the request (Code exhausted), when a quota did.
	Quota *QuotaExceeded
	// Permission is the permission the caller lacks (Code denied), when one is named.
	Permission string
}

// Error returns the server's message, followed by the field it concerns when there is one and
// the message does not already start with it ("ttl: ...").
func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
	}
	if e.Field != "" && !strings.HasPrefix(msg, e.Field+":") {
		return fmt.Sprintf("%s (field %q)", msg, e.Field)
	}
	return msg
}

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// decodeError builds the *APIError for a response with a status of 400 or above. It reads (a
// bounded part of) the body but does not close it.
func decodeError(resp *http.Response) *APIError {
	e := &APIError{Status: resp.StatusCode}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var wire Error
	if json.Unmarshal(body, &wire) == nil && (wire.Code != "" || wire.Message != "") {
		e.Code, e.Message, e.Field = wire.Code, wire.Message, wire.Field
		e.Quota, e.Permission = wire.Quota, wire.Permission
	} else {
		e.Message = strings.TrimSpace(string(body))
		if len(e.Message) > 512 {
			e.Message = e.Message[:512] + "..."
		}
	}
	if e.Code == "" {
		e.Code = CodeForStatus(resp.StatusCode)
	}
	return e
}

// CodeForStatus is the error code ([Error.Code]) an HTTP status stands for, for a failure that
// came without a Corral error body.
func CodeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return CodeInvalid
	case http.StatusUnauthorized:
		return CodeUnauthorized
	case http.StatusForbidden:
		return CodeDenied
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeConflict
	case http.StatusRequestEntityTooLarge:
		return CodeTooLarge
	case http.StatusTooManyRequests:
		return CodeExhausted
	case http.StatusServiceUnavailable:
		return CodeUnavailable
	}
	return CodeInternal
}

// hasCode reports whether err is, or wraps, an *APIError with the given code.
func hasCode(err error, code string) bool {
	e, ok := errors.AsType[*APIError](err)
	return ok && e.Code == code
}

// IsNotFound reports whether err is an API error saying the object does not exist.
func IsNotFound(err error) bool { return hasCode(err, CodeNotFound) }

// IsConflict reports whether err is an API error saying the request conflicts with the current
// state (a layer version published with other content, a sandbox that is not running).
func IsConflict(err error) bool { return hasCode(err, CodeConflict) }

// IsInvalid reports whether err is an API error saying the request was malformed; the
// [APIError.Field] says which field, when known.
func IsInvalid(err error) bool { return hasCode(err, CodeInvalid) }

// IsUnauthorized reports whether err is an API error saying the token was missing or wrong.
func IsUnauthorized(err error) bool { return hasCode(err, CodeUnauthorized) }

// IsDenied reports whether err is an API error saying the token may not do this.
func IsDenied(err error) bool { return hasCode(err, CodeDenied) }

// IsExhausted reports whether err is an API error saying a quota or capacity is used up.
func IsExhausted(err error) bool { return hasCode(err, CodeExhausted) }

// IsUnavailable reports whether err is an API error saying the server cannot serve the request
// now; retrying later may succeed.
func IsUnavailable(err error) bool { return hasCode(err, CodeUnavailable) }
