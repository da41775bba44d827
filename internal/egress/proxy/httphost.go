package proxy

import (
	"bytes"
	"strings"
)

// maxMethodLen bounds a request method; the longest registered ones are 17 characters.
const maxMethodLen = 24

// parseHTTPHost returns the normalized name of the host an HTTP/1.x request at the start of data is
// for: the Host header, or the host of an absolute-form or authority-form request target (RFC 9112
// section 3.2), which must then name the same host as the Host header, if any. It reads the whole
// header block, so that a second Host header is seen, and is strict where servers could read the
// request differently: lines end in CRLF, the request line has single spaces, header names are
// tokens directly followed by ':' (no obsolete line folding), and Host appears at most once.
// Malformed lines are reported as soon as they are complete, so that other protocols are
// refused without waiting for the peek timeout.
func parseHTTPHost(data []byte) (string, error) {
	var target, host string // the names from the request target and the Host header
	haveHost := false
	for first := true; ; first = false {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return "", checkPartialLine(data, first)
		}
		if i == 0 || data[i-1] != '\r' {
			return "", errMalformed
		}
		line := data[:i-1]
		data = data[i+1:]
		if bytes.IndexByte(line, '\r') >= 0 {
			return "", errMalformed
		}
		switch {
		case first:
			t, err := parseRequestLine(line)
			if err != nil {
				return "", err
			}
			target = t
		case len(line) == 0: // end of the header block
			switch {
			case target != "" && haveHost && host != target:
				return target, errHostMismatch
			case target != "":
				return target, nil
			case haveHost:
				return host, nil
			}
			return "", errNoName
		default:
			name, value, ok := bytes.Cut(line, []byte{':'})
			if !ok || !isToken(name) || !isFieldValue(value) {
				return "", errMalformed
			}
			if !strings.EqualFold(string(name), "host") {
				continue
			}
			if haveHost {
				return "", errMalformed
			}
			haveHost = true
			h, err := hostOf(string(bytes.Trim(value, " \t")))
			if err != nil {
				return "", err
			}
			host = h
		}
	}
}

// checkPartialLine judges the start of a line whose end has not arrived: errIncomplete while it
// can still become a valid line, errMalformed otherwise.
func checkPartialLine(line []byte, first bool) error {
	if i := bytes.IndexByte(line, '\r'); i >= 0 && i != len(line)-1 {
		return errMalformed
	}
	if first {
		method, _, ok := bytes.Cut(bytes.TrimSuffix(line, []byte{'\r'}), []byte{' '})
		if ok && len(method) == 0 || len(method) > maxMethodLen || len(method) > 0 && !isToken(method) {
			return errMalformed
		}
	}
	return errIncomplete
}

// parseRequestLine checks "method SP request-target SP HTTP/1.x" and returns the normalized host
// of the request target, or "" for origin-form and asterisk-form targets.
func parseRequestLine(line []byte) (string, error) {
	method, rest, ok1 := bytes.Cut(line, []byte{' '})
	target, version, ok2 := bytes.Cut(rest, []byte{' '})
	if !ok1 || !ok2 || len(method) == 0 || len(method) > maxMethodLen || !isToken(method) || len(target) == 0 {
		return "", errMalformed
	}
	if len(version) != len("HTTP/1.1") || !bytes.HasPrefix(version, []byte("HTTP/1.")) || version[7] < '0' || version[7] > '9' {
		return "", errMalformed
	}
	for _, c := range target {
		if c <= ' ' || c >= 0x7f {
			return "", errMalformed
		}
	}
	switch {
	case target[0] == '/':
		return "", nil
	case string(target) == "*":
		return "", nil
	case string(method) == "CONNECT":
		return hostOf(string(target))
	}
	// absolute-form: scheme "://" authority [path-abempty] ["?" query]
	scheme, rest2, ok := strings.Cut(string(target), "://")
	if !ok || !isScheme(scheme) {
		return "", errMalformed
	}
	authority := rest2
	if i := strings.IndexAny(rest2, "/?#"); i >= 0 {
		authority = rest2[:i]
	}
	if strings.Contains(authority, "@") { // userinfo: deprecated, and a way to confuse parsers
		return "", errMalformed
	}
	return hostOf(authority)
}

// hostOf returns the normalized name of host[:port], as in a Host header or request target.
func hostOf(hostport string) (string, error) {
	if strings.HasPrefix(hostport, "[") {
		if !strings.Contains(hostport, "]") {
			return "", errMalformed
		}
		return "", errIPLiteral
	}
	host, port, ok := strings.Cut(hostport, ":")
	if ok {
		for _, c := range []byte(port) {
			if c < '0' || c > '9' {
				return "", errMalformed
			}
		}
	}
	return normalizeName(host)
}

// isToken reports whether b is an RFC 9110 token: one or more tchars.
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isTchar(c) {
			return false
		}
	}
	return true
}

func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isFieldValue reports whether b holds no control characters but horizontal tab.
func isFieldValue(b []byte) bool {
	for _, c := range b {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// isScheme reports whether s is a URI scheme: a letter, then letters, digits, '+', '-' or '.'.
func isScheme(s string) bool {
	for i, c := range []byte(s) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}
