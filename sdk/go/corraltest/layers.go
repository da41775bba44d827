package corraltest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"

	corral "github.com/corral-dev/corral/sdk/go"
)

// layer is a published layer; the fake keeps its metadata only.
type layer struct {
	info corral.Layer
}

// AddLayer publishes an empty layer, so sandboxes can name it.
func (s *Server) AddLayer(name, version, kind string) corral.Layer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addLayerLocked(corral.Layer{Name: name, Version: version, Kind: kind}, nil)
}

// addLayerLocked records l with the digest of content.
//
// Preconditions: s.mu is held.
func (s *Server) addLayerLocked(l corral.Layer, content []byte) corral.Layer {
	sum := sha256.Sum256(content)
	l.Digest = "sha256:" + hex.EncodeToString(sum[:])
	l.Size = int64(len(content))
	l.CreatedAt = timeNow()
	key := l.Name + ":" + l.Version
	if _, ok := s.layers[key]; !ok {
		s.layerOrder = append(s.layerOrder, key)
	}
	s.layers[key] = &layer{info: l}
	return l
}

// countFiles counts the entries of a plain or gzip tar. It returns -1 for content it cannot
// read (zstd, which the fake does not decode, or not a tar).
func countFiles(content []byte) int64 {
	var r io.Reader = bytes.NewReader(content)
	if bytes.HasPrefix(content, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return -1
		}
		r = zr
	} else if bytes.HasPrefix(content, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		return 0
	}
	tr := tar.NewReader(r)
	var n int64
	for {
		_, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return n
		}
		if err != nil {
			return -1
		}
		n++
	}
}

func validName(s string) bool {
	return s != "" && !strings.ContainsAny(s, ":/ \t\n")
}

func (s *Server) importLayer(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name, version, kind := q.Get("name"), q.Get("version"), q.Get("kind")
	switch {
	case !validName(name):
		fail(w, invalid("name", "layer name %q is empty or contains ':', '/' or spaces", name))
		return
	case !validName(version):
		fail(w, invalid("version", "layer version %q is empty or contains ':', '/' or spaces", version))
		return
	case kind != corral.KindBase && kind != corral.KindWorkspace && kind != corral.KindToolkit:
		fail(w, invalid("kind", "layer kind %q is not base, workspace or toolkit", kind))
		return
	}
	content, _ := io.ReadAll(r.Body)
	files := countFiles(content)
	if files < 0 {
		fail(w, invalid("", "layer content is not a tar stream"))
		return
	}
	sum := sha256.Sum256(content)
	digest := "sha256:" + hex.EncodeToString(sum[:])

	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.layers[name+":"+version]; ok {
		if old.info.Digest != digest || old.info.Kind != kind {
			fail(w, conflict("layer %s:%s already exists with other content; publish a new version", name, version))
			return
		}
		writeJSON(w, http.StatusOK, s.layerViewLocked(old))
		return
	}
	l := s.addLayerLocked(corral.Layer{Name: name, Version: version, Kind: kind, Files: files}, content)
	writeJSON(w, http.StatusCreated, l)
}

func (s *Server) listLayers(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []corral.Layer{}
	for _, key := range s.layerOrder {
		if l := s.layers[key]; name == "" || l.info.Name == name {
			out = append(out, s.layerViewLocked(l))
		}
	}
	slices.SortStableFunc(out, func(a, b corral.Layer) int { return strings.Compare(a.Name, b.Name) })
	writeJSON(w, http.StatusOK, map[string]any{"layers": out})
}

func (s *Server) getLayer(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("name") + ":" + r.PathValue("version")
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.layers[key]
	if !ok {
		fail(w, notFound("layer %s not found", key))
		return
	}
	writeJSON(w, http.StatusOK, s.layerViewLocked(l))
}
