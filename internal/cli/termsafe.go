package cli

import (
	"io"
	"strconv"
	"sync"
	"unicode/utf8"
)

// termEscaper is a writer that makes what passes through it safe to show on the operator's
// terminal: bytes a sandbox chose cannot move the cursor, retitle the window, set the
// clipboard (OSC 52), rewrite earlier lines or hide text. Every control character except
// newline and tab (C0, DEL, the C1 controls both as raw bytes and as UTF-8 runes U+0080..U+009F,
// a CR not followed by LF) and every byte that is not valid UTF-8 is written as visible text:
// "\x1b" for a byte, "\u009b" for a rune. The bidirectional overrides and isolates
// (U+202A..U+202E, U+2066..U+2069), which make text read differently from what it is, are
// escaped as well. Everything else passes unchanged, so plain output looks the same.
//
// Escaping is byte by byte, so a sequence split across writes is escaped just as a whole one
// is. A UTF-8 rune split across writes, or a CR at the end of one, is held (at most
// utf8.UTFMax bytes) until the next write says what it is; Flush writes what is held.
// termEscaper is safe for concurrent use.
type termEscaper struct {
	w io.Writer

	mu sync.Mutex
	// pending is the held tail of the last write; protected by mu.
	pending []byte
	// buf is reused for the escaped output; protected by mu.
	buf []byte
}

func newTermEscaper(w io.Writer) *termEscaper { return &termEscaper{w: w} }

// Write escapes p and writes it. It reports len(p) when the escaped bytes were written.
func (e *termEscaper) Write(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	in := p
	if len(e.pending) > 0 {
		in = append(e.pending, p...)
		e.pending = nil
	}
	out, rest := escapeTerminal(e.buf[:0], in, false)
	e.pending = append(e.pending[:0], rest...)
	e.buf = out[:0]
	if len(out) > 0 {
		if _, err := e.w.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush writes what an earlier write left held (an incomplete UTF-8 rune, a trailing CR),
// escaped, as the end of the stream.
func (e *termEscaper) Flush() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.pending) == 0 {
		return nil
	}
	out, _ := escapeTerminal(e.buf[:0], e.pending, true)
	e.pending = nil
	_, err := e.w.Write(out)
	return err
}

// escapeTerminal appends the escaped form of in to out. Unless final, it stops before a tail
// whose meaning depends on what follows (an incomplete rune, a CR) and returns that tail.
func escapeTerminal(out, in []byte, final bool) ([]byte, []byte) {
	for i := 0; i < len(in); {
		c := in[i]
		switch {
		case c >= 0x20 && c < 0x7f, c == '\n', c == '\t':
			j := i + 1
			for j < len(in) && (in[j] >= 0x20 && in[j] < 0x7f || in[j] == '\n' || in[j] == '\t') {
				j++
			}
			out = append(out, in[i:j]...)
			i = j
		case c == '\r':
			// CRLF only ends a line; a lone CR would let later text overwrite it.
			if i+1 == len(in) && !final {
				return out, in[i:]
			}
			if i+1 < len(in) && in[i+1] == '\n' {
				out = append(out, '\r', '\n')
				i += 2
				continue
			}
			out = appendByteEscape(out, c)
			i++
		case c < 0x80:
			out = appendByteEscape(out, c)
			i++
		default:
			if !final && !utf8.FullRune(in[i:]) {
				return out, in[i:]
			}
			r, size := utf8.DecodeRune(in[i:])
			switch {
			case r == utf8.RuneError && size <= 1:
				out = appendByteEscape(out, c)
				i++
				continue
			case unsafeRune(r):
				out = append(out, `\u`...)
				h := strconv.FormatInt(int64(r), 16)
				for range 4 - len(h) {
					out = append(out, '0')
				}
				out = append(out, h...)
			default:
				out = append(out, in[i:i+size]...)
			}
			i += size
		}
	}
	return out, nil
}

// unsafeRune reports whether r is a C1 control or a bidirectional override or isolate.
func unsafeRune(r rune) bool {
	return r >= 0x80 && r <= 0x9f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}

func appendByteEscape(out []byte, c byte) []byte {
	const hex = "0123456789abcdef"
	return append(out, '\\', 'x', hex[c>>4], hex[c&0xf])
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	_, ok := terminalFd(w)
	return ok
}

// guardTerminal replaces a's stdout and stderr by escaping writers where they are terminals,
// unless --raw or -o json was given (JSON escapes control characters itself). The unescaped
// writers stay in rawStdout and rawStderr for a command that runs on a PTY, whose output is a
// terminal session the operator asked for.
func (a *app) guardTerminal() {
	a.rawStdout, a.rawStderr = a.stdout, a.stderr
	if a.flagRaw || a.jsonOut() {
		return
	}
	if isTerminal(a.stdout) {
		e := newTermEscaper(a.stdout)
		a.stdout, a.flushers = e, append(a.flushers, e)
	}
	if isTerminal(a.stderr) {
		e := newTermEscaper(a.stderr)
		a.stderr, a.flushers = e, append(a.flushers, e)
	}
}
