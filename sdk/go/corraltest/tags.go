package corraltest

import (
	"net/http"
	"regexp"
	"slices"
	"strings"

	corral "github.com/corral-dev/corral/sdk/go"
)

// layerVerRE is the real server's rule for layer versions and tags.
var layerVerRE = regexp.MustCompile(`^[A-Za-z0-9_]([A-Za-z0-9._-]{0,126})$`)

// resolveLocked turns a reference NAME:VERSION or NAME:TAG into the NAME:VERSION it names, and
// reports whether that version is published.
//
// Preconditions: s.mu is held.
func (s *Server) resolveLocked(ref string) (string, bool) {
	if _, ok := s.layers[ref]; ok {
		return ref, true
	}
	name, tag, _ := strings.Cut(ref, ":")
	if v, ok := s.tags[name][tag]; ok {
		return name + ":" + v, true
	}
	return ref, false
}

// layerViewLocked is a layer as the API shows it, with the tags that point at it now.
//
// Preconditions: s.mu is held.
func (s *Server) layerViewLocked(l *layer) corral.Layer {
	v := l.info
	v.Tags = nil
	for tag, version := range s.tags[v.Name] {
		if version == v.Version {
			v.Tags = append(v.Tags, tag)
		}
	}
	slices.Sort(v.Tags)
	return v
}

func (s *Server) tagLayer(w http.ResponseWriter, r *http.Request) {
	var req corral.TagRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	name, tag := r.PathValue("name"), r.PathValue("tag")
	switch {
	case !envNameRE.MatchString(name):
		fail(w, invalid("tag", "layer name %q must be lowercase letters, digits, '.', '_' or '-' (at most 128)", name))
		return
	case !layerVerRE.MatchString(tag):
		fail(w, invalid("tag", "layer version %q must be letters, digits, '.', '_' or '-' (at most 128)", tag))
		return
	case !layerVerRE.MatchString(req.Version):
		fail(w, invalid("version", "layer version %q must be letters, digits, '.', '_' or '-' (at most 128)", req.Version))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.layers[name+":"+req.Version]
	if !ok {
		fail(w, notFound("layer %s:%s not found", name, req.Version))
		return
	}
	if e := s.allowLocked(r, corral.PermLayerPublish, s.callerProjectLocked(r)); e != nil {
		refuse(w, e)
		return
	}
	if s.tags[name] == nil {
		s.tags[name] = map[string]string{}
	}
	s.tags[name][tag] = req.Version
	s.auditLocked(r, "layer.tag", s.callerProjectLocked(r), name+":"+tag, req.Version)
	writeJSON(w, http.StatusOK, s.layerViewLocked(l))
}

func (s *Server) deleteTag(w http.ResponseWriter, r *http.Request) {
	name, tag := r.PathValue("name"), r.PathValue("tag")
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tags[name][tag]; !ok {
		fail(w, notFound("tag %s:%s not found", name, tag))
		return
	}
	if e := s.allowLocked(r, corral.PermLayerPublish, s.callerProjectLocked(r)); e != nil {
		refuse(w, e)
		return
	}
	delete(s.tags[name], tag)
	s.auditLocked(r, "layer.untag", s.callerProjectLocked(r), name+":"+tag, "")
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) deleteLayer(w http.ResponseWriter, r *http.Request) {
	name, version := r.PathValue("name"), r.PathValue("version")
	key := name + ":" + version
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.layers[key]
	if !ok {
		fail(w, notFound("layer %s not found", key))
		return
	}
	if e := s.allowLocked(r, corral.PermLayerPublish, s.callerProjectLocked(r)); e != nil {
		refuse(w, e)
		return
	}
	// As on the real server: a version a tag or a saved environment refers to stays.
	for tag, v := range s.tags[name] {
		if v == version {
			fail(w, conflict("layer %s is tagged %s:%s; move or delete the tag first", key, name, tag))
			return
		}
	}
	for _, env := range s.environments {
		if env.Base == key || env.Workspace == key || slices.Contains(env.Toolkits, key) {
			fail(w, conflict("layer %s is used by environment %s; delete it first", key, env.Name))
			return
		}
	}
	view := s.layerViewLocked(l)
	delete(s.layers, key)
	s.layerOrder = slicesDelete(s.layerOrder, key)
	s.auditLocked(r, "layer.delete", s.callerProjectLocked(r), key, "")
	writeJSON(w, http.StatusOK, view)
}
