package edge

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/store"
	corral "github.com/corral-dev/corral/sdk/go"
)

// Services: programs a layer starts in every sandbox made with it (corral.ImageConfig.Services),
// such as the code-execution server of `corral env install code-interpreter`. The edge starts
// them through the agent, as background commands, right after the sandbox is created, so they
// are up before the create returns to its caller (or before a warm sandbox is claimed): a
// server that takes a second to load (a Jupyter kernel) costs the first request nothing.

// serviceWait bounds how long a create waits for its services' ports.
const serviceWait = 10 * time.Second

// maxServices bounds the services one layer declares.
const maxServices = 8

var serviceNameRE = lazyregexp.New(`^[a-z0-9][a-z0-9-]{0,62}$`)

// validateServices checks the services of an imported layer's configuration.
func validateServices(svcs []corral.Service) error {
	if len(svcs) > maxServices {
		return errdefs.Invalid("image_config.services", "at most %d services, got %d", maxServices, len(svcs))
	}
	for i, s := range svcs {
		field := fmt.Sprintf("image_config.services[%d]", i)
		if !serviceNameRE.MatchString(s.Name) {
			return errdefs.Invalid(field+".name", "%q: want lower-case letters, digits and dashes", s.Name)
		}
		if len(s.Command) == 0 || len(s.Command) > 64 {
			return errdefs.Invalid(field+".command", "want 1 to 64 arguments, got %d", len(s.Command))
		}
		for _, a := range s.Command {
			if len(a) > 4096 {
				return errdefs.Invalid(field+".command", "an argument is longer than 4096 bytes")
			}
		}
		if err := validateEnv(field+".env", s.Env); err != nil {
			return err
		}
		if s.Port < 0 || s.Port > 65535 {
			return errdefs.Invalid(field+".port", "%d: want 1-65535 (or 0: none)", s.Port)
		}
	}
	return nil
}

// startServices starts svcs in sandbox sb and waits until each service's port accepts
// connections. A service that does not start is logged, not fatal: the sandbox works without
// it, and a request for it says that nothing answers.
func (e *Edge) startServices(ctx context.Context, sb *sandbox, rec *store.Sandbox, svcs []corral.Service) {
	if len(svcs) == 0 || rec.Tier == TierVM {
		return
	}
	log := e.log.With("sandbox", rec.ID)
	var ports []int
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
			ports = append(ports, s.Port)
		}
	}
	if len(ports) == 0 {
		return
	}
	dial, err := e.dialerFor(ctx, sb, rec)
	if err != nil {
		log.Warn("services' ports cannot be waited for", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, serviceWait)
	defer cancel()
	every := 5 * time.Millisecond
	if rec.Tier != TierContainer || rec.Runtime == RuntimeGVisor {
		every = 50 * time.Millisecond // each try is a call to the agent
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for _, port := range ports {
		for {
			conn, err := dial(ctx, port)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-ctx.Done():
				log.Warn("a service's port does not answer", "port", port, "waited", serviceWait)
				return
			case <-tick.C:
			}
		}
	}
}
