package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/egress/netlab"
	corral "github.com/corral-dev/corral/sdk/go"
)

// NetworkConfig sizes a networking benchmark run.
type NetworkConfig struct {
	// Corral is the corral binary to start (`corral up`) and Rootfs the base layer's directory.
	Corral, Rootfs string
	TTIRounds      int // create→first exec samples, with networking and without
	Updates        int // policy replacements
	DownloadMiB    int // size of the download through the policy
	Downloads      int // downloads, each way
}

// NetworkResult is what one networking run measured.
type NetworkResult struct {
	Date string `json:"date"`
	// TTINet is create→first exec of a sandbox whose policy allows 3 catalog services; TTINone
	// of one without networking, in the same run.
	TTINet     Stats   `json:"tti_allowlist_3_services"`
	TTINone    Stats   `json:"tti_network_none"`
	TTIAddedMs float64 `json:"tti_added_ms_p50"`
	// Update is a PUT of the policy of a running sandbox, answered when the rules are in force.
	Update Stats `json:"policy_update"`
	// SandboxMBps and HostMBps are downloads of DownloadMiB from the lab's web server with the same
	// tools (busybox nc | wc -c), from inside an allowlisted sandbox and from the host.
	DownloadMiB     int     `json:"download_mib"`
	SandboxMBps     float64 `json:"sandbox_mb_per_s_p50"`
	HostMBps        float64 `json:"host_mb_per_s_p50"`
	ThroughputRatio float64 `json:"throughput_ratio"`
}

// Network starts a lab internet (internal/egress/netlab) and a private `corral up` that uses it,
// and measures what networking costs: creation with a policy against without, policy updates,
// and download throughput through the policy against the host's own.
func Network(ctx context.Context, cfg NetworkConfig, log *slog.Logger) (_ *NetworkResult, err error) {
	res := &NetworkResult{Date: time.Now().UTC().Format(time.RFC3339), DownloadMiB: cfg.DownloadMiB}
	lab, err := netlab.Start("bn", netip.MustParsePrefix("203.0.113.0/24"), []netlab.Host{
		{Name: "one.test", Addr: "203.0.113.1"}, {Name: "two.test", Addr: "203.0.113.2"}, {Name: "three.test", Addr: "203.0.113.3"},
	})
	if err != nil {
		return nil, err
	}
	defer lab.Close()
	work, err := os.MkdirTemp("", "crl-netbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	services := filepath.Join(work, "services.json")
	os.WriteFile(services, []byte(`{"services": {"one": {"domains": ["one.test"]}, "two": {"domains": ["two.test"]},
		"three": {"addresses": ["203.0.113.3:80/tcp"]}}}`), 0o644)
	const listen = "127.0.0.1:7198"
	up := exec.CommandContext(ctx, cfg.Corral, "up", "--data-dir", filepath.Join(work, "data"), "--listen", listen,
		"--cgroup-parent", "/corral-netbench", "--net-tag", "bn", "--net-pool", "10.250.0.0/24",
		"--services", services, "--dns-upstream", lab.DNS, "--disk-pool", "4")
	logf, err := os.Create(filepath.Join(work, "corral.log"))
	if err != nil {
		return nil, err
	}
	up.Stdout, up.Stderr = logf, logf
	if err := up.Start(); err != nil {
		return nil, err
	}
	defer func() {
		up.Process.Signal(os.Interrupt)
		up.Wait()
		logf.Close()
	}()
	url := "http://" + listen
	for i := 0; ; i++ {
		if r, err := http.Get(url + "/healthz"); err == nil && r.StatusCode == 200 {
			r.Body.Close()
			break
		}
		if i > 100 {
			return nil, fmt.Errorf("corral up did not come up; see its log")
		}
		time.Sleep(100 * time.Millisecond)
	}
	token, err := os.ReadFile(filepath.Join(work, "data", "admin.token"))
	if err != nil {
		return nil, err
	}
	c := corral.New(url, strings.TrimSpace(string(token)))
	if err := importDir(ctx, c, cfg.Rootfs); err != nil {
		return nil, err
	}

	log.Info("measuring creation with and without networking", "rounds", cfg.TTIRounds)
	policy := &corral.NetworkPolicy{Allow: []string{"one", "two", "three"}}
	var withNet, without []time.Duration
	for range cfg.TTIRounds {
		for _, p := range []*corral.NetworkPolicy{policy, nil} {
			start := time.Now()
			sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:netbench", Network: p})
			if err != nil {
				return nil, err
			}
			if _, _, _, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
				return nil, err
			}
			d := time.Since(start)
			c.DeleteSandbox(ctx, sb.ID)
			if p != nil {
				withNet = append(withNet, d)
			} else {
				without = append(without, d)
			}
		}
	}
	res.TTINet, res.TTINone = summarise(withNet), summarise(without)
	res.TTIAddedMs = res.TTINet.P50 - res.TTINone.P50

	// Two CPUs, as many as the host's download below may use.
	sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:netbench", Network: policy, Limits: corral.Limits{CPUs: 2}})
	if err != nil {
		return nil, err
	}
	defer c.DeleteSandbox(ctx, sb.ID)
	log.Info("measuring policy updates", "n", cfg.Updates)
	var updates []time.Duration
	for i := range cfg.Updates {
		p := corral.NetworkPolicy{Allow: []string{"one", "two"}}
		if i%2 == 1 {
			p.Allow = []string{"three", "203.0.113.0/25:80/tcp"}
		}
		start := time.Now()
		if _, err := c.SetNetwork(ctx, sb.ID, p); err != nil {
			return nil, err
		}
		updates = append(updates, time.Since(start))
	}
	res.Update = summarise(updates)
	if _, err := c.SetNetwork(ctx, sb.ID, *policy); err != nil {
		return nil, err
	}

	log.Info("measuring download throughput", "mib", cfg.DownloadMiB, "n", cfg.Downloads)
	size := int64(cfg.DownloadMiB) << 20
	script := fmt.Sprintf(`printf 'GET /blob?size=%d HTTP/1.0\r\n\r\n' | nc 203.0.113.3 80 | wc -c`, size)
	var inSandbox, onHost []time.Duration
	for range cfg.Downloads {
		start := time.Now()
		out, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
		if err != nil || exit.Code != 0 {
			return nil, fmt.Errorf("download in the sandbox: %v %+v", err, exit)
		}
		inSandbox = append(inSandbox, time.Since(start))
		if n, _ := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); n < size {
			return nil, fmt.Errorf("download in the sandbox got %s bytes, want more than %d", out, size)
		}
		start = time.Now()
		if o, err := exec.CommandContext(ctx, "/bin/busybox", "sh", "-c", script).Output(); err != nil {
			return nil, fmt.Errorf("download on the host: %v", err)
		} else if n, _ := strconv.ParseInt(strings.TrimSpace(string(o)), 10, 64); n < size {
			return nil, fmt.Errorf("download on the host got %s bytes", o)
		}
		onHost = append(onHost, time.Since(start))
	}
	mbps := func(d []time.Duration) float64 { return float64(size) / 1e6 / (summarise(d).P50 / 1000) }
	res.SandboxMBps, res.HostMBps = mbps(inSandbox), mbps(onHost)
	res.ThroughputRatio = res.SandboxMBps / res.HostMBps
	return res, nil
}

// importDir publishes dir as base:netbench through `corral layer import`'s API (a tar stream).
func importDir(ctx context.Context, c *corral.Client, dir string) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	tar := exec.CommandContext(ctx, "tar", "-C", dir, "-cf", "-", ".")
	tar.Stdout = pw
	if err := tar.Start(); err != nil {
		return err
	}
	pw.Close()
	_, err = c.ImportLayer(ctx, "base", "netbench", corral.KindBase, pr)
	pr.Close()
	if werr := tar.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("tar %s: %w", dir, werr)
	}
	return err
}
