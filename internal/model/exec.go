package model

// Event types in an output stream.
const (
	EventStart     = "start"
	EventStdout    = "stdout"
	EventStderr    = "stderr"
	EventTruncated = "truncated"
	EventExit      = "exit"
	// EventError is sent by the server, instead of an exit, when it lost the command's output
	// stream; Data holds its message (the SDK's Stream.Next turns it into an error).
	EventError = "error"
)
