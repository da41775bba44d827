package model

import (
	"encoding/json"
)

// CodePort is the loopback port of the code-execution server inside a code-interpreter sandbox
// (`corral env install code-interpreter`), which POST /v1/sandboxes/{id}/code reaches.
const CodePort = 49999

// Code event types: a run's NDJSON stream is stdout, stderr, result and error events in the
// order the code produced them, and always ends with one end event.
const (
	CodeStdout = "stdout"
	CodeStderr = "stderr"
	CodeResult = "result"
	CodeError  = "error"
	CodeEnd    = "end"
)

// CodeRequest is the body of POST /v1/sandboxes/{id}/code: code run in a stateful kernel of
// the sandbox's code-execution server (variables are kept between runs of the same context).
type CodeRequest struct {
	Code string `json:"code"`
	// Language is "python" (the default). A request names a context or a language, not both.
	Language string `json:"language,omitempty"`
	// Context is the ID of a context (CreateCodeContext); empty: the sandbox's default one.
	Context string `json:"context,omitempty"`
	// Timeout (a Go duration, at most 1h; default 5m) interrupts the kernel when the code runs
	// longer: the run ends with a TimeoutError event and the context keeps its variables.
	Timeout string `json:"timeout,omitempty"`
	// Env is set in the kernel's environment (os.environ) before the code runs.
	Env map[string]string `json:"env,omitempty"`
}

// CodeEvent is one line of a code run's stream.
type CodeEvent struct {
	Type string `json:"type"`
	// Text is a stdout or stderr event's text, or a result's plain-text representation.
	Text string `json:"text,omitempty"`
	// A result's other representations (Jupyter's MIME bundle): images are base64.
	HTML       string          `json:"html,omitempty"`
	Markdown   string          `json:"markdown,omitempty"`
	SVG        string          `json:"svg,omitempty"`
	PNG        string          `json:"png,omitempty"`
	JPEG       string          `json:"jpeg,omitempty"`
	PDF        string          `json:"pdf,omitempty"`
	LaTeX      string          `json:"latex,omitempty"`
	JavaScript string          `json:"javascript,omitempty"`
	JSON       json.RawMessage `json:"json,omitempty"`
	// IsMainResult marks the value of the run's last expression (the others were displayed).
	IsMainResult bool `json:"is_main_result,omitempty"`
	// An error event: the exception's name (ZeroDivisionError; TimeoutError when the run's
	// timeout interrupted it; KernelDied when the kernel died and was replaced), its value and
	// traceback.
	Name      string `json:"name,omitempty"`
	Value     string `json:"value,omitempty"`
	Traceback string `json:"traceback,omitempty"`
	// ExecutionCount is, on the end event, the context's count of runs so far.
	ExecutionCount int `json:"execution_count,omitempty"`
}

// CodeContext is a separate kernel of a sandbox's code-execution server: runs in different
// contexts share nothing but the sandbox's files.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// CodeContextRequest is the body of POST /v1/sandboxes/{id}/code/contexts.
type CodeContextRequest struct {
	Language string `json:"language,omitempty"`
	Cwd      string `json:"cwd,omitempty"`
}
