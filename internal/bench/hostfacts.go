package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// HostFactsConfig sizes `corral bench lxcfs`.
type HostFactsConfig struct {
	Base      string // layer NAME:VERSION, on both servers
	TTIRounds int    // create→first exec samples per server
	Idle      int    // idle sandboxes for LXCFS's memory
}

// HostFactsResult compares two `corral up` on one host, one serving sandboxes' /proc figures
// with LXCFS and one started with --no-lxcfs, sampled alternately so both see the same load.
type HostFactsResult struct {
	Date  string `json:"date"`
	Host  string `json:"host"`
	LXCFS string `json:"lxcfs_version"`
	// TTIWith and TTIWithout are create→first exec (`true`) with and without LXCFS.
	TTIWith    Stats   `json:"tti_with_lxcfs"`
	TTIWithout Stats   `json:"tti_without_lxcfs"`
	RatioP50   float64 `json:"tti_ratio_p50"`
	RatioP99   float64 `json:"tti_ratio_p99"`
	// ReadMeminfo is an exec of `cat /proc/meminfo` in a sandbox with LXCFS, against the same in
	// one without (the host's file).
	ReadWith    Stats `json:"read_meminfo_with_lxcfs"`
	ReadWithout Stats `json:"read_meminfo_without_lxcfs"`
	// LXCFS's own memory: RSS and PSS with no sandbox, and with Idle idle sandboxes that each
	// read their figures once.
	Idle           int     `json:"idle"`
	RSSBeforeMiB   float64 `json:"lxcfs_rss_before_mib"`
	RSSIdleMiB     float64 `json:"lxcfs_rss_idle_mib"`
	PSSIdleMiB     float64 `json:"lxcfs_pss_idle_mib"`
	KiBPerSandbox  float64 `json:"lxcfs_kib_per_sandbox"`
	LXCFSPidSource string  `json:"lxcfs_pid_source"`
}

// HostFacts measures what LXCFS costs a sandbox's creation and reads, and LXCFS's memory.
// with must run LXCFS, without must not (corral up --no-lxcfs); both on this host.
func HostFacts(ctx context.Context, with, without *corral.Client, cfg HostFactsConfig, log *slog.Logger) (*HostFactsResult, error) {
	wi, err := with.Info(ctx)
	if err != nil {
		return nil, err
	}
	wo, err := without.Info(ctx)
	if err != nil {
		return nil, err
	}
	if wi.LXCFSVersion == "" {
		return nil, fmt.Errorf("the server measured with LXCFS runs without it: %s", wi.LXCFSUnavailable)
	}
	if wo.LXCFSVersion != "" {
		return nil, fmt.Errorf("the server measured without LXCFS runs it (start it with --no-lxcfs)")
	}
	host, _ := os.Hostname()
	res := &HostFactsResult{Date: time.Now().UTC().Format(time.RFC3339), Host: host, LXCFS: wi.LXCFSVersion}
	for _, c := range []*corral.Client{with, without} { // warm up
		if _, err := ttiOnce(ctx, c, cfg.Base); err != nil {
			return nil, err
		}
	}
	log.Info("measuring create→first exec with and without LXCFS", "rounds", cfg.TTIRounds)
	var tw, two []time.Duration
	for range cfg.TTIRounds {
		d, err := ttiOnce(ctx, with, cfg.Base)
		if err != nil {
			return nil, err
		}
		tw = append(tw, d)
		if d, err = ttiOnce(ctx, without, cfg.Base); err != nil {
			return nil, err
		}
		two = append(two, d)
	}
	res.TTIWith, res.TTIWithout = summarise(tw), summarise(two)
	res.RatioP50, res.RatioP99 = res.TTIWith.P50/res.TTIWithout.P50, res.TTIWith.P99/res.TTIWithout.P99

	log.Info("measuring a read of /proc/meminfo")
	var rw, rwo []time.Duration
	for i, c := range []*corral.Client{with, without} {
		sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base})
		if err != nil {
			return nil, err
		}
		for range 100 {
			start := time.Now()
			if _, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"cat", "/proc/meminfo"}}); err != nil || exit == nil || exit.Code != 0 {
				c.DeleteSandbox(ctx, sb.ID)
				return nil, fmt.Errorf("cat /proc/meminfo: %v %+v", err, exit)
			}
			if i == 0 {
				rw = append(rw, time.Since(start))
			} else {
				rwo = append(rwo, time.Since(start))
			}
		}
		c.DeleteSandbox(ctx, sb.ID)
	}
	res.ReadWith, res.ReadWithout = summarise(rw), summarise(rwo)

	if cfg.Idle > 0 {
		pidFile := filepath.Join(wi.DataDir, "lxcfs", "lxcfs.pid")
		res.LXCFSPidSource = pidFile
		pid := readInt(pidFile)
		if pid <= 0 {
			return nil, fmt.Errorf("no LXCFS pid in %s", pidFile)
		}
		log.Info("measuring LXCFS's memory with idle sandboxes", "sandboxes", cfg.Idle, "pid", pid)
		before := rssOf(pid)
		var ids []string
		defer func() { deleteAll(ctx, with, ids) }()
		for range cfg.Idle {
			sb, err := with.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base, Limits: corral.Limits{DiskBytes: 64 << 20}})
			if err != nil {
				return nil, fmt.Errorf("idle sandbox %d: %w", len(ids), err)
			}
			ids = append(ids, sb.ID)
			// Every figure once, so LXCFS has met each sandbox's cgroups.
			if _, _, _, err := with.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"cat", "/proc/meminfo", "/proc/cpuinfo", "/proc/stat",
				"/proc/uptime", "/proc/loadavg", "/proc/diskstats", "/proc/swaps", "/sys/devices/system/cpu/online"}}); err != nil {
				return nil, err
			}
		}
		time.Sleep(3 * time.Second) // LXCFS's load-average thread visits every cgroup each 5 s or so
		const mib = 1 << 20
		res.Idle = len(ids)
		res.RSSBeforeMiB = float64(before) / mib
		res.RSSIdleMiB = float64(rssOf(pid)) / mib
		res.PSSIdleMiB = float64(pssOf(pid)) / mib
		res.KiBPerSandbox = float64(rssOf(pid)-before) / float64(len(ids)) / 1024
	}
	return res, nil
}

// readToken returns the token in file (an admin.token).
func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// NewClientFromTokenFile is a client of url authenticated by the token in file.
func NewClientFromTokenFile(url, file string) (*corral.Client, error) {
	tok, err := readToken(file)
	if err != nil {
		return nil, fmt.Errorf("read token: %w", err)
	}
	return corral.New(url, tok), nil
}
