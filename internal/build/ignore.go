package build

import (
	"path"
	"regexp"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// maxIgnorePatterns bounds a .dockerignore.
const maxIgnorePatterns = 10_000

// Ignore is a parsed .dockerignore: patterns in order, the last one matching a path decides,
// "!" patterns re-include. A pattern that matches a directory matches everything below it.
// "**" matches any number of directories, "*" and "?" do not cross a "/".
type Ignore struct {
	rules []ignoreRule
}

type ignoreRule struct {
	re     *regexp.Regexp
	negate bool
}

// ParseIgnore parses the text of a .dockerignore.
func ParseIgnore(text string) (*Ignore, error) {
	ig := &Ignore{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		negate := false
		if strings.HasPrefix(line, "!") {
			negate, line = true, strings.TrimSpace(line[1:])
		}
		line = strings.TrimPrefix(path.Clean("/"+line), "/")
		if line == "" {
			line = "."
		}
		re, err := globRegexp(line)
		if err != nil {
			return nil, errdefs.Invalid("context", ".dockerignore pattern %q: %v", line, err)
		}
		if len(ig.rules) >= maxIgnorePatterns {
			return nil, errdefs.Invalid("context", ".dockerignore has more than %d patterns", maxIgnorePatterns)
		}
		ig.rules = append(ig.rules, ignoreRule{re: re, negate: negate})
	}
	return ig, nil
}

// Excludes reports whether name (clean, relative) is left out of the context. The Dockerfile
// and .dockerignore themselves are never needed by COPY, but are excluded only if listed.
func (ig *Ignore) Excludes(name string) bool {
	if ig == nil {
		return false
	}
	excluded := false
	for _, r := range ig.rules {
		if r.negate == !excluded {
			continue // cannot change the answer
		}
		if matchSelfOrParent(r.re, name) {
			excluded = !r.negate
		}
	}
	return excluded
}

func matchSelfOrParent(re *regexp.Regexp, name string) bool {
	for {
		if re.MatchString(name) {
			return true
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return false
		}
		name = name[:i]
	}
}

// globRegexp turns a .dockerignore pattern into an anchored regular expression.
func globRegexp(p string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '*' && i+1 < len(p) && p[i+1] == '*':
			i++
			if i+1 < len(p) && p[i+1] == '/' {
				i++
				b.WriteString("(.*/)?")
			} else {
				b.WriteString(".*")
			}
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		case c == '[':
			end := strings.IndexByte(p[i:], ']')
			if end < 0 {
				return nil, errBadClass
			}
			class := p[i+1 : i+end]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
			i += end
		case c == '\\' && i+1 < len(p):
			i++
			b.WriteString(regexp.QuoteMeta(string(p[i])))
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

var errBadClass = errorString("unterminated [ class")

type errorString string

// Error is the message.
func (e errorString) Error() string { return string(e) }

// MayReinclude reports whether some pattern re-includes ("!"), so that a walker cannot skip an
// excluded directory whole.
func (ig *Ignore) MayReinclude() bool {
	if ig == nil {
		return false
	}
	for _, r := range ig.rules {
		if r.negate {
			return true
		}
	}
	return false
}
