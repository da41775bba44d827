package e2b

import (
	"net/http"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// forkBody is SandboxForkRequest, the body of POST /sandboxes/{id}/fork.
type forkBody struct {
	Count   *int64 `json:"count"`
	Timeout *int64 `json:"timeout"`
}

// forkResult is SandboxForkResult: one fork's outcome. Corral's fork is all or nothing, so a
// 201 carries a sandbox in every entry; a failure is the request's error status instead.
type forkResult struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
}

// fork serves POST /sandboxes/{id}/fork: count copies (default 1) of the running sandbox, each
// going on from its state now (Corral's POST /v1/sandboxes/{id}/fork), living timeout seconds
// (default Config.DefaultTimeout, as a create; E2B's documented default is 15 s).
func (g *Gateway) fork(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	id := r.PathValue("sandboxID")
	var in forkBody
	if err := decodeBody(r, &in, true); err != nil {
		return err
	}
	req := corral.ForkRequest{Count: 1}
	if in.Count != nil {
		if *in.Count < 1 || *in.Count > corral.MaxForkCount {
			return invalid("count", "%d: want 1 to %d forks", *in.Count, corral.MaxForkCount)
		}
		req.Count = int(*in.Count)
	}
	d := g.cfg.DefaultTimeout
	if in.Timeout != nil {
		var err error
		if d, err = seconds("timeout", *in.Timeout); err != nil {
			return err
		}
	}
	req.TTL = d.Round(time.Second).String()
	if _, err := live(r.Context(), c, id); err != nil {
		return err
	}
	copies, err := c.Fork(r.Context(), id, req)
	if err != nil {
		return ttlError(sandboxError(r.Context(), c, id, err), "timeout")
	}
	out := make([]forkResult, len(copies))
	for i := range copies {
		sb := g.sandboxJSON(r, &copies[i])
		out[i] = forkResult{Sandbox: &sb}
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}
