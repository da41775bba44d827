package corral

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
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

// Execution is a finished code run, its events gathered.
type Execution struct {
	Stdout  []string
	Stderr  []string
	Results []CodeEvent
	// Error is the run's error event, or nil.
	Error          *CodeEvent
	ExecutionCount int
}

// Text returns the plain text of the run's main result ("" when it had none).
func (e *Execution) Text() string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// CodeStream is a code run's events, read with Next. The caller must Close it.
type CodeStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
	done bool
}

// Next returns the next event; after the end event, io.EOF. A stream that breaks off before
// its end event is an error wrapping io.ErrUnexpectedEOF.
func (s *CodeStream) Next() (CodeEvent, error) {
	if s.done {
		return CodeEvent{}, io.EOF
	}
	for s.sc.Scan() {
		if len(s.sc.Bytes()) == 0 {
			continue
		}
		var ev CodeEvent
		if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
			return CodeEvent{}, fmt.Errorf("decode code event: %w", err)
		}
		if ev.Type == CodeEnd {
			s.done = true
		}
		return ev, nil
	}
	if err := s.sc.Err(); err != nil {
		return CodeEvent{}, fmt.Errorf("read code events: %w", err)
	}
	return CodeEvent{}, fmt.Errorf("code stream ended before its end event: %w", io.ErrUnexpectedEOF)
}

// Close ends the stream; closing it before the end interrupts the run.
func (s *CodeStream) Close() error { return s.body.Close() }

// maxCodeEvent bounds one event line (a result's images included).
const maxCodeEvent = 64 << 20

// RunCodeStream runs code in sandbox id's code-execution server and returns its events as
// they come. A sandbox without that server is an error IsConflict recognizes; an unknown
// context one IsNotFound recognizes.
func (c *Client) RunCodeStream(ctx context.Context, id string, req CodeRequest) (*CodeStream, error) {
	resp, err := c.send(ctx, request{method: http.MethodPost, path: "/v1/sandboxes/" + url.PathEscape(id) + "/code", json: req})
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxCodeEvent)
	return &CodeStream{body: resp.Body, sc: sc}, nil
}

// RunCode runs code in sandbox id's code-execution server and gathers its events; onEvent,
// when not nil, sees each as it comes. An error of the code itself is Execution.Error, not an
// error of the call.
func (c *Client) RunCode(ctx context.Context, id string, req CodeRequest, onEvent func(CodeEvent)) (*Execution, error) {
	s, err := c.RunCodeStream(ctx, id, req)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	ex := &Execution{}
	for {
		ev, err := s.Next()
		if err == io.EOF {
			return ex, nil
		}
		if err != nil {
			return ex, err
		}
		if onEvent != nil {
			onEvent(ev)
		}
		switch ev.Type {
		case CodeStdout:
			ex.Stdout = append(ex.Stdout, ev.Text)
		case CodeStderr:
			ex.Stderr = append(ex.Stderr, ev.Text)
		case CodeResult:
			ex.Results = append(ex.Results, ev)
		case CodeError:
			e := ev
			ex.Error = &e
		case CodeEnd:
			ex.ExecutionCount = ev.ExecutionCount
		}
	}
}

// CreateCodeContext starts a new context (a kernel of its own) in sandbox id.
func (c *Client) CreateCodeContext(ctx context.Context, id string, req CodeContextRequest) (*CodeContext, error) {
	var out CodeContext
	if err := c.do(ctx, request{method: http.MethodPost, path: codeContexts(id), json: req}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CodeContexts lists sandbox id's contexts, the default one included.
func (c *Client) CodeContexts(ctx context.Context, id string) ([]CodeContext, error) {
	var out []CodeContext
	if err := c.do(ctx, request{method: http.MethodGet, path: codeContexts(id)}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// RestartCodeContext replaces a context's kernel with a new one: its variables are gone.
func (c *Client) RestartCodeContext(ctx context.Context, id, contextID string) error {
	return c.do(ctx, request{method: http.MethodPost, path: codeContexts(id) + "/" + url.PathEscape(contextID) + "/restart"}, nil)
}

// DeleteCodeContext stops a context's kernel and forgets the context.
func (c *Client) DeleteCodeContext(ctx context.Context, id, contextID string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: codeContexts(id) + "/" + url.PathEscape(contextID)}, nil)
}

func codeContexts(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/code/contexts" }
