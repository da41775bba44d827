package daemon

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
)

// ClusterConfig makes `corral up` an edge of a cluster (`corral edge`): it registers its node
// with the cluster's servers, holds the node's lease by heartbeats, and has the servers admit,
// resolve and record its sandboxes under its incarnation's epoch. It opens no store.
type ClusterConfig struct {
	// URL is how the cluster's servers reach this edge's API (https://HOST:PORT).
	URL string
	// TLS serves the API to the cluster's servers only (mutual TLS under the cluster CA; from
	// cluster.Join). Without it the API is served in the clear, as `corral up` serves it.
	TLS *tls.Config
	// Servers is the servers' node channel (from cluster.Join), through which the edge does
	// everything it would do in a store; required.
	Servers *nodeproto.Servers
	// Labels describe the node to placement (gpu=h100, kvm=true).
	Labels map[string]string
	// LeaseTTL is how long a heartbeat holds the lease (default 15s; heartbeats every third).
	LeaseTTL time.Duration
	// Sandboxes caps how many sandboxes this node runs (default 1000).
	Sandboxes int
	// Overcommit is how far the edge admits limits beyond the host's CPUs, memory and data-dir
	// disk (defaults: CPU 4, memory 1, disk 1). It is the node's final say: a create over it is
	// refused with 409 node_full and placement tries another node. Keep the servers' placement
	// overcommit at or below it.
	Overcommit struct{ CPU, Memory, Disk float64 }
}

func (c *ClusterConfig) setDefaults() {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 15 * time.Second
	}
	if c.Sandboxes == 0 {
		c.Sandboxes = 1000
	}
	for _, f := range []struct {
		v   *float64
		def float64
	}{{&c.Overcommit.CPU, 4}, {&c.Overcommit.Memory, 1}, {&c.Overcommit.Disk, 1}} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
}

// admissible is what the edge admits: the host's capacity with the overcommit applied.
func (c *ClusterConfig) admissible(host store.Resources) *store.Resources {
	return &store.Resources{
		CPUs:        host.CPUs * c.Overcommit.CPU,
		MemoryBytes: int64(float64(host.MemoryBytes) * c.Overcommit.Memory),
		DiskBytes:   int64(float64(host.DiskBytes) * c.Overcommit.Disk),
		Sandboxes:   host.Sandboxes,
	}
}

// registration is what an edge starts from: its node's row with the incarnation's epoch, its
// instance name and the records of its sandboxes that may still run.
type registration struct {
	node     *store.Node
	instance string
	records  []*store.Sandbox
}

// registerNode starts this edge's incarnation through the servers, whose node channel fences
// what the edge writes with its epoch from then on. The servers must serve every part of the
// channel this release uses (nodeproto.Features): the edge holds no store credentials to fall
// back on, so servers of an older release are refused, and are upgraded before their edges.
func registerNode(ctx context.Context, cfg Config, tiers, runtimes []string, diskHeld int64, log *slog.Logger) (*registration, error) {
	srv := cfg.Cluster.Servers
	if srv == nil {
		return nil, errors.New("the server joined through named no node channel, which an edge holding no store credentials works through: it is of an older release; upgrade the servers first")
	}
	req := nodeproto.RegisterRequest{
		URL: cfg.Cluster.URL, Labels: cfg.Cluster.Labels,
		Capacity: hostCapacity(cfg.DataDir, cfg.Cluster.Sandboxes, diskHeld),
		Tiers:    tiers, Runtimes: runtimes,
		Protocol:       nodeproto.Version, // servers send this edge callers, never tokens
		LeaseTTLMillis: cfg.Cluster.LeaseTTL.Milliseconds(),
	}
	ans, err := registerWithServers(ctx, srv, req, log)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, f := range nodeproto.Features {
		if !slices.Contains(ans.Features, f) {
			missing = append(missing, f)
		}
	}
	if ans.Instance == "" {
		missing = append([]string{"the node's records and instance name"}, missing...)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the cluster's servers (%s) are of an older release than this edge: they do not serve %s, which an edge without store credentials needs; upgrade the servers first",
			strings.Join(srv.URLs(), ","), strings.Join(missing, ", "))
	}
	reg := &registration{node: &ans.Node, instance: ans.Instance, records: ans.Sandboxes}
	if reg.records == nil {
		reg.records = []*store.Sandbox{}
	}
	n := reg.node
	if n.Name != cfg.Node {
		return nil, fmt.Errorf("the servers registered node %q, not %q: the edge's certificate names another node", n.Name, cfg.Node)
	}
	log.Info("node registered", "epoch", n.Epoch, "state", n.State, "url", n.URL, "capacity", n.Capacity, "through", strings.Join(srv.URLs(), ","),
		"overcommit_cpu", cfg.Cluster.Overcommit.CPU, "overcommit_memory", cfg.Cluster.Overcommit.Memory, "overcommit_disk", cfg.Cluster.Overcommit.Disk)
	return reg, nil
}

// registerTries bounds how long an edge's start waits for the servers' node channel: servers
// rolling or restarting come back within it.
const registerTries = 10

// registerWithServers registers through the node channel, trying again while the servers are
// unavailable.
func registerWithServers(ctx context.Context, srv *nodeproto.Servers, req nodeproto.RegisterRequest, log *slog.Logger) (*nodeproto.RegisterResponse, error) {
	var ans *nodeproto.RegisterResponse
	err := retryUnavailable(ctx, "register with the servers", func() (err error) {
		ans, err = srv.Register(ctx, req)
		return err
	}, log)
	return ans, err
}

// retryUnavailable calls fn until it succeeds, fails otherwise than with the servers unavailable
// (ErrVersion is final), or failed registerTries times, backing off from 1 s to 10 s.
func retryUnavailable(ctx context.Context, what string, fn func() error, log *slog.Logger) error {
	wait := time.Second
	for try := 1; ; try++ {
		err := fn()
		if err == nil || !errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, nodeproto.ErrVersion) || try == registerTries {
			return err
		}
		log.Warn(what+"; trying again", "err", err, "try", try, "wait", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// heartbeats holds what the heartbeat loop acts on, set while the edge starts: the loop runs from
// the registration on, so a slow start never lets the lease run out.
type heartbeats struct {
	// edge, once set, is told whether its node is draining and when the settings changed.
	edge atomic.Pointer[edge.Edge]
	// settings, once set, is the edge's copy of the servers' configuration: fetched again
	// whenever a heartbeat names a generation other than the one it holds.
	settings  atomic.Pointer[nodeproto.Config]
	following atomic.Bool // a fetch of the settings is under way
}

// heartbeat renews the node's lease until ctx ends, telling the edge (once hb has one) whether
// its node is draining. It returns when the node was fenced (a newer incarnation, or declared
// lost): this process must stop, and register again when restarted.
func heartbeat(ctx context.Context, cfg Config, epoch int64, hb *heartbeats, log *slog.Logger) error {
	srv := cfg.Cluster.Servers
	t := time.NewTicker(cfg.Cluster.LeaseTTL / 3)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// The servers count what this node's sandboxes use from their records; the warm
		// pools' figures are shown with the environments.
		var warm map[string]store.WarmFigures
		if e := hb.edge.Load(); e != nil {
			warm = e.WarmFigures()
		}
		ans, err := srv.Heartbeat(ctx, epoch, cfg.Cluster.LeaseTTL, warm)
		if settings := hb.settings.Load(); err == nil && settings != nil && ans.Config != "" && ans.Config != settings.Generation() {
			// Off the loop, one at a time: a slow fetch delays no heartbeat.
			if hb.following.CompareAndSwap(false, true) {
				go func() {
					defer hb.following.Store(false)
					followSettings(ctx, settings, ans.Config, hb.edge.Load(), log)
				}()
			}
		}
		if e := hb.edge.Load(); err == nil && e != nil {
			e.SetDraining(ans.State == store.NodeDraining)
		}
		switch {
		case errors.Is(err, store.ErrFenced):
			return fmt.Errorf("node %s lost its lease (epoch %d): %w", cfg.Node, epoch, err)
		case err != nil:
			failures++
			log.Warn("heartbeat failed; the lease runs out unless one succeeds", "err", err, "failures_in_a_row", failures)
		default:
			failures = 0
		}
	}
}

// followSettings fetches the servers' configuration of generation and has the edge (when it has
// started) follow it.
func followSettings(ctx context.Context, settings *nodeproto.Config, generation string, e *edge.Edge, log *slog.Logger) {
	changed, err := settings.Follow(ctx, generation)
	if err != nil {
		log.Warn("fetch the servers' configuration; the edge keeps the one it holds", "err", err)
		return
	}
	if changed && e != nil {
		log.Info("configuration changed on the servers", "generation", settings.Generation())
		e.SettingsChanged(context.WithoutCancel(ctx))
	}
}

// hostCapacity is what this host offers: its CPUs, memory, the data dir's disk, and a cap on
// sandboxes. The disk is the edge's figure (edge.DiskPromise.Have before overcommit): the
// filesystem's free space plus what sandbox disks (diskHeld) have taken from it already.
func hostCapacity(dataDir string, sandboxes int, diskHeld int64) store.Resources {
	c := store.Resources{CPUs: float64(runtime.NumCPU()), Sandboxes: sandboxes}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				c.MemoryBytes = kb << 10
			}
		}
		f.Close()
	}
	var fs syscall.Statfs_t
	if syscall.Statfs(dataDir, &fs) == nil {
		c.DiskBytes = int64(fs.Bavail)*int64(fs.Bsize) + diskHeld
	}
	return c
}
