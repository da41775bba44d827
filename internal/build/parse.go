package build

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Limits on a Dockerfile, applied before anything is parsed further.
const (
	MaxDockerfileBytes = 1 << 20
	maxInstructions    = 1000
)

// Instruction is one instruction of a Dockerfile, as written: continuations joined, comments
// dropped, nothing expanded.
type Instruction struct {
	Line  int      // the line it starts on, from 1
	Cmd   string   // upper case: FROM, RUN, ...
	Flags []string // leading --name=value flags, as written
	Args  string   // the rest of the line, trimmed
	// JSON is the exec form of RUN, CMD and ENTRYPOINT (["a", "b"]), nil for the shell form.
	JSON []string
}

// String is the instruction as a progress line shows it.
func (in Instruction) String() string {
	var b strings.Builder
	b.WriteString(in.Cmd)
	for _, f := range in.Flags {
		b.WriteString(" " + f)
	}
	if in.Args != "" {
		b.WriteString(" " + in.Args)
	}
	return b.String()
}

// Dockerfile is a parsed Dockerfile: the ARGs before FROM, and the instructions from FROM on.
type Dockerfile struct {
	MetaArgs     []Instruction
	Instructions []Instruction // Instructions[0] is the FROM
}

// supported are the instructions Corral builds; everything else is refused by name.
var supported = map[string]bool{
	"FROM": true, "RUN": true, "COPY": true, "ADD": true, "ENV": true, "WORKDIR": true,
	"USER": true, "ARG": true, "LABEL": true, "CMD": true, "ENTRYPOINT": true, "EXPOSE": true,
}

// known are the Dockerfile instructions Corral does not build, so the answer can say "not
// supported" rather than "unknown".
var known = map[string]string{
	"HEALTHCHECK": "health checks are not part of a Corral environment",
	"ONBUILD":     "triggers for later builds are not supported",
	"SHELL":       "the shell of RUN is /bin/sh -c; use the exec form RUN [\"bash\", \"-c\", \"...\"]",
	"VOLUME":      "use Corral volumes (corral create --volume) instead",
	"STOPSIGNAL":  "sandboxes are stopped by Corral, not by a signal the image names",
	"MAINTAINER":  "use LABEL maintainer=...",
}

// Parse reads a Dockerfile. Errors are ErrInvalid naming the line, so a bad file is refused
// before anything is made.
func Parse(text string) (*Dockerfile, error) {
	if len(text) > MaxDockerfileBytes {
		return nil, errdefs.Invalid("dockerfile", "larger than %d bytes", MaxDockerfileBytes)
	}
	if strings.IndexByte(text, 0) >= 0 {
		return nil, errdefs.Invalid("dockerfile", "contains a NUL byte")
	}
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	df := &Dockerfile{}
	for i := 0; i < len(lines); i++ {
		start := i + 1
		line := strings.TrimSpace(lines[i])
		if line == "" || line[0] == '#' {
			continue
		}
		// Continuations: a line ending in a backslash goes on; comment lines and empty lines
		// inside the continuation are skipped, as Docker does.
		var b strings.Builder
		for {
			cont := strings.HasSuffix(line, "\\") && !strings.HasSuffix(line, "\\\\")
			if cont {
				line = strings.TrimRight(strings.TrimSuffix(line, "\\"), " \t")
			}
			b.WriteString(line)
			if !cont {
				break
			}
			for i++; i < len(lines); i++ {
				next := strings.TrimSpace(lines[i])
				if next != "" && next[0] != '#' {
					break
				}
			}
			if i >= len(lines) {
				break
			}
			b.WriteByte(' ')
			line = strings.TrimSpace(lines[i])
		}
		in, err := parseInstruction(start, b.String())
		if err != nil {
			return nil, err
		}
		if len(df.MetaArgs)+len(df.Instructions) >= maxInstructions {
			return nil, errdefs.Invalid("dockerfile", "more than %d instructions", maxInstructions)
		}
		switch {
		case len(df.Instructions) == 0 && in.Cmd == "ARG":
			df.MetaArgs = append(df.MetaArgs, in)
		case len(df.Instructions) == 0 && in.Cmd != "FROM":
			return nil, lineErr(start, "%s before FROM: a Dockerfile starts with FROM (only ARG may come before it)", in.Cmd)
		case len(df.Instructions) > 0 && in.Cmd == "FROM":
			return nil, lineErr(start, "a second FROM: multi-stage builds are not supported; build one stage per environment")
		default:
			df.Instructions = append(df.Instructions, in)
		}
	}
	if len(df.Instructions) == 0 {
		return nil, errdefs.Invalid("dockerfile", "no FROM instruction")
	}
	return df, nil
}

func lineErr(line int, format string, args ...any) error {
	return errdefs.Invalid("dockerfile", "line %d: %s", line, fmt.Sprintf(format, args...))
}

// parseInstruction splits one logical line into its instruction, flags and arguments.
func parseInstruction(line int, s string) (Instruction, error) {
	word, rest, _ := strings.Cut(s, " ")
	if i := strings.IndexByte(word, '\t'); i >= 0 {
		word, rest = word[:i], word[i+1:]+" "+rest
	}
	in := Instruction{Line: line, Cmd: strings.ToUpper(word)}
	if !supported[in.Cmd] {
		if why, ok := known[in.Cmd]; ok {
			return in, lineErr(line, "%s is not supported: %s", in.Cmd, why)
		}
		return in, lineErr(line, "unknown instruction %q", word)
	}
	rest = strings.TrimSpace(rest)
	for strings.HasPrefix(rest, "--") {
		flag, after, _ := strings.Cut(rest, " ")
		in.Flags = append(in.Flags, flag)
		rest = strings.TrimSpace(after)
	}
	in.Args = rest
	if strings.Contains(rest, "<<") && (in.Cmd == "RUN" || in.Cmd == "COPY" || in.Cmd == "ADD") && heredoc(rest) {
		return in, lineErr(line, "heredocs (<<EOF) are not supported; write the file with COPY or the script on one RUN line")
	}
	switch in.Cmd {
	case "RUN", "CMD", "ENTRYPOINT":
		if strings.HasPrefix(rest, "[") {
			var argv []string
			if err := json.Unmarshal([]byte(rest), &argv); err == nil {
				if argv == nil {
					argv = []string{}
				}
				in.JSON = argv
			}
			// Not a JSON string array: the shell form, as Docker treats it.
		}
		if in.Cmd == "RUN" && in.JSON == nil && rest == "" {
			return in, lineErr(line, "RUN needs a command")
		}
		if in.Cmd == "RUN" && in.JSON != nil && len(in.JSON) == 0 {
			return in, lineErr(line, "RUN needs a command")
		}
	case "FROM", "COPY", "ADD", "WORKDIR", "USER", "ARG", "ENV", "LABEL":
		if rest == "" {
			return in, lineErr(line, "%s needs an argument", in.Cmd)
		}
	}
	return in, nil
}

// heredoc reports whether s uses a heredoc (<<WORD or <<-WORD at the start of a word).
func heredoc(s string) bool {
	for i := 0; i+2 < len(s); i++ {
		if s[i] == '<' && s[i+1] == '<' && (i == 0 || s[i-1] == ' ') {
			j := i + 2
			if j < len(s) && s[j] == '-' {
				j++
			}
			if j < len(s) && (s[j] == '"' || s[j] == '\'' || s[j] == '_' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= 'a' && s[j] <= 'z') {
				return true
			}
		}
	}
	return false
}

// Expand replaces $X, ${X}, ${X:-default}, ${X-default}, ${X:+alt} and ${X+alt} in s with
// values from lookup; \$ is a literal dollar. An unset variable expands to nothing.
func Expand(s string, lookup func(string) (string, bool)) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if c != '$' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		if s[i+1] == '{' {
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 {
				return "", fmt.Errorf("unterminated ${ in %q", s)
			}
			inner := s[i+2 : i+2+end]
			i += 2 + end
			v, err := expandBraced(inner, lookup)
			if err != nil {
				return "", err
			}
			b.WriteString(v)
			continue
		}
		j := i + 1
		for j < len(s) && isNameByte(s[j], j == i+1) {
			j++
		}
		if j == i+1 {
			b.WriteByte('$')
			continue
		}
		v, _ := lookup(s[i+1 : j])
		b.WriteString(v)
		i = j - 1
	}
	return b.String(), nil
}

func isNameByte(c byte, first bool) bool {
	return c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || !first && c >= '0' && c <= '9'
}

func validName(n string) bool {
	if n == "" {
		return false
	}
	for i := 0; i < len(n); i++ {
		if !isNameByte(n[i], i == 0) {
			return false
		}
	}
	return true
}

func expandBraced(inner string, lookup func(string) (string, bool)) (string, error) {
	n := 0
	for n < len(inner) && isNameByte(inner[n], n == 0) {
		n++
	}
	name, op := inner[:n], inner[n:]
	if name == "" {
		return "", fmt.Errorf("${%s}: not a variable name", inner)
	}
	v, set := lookup(name)
	switch {
	case op == "":
		return v, nil
	case strings.HasPrefix(op, ":-"):
		if v == "" {
			return Expand(op[2:], lookup)
		}
		return v, nil
	case strings.HasPrefix(op, "-"):
		if !set {
			return Expand(op[1:], lookup)
		}
		return v, nil
	case strings.HasPrefix(op, ":+"):
		if v != "" {
			return Expand(op[2:], lookup)
		}
		return "", nil
	case strings.HasPrefix(op, "+"):
		if set {
			return Expand(op[1:], lookup)
		}
		return "", nil
	}
	return "", fmt.Errorf("${%s}: unsupported modifier %q (supported: :- - :+ +)", inner, op)
}

// Words splits s into words as Docker does for ENV, LABEL and ARG: spaces separate, double and
// single quotes group (and are removed), a backslash escapes the next character outside single
// quotes.
func Words(s string) ([]string, error) {
	var out []string
	var b strings.Builder
	in := false
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == 0 && (c == ' ' || c == '\t'):
			if in {
				out = append(out, b.String())
				b.Reset()
				in = false
			}
		case quote == 0 && (c == '"' || c == '\''):
			quote, in = c, true
		case quote != 0 && c == quote:
			quote = 0
		case c == '\\' && quote != '\'' && i+1 < len(s):
			i++
			b.WriteByte(s[i])
			in = true
		default:
			b.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote in %q", quote, s)
	}
	if in {
		out = append(out, b.String())
	}
	return out, nil
}

// KeyValues parses the arguments of ENV or LABEL: KEY=VALUE pairs, or ENV's legacy form
// "KEY VALUE..." (legacy). Values are expanded with lookup; for ENV each pair is visible to the
// pairs after it on the line only through the caller's next instruction, as in Docker.
func KeyValues(args string, legacy bool, lookup func(string) (string, bool)) ([][2]string, error) {
	first, rest, _ := strings.Cut(strings.TrimSpace(args), " ")
	if legacy && !strings.Contains(first, "=") {
		v, err := Expand(strings.TrimSpace(rest), lookup)
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(rest) == "" {
			return nil, fmt.Errorf("%s has no value (want KEY=VALUE)", first)
		}
		return [][2]string{{first, v}}, nil
	}
	words, err := Words(args)
	if err != nil {
		return nil, err
	}
	var out [][2]string
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not KEY=VALUE", w)
		}
		// Quotes were removed by Words; expansion works on the unquoted value (single-quoted
		// values are expanded too: a known simplification).
		ev, err := Expand(v, lookup)
		if err != nil {
			return nil, err
		}
		out = append(out, [2]string{k, ev})
	}
	return out, nil
}
