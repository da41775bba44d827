package corraltest

import (
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"slices"

	corral "github.com/corral-dev/corral/sdk/go"
)

// envNameRE is the real server's rule for environment (and layer) names.
var envNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?$`)

// checkLayerLocked checks that *ref names a published layer of kind, as the request's field, and
// replaces a tag in it by the version it points at. Like the real server's, a missing layer
// named in a body is invalid input (400), not a missing URL (404).
//
// Preconditions: s.mu is held.
func (s *Server) checkLayerLocked(field string, ref *string, kind string) *httpError {
	key, ok := s.resolveLocked(*ref)
	if !ok {
		return invalid(field, "layer %s is not published (see `corral layer ls`)", *ref)
	}
	l := s.layers[key]
	if l.info.Kind != kind {
		return invalid(field, "layer %s is a %s layer, not a %s layer", *ref, l.info.Kind, kind)
	}
	*ref = key
	return nil
}

// checkLayersLocked checks the layers of a sandbox or an environment, replacing tags by the
// versions they point at.
//
// Preconditions: s.mu is held.
func (s *Server) checkLayersLocked(base, workspace *string, toolkits []string) *httpError {
	if *base == "" {
		return invalid("base", "a base layer is required (NAME:VERSION)")
	}
	if err := s.checkLayerLocked("base", base, corral.KindBase); err != nil {
		return err
	}
	if *workspace != "" {
		if err := s.checkLayerLocked("workspace", workspace, corral.KindWorkspace); err != nil {
			return err
		}
	}
	for i := range toolkits {
		if err := s.checkLayerLocked(fmt.Sprintf("toolkits[%d]", i), &toolkits[i], corral.KindToolkit); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) saveEnvironment(w http.ResponseWriter, r *http.Request) {
	var env corral.Environment
	if err := decodeBody(r, &env); err != nil {
		fail(w, err)
		return
	}
	if !env.CreatedAt.IsZero() {
		fail(w, invalid("created_at", "is set by the server"))
		return
	}
	if !envNameRE.MatchString(env.Name) {
		fail(w, invalid("name", "environment name %q must be lowercase letters, digits, '.', '_' or '-' (at most 128)", env.Name))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if env.Project == "" {
		env.Project = s.callerProjectLocked(r)
	}
	project, perr := projectArg("project", env.Project)
	if perr != nil {
		fail(w, perr)
		return
	}
	if e := s.allowLocked(r, corral.PermLayerPublish, project); e != nil {
		refuse(w, e)
		return
	}
	env.Toolkits = slices.Clone(env.Toolkits)
	if err := s.checkLayersLocked(&env.Base, &env.Workspace, env.Toolkits); err != nil {
		fail(w, err)
		return
	}
	if old, ok := s.environments[env.Name]; ok {
		// As on the real server: saving the same composition again is idempotent (and sets the
		// pool size); another composition under the name is a conflict.
		same := old.Base == env.Base && old.Workspace == env.Workspace && slices.Equal(old.Toolkits, env.Toolkits) &&
			old.MicroVMTemplate == env.MicroVMTemplate && old.Tier == env.Tier && old.Runtime == env.Runtime && reflect.DeepEqual(old.Network, env.Network)
		if !same || old.Project != project {
			fail(w, conflict("environment %s exists with another composition; delete it first or use another name", env.Name))
			return
		}
		old.Warm = env.Warm
		writeJSON(w, http.StatusOK, old)
		return
	}
	env.Project = project
	env.CreatedAt = timeNow()
	s.environments[env.Name] = &env
	s.envOrder = append(s.envOrder, env.Name)
	s.auditLocked(r, "environment.save", project, env.Name, "")
	writeJSON(w, http.StatusOK, env)
}

func (s *Server) listEnvironments(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []corral.Environment{}
	for _, name := range s.envOrder {
		out = append(out, *s.environments[name])
	}
	writeJSON(w, http.StatusOK, out)
}

// environmentLocked returns the environment named by the request's {name}.
//
// Preconditions: s.mu is held.
func (s *Server) environmentLocked(r *http.Request) (*corral.Environment, *httpError) {
	name := r.PathValue("name")
	env, ok := s.environments[name]
	if !ok {
		return nil, notFound("environment %q not found", name)
	}
	return env, nil
}

func (s *Server) getEnvironment(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	env, err := s.environmentLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, env)
}

func (s *Server) deleteEnvironment(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	env, err := s.environmentLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	if e := s.allowLocked(r, corral.PermLayerPublish, env.Project); e != nil {
		refuse(w, e)
		return
	}
	delete(s.environments, env.Name)
	s.envOrder = slicesDelete(s.envOrder, env.Name)
	s.auditLocked(r, "environment.delete", env.Project, env.Name, "")
	w.WriteHeader(http.StatusNoContent)
}

func slicesDelete(list []string, v string) []string {
	out := list[:0]
	for _, x := range list {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}
