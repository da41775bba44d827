package edge

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// Services: programs a layer starts in every sandbox made with it (corral.ImageConfig.Services),
// such as the code-execution server of `corral env install code-interpreter`. The edge starts
// them through the agent, as background commands, right after the sandbox is created, so they
// are up before the create returns to its caller (or before a warm sandbox is claimed). A
// create waits for their ports only; a warm pool's fill also waits for their readiness checks
// (Service.Ready), off the hot path, so a server that listens at once but takes a second more
// to load (the code interpreter's Jupyter kernel) costs a claim's first request nothing.

const (
	// serviceWait bounds how long a create waits for its services' ports.
	serviceWait = 10 * time.Second
	// serviceReadyWait bounds how long a pool's fill waits for its services' readiness
	// checks (after their ports): a check that never passes leaves the sandbox usable, its
	// service merely not ready when claimed.
	serviceReadyWait = 60 * time.Second
	// readyRetry is the pause between two tries of a readiness check (a check may hold each
	// request until ready, as the code interpreter's /ready?wait= does).
	readyRetry = 50 * time.Millisecond
)

// startServices starts svcs in sandbox sb and waits until each service's port accepts
// connections, then, with checkReady (a warm pool's fill), until each readiness check passes. A
// service that does not start or get ready is logged, not fatal: the sandbox works without it,
// and a request for it says that nothing answers (or waits for it).
func (e *Edge) startServices(ctx context.Context, sb *sandbox, rec *store.Sandbox, svcs []model.Service, checkReady bool) {
	if len(svcs) == 0 || rec.Tier == TierVM {
		return
	}
	log := e.log.With("sandbox", rec.ID)
	var listening []model.Service
	for _, s := range svcs {
		info, err := sb.agent.Start(ctx, agentrpc.ExecRequest{Argv: s.Command, Env: s.Env, Cwd: "/", Tag: "service:" + s.Name, OutputLimit: 1 << 20})
		if err == nil {
			err = startError(info)
		}
		if err != nil {
			log.Warn("start a service", "service", s.Name, "err", err)
			continue
		}
		if s.Port > 0 {
			listening = append(listening, s)
		}
	}
	if len(listening) == 0 {
		return
	}
	dial, err := e.dialerFor(ctx, sb, rec)
	if err != nil {
		log.Warn("services' ports cannot be waited for", "err", err)
		return
	}
	every := 5 * time.Millisecond
	if rec.Tier != TierContainer || rec.Runtime == RuntimeGVisor {
		every = 50 * time.Millisecond // each try is a call to the agent
	}
	if !waitPorts(ctx, dial, listening, every, log) || !checkReady {
		return
	}
	waitReady(ctx, dial, listening, log)
}

// waitPorts waits (≤ serviceWait) until each service's port accepts connections, trying every
// every; false when one does not.
func waitPorts(ctx context.Context, dial portDialFunc, svcs []model.Service, every time.Duration, log *slog.Logger) bool {
	ctx, cancel := context.WithTimeout(ctx, serviceWait)
	defer cancel()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for _, s := range svcs {
		for {
			conn, err := dial(ctx, s.Port)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-ctx.Done():
				log.Warn("a service's port does not answer", "service", s.Name, "port", s.Port, "waited", serviceWait)
				return false
			case <-tick.C:
			}
		}
	}
	return true
}

// waitReady runs the services' readiness checks (Service.Ready: GET the path on the port) until
// each answers 2xx, answers anything but 503 (it failed to get ready: logged), or
// serviceReadyWait has passed.
func waitReady(ctx context.Context, dial portDialFunc, svcs []model.Service, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, serviceReadyWait)
	defer cancel()
	for _, s := range svcs {
		if s.Ready == "" {
			continue
		}
		c := &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dial(ctx, s.Port)
			},
			DisableKeepAlives: true,
		}}
		target := "http://127.0.0.1:" + strconv.Itoa(s.Port) + s.Ready
		for {
			status, err := getStatus(ctx, c, target)
			if err == nil && status/100 == 2 {
				break
			}
			if err == nil && status != http.StatusServiceUnavailable {
				log.Warn("a service failed its readiness check", "service", s.Name, "check", s.Ready, "status", status)
				break
			}
			select {
			case <-ctx.Done():
				log.Warn("a service is not ready", "service", s.Name, "check", s.Ready, "waited", serviceReadyWait, "err", err)
				return
			case <-time.After(readyRetry):
			}
		}
	}
}

// getStatus sends GET target with c and returns the response's status.
func getStatus(ctx context.Context, c *http.Client, target string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}
