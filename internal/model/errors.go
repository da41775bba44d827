package model

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
