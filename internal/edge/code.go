package edge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
)

// Code: POST /v1/sandboxes/{id}/code runs code in the sandbox's code-execution server (the one
// `corral env install code-interpreter` puts in its toolkit, started as a service of the layer)
// and streams what it produced as NDJSON corral.CodeEvents; /code/contexts manages its kernels.
// The edge reaches the server as it reaches ports (ports.go): from inside the sandbox's network
// namespace, on its loopback, so it works with networking "none" and default-deny egress. The
// server speaks E2B's code-interpreter protocol (what E2B's SDK calls through the gateway's
// port proxy); the edge converts its events at this boundary, bounds them, and always ends
// the stream with an end event.

const (
	// defaultCodeTimeout and maxCodeTimeout bound one run (CodeRequest.Timeout).
	defaultCodeTimeout = 5 * time.Minute
	maxCodeTimeout     = time.Hour
	// maxCodeBody bounds a code request (the code itself).
	maxCodeBody = 8 << 20
	// maxCodeLine bounds one event from the server (a result's images included).
	maxCodeLine = 32 << 20
	// codeGrace is how long past the run's timeout the edge waits for the server's own
	// timeout error before giving up on it.
	codeGrace = 3 * time.Minute
)

var codeContextRE = lazyregexp.New(`^[A-Za-z0-9_-]{1,64}$`)

// codeRoutes adds the code routes to the data plane's mux.
func (h *dataPlane) codeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes/{id}/code", h.runCode)
	mux.HandleFunc("GET /v1/sandboxes/{id}/code/contexts", h.codeContexts)
	mux.HandleFunc("POST /v1/sandboxes/{id}/code/contexts", h.codeContexts)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/code/contexts/{ctx}", h.codeContext)
	mux.HandleFunc("POST /v1/sandboxes/{id}/code/contexts/{ctx}/restart", h.codeContext)
}

// codeServer sends one request to sandbox id's code-execution server. A sandbox without one is
// a conflict that says how to get one; the server's own refusals keep their kinds.
func (e *Edge) codeServer(ctx context.Context, id, method, path string, body any) (*http.Response, error) {
	dial, err := e.portDialer(ctx, id)
	if err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://127.0.0.1:"+strconv.Itoa(model.CodePort)+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx, model.CodePort)
		},
		DisableKeepAlives: true,
	}}
	resp, err := c.Do(req)
	if errors.Is(err, errdefs.ErrUnavailable) {
		return nil, errdefs.Conflict("sandbox %s runs no code-execution server (nothing listens on port %d): create it from an environment that has one (corral env install code-interpreter; corral create --env code-interpreter)", id, model.CodePort)
	}
	if err != nil {
		return nil, errdefs.Unavailable("the code-execution server of sandbox %s: %v", id, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var m struct {
			Message string `json:"message"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &m) != nil || m.Message == "" {
			m.Message = fmt.Sprintf("%s %s: %s", method, path, resp.Status)
		}
		switch resp.StatusCode {
		case http.StatusNotFound:
			return nil, errdefs.NotFound("sandbox %s: %s", id, m.Message)
		case http.StatusBadRequest:
			return nil, errdefs.Invalid("code", "%s", m.Message)
		}
		return nil, errdefs.Unavailable("the code-execution server of sandbox %s: %s", id, m.Message)
	}
	return resp, nil
}

// serverEvent is one line of the server's /execute stream (E2B's shape).
type serverEvent struct {
	Type           string          `json:"type"`
	Text           string          `json:"text"`
	HTML           string          `json:"html"`
	Markdown       string          `json:"markdown"`
	SVG            string          `json:"svg"`
	PNG            string          `json:"png"`
	JPEG           string          `json:"jpeg"`
	PDF            string          `json:"pdf"`
	LaTeX          string          `json:"latex"`
	JavaScript     string          `json:"javascript"`
	JSON           json.RawMessage `json:"json"`
	IsMainResult   bool            `json:"is_main_result"`
	Name           string          `json:"name"`
	Value          string          `json:"value"`
	Traceback      string          `json:"traceback"`
	ExecutionCount int             `json:"execution_count"`
}

// checkCodeRequest validates a code request and fills its defaults.
func checkCodeRequest(req *model.CodeRequest) (time.Duration, error) {
	switch req.Language {
	case "", "python", "python3":
	default:
		return 0, errdefs.Invalid("language", "%q: this sandbox's code-execution server runs python", req.Language)
	}
	if req.Context != "" && req.Language != "" {
		return 0, errdefs.Invalid("context", "name a context or a language, not both")
	}
	if req.Context != "" && !codeContextRE.MatchString(req.Context) {
		return 0, errdefs.Invalid("context", "%q is not a context ID", req.Context)
	}
	timeout := defaultCodeTimeout
	if req.Timeout != "" {
		d, err := time.ParseDuration(req.Timeout)
		if err != nil || d <= 0 || d > maxCodeTimeout {
			return 0, errdefs.Invalid("timeout", "%q: want a duration up to %s (e.g. 30s)", req.Timeout, maxCodeTimeout)
		}
		timeout = d
	}
	if len(req.Env) > 256 {
		return 0, errdefs.Invalid("env", "at most 256 variables, got %d", len(req.Env))
	}
	for k := range req.Env {
		if !envNameRE.MatchString(k) {
			return 0, errdefs.Invalid("env", "%q is not a variable name", k)
		}
	}
	return timeout, nil
}

var envNameRE = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// runCode serves POST /v1/sandboxes/{id}/code.
func (h *dataPlane) runCode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req model.CodeRequest
	if err := httpjson.DecodeLimit(r, &req, maxCodeBody); err != nil {
		h.fail(w, r, err)
		return
	}
	timeout, err := checkCodeRequest(&req)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	sb := h.sandbox(w, r)
	if sb == nil {
		return
	}
	// The client going away ends the request to the server, which interrupts the kernel.
	ctx, cancel := context.WithTimeout(r.Context(), timeout+codeGrace)
	defer cancel()
	body := map[string]any{"code": req.Code, "timeout": timeout.Seconds()}
	if req.Context != "" {
		body["context_id"] = req.Context
	}
	if req.Language != "" {
		body["language"] = req.Language
	}
	if len(req.Env) > 0 {
		body["env_vars"] = req.Env
	}
	resp, err := h.e.codeServer(ctx, id, http.MethodPost, "/execute", body)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	flush()
	count := 0
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := readLine(br, maxCodeLine)
		if err != nil {
			msg := "the code-execution server's stream ended before the run's end"
			switch {
			case errors.Is(err, errLineTooLong):
				msg = fmt.Sprintf("the code-execution server sent an event larger than %d bytes", maxCodeLine)
			case ctx.Err() != nil && r.Context().Err() == nil:
				msg = fmt.Sprintf("the code-execution server did not end the run %s after its timeout", codeGrace)
			case err != io.EOF:
				msg += ": " + err.Error()
			}
			enc.Encode(model.CodeEvent{Type: model.CodeError, Name: "CodeServerError", Value: msg})
			enc.Encode(model.CodeEvent{Type: model.CodeEnd, ExecutionCount: count})
			return
		}
		var ev serverEvent
		if len(bytes.TrimSpace(line)) == 0 || json.Unmarshal(line, &ev) != nil {
			continue
		}
		sb.touch()
		var out model.CodeEvent
		switch ev.Type {
		case model.CodeStdout, model.CodeStderr:
			out = model.CodeEvent{Type: ev.Type, Text: ev.Text}
		case model.CodeResult:
			out = model.CodeEvent{Type: ev.Type, Text: ev.Text, HTML: ev.HTML, Markdown: ev.Markdown, SVG: ev.SVG, PNG: ev.PNG,
				JPEG: ev.JPEG, PDF: ev.PDF, LaTeX: ev.LaTeX, JavaScript: ev.JavaScript, IsMainResult: ev.IsMainResult}
			if len(ev.JSON) > 0 && json.Valid(ev.JSON) && string(ev.JSON) != "null" {
				out.JSON = ev.JSON
			}
		case model.CodeError:
			out = model.CodeEvent{Type: ev.Type, Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
		case "number_of_executions":
			count = ev.ExecutionCount
			continue
		case "end_of_execution":
			enc.Encode(model.CodeEvent{Type: model.CodeEnd, ExecutionCount: count})
			return
		default:
			continue
		}
		if err := enc.Encode(out); err != nil {
			return // the client went away
		}
		flush()
	}
}

var errLineTooLong = errors.New("line too long")

// readLine reads one newline-terminated line of at most limit bytes.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > limit {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil && len(line) > 0 && err == io.EOF {
			return line, nil
		}
		return line, err
	}
}

// codeContexts serves GET and POST /v1/sandboxes/{id}/code/contexts.
func (h *dataPlane) codeContexts(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var body any
	status := http.StatusOK
	if r.Method == http.MethodPost {
		var req model.CodeContextRequest
		if err := httpjson.Decode(r, &req); err != nil {
			h.fail(w, r, err)
			return
		}
		switch req.Language {
		case "", "python", "python3":
		default:
			h.fail(w, r, errdefs.Invalid("language", "%q: this sandbox's code-execution server runs python", req.Language))
			return
		}
		if req.Cwd != "" && (req.Cwd[0] != '/' || len(req.Cwd) > 4096) {
			h.fail(w, r, errdefs.Invalid("cwd", "%q is not an absolute path", req.Cwd))
			return
		}
		body, status = req, http.StatusCreated
	}
	if sb := h.sandbox(w, r); sb == nil {
		return
	}
	resp, err := h.e.codeServer(r.Context(), id, r.Method, "/contexts", body)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer resp.Body.Close()
	if r.Method == http.MethodPost {
		var c model.CodeContext
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&c); err != nil {
			h.fail(w, r, errdefs.Unavailable("the code-execution server of sandbox %s: decode its context: %v", id, err))
			return
		}
		httpjson.Write(w, status, c)
		return
	}
	var list []model.CodeContext
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&list); err != nil {
		h.fail(w, r, errdefs.Unavailable("the code-execution server of sandbox %s: decode its contexts: %v", id, err))
		return
	}
	if list == nil {
		list = []model.CodeContext{}
	}
	httpjson.Write(w, http.StatusOK, list)
}

// codeContext serves DELETE /v1/sandboxes/{id}/code/contexts/{ctx} and POST .../restart.
func (h *dataPlane) codeContext(w http.ResponseWriter, r *http.Request) {
	id, cid := r.PathValue("id"), r.PathValue("ctx")
	if !codeContextRE.MatchString(cid) {
		h.fail(w, r, errdefs.Invalid("context", "%q is not a context ID", cid))
		return
	}
	if sb := h.sandbox(w, r); sb == nil {
		return
	}
	path := "/contexts/" + cid
	if r.Method == http.MethodPost {
		path += "/restart"
	}
	resp, err := h.e.codeServer(r.Context(), id, r.Method, path, nil)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	resp.Body.Close()
	w.WriteHeader(http.StatusNoContent)
}
