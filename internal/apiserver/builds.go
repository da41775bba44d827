package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"

	"github.com/corral-dev/corral/internal/build"
	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
)

// Builds: Dockerfiles built into environments by internal/build on this process's edge.

var _ build.Backend = (*edge.Edge)(nil)

// SetBuilds enables the build routes: jobs run builds, spool is the directory build contexts
// are spooled to.
func (s *Server) SetBuilds(jobs *build.Jobs, spool string) {
	s.builds, s.buildSpool = jobs, spool
}

// maxContextBytes bounds an uploaded build context; maxContextEntries its entries.
const (
	maxContextBytes   = build.DefaultMaxContextBytes
	maxContextEntries = build.DefaultMaxContextEntries
)

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	if s.builds == nil {
		s.fail(w, r, errdefs.Unavailable("builds run on a node's corral up, not on a cluster server yet"))
		return
	}
	if s.edge != nil {
		// Refused before the body is read: a cluster's replica, which asked for a 100-continue,
		// sends it to another node.
		if err := s.edge.BuildRoom(); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	var req model.BuildRequest
	rest, err := httpjson.DecodeStream(http.MaxBytesReader(w, r.Body, maxContextBytes+httpjson.MaxBody+1024), &req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	project, err := c.project("project", req.Project)
	if err == nil {
		// A build makes sandboxes, publishes layers and saves an environment in the project.
		err = c.require(iam.LayerPublish|iam.SandboxAdmin, project)
	}
	if err != nil {
		s.audit(r, "build.start", project, req.Name, err, "")
		s.fail(w, r, err)
		return
	}
	bctx := build.EmptyContext()
	br := bufio.NewReader(rest)
	if _, perr := br.Peek(1); perr == nil {
		if err := os.MkdirAll(s.buildSpool, 0o700); err != nil {
			s.fail(w, r, err)
			return
		}
		bctx, err = build.ReadContext(br, s.buildSpool, maxContextBytes, maxContextEntries)
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				err = errdefs.Invalid("context", "larger than %d bytes", maxContextBytes)
			}
			s.audit(r, "build.start", project, req.Name, err, "")
			s.fail(w, r, err)
			return
		}
	} else if perr != io.EOF {
		s.fail(w, r, perr)
		return
	}
	checked, err := s.builds.Check(r.Context(), buildSpec(req), project, bctx)
	if err != nil {
		bctx.Close()
		s.audit(r, "build.start", project, req.Name, err, "")
		s.fail(w, r, err)
		return
	}
	if v := nodeproto.VoucherFrom(r.Context()); v != nil {
		checked.Bind = func(ctx context.Context) context.Context { return nodeproto.WithVoucher(ctx, v) }
	}
	job := s.builds.Start(checked, iam.Display(project))
	b := job.Snapshot()
	s.audit(r, "build.start", project, req.Name, nil, b.ID)
	httpjson.Write(w, http.StatusCreated, apiBuild(b))
}

// onBuild resolves to the project of the build in the path.
func (s *Server) onBuild(r *http.Request) (string, string, error) {
	id := r.PathValue("id")
	if s.builds == nil {
		return "", id, errdefs.NotFound("build %s", id)
	}
	job, ok := s.builds.Get(id)
	if !ok {
		return "", id, errdefs.NotFound("build %s", id)
	}
	p, err := iam.ParsePath("project", job.Snapshot().Project)
	return p, id, err
}

func (s *Server) getBuild(w http.ResponseWriter, r *http.Request) {
	job, _ := s.builds.Get(r.PathValue("id"))
	httpjson.Write(w, http.StatusOK, apiBuild(job.Snapshot()))
}

func (s *Server) listBuilds(w http.ResponseWriter, r *http.Request) {
	out := []model.Build{}
	if s.builds != nil {
		c := who(r)
		for _, job := range s.builds.List() {
			b := job.Snapshot()
			if c.canRead(iam.LayerRead, b.Project, false) {
				out = append(out, apiBuild(b))
			}
		}
	}
	httpjson.Write(w, http.StatusOK, out)
}

// buildLogs streams a build's events as NDJSON; with follow=true until the build ends.
func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request) {
	job, _ := s.builds.Get(r.PathValue("id"))
	follow, err := queryBool(r.URL.Query(), "follow")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	flusher, _ := w.(http.Flusher)
	next := 0
	for {
		evs, n, done, changed := job.Events(next)
		for _, ev := range evs {
			if err := enc.Encode(apiBuildEvent(ev)); err != nil {
				return
			}
		}
		next = n
		if flusher != nil {
			flusher.Flush()
		}
		if done || !follow {
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

func (s *Server) cancelBuild(w http.ResponseWriter, r *http.Request) {
	job, _ := s.builds.Get(r.PathValue("id"))
	job.Cancel()
	httpjson.Write(w, http.StatusOK, apiBuild(job.Snapshot()))
}
