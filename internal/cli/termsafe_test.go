package cli

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

// escapeAll runs in through a termEscaper in the given chunks and flushes it.
func escapeAll(t testing.TB, chunks ...[]byte) string {
	t.Helper()
	var out bytes.Buffer
	e := newTermEscaper(&out)
	for _, c := range chunks {
		if n, err := e.Write(c); n != len(c) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", c, n, err)
		}
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestTermEscaper(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"plain", "hello, world\n\ttab\n", "hello, world\n\ttab\n"},
		{"utf8", "héllo → ✓ 日本\n", "héllo → ✓ 日本\n"},
		{"csi", "\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"osc title bel", "\x1b]0;pwned\x07", `\x1b]0;pwned\x07`},
		{"osc 52 clipboard st", "\x1b]52;c;cm0gLXJmIC8=\x1b\\", `\x1b]52;c;cm0gLXJmIC8=\x1b\`},
		{"lone esc", "a\x1b", `a\x1b`},
		{"c0", "\x00\x01\x08\x0b\x0c\x7f", `\x00\x01\x08\x0b\x0c\x7f`},
		{"crlf", "line\r\nnext\r\n", "line\r\nnext\r\n"},
		{"lone cr", "safe\rrm -rf /", `safe\x0drm -rf /`},
		{"trailing cr", "x\r", `x\x0d`},
		{"c1 raw byte", "a\x9b31mb", `a\x9b31mb`},
		{"c1 utf8 csi", "a\u009b31mb", `a\u009b31mb`},
		{"c1 utf8 nel", "\u0085", `\u0085`},
		{"bidi override", "abc\u202edef", `abc\u202edef`},
		{"bidi isolate", "\u2066x\u2069", `\u2066x\u2069`},
		{"invalid utf8", "\xff\xfe", `\xff\xfe`},
		{"truncated rune at end", "ok\xe2\x82", `ok\xe2\x82`},
		{"surrogate", "\xed\xa0\x80", `\xed\xa0\x80`},
		{"replacement char", "\uFFFD", "\uFFFD"},
		{"backslash kept", `C:\x1b`, `C:\x1b`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := escapeAll(t, []byte(tc.in)); got != tc.want {
				t.Errorf("escape(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestTermEscaperSplit writes every input cut at every point: a sequence or a rune split across
// two writes comes out as it does whole.
func TestTermEscaperSplit(t *testing.T) {
	for _, in := range []string{
		"\x1b[31mred\x1b[0m\n",
		"日本語 ✓\n",
		"a\u009bb",
		"x\r\ny\rz",
		"\xe2\x82\xac\xe2\x82",
	} {
		whole := escapeAll(t, []byte(in))
		for i := 0; i <= len(in); i++ {
			for j := i; j <= len(in); j++ {
				got := escapeAll(t, []byte(in[:i]), []byte(in[i:j]), []byte(in[j:]))
				if got != whole {
					t.Errorf("escape(%q) cut at %d,%d = %q, whole %q", in, i, j, got, whole)
				}
			}
		}
	}
}

// FuzzTermEscaper checks, for any bytes cut anywhere: the output is valid UTF-8 with no control
// character but newline, tab and CR before LF, no C1 rune and no bidi override; it does not
// depend on where the input was cut; and input without such characters passes unchanged.
func FuzzTermEscaper(f *testing.F) {
	for _, s := range []string{"plain\n", "\x1b]0;t\x07", "\x1b[2J", "\u009b", "x\r\n", "\xff", "日本", "\u202e"} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, in []byte, cut uint8) {
		whole := escapeAll(t, in)
		at := 0
		if len(in) > 0 {
			at = int(cut) % (len(in) + 1)
		}
		if split := escapeAll(t, in[:at], in[at:]); split != whole {
			t.Fatalf("escape(%q) = %q whole, %q cut at %d", in, whole, split, at)
		}
		if !utf8.ValidString(whole) {
			t.Fatalf("escape(%q) = %q: not valid UTF-8", in, whole)
		}
		for i, r := range whole {
			bad := r < 0x20 && r != '\n' && r != '\t' && r != '\r' || r == 0x7f || unsafeRune(r)
			if r == '\r' && (i+1 >= len(whole) || whole[i+1] != '\n') {
				bad = true
			}
			if bad {
				t.Fatalf("escape(%q) = %q: %U at %d", in, whole, r, i)
			}
		}
		safe := utf8.Valid(in) && !strings.ContainsFunc(strings.ReplaceAll(string(in), "\r\n", ""), func(r rune) bool {
			return r < 0x20 && r != '\n' && r != '\t' || r == 0x7f || unsafeRune(r)
		})
		if safe && whole != string(in) {
			t.Fatalf("escape(%q) = %q: safe input changed", in, whole)
		}
	})
}

// BenchmarkTermEscaper measures the escaper on 64 KiB writes of plain text (make output, logs)
// and of text dense with escape sequences (colored output), against copying the bytes.
func BenchmarkTermEscaper(b *testing.B) {
	plain := bytes.Repeat([]byte("compiling internal/cli/termsafe.go ... ok — 12.3s\n"), 64<<10/52)
	colored := bytes.Repeat([]byte("\x1b[32mok\x1b[0m  internal/cli  0.5s\n"), 64<<10/34)
	for _, in := range []struct {
		name string
		data []byte
	}{{"plain", plain}, {"colored", colored}} {
		b.Run(in.name+"/copy", func(b *testing.B) {
			var buf []byte
			b.SetBytes(int64(len(in.data)))
			for b.Loop() {
				buf = append(buf[:0], in.data...)
			}
		})
		b.Run(in.name+"/escaped", func(b *testing.B) {
			e := newTermEscaper(io.Discard)
			b.SetBytes(int64(len(in.data)))
			for b.Loop() {
				e.Write(in.data)
			}
		})
	}
}
