package corraltest

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// fork serves POST /v1/sandboxes/{id}/fork as Corral does, as far as a fake can: count copies
// (1 when absent, 0 or over corral.MaxForkCount refused) of a running sandbox, all or nothing
// under the project's quota, each with the source's files (a deep copy) and forked_from. The
// fake has no processes to carry: its commands are not copied. As on Corral, a runc sandbox
// forks only with disk_only (create with runtime "gvisor" for the other kind).
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Count    *int              `json:"count"`
		Labels   map[string]string `json:"labels"`
		DiskOnly bool              `json:"disk_only"`
		TTL      string            `json:"ttl"`
	}
	if err := decodeBody(r, &body); err != nil {
		fail(w, err)
		return
	}
	n := 1
	if body.Count != nil {
		n = *body.Count
	}
	if n < 1 || n > corral.MaxForkCount {
		fail(w, invalid("count", "%d: want 1 to %d copies", n, corral.MaxForkCount))
		return
	}
	var ttl time.Duration
	if body.TTL != "" {
		var err error
		if ttl, err = time.ParseDuration(body.TTL); err != nil || ttl <= 0 {
			fail(w, invalid("ttl", "ttl %q is not a positive Go duration", body.TTL))
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	src, herr := s.lookupLocked(r)
	if herr != nil {
		fail(w, herr)
		return
	}
	if e := s.allowLocked(r, corral.PermSandboxCreate, src.spec.Project); e != nil {
		refuse(w, e)
		return
	}
	if src.state != corral.StateRunning {
		fail(w, conflict("sandbox %s is %s: only a running sandbox can be forked", src.spec.ID, src.state))
		return
	}
	if src.spec.Runtime == "runc" && !body.DiskOnly {
		fail(w, conflict("sandbox %s runs on runc, whose processes cannot be checkpointed: fork it with disk_only", src.spec.ID))
		return
	}
	now := timeNow()
	var made []*sandbox
	for range n {
		if e := s.admitLocked(src.spec.Project, src.spec.Limits, src.spec.Tier); e != nil {
			for _, c := range made { // all or nothing
				delete(s.sandboxes, c.spec.ID)
				s.sbOrder = s.sbOrder[:len(s.sbOrder)-1]
				c.cancel()
			}
			refuse(w, e)
			return
		}
		s.nextSandbox++
		id := "sb-" + strconv.Itoa(s.nextSandbox)
		c := &sandbox{spec: src.spec, state: corral.StateRunning, files: map[string]*node{}, cmds: map[string]*command{}}
		c.spec.ID, c.spec.ForkedFrom, c.spec.CreatedAt, c.spec.LastActivityAt = id, src.spec.ID, now, now
		c.spec.EndedAt = time.Time{}
		c.spec.Labels = maps.Clone(src.spec.Labels)
		if len(body.Labels) > 0 && c.spec.Labels == nil {
			c.spec.Labels = map[string]string{}
		}
		maps.Copy(c.spec.Labels, body.Labels)
		c.spec.Env, c.spec.Toolkits = slices.Clone(src.spec.Env), slices.Clone(src.spec.Toolkits)
		if ttl > 0 {
			c.spec.ExpiresAt = now.Add(ttl)
		}
		for p, nd := range src.files {
			cp := *nd
			cp.data = slices.Clone(nd.data)
			c.files[p] = &cp
		}
		c.ctx, c.cancel = context.WithCancel(s.ctx)
		s.sandboxes[id] = c
		s.sbOrder = append(s.sbOrder, id)
		made = append(made, c)
	}
	out := corral.ForkResult{Sandboxes: make([]corral.Sandbox, len(made))}
	for i, c := range made {
		out.Sandboxes[i] = c.view()
		s.auditLocked(r, "sandbox.fork", c.spec.Project, c.spec.ID, "")
	}
	writeJSON(w, http.StatusCreated, out)
}
