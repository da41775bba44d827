package e2b

// The translation of an E2B template build's steps into a Dockerfile of Corral's builder
// (internal/build), and of its base into a FROM reference: pure functions, no I/O.

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// imageLayerRef maps an image reference onto the layer NAME:TAG it would be imported as:
// Docker Hub's own prefixes dropped, ":latest" when no tag. A reference naming another registry,
// a digest, or a name with a '/' is refused: Corral reaches no registry, and a layer name has no
// '/'.
func imageLayerRef(img string) (string, error) {
	ref := img
	if strings.Contains(ref, "@") {
		return "", fmt.Errorf("%q: digests are not supported: import the image as a layer (corral layer import) and name it NAME:TAG", img)
	}
	if host, rest, ok := strings.Cut(ref, "/"); ok && (strings.ContainsAny(host, ".:") || host == "localhost") {
		switch host {
		case "docker.io", "index.docker.io", "registry-1.docker.io":
			ref = rest
		default:
			return "", fmt.Errorf("%q names registry %s: Corral pulls from no registry; import the image as a layer (corral layer import) and name it NAME:TAG", img, host)
		}
	}
	ref = strings.TrimPrefix(ref, "library/")
	name, tag, ok := strings.Cut(ref, ":")
	if !ok {
		tag = "latest"
	}
	if !templateNameRE.MatchString(name) || !layerVersionRE.MatchString(tag) {
		return "", fmt.Errorf("%q: Corral pulls from no registry and this is no layer name (lowercase letters, digits, '.', '_', '-'; no '/'): import the image as a layer (corral layer import) and name it NAME:TAG", img)
	}
	return name + ":" + tag, nil
}

var layerVersionRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,126}$`)

// templatePlan is a translated build.
type templatePlan struct {
	dockerfile string
	hashes     []uploadRef // the uploads the context is made of, in order, each once
	stepOf     []string    // E2B step name of Corral step N (the Dockerfile's line N) at N-1
	noCache    bool
}

type uploadRef struct {
	hash  string
	field string // the step that names it first, for errors
}

// planTemplate translates the steps of a build into a Dockerfile FROM from, one line per
// step:
//
//	RUN  [cmd, user?]            RUN ["/bin/sh","-c",cmd]; with a user other than the current
//	                             one, between USER user and USER <the current one>
//	COPY [src, dest, user?, mode?]  COPY --chown=user --chmod=mode ["src","dest"]; src relative,
//	                             inside the context (the uploads)
//	ENV  [k1, v1, k2, v2, ...]   ENV k1="v1" k2="v2"
//	WORKDIR [path]               WORKDIR path
//	USER [user]                  USER user
//
// The current user starts as baseUser (the base's; "root" when it names none). force on the
// build or any step is a build without the cache (Corral cannot skip the cache from one step
// on). Line N is Corral's step N; stepOf maps it back to E2B's step: "base" for FROM, the
// step's index from 1 otherwise (the SDK's stack traces are indexed so).
func planTemplate(in templateStart, from, baseUser string) (*templatePlan, error) {
	p := &templatePlan{noCache: in.Force != nil && *in.Force}
	var df strings.Builder
	line := func(step string, format string, args ...any) {
		fmt.Fprintf(&df, format+"\n", args...)
		p.stepOf = append(p.stepOf, step)
	}
	line("base", "FROM %s", from)
	user := baseUser
	if user == "" {
		user = "root"
	}
	seen := map[string]bool{}
	for i, s := range in.Steps {
		field := fmt.Sprintf("steps[%d]", i)
		step := strconv.Itoa(i + 1)
		p.noCache = p.noCache || s.Force
		if s.FilesHash != "" && s.Type != "COPY" {
			return nil, invalid(field+".filesHash", "only COPY steps carry files")
		}
		for j, a := range s.Args {
			if strings.IndexByte(a, 0) >= 0 {
				return nil, invalid(fmt.Sprintf("%s.args[%d]", field, j), "contains NUL")
			}
		}
		oneLine := func(j int) error {
			if strings.ContainsAny(s.Args[j], "\r\n") {
				return invalid(fmt.Sprintf("%s.args[%d]", field, j), "%s takes no line breaks", s.Type)
			}
			return nil
		}
		switch s.Type {
		case "RUN":
			if len(s.Args) < 1 || len(s.Args) > 2 || strings.TrimSpace(s.Args[0]) == "" {
				return nil, invalid(field+".args", "RUN takes [command] or [command, user]")
			}
			cmd, _ := json.Marshal([]string{"/bin/sh", "-c", s.Args[0]})
			if len(s.Args) == 2 && s.Args[1] != "" && s.Args[1] != user {
				if err := checkUser(field+".args[1]", s.Args[1]); err != nil {
					return nil, err
				}
				line(step, "USER %s", s.Args[1])
				line(step, "RUN %s", cmd)
				line(step, "USER %s", user)
				continue
			}
			line(step, "RUN %s", cmd)
		case "COPY":
			if len(s.Args) < 2 || len(s.Args) > 4 {
				return nil, invalid(field+".args", "COPY takes [src, dest, user?, mode?]")
			}
			src, dest := s.Args[0], s.Args[1]
			if err := checkCopySource(src); err != nil {
				return nil, invalid(field+".args[0]", "%v", err)
			}
			if strings.TrimSpace(dest) == "" {
				return nil, invalid(field+".args[1]", "the destination is required")
			}
			if !filesHashRE.MatchString(s.FilesHash) {
				return nil, invalid(field+".filesHash", "%q: want the SDK's files hash, 64 lowercase hex digits", s.FilesHash)
			}
			if !seen[s.FilesHash] {
				seen[s.FilesHash] = true
				p.hashes = append(p.hashes, uploadRef{hash: s.FilesHash, field: field + ".filesHash"})
			}
			var flags string
			if len(s.Args) > 2 && s.Args[2] != "" {
				if err := checkUser(field+".args[2]", s.Args[2]); err != nil {
					return nil, err
				}
				flags += " --chown=" + s.Args[2]
			}
			if len(s.Args) > 3 && s.Args[3] != "" {
				if m, err := strconv.ParseUint(s.Args[3], 8, 32); err != nil || m > 0o7777 {
					return nil, invalid(field+".args[3]", "%q is not an octal mode", s.Args[3])
				}
				flags += " --chmod=" + s.Args[3]
			}
			words, _ := json.Marshal([]string{src, dest})
			line(step, "COPY%s %s", flags, words)
		case "ENV":
			if len(s.Args) == 0 || len(s.Args)%2 != 0 {
				return nil, invalid(field+".args", "ENV takes [name, value, ...] pairs")
			}
			var kv []string
			for j := 0; j < len(s.Args); j += 2 {
				if !envKeyRE.MatchString(s.Args[j]) {
					return nil, invalid(fmt.Sprintf("%s.args[%d]", field, j), "%q is not a variable name", s.Args[j])
				}
				if err := oneLine(j + 1); err != nil {
					return nil, err
				}
				kv = append(kv, s.Args[j]+"="+quoteWord(s.Args[j+1]))
			}
			line(step, "ENV %s", strings.Join(kv, " "))
		case "WORKDIR":
			if len(s.Args) != 1 || strings.TrimSpace(s.Args[0]) == "" {
				return nil, invalid(field+".args", "WORKDIR takes [path]")
			}
			if err := oneLine(0); err != nil {
				return nil, err
			}
			if strings.HasSuffix(strings.TrimSpace(s.Args[0]), `\`) {
				// A Dockerfile line ending in a backslash goes on to the next.
				return nil, invalid(field+".args[0]", "%q: a working directory may not end in a backslash", s.Args[0])
			}
			line(step, "WORKDIR %s", strings.TrimSpace(s.Args[0]))
		case "USER":
			if len(s.Args) != 1 {
				return nil, invalid(field+".args", "USER takes [user]")
			}
			if err := checkUser(field+".args[0]", s.Args[0]); err != nil {
				return nil, err
			}
			user = s.Args[0]
			line(step, "USER %s", user)
		default:
			return nil, invalid(field+".type", "%q is not a step Corral builds (RUN, COPY, ENV, WORKDIR, USER)", s.Type)
		}
	}
	p.dockerfile = df.String()
	return p, nil
}

// userRE is Corral's rule for USER and --chown (internal/build).
var userRE = regexp.MustCompile(`^([a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10}(:[0-9]{1,10})?)$`)

func checkUser(field, u string) error {
	if !userRE.MatchString(u) {
		return invalid(field, "%q is not a user name or uid[:gid]", u)
	}
	return nil
}

// checkCopySource refuses a COPY source outside the context: absolute, with "..", or with NUL.
func checkCopySource(src string) error {
	switch {
	case strings.TrimSpace(src) == "":
		return errors.New("the source is required")
	case path.IsAbs(src):
		return fmt.Errorf("%q: absolute: a source is relative to the template's file context", src)
	}
	for _, part := range strings.Split(src, "/") {
		if part == ".." {
			return fmt.Errorf("%q escapes the template's file context", src)
		}
	}
	return nil
}

// quoteWord quotes s as one word of a Dockerfile ENV (build.Words): double quotes, with '"'
// and '\' escaped. '$' stays: values expand as in a Dockerfile.
func quoteWord(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
