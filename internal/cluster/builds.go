package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/limits"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/revproxy"
)

// Builds run on the edge a replica sends their POST to, and live in its memory with their logs
// (internal/build): a build's ID names its node (build.NodeOf), so every request about one goes
// there (toBuildNode), and the list is every up edge's, asked at once and merged. The edge creates
// every RUN step's sandbox on itself, so a build is placed as its steps' sandboxes would be
// (startBuild).

const (
	// buildListTimeout bounds how long a list waits for one edge.
	buildListTimeout = 10 * time.Second
	// buildListMax bounds one edge's answer (it keeps its last 100 builds).
	buildListMax = 16 << 20
)

// startBuild answers POST /v1/builds: it places the build where its steps' sandboxes fit (a
// container of the default limits and the build's runtime, in the project's node groups) and
// sends it to that edge, body and context as they came; an edge without room is refused and
// another tried. The edge checks the request.
func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	var head bytes.Buffer // what the decoder read: sent on before the rest of the body
	dec := json.NewDecoder(io.TeeReader(io.LimitReader(r.Body, httpjson.MaxBody), &head))
	var req struct {
		Runtime string `json:"runtime"`
		Project string `json:"project"`
	}
	if err := dec.Decode(&req); err != nil {
		httpjson.Error(w, r, s.log, errdefs.Invalid("body", "not a build request (a JSON object, then the context): %v", err))
		return
	}
	_, groups, err := s.projectGroups(r, req.Project)
	var lim limits.Limits
	if err == nil {
		lim, err = clusterLimits.Resolve(limits.TierContainer, limits.Limits{})
	}
	if err != nil {
		httpjson.Error(w, r, s.log, err)
		return
	}
	preq := placement.Request{Tier: limits.TierContainer, Runtime: req.Runtime, CPUs: lim.CPUs, MemoryBytes: lim.MemoryBytes,
		DiskBytes: lim.DiskBytes, Pin: selectors(groups.Effective.Pin), Avoid: selectors(groups.Effective.Avoid)}
	// The edge has the final say on its room: it refuses a build before reading its context
	// (edge.BuildRoom), and the request asks it to (Expect: 100-continue), so the body is sent
	// only to the edge that takes the build, and a refusal is tried elsewhere while nothing of
	// the client's body beyond the head was read.
	sent := false // some of the client's body beyond the head went to a refusing edge
	var resp *http.Response
	node, err := s.placer.PlaceWithRetry(r.Context(), preq, placementNodes(s.upNodes(r.Context())), func(ctx context.Context, name string) error {
		if sent {
			// (An edge that took the context and then refused: not one of this release's.)
			return errdefs.Retryable(errdefs.Unavailable("the build's context went to a node that then refused it, and cannot be sent again; retry"), time.Second)
		}
		body := revproxy.NewBody(r.Body)
		var err error
		resp, err = s.offer(ctx, r, name, "/v1/builds", io.MultiReader(bytes.NewReader(head.Bytes()), body), func(h http.Header) {
			h.Set("Expect", "100-continue")
		})
		if err != nil {
			body.End() // the refused try's transport reads no more of the client's body
			sent = body.Consumed() > 0
		}
		if errors.As(err, new(maybeSent)) {
			err = errdefs.Unavailable("node %s: %v (the build may have started: corral build ls)", name, err)
		}
		return err
	}, s.cfg.MaxTries)
	if err != nil {
		if errors.Is(err, errNodeUnavailable) {
			err = errdefs.Retryable(errdefs.Unavailable("no node could take the build now (%v); retry", err), time.Second)
		}
		httpjson.Error(w, r, s.log, fmt.Errorf("place the build: %w", err))
		return
	}
	relayPlaced(w, resp, node)
}

// listBuilds answers GET /v1/builds: the builds of every up edge the caller may see, oldest
// first. An edge that does not answer is left out of the list and logged.
func (s *Server) listBuilds(w http.ResponseWriter, r *http.Request) {
	nodes := s.upNodes(r.Context())
	lists := make([][]model.Build, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			var err error
			if lists[i], err = s.nodeBuilds(r, n); err != nil {
				s.log.Warn("list a node's builds; leaving them out", "node", n.Name, "err", err)
			}
		})
	}
	wg.Wait()
	out := []model.Build{}
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.SortStableFunc(out, func(a, b model.Build) int { return a.CreatedAt.Compare(b.CreatedAt) })
	httpjson.Write(w, http.StatusOK, out)
}

// nodeBuilds lists node n's builds as r's caller sees them.
func (s *Server) nodeBuilds(r *http.Request, n model.Node) ([]model.Build, error) {
	ctx, cancel := context.WithTimeout(r.Context(), buildListTimeout)
	defer cancel()
	resp, err := s.edgeRequest(ctx, r, n, http.MethodGet, "/v1/builds")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, buildListMax+1))
	switch {
	case err != nil:
		return nil, errdefs.Unavailable("node %s: %v", n.Name, err)
	case resp.StatusCode != http.StatusOK:
		return nil, errdefs.Unavailable("node %s answered %d: %.200s", n.Name, resp.StatusCode, b)
	case len(b) > buildListMax:
		return nil, errdefs.Unavailable("node %s: its builds are over %d bytes", n.Name, buildListMax)
	}
	var list []model.Build
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, errdefs.Unavailable("node %s: undecodable builds: %v", n.Name, err)
	}
	return list, nil
}
