package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// DiskConfig sizes `corral bench disk`.
type DiskConfig struct {
	Base string // layer NAME:VERSION, on both servers
	// TTIRounds is create→first exec samples per server; DiskBytes their disk (0: the servers'
	// default, which comes from their pools of disks made ahead).
	TTIRounds int
	DiskBytes int64
	// Creates is how many sandboxes of AccountDiskBytes the accounting creates (and keeps until
	// it has read the node's account).
	Creates          int
	AccountDiskBytes int64
}

// DiskResult compares two `corral up` on one host: one allocating writable disks when it makes
// them (the default), one with --sparse-disks, sampled alternately; and the first one's disk
// account before and after Creates creates.
type DiskResult struct {
	Date      string `json:"date"`
	Host      string `json:"host"`
	DiskBytes int64  `json:"disk_bytes"`
	// TTIAllocated and TTISparse are create→first exec (`true`).
	TTIAllocated Stats   `json:"tti_allocated"`
	TTISparse    Stats   `json:"tti_sparse"`
	RatioP50     float64 `json:"tti_ratio_p50"`
	RatioP99     float64 `json:"tti_ratio_p99"`
	// The accounting: sandboxes created and refused (node_full), how long the creates took, and
	// the node's disk account before and after.
	Creates          int                 `json:"creates"`
	Refused          int                 `json:"refused"`
	RefusedMessage   string              `json:"refused_message,omitempty"`
	AccountDiskBytes int64               `json:"account_disk_bytes"`
	CreatesSeconds   float64             `json:"creates_seconds"`
	Before           *corral.DiskAccount `json:"before"`
	After            *corral.DiskAccount `json:"after"`
}

// Disk measures what allocating writable disks costs a sandbox's creation, and the node's disk
// account after many creates. allocated must run with allocated disks, sparse with
// --sparse-disks; both on this host, with admin tokens (the account is the operator's).
func Disk(ctx context.Context, allocated, sparse *corral.Client, cfg DiskConfig, log *slog.Logger) (*DiskResult, error) {
	host, _ := os.Hostname()
	res := &DiskResult{Date: time.Now().UTC().Format(time.RFC3339), Host: host, DiskBytes: cfg.DiskBytes,
		AccountDiskBytes: cfg.AccountDiskBytes}
	tti := func(c *corral.Client) (time.Duration, error) {
		start := time.Now()
		sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base, Limits: corral.Limits{DiskBytes: cfg.DiskBytes}})
		if err != nil {
			return 0, err
		}
		_, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}})
		d := time.Since(start)
		c.DeleteSandbox(ctx, sb.ID)
		if err != nil || exit == nil || exit.Code != 0 {
			return 0, fmt.Errorf("first exec: %v %+v", err, exit)
		}
		return d, nil
	}
	if cfg.TTIRounds > 0 {
		for _, c := range []*corral.Client{allocated, sparse} { // warm up
			if _, err := tti(c); err != nil {
				return nil, err
			}
		}
		log.Info("measuring create→first exec with allocated and sparse disks", "rounds", cfg.TTIRounds, "disk_bytes", cfg.DiskBytes)
		var ta, ts []time.Duration
		for range cfg.TTIRounds {
			d, err := tti(allocated)
			if err != nil {
				return nil, err
			}
			ta = append(ta, d)
			if d, err = tti(sparse); err != nil {
				return nil, err
			}
			ts = append(ts, d)
		}
		res.TTIAllocated, res.TTISparse = summarise(ta), summarise(ts)
		res.RatioP50, res.RatioP99 = res.TTIAllocated.P50/res.TTISparse.P50, res.TTIAllocated.P99/res.TTISparse.P99
	}
	if cfg.Creates > 0 {
		info, err := allocated.Info(ctx)
		if err != nil {
			return nil, err
		}
		if info.Disk == nil {
			return nil, fmt.Errorf("the server shows no disk account (an admin token is needed)")
		}
		res.Before = info.Disk
		log.Info("creating sandboxes for the disk account", "creates", cfg.Creates, "disk_bytes", cfg.AccountDiskBytes)
		var ids []string
		defer func() { deleteAll(context.WithoutCancel(ctx), allocated, ids) }()
		start := time.Now()
		for range cfg.Creates {
			sb, err := allocated.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base, Limits: corral.Limits{DiskBytes: cfg.AccountDiskBytes}})
			if err != nil {
				if ae, ok := errors.AsType[*corral.APIError](err); !ok || ae.Code != "node_full" {
					return nil, err
				}
				res.Refused++
				res.RefusedMessage = err.Error()
				continue
			}
			ids = append(ids, sb.ID)
		}
		res.CreatesSeconds = time.Since(start).Seconds()
		res.Creates = len(ids)
		if info, err = allocated.Info(ctx); err != nil {
			return nil, err
		}
		res.After = info.Disk
	}
	return res, nil
}
