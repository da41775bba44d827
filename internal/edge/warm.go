package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
)

// Warm Python interpreters. A call with Python code runs `python3 -c pyBoot`: the boot program
// imports the environment's modules, then reads from stdin one JSON header line (files, env,
// cwd, argv), then the code, and runs it in a fresh globals dict (the boot's own names are not
// visible to it), leaving the rest of stdin to it. An environment with
// Warm keeps one such interpreter started ahead in each pool container: a call prepared
// (CallPrep) and started before any call arrives, so its imports are done by then. A warm call
// takes it and writes the header and code into its stdin; everything else (a fresh root and
// namespaces, outputs, CallEnd) is as for any call, and each interpreter serves one call. When
// none is ready (the pool is busier than the interpreters are started), the same boot runs as
// an ordinary call, paying its imports.

// pyBoot is the boot program; %s is the Python list of modules to import.
const pyBoot = `import sys, os, json, base64
for _m in %s:
    __import__(_m)
_b = sys.stdin.buffer
_h = json.loads(_b.readline())
for _f in _h.get("files") or []:
    _d = os.path.dirname(_f["path"])
    if _d:
        os.makedirs(_d, exist_ok=True)
    with open(_f["path"], "wb") as _o:
        _o.write(base64.b64decode(_f["data"] or ""))
    os.chmod(_f["path"], _f.get("mode") or 0o644)
_code = _b.read(_h["code_len"]).decode()
os.environ.update(_h.get("env") or {})
os.makedirs(_h["cwd"], exist_ok=True)
os.chdir(_h["cwd"])
sys.argv = ["<call>"] + (_h.get("argv") or [])
exec(compile(_code, "<call>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
`

var (
	moduleRE      = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
	interpreterRE = lazyregexp.New(`^[A-Za-z0-9_./+-]{1,256}$`)
)

const maxWarmImports = 256

// checkWarm validates and fills the defaults of an environment's warm interpreter.
func checkWarm(w *model.WarmPython) error {
	if w.Interpreter == "" {
		w.Interpreter = "python3"
	}
	if !interpreterRE.MatchString(w.Interpreter) {
		return errdefs.Invalid("warm.interpreter", "%q is not a program name or path", w.Interpreter)
	}
	if len(w.Imports) > maxWarmImports {
		return errdefs.Invalid("warm.imports", "at most %d modules, got %d", maxWarmImports, len(w.Imports))
	}
	for i, m := range w.Imports {
		if !moduleRE.MatchString(m) {
			return errdefs.Invalid(fmt.Sprintf("warm.imports[%d]", i), "%q is not a Python module name", m)
		}
	}
	return nil
}

// pyArgv is the command of a Python call in env.
func pyArgv(env model.FncallEnv) []string {
	interp, imports := "python3", []string{}
	if env.Warm != nil {
		interp, imports = env.Warm.Interpreter, env.Warm.Imports
	}
	list, _ := json.Marshal(imports) // a JSON list of identifiers is a Python list
	return []string{interp, "-c", fmt.Sprintf(pyBoot, list)}
}

// pyFile is one input file in a Python call's header.
type pyFile struct {
	Path string `json:"path"`
	Data []byte `json:"data"`
	Mode uint32 `json:"mode,omitempty"`
}

// pyPayload is what a Python call writes to the boot program's stdin: the header line, the
// code, then the call's own stdin.
func (e *Edge) pyPayload(c *callSpec, code string, argv []string) ([]byte, error) {
	h := struct {
		Files   []pyFile          `json:"files,omitempty"`
		Env     map[string]string `json:"env,omitempty"`
		Cwd     string            `json:"cwd"`
		Argv    []string          `json:"argv,omitempty"`
		CodeLen int               `json:"code_len"`
	}{Cwd: c.req.Cwd, Argv: argv, CodeLen: len(code)}
	for _, f := range c.files {
		h.Files = append(h.Files, pyFile{Path: f.path, Data: f.data})
	}
	for _, f := range c.refs {
		a, mode, err := e.artifacts.open(c.project, string(f.data))
		if err != nil {
			return nil, err
		}
		var b bytes.Buffer
		_, err = b.ReadFrom(a)
		a.Close()
		if err != nil {
			return nil, err
		}
		h.Files = append(h.Files, pyFile{Path: f.path, Data: b.Bytes(), Mode: uint32(mode.Perm())})
	}
	if len(c.req.Env) > 0 {
		h.Env = map[string]string{}
		for _, kv := range c.req.Env {
			k, v, _ := strings.Cut(kv, "=")
			h.Env[k] = v
		}
	}
	head, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(head)+1+len(code)+len(c.req.Stdin))
	out = append(append(append(append(out, head...), '\n'), code...), c.req.Stdin...)
	return out, nil
}

// warmCall is an interpreter started ahead in a pool container, waiting for a call.
type warmCall struct {
	id, dir, cmd string
}

// prewarm starts a warm interpreter in sb unless it has one or one is being started.
func (p *fncallPool) prewarm(sb *sandbox) {
	if p.env.Warm == nil {
		return
	}
	p.mu.Lock()
	if _, ok := p.warm[sb.id]; ok || p.closed {
		p.mu.Unlock()
		return
	}
	p.warm[sb.id] = nil // being started
	p.mu.Unlock()
	w, err := p.startWarm(sb)
	p.mu.Lock()
	if err != nil || p.closed {
		delete(p.warm, sb.id)
	} else {
		p.warm[sb.id] = w
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Warn("start a warm interpreter; calls use a fresh one", "sandbox", sb.id, "err", err)
	}
}

func (p *fncallPool) startWarm(sb *sandbox) (*warmCall, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := newCallID()
	dir, err := sb.agent.CallPrep(ctx, id, p.env.FilesBytes)
	if err != nil {
		return nil, err
	}
	info, err := sb.agent.Start(ctx, agentrpc.ExecRequest{Argv: pyArgv(p.env), Cwd: "/", KeepStdinOpen: true,
		OutputLimit: 2 * defaultCallOutput, Call: &agentrpc.CallSpec{Dir: dir}})
	if err == nil {
		err = startError(info)
	}
	if err != nil {
		sb.agent.CallEnd(ctx, id)
		return nil, err
	}
	return &warmCall{id: id, dir: dir, cmd: info.ID}, nil
}

// takeWarm returns sb's ready warm interpreter, if any, and forgets it.
func (p *fncallPool) takeWarm(sb *sandbox) *warmCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.warm[sb.id]
	if w != nil {
		delete(p.warm, sb.id)
	}
	return w
}

// runWarm feeds a call to a warm interpreter and streams its events to next's consumer. The
// edge enforces the timeout: the interpreter was started before the call.
func (p *fncallPool) runWarm(ctx context.Context, sb *sandbox, w *warmCall, payload []byte, timeout time.Duration) (func() (agentrpc.Event, error), func(), *atomic.Bool, error) {
	st, err := sb.agent.Attach(ctx, w.cmd, 0, true)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := sb.agent.WriteStdin(ctx, w.cmd, bytes.NewReader(payload), true); err != nil {
		st.Close()
		return nil, nil, nil, err
	}
	var timedOut atomic.Bool
	t := time.AfterFunc(timeout, func() {
		timedOut.Store(true)
		sb.agent.Signal(context.Background(), w.cmd, syscall.SIGKILL)
	})
	return st.Next, func() { t.Stop(); st.Close() }, &timedOut, nil
}
