package nodeproto

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// Config is an edge's copy of the configuration it follows (ConfigResponse), fetched from the
// servers when a heartbeat names another generation than the one it holds, or when the edge
// changed something itself (Refresh). Its reads answer from the copy, never from the network
// (but artifact limits, fetched when asked and held artifactLimitsFresh), and fail with
// ErrUnavailable until a first fetch succeeded. Its methods may be called concurrently.
type Config struct {
	s *Servers

	mu     sync.Mutex
	cur    *ConfigResponse
	curSeq int64                 // the fetch cur came from: fetches are numbered as they start
	seq    int64                 // the last fetch started
	limits map[string]heldLimits // by project ID
}

// Config returns an empty copy of the servers' configuration; Follow or Refresh fills it.
func (s *Servers) Config() *Config { return &Config{s: s} }

// Follow fetches the configuration unless the copy is of generation already, and reports
// whether the copy changed.
func (c *Config) Follow(ctx context.Context, generation string) (changed bool, err error) {
	c.mu.Lock()
	held := c.cur
	c.mu.Unlock()
	if held != nil && generation != "" && held.Generation == generation {
		return false, nil
	}
	changed, err = c.fetch(ctx, false)
	if err == nil && generation != "" && c.Generation() != generation {
		// A replica whose copy is older than the heartbeat's answered: past its copy, once.
		var again bool
		again, err = c.fetch(ctx, true)
		changed = changed || again
	}
	return changed, err
}

// Refresh fetches the configuration as it is now, past any replica's copy: the edge changed it
// (an environment's warm size, an fncall environment) and acts on the change at once.
func (c *Config) Refresh(ctx context.Context) error {
	_, err := c.fetch(ctx, true)
	return err
}

// fetch asks the servers for the configuration and keeps it unless a fetch started later was
// kept already (fetches overlap: a heartbeat's and a Refresh): the copy never goes back.
func (c *Config) fetch(ctx context.Context, fresh bool) (bool, error) {
	c.mu.Lock()
	c.seq++
	seq := c.seq
	c.mu.Unlock()
	var out ConfigResponse
	if err := c.s.call(ctx, PathConfig, ConfigRequest{Fresh: fresh}, &out); err != nil {
		return false, fmt.Errorf("fetch the configuration from the servers: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq < c.curSeq {
		return false, nil
	}
	changed := c.cur == nil || c.cur.Generation != out.Generation
	c.cur, c.curSeq = &out, seq
	return changed, nil
}

// Generation returns the generation of the copy; "" before a first fetch.
func (c *Config) Generation() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		return ""
	}
	return c.cur.Generation
}

// held returns the copy, or why there is none yet.
func (c *Config) held() (*ConfigResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		return nil, fmt.Errorf("the servers' configuration has not been fetched yet: %w", errdefs.ErrUnavailable)
	}
	return c.cur, nil
}

// WarmEnvironments returns the environments to keep warm.
func (c *Config) WarmEnvironments(context.Context) ([]model.Environment, error) {
	cur, err := c.held()
	if err != nil {
		return nil, err
	}
	return slices.Clone(cur.WarmEnvironments), nil
}

// ListFncallEnvs returns the fncall environments, by name.
func (c *Config) ListFncallEnvs(context.Context) ([]store.FncallEnvRecord, error) {
	cur, err := c.held()
	if err != nil {
		return nil, err
	}
	return slices.Clone(cur.FncallEnvs), nil
}

// artifactLimitsFresh is how long the copy answers a project's artifact limits before it asks
// the servers again: a quota set through the API reaches the edge's calls within it.
const artifactLimitsFresh = 10 * time.Second

// ArtifactLimits returns the limits on the artifacts of project (an fncall environment's
// project's ID), from the servers at most every artifactLimitsFresh.
func (c *Config) ArtifactLimits(ctx context.Context, project string) ([]store.ArtifactLimit, error) {
	c.mu.Lock()
	held, ok := c.limits[project]
	c.mu.Unlock()
	if ok && time.Since(held.at) < artifactLimitsFresh {
		return slices.Clone(held.limits), nil
	}
	var out ArtifactLimitsResponse
	if err := c.s.call(ctx, PathArtifactLimits, ArtifactLimitsRequest{Project: project}, &out); err != nil {
		return nil, fmt.Errorf("the artifact limits of project %s from the servers: %w", project, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.limits == nil || len(c.limits) >= maxHeldLimits {
		c.limits = map[string]heldLimits{}
	}
	c.limits[project] = heldLimits{out.Limits, time.Now()}
	return slices.Clone(out.Limits), nil
}

// maxHeldLimits bounds the projects whose limits the copy keeps (it starts over past it).
const maxHeldLimits = 1024

// heldLimits is a project's artifact limits as fetched at at.
type heldLimits struct {
	limits []store.ArtifactLimit
	at     time.Time
}

// ServiceCatalog returns the service catalog saved through the API, or ErrNotFound when none
// was.
func (c *Config) ServiceCatalog(context.Context) ([]byte, error) {
	cur, err := c.held()
	if err != nil {
		return nil, err
	}
	if len(cur.ServiceCatalog) == 0 {
		return nil, errdefs.NotFound("service catalog")
	}
	return slices.Clone([]byte(cur.ServiceCatalog)), nil
}

// ProjectPath returns the path of the project with this ID, as its fncall environments name it.
func (c *Config) ProjectPath(_ context.Context, project string) (string, error) {
	cur, err := c.held()
	if err != nil {
		return "", err
	}
	for _, env := range cur.FncallEnvs {
		if env.ProjectID == project {
			return env.Project, nil
		}
	}
	return "", errdefs.NotFound("project %s: no fncall environment of the servers' configuration is in it", project)
}
