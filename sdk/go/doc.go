// Package corral is the Go client for the Corral REST API: sandboxes, the commands running in
// them, their files, and the layers sandboxes are built from.
//
// A [Client] is safe for concurrent use. Every method takes a context first; cancelling it aborts
// the HTTP exchange (a command already started in a sandbox keeps running on the server).
//
// Failures the server reports come back as [*APIError]; classify them with [IsNotFound],
// [IsConflict], [IsInvalid], [IsUnauthorized] and friends rather than by message text. Transport
// failures come back as the underlying net/http error.
//
// Commands stream their output as a sequence of [Event] values. [Client.Exec] starts a command
// and returns a [Stream] of its events; [Client.Run] collects them into byte slices;
// [Client.ExecStream] additionally feeds an io.Reader to the command's stdin while output is
// streaming back (one full-duplex HTTP request).
package corral
