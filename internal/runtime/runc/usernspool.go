package runc

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// A user namespace cost a create 5-7 ms of its time on a 2-CPU host when its helper was a Go
// process started from the agent binary (startUserns; corral-runcd's helper in C, where it is
// used, starts faster), and the create waits for its "ok". The runtime
// therefore keeps up to usernsPoolSize of them made ahead: each is a slot taken for no sandbox
// yet (poolOwner) with its helper running. claimUserns takes one and the refill makes the next
// off the create's path, after the creates in flight and the commands that follow them, as the
// disk pool does (refillWait). They live in memory only: their helpers end with this process
// (their standard input closes) and their slots were never recorded in a sandbox directory, so
// a restarted Runtime finds the slots free.
const usernsPoolSize = 2

// poolOwner owns the slots of the user namespaces made ahead; no sandbox ID has this form.
const poolOwner = "(user-namespace pool)"

// pooledUserns is a user namespace made ahead: its slot, its helper and the agent binary the
// helper is.
type pooledUserns struct {
	slot  int
	h     *usernsHandle
	agent string
}

// takePooledUserns returns a user namespace made ahead by the agent binary at agentPath, its
// slot now id's, or false when the pool has none (one made by another binary is ended: a
// create's namespace comes from its own agent, as if made for it).
func (r *Runtime) takePooledUserns(id, agentPath string) (pooledUserns, bool) {
	for {
		select {
		case p := <-r.nsReady:
			if p, ok := r.claimPooled(p, id, agentPath); ok {
				return p, true
			}
		default:
			return pooledUserns{}, false
		}
	}
}

// claimPooled gives p's slot to id when p's helper is the agent binary at agentPath (or
// corral-runcd's, which serves every agent), and ends p otherwise.
func (r *Runtime) claimPooled(p pooledUserns, id, agentPath string) (pooledUserns, bool) {
	if r.nsHelper == "" && p.agent != agentPath {
		p.h.close()
		r.slots.releaseSlot(p.slot)
		return pooledUserns{}, false
	}
	r.slots.assign(p.slot, id)
	return p, true
}

// usernsAwait bounds how long a create that found every slot taken waits for a namespace the
// refill is making (a helper's start: milliseconds).
const usernsAwait = 5 * time.Second

// awaitPooledUserns is for a create that found no free slot: while the refill holds one for a
// namespace it is making, perhaps the last free slot, the create waits for that namespace and
// takes it (else the pool, there to speed creates up, would refuse one on a node at its
// limit). False when the refill makes none, or after usernsAwait.
func (r *Runtime) awaitPooledUserns(ctx context.Context, id, agentPath string) (pooledUserns, bool) {
	t := time.NewTimer(usernsAwait)
	defer t.Stop()
	for {
		if p, ok := r.takePooledUserns(id, agentPath); ok {
			return p, true
		}
		if r.nsMaking.Load() == 0 {
			return pooledUserns{}, false
		}
		select {
		case p := <-r.nsReady:
			if p, ok := r.claimPooled(p, id, agentPath); ok {
				return p, true
			}
		case <-r.nsMade:
		case <-ctx.Done():
			return pooledUserns{}, false
		case <-t.C:
			return pooledUserns{}, false
		}
	}
}

func (r *Runtime) kickUserns() {
	select {
	case r.nsRefill <- struct{}{}:
	default:
	}
}

// refillUserns keeps r.nsReady full once a Create has named the agent binary (the helper is
// one of its commands). It runs until ctx ends; Close waits for it, then closes what is left
// (closeUsernsPool).
func (r *Runtime) refillUserns(ctx context.Context) {
	defer r.wg.Done()
	r.refillLoop(ctx, r.nsRefill, func() (int, int) { return len(r.nsReady), cap(r.nsReady) }, "make a user namespace ahead", func() error {
		path, _ := r.nsAgentPath.Load().(string)
		if path == "" {
			return errRoundDone // no Create has named the agent yet
		}
		// nsMaking covers the namespace from its slot's take until it is in nsReady (or its
		// make failed): a create that finds no slot free waits for it (awaitPooledUserns).
		r.nsMaking.Add(1)
		defer func() {
			r.nsMaking.Add(-1)
			select {
			case r.nsMade <- struct{}{}:
			default:
			}
		}()
		p, err := r.makePooledUserns(path)
		if errors.Is(err, errdefs.ErrExhausted) {
			return errRoundDone // every slot is a sandbox's: the next create kicks again
		}
		if err != nil {
			return err
		}
		r.nsReady <- p // only this goroutine sends, and len < cap: never blocks
		return nil
	})
}

// makePooledUserns takes a free slot for the pool and starts its namespace's helper with the
// agent binary at path.
func (r *Runtime) makePooledUserns(path string) (pooledUserns, error) {
	slot, err := r.slots.take(poolOwner)
	if err != nil {
		return pooledUserns{}, err
	}
	var agentFile *os.File // the agent's helper only; corral-runcd's needs none
	if r.nsHelper == "" {
		agent, err := r.agents.acquire(path)
		if err != nil {
			r.slots.releaseSlot(slot)
			return pooledUserns{}, err
		}
		defer r.agents.release(agent)
		agentFile = agent.f
	}
	// Not the refill's context: a helper a Create took must outlive Close's cancel until that
	// Create is done with it (closeUsernsPool ends the ones left).
	h, err := r.startUserns(context.Background(), r.slotBase(slot), agentFile)
	if err != nil {
		r.slots.releaseSlot(slot)
		return pooledUserns{}, err
	}
	return pooledUserns{slot: slot, h: h, agent: path}, nil
}

// closeUsernsPool ends the helpers of the namespaces made ahead and frees their slots. Call it
// once the refill has ended.
func (r *Runtime) closeUsernsPool() {
	for {
		select {
		case p := <-r.nsReady:
			p.h.close()
			r.slots.releaseSlot(p.slot)
		default:
			return
		}
	}
}
