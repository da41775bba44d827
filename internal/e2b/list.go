package e2b

import (
	"cmp"
	"encoding/base64"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// Listing. Corral lists a caller's sandboxes in one answer, filtered by labels; the gateway
// filters the rest (state, start time, template), orders them by start time and cuts pages,
// whose cursor (X-Next-Token) is the start time and ID of the last sandbox of the page: a
// sandbox created or ended between two pages neither shifts nor repeats the others.

// Limits of a v2 list page, as E2B's API has them.
const (
	defaultPageSize = 100
	maxPageSize     = 100
)

// listQuery is a parsed list request.
type listQuery struct {
	metadata     map[string]string
	running      bool // keep running sandboxes
	paused       bool // keep paused sandboxes
	startedAfter time.Time
	template     string
	asc          bool
	limit        int
	after        *cursor // the last sandbox of the previous page
}

// cursor is the position of a sandbox in the list order.
type cursor struct {
	at time.Time
	id string
}

// String returns the cursor as the opaque X-Next-Token.
func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.at.UnixNano(), 10) + ":" + c.id))
}

func parseCursor(s string) (*cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		ns, id, ok := strings.Cut(string(b), ":")
		n, perr := strconv.ParseInt(ns, 10, 64)
		if ok && perr == nil && id != "" {
			return &cursor{at: time.Unix(0, n), id: id}, nil
		}
	}
	return nil, invalid("nextToken", "%q is not a token this gateway handed out (X-Next-Token)", s)
}

// compare orders two sandboxes by start time, then ID.
func compareSandboxes(a, b cursor) int {
	if c := a.at.Compare(b.at); c != 0 {
		return c
	}
	return cmp.Compare(a.id, b.id)
}

// parseMetadataQuery decodes the metadata filter as the SDK encodes it: after the query
// parameter's own decoding the value is still a query string ("k=v&k2=v2") whose keys and values
// are escaped once more; unescape it, split it, unescape each key and value.
func parseMetadataQuery(v string) (map[string]string, error) {
	s, err := url.QueryUnescape(v)
	if err != nil {
		return nil, invalid("metadata", "not a query string of key=value pairs: %v", err)
	}
	out := map[string]string{}
	for pair := range strings.SplitSeq(s, "&") {
		if pair == "" {
			continue
		}
		k, val, _ := strings.Cut(pair, "=")
		if k, err = url.QueryUnescape(k); err == nil {
			val, err = url.QueryUnescape(val)
		}
		if err != nil {
			return nil, invalid("metadata", "%q: %v", pair, err)
		}
		if k == "" {
			return nil, invalid("metadata", "%q: empty key", pair)
		}
		out[k] = val
	}
	return out, nil
}

// parseListQuery reads the query of GET /v2/sandboxes (v2) or GET /sandboxes.
func parseListQuery(q url.Values, v2 bool) (listQuery, error) {
	lq := listQuery{running: true, limit: defaultPageSize}
	known := map[string]bool{"metadata": true}
	if v2 {
		lq.paused = true
		for _, k := range []string{"state", "startedAfter", "template", "order", "limit", "nextToken"} {
			known[k] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if !known[k] {
			return lq, invalid(k, "unknown query parameter")
		}
	}
	var err error
	if v := q.Get("metadata"); v != "" {
		if lq.metadata, err = parseMetadataQuery(v); err != nil {
			return lq, err
		}
	}
	if !v2 {
		return lq, nil
	}
	if states := q["state"]; len(states) > 0 {
		lq.running, lq.paused = false, false
		for _, v := range states {
			for s := range strings.SplitSeq(v, ",") {
				switch strings.TrimSpace(s) {
				case "running":
					lq.running = true
				case "paused":
					lq.paused = true
				default:
					return lq, invalid("state", "%q: want running or paused (comma-separated)", s)
				}
			}
		}
	}
	if v := q.Get("startedAfter"); v != "" {
		if lq.startedAfter, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return lq, invalid("startedAfter", "%q is not an RFC 3339 time", v)
		}
	}
	lq.template = q.Get("template")
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		lq.asc = true
	default:
		return lq, invalid("order", "%q: want asc or desc", o)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageSize {
			return lq, invalid("limit", "%q: want a number from 1 to %d", v, maxPageSize)
		}
		lq.limit = n
	}
	if v := q.Get("nextToken"); v != "" {
		if lq.after, err = parseCursor(v); err != nil {
			return lq, err
		}
	}
	return lq, nil
}

func (g *Gateway) listV2(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	return g.list(w, r, c, true)
}

func (g *Gateway) listV1(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	return g.list(w, r, c, false)
}

// list serves GET /v2/sandboxes (pages, running and paused) and GET /sandboxes (running only, one
// answer).
func (g *Gateway) list(w http.ResponseWriter, r *http.Request, c *corral.Client, v2 bool) error {
	lq, err := parseListQuery(r.URL.Query(), v2)
	if err != nil {
		return err
	}
	all, err := c.ListSandboxes(r.Context(), corral.ListOptions{Labels: lq.metadata})
	if err != nil {
		return err
	}
	var keep []*corral.Sandbox
	running := 0
	for i := range all {
		sb := &all[i]
		st, ok := state(sb.State)
		if !ok || lq.template != "" && templateOf(sb) != lq.template {
			continue
		}
		if st == "running" {
			running++
		}
		if st == "running" && !lq.running || st == "paused" && !lq.paused {
			continue
		}
		if !lq.startedAfter.IsZero() && !sb.CreatedAt.After(lq.startedAfter) {
			continue
		}
		keep = append(keep, sb)
	}
	pos := func(sb *corral.Sandbox) cursor { return cursor{sb.CreatedAt, sb.ID} }
	slices.SortFunc(keep, func(a, b *corral.Sandbox) int {
		if lq.asc {
			return compareSandboxes(pos(a), pos(b))
		}
		return compareSandboxes(pos(b), pos(a))
	})
	if lq.after != nil {
		i := 0
		for i < len(keep) {
			c := compareSandboxes(pos(keep[i]), *lq.after)
			if lq.asc && c > 0 || !lq.asc && c < 0 {
				break
			}
			i++
		}
		keep = keep[i:]
	}
	out := make([]sandboxDetail, 0, min(len(keep), lq.limit))
	for i, sb := range keep {
		if v2 && i == lq.limit {
			w.Header().Set("X-Next-Token", pos(keep[i-1]).String())
			break
		}
		out = append(out, g.detail(sb, false))
	}
	if v2 {
		w.Header().Set("X-Total-Running", strconv.Itoa(running))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
