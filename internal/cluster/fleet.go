package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

// fleet is how a replica's identity routes reach the sandboxes a forced project delete removes:
// each sandbox's delete goes to the node that runs it, over the node protocol as the caller of
// the project delete. The edges audit them.
type fleet struct{ s *Server }

func (f fleet) DeleteSandbox(r *http.Request, under, id string) error {
	name := edge.NodeOf(id)
	n, ok := f.s.node(r.Context(), name)
	switch {
	case !ok:
		return errdefs.UnknownSandbox(id, "(no node %s in this cluster)", name)
	case n.State == model.NodeLost:
		return errdefs.Unavailable("sandbox %s: node %s is lost (its sandboxes fail with %s within a second; delete the project again)", id, name, model.ReasonNodeLost)
	}
	return f.s.callEdge(r, n, http.MethodDelete, "/v1/sandboxes/"+id)
}

// edgeRequest sends a request without a body to node n's edge as r's caller, under ctx; the
// caller closes the answer's body.
func (s *Server) edgeRequest(ctx context.Context, r *http.Request, n model.Node, method, path string) (*http.Response, error) {
	c, err := s.conn(n)
	if err != nil {
		return nil, err
	}
	out, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(n.URL, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	if err := s.asCaller(r, n, out.Header); err != nil {
		return nil, err
	}
	resp, err := c.client.Do(out)
	if err != nil {
		return nil, errdefs.Unavailable("node %s: %s %s: %v", n.Name, method, path, err)
	}
	return resp, nil
}

// callEdge sends a request without a body to node n's edge as r's caller, and turns an error
// answer back into an error of its kind.
func (s *Server) callEdge(r *http.Request, n model.Node, method, path string) error {
	// A delete started is seen through even if the client goes away, but not for ever: an
	// edge's delete answers before its cleanup, so a minute is plenty.
	return s.callEdgeWithin(r, n, method, path, time.Minute)
}

// callEdgeWithin is callEdge bounded by timeout.
func (s *Server) callEdgeWithin(r *http.Request, n model.Node, method, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), timeout)
	defer cancel()
	resp, err := s.edgeRequest(ctx, r, n, method, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 300 {
		return nil
	}
	var e model.Error
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(b))
	}
	return fmt.Errorf("node %s: %s: %w", n.Name, e.Message, errdefs.KindOf(resp.StatusCode))
}
