package cluster

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	corral "github.com/corral-dev/corral/sdk/go"
)

// Builds run on the edge a replica sends their POST to, and live in its memory with their logs
// (internal/build): a build's ID names its node (build.NodeOf), so every request about one goes
// there (toBuildNode), and the list is every up edge's, asked at once and merged.

const (
	// buildListTimeout bounds how long a list waits for one edge.
	buildListTimeout = 10 * time.Second
	// buildListMax bounds one edge's answer (it keeps its last 100 builds).
	buildListMax = 16 << 20
)

// listBuilds answers GET /v1/builds: the builds of every up edge the caller may see, oldest
// first. An edge that does not answer is left out of the list and logged.
func (s *Server) listBuilds(w http.ResponseWriter, r *http.Request) {
	nodes := s.upNodes(r.Context())
	lists := make([][]corral.Build, len(nodes))
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
	out := []corral.Build{}
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.SortStableFunc(out, func(a, b corral.Build) int { return a.CreatedAt.Compare(b.CreatedAt) })
	httpjson.Write(w, http.StatusOK, out)
}

// nodeBuilds lists node n's builds as r's caller sees them.
func (s *Server) nodeBuilds(r *http.Request, n corral.Node) ([]corral.Build, error) {
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
	var list []corral.Build
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, errdefs.Unavailable("node %s: undecodable builds: %v", n.Name, err)
	}
	return list, nil
}
