package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	corral "github.com/corral-dev/corral/sdk/go"
)

// E2BConfig sizes `corral bench e2b`: the real e2b SDK through Corral's E2B gateway against
// Corral's own API for the same operations, in one run.
type E2BConfig struct {
	Base     string // the template: a layer NAME:VERSION (default base:default)
	E2BURL   string // the gateway (corral up --e2b-listen), http://HOST:PORT
	SDKDir   string // where node_modules/e2b is (scripts/e2b-sdk.sh prints it)
	Script   string // test/e2b/bench.mjs
	Creates  int    // sandboxes created each way (default 10)
	Runs     int    // commands run('true') each way (default 100)
	Builds   int    // template builds each way, cold and cached (0: none)
	NodePath string // node (default: on PATH)
	APIKey   string // the Corral token the SDK presents (the client's)
}

// E2BResult is what `corral bench e2b` measured.
type E2BResult struct {
	Date   string  `json:"date"`
	Host   string  `json:"host"`
	Base   string  `json:"base"`
	SDK    E2BSide `json:"e2b_sdk"`
	Native E2BSide `json:"corral_api"`
	// Ratios are the SDK's p50 over Corral's own.
	CreateRatioP50 float64 `json:"create_to_first_run_ratio_p50"`
	RunRatioP50    float64 `json:"run_true_ratio_p50"`
	// LoginShellRatioP50 is the SDK's commands.run('true') p50 over Corral's exec of the command
	// line the gateway actually runs for it ("/bin/bash -l -c true", or /bin/sh where the
	// sandbox has no bash): the same work in the sandbox on both sides, so what remains is the
	// gateway and the SDK's side. RunRatioP50 (against Corral's exec of plain `true`) is the
	// one issue 24 sets its goal on.
	LoginShellRatioP50 float64 `json:"run_true_vs_login_shell_ratio_p50"`
	// LoginShellArgv is that command line.
	LoginShellArgv []string `json:"login_shell_argv"`
	// Where the rest goes, measured in the same run:
	//   - GatewayStart: envd's process.Process/Start of the SDK's command line sent to the
	//     gateway by a plain Go HTTP client (what run('true') asks, without Node.js), sampled
	//     in turn with Corral's exec of the same command line (GatewayRatioP50: the gateway's
	//     own share);
	//   - SDK.RunTrueFloor: the SDK's run('true') against an envd that answers Start at once
	//     (a start and an end event, no sandbox): Node.js and the SDK's Connect client alone.
	GatewayStart      Stats   `json:"gateway_start_go_client"`
	GatewayLoginShell Stats   `json:"gateway_start_baseline_login_shell"`
	GatewayRatioP50   float64 `json:"gateway_start_vs_login_shell_ratio_p50"`
	// The same for template builds (Template.build against POST /v1/builds of the Dockerfile
	// the gateway writes), with Builds set.
	BuildColdRatioP50   float64 `json:"build_cold_ratio_p50,omitempty"`
	BuildCachedRatioP50 float64 `json:"build_cached_ratio_p50,omitempty"`
}

// E2BSide is one way of doing the operations.
type E2BSide struct {
	CreateToFirstRun Stats `json:"create_to_first_run"`
	RunTrue          Stats `json:"run_true"`
	// RunLoginShell is Corral's exec of the gateway's command line for run('true'), sampled
	// in turn with RunTrue (Corral's side only).
	RunLoginShell Stats `json:"run_login_shell_true,omitzero"`
	// RunTrueFloor is run('true') against an envd that answers at once (the SDK's side only),
	// sampled in turn with RunTrue.
	RunTrueFloor Stats `json:"run_true_instant_envd,omitzero"`
	// A template of an ENV, a WORKDIR, a RUN and a COPY of a small file, built without the cache
	// (cold) and again unchanged (cached), to its end.
	BuildCold   Stats `json:"build_cold"`
	BuildCached Stats `json:"build_cached"`
}

// E2B runs the benchmark: the SDK side in node (the script), the native side here with c.
func E2B(ctx context.Context, c *corral.Client, cfg E2BConfig, log *slog.Logger) (*E2BResult, error) {
	if cfg.Base == "" {
		cfg.Base = "base:default"
	}
	if cfg.Creates == 0 {
		cfg.Creates = 10
	}
	if cfg.Runs == 0 {
		cfg.Runs = 100
	}
	if cfg.NodePath == "" {
		cfg.NodePath = "node"
	}
	if cfg.E2BURL == "" || cfg.SDKDir == "" || cfg.Script == "" {
		return nil, errdefs.Invalid("e2b", "--e2b-url, --sdk-dir and --script are required")
	}
	host, _ := os.Hostname()
	res := &E2BResult{Date: time.Now().UTC().Format(time.RFC3339), Host: host, Base: cfg.Base}

	log.Info("measuring Corral's own API", "creates", cfg.Creates, "runs", cfg.Runs)
	var create, run, shell []time.Duration
	var err error
	for i := range cfg.Creates {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: cfg.Base, Labels: map[string]string{"bench": "e2b-native"}})
		if err != nil {
			return nil, err
		}
		if _, _, _, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}}); err != nil {
			return nil, err
		}
		create = append(create, time.Since(t0))
		if i == 0 {
			// What the gateway runs for the SDK's run('true'): the SDK asks for a login bash,
			// and the gateway runs /bin/sh with the same arguments where there is no bash.
			res.LoginShellArgv = []string{"/bin/bash", "-l", "-c", "true"}
			if _, err := c.Stat(ctx, sb.ID, "/bin/bash"); corral.IsNotFound(err) {
				res.LoginShellArgv[0] = "/bin/sh"
			} else if err != nil {
				return nil, err
			}
			for range cfg.Runs {
				for _, argv := range [][]string{{"true"}, res.LoginShellArgv} {
					t1 := time.Now()
					if _, _, _, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: argv}); err != nil {
						return nil, err
					}
					if len(argv) == 1 {
						run = append(run, time.Since(t1))
					} else {
						shell = append(shell, time.Since(t1))
					}
				}
			}
		}
		if _, err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			return nil, err
		}
	}
	res.Native = E2BSide{CreateToFirstRun: summarise(create), RunTrue: summarise(run), RunLoginShell: summarise(shell)}
	if cfg.Builds > 0 {
		log.Info("measuring Corral's builds", "builds", cfg.Builds)
		if res.Native.BuildCold, res.Native.BuildCached, err = nativeBuilds(ctx, c, cfg); err != nil {
			return nil, err
		}
	}

	log.Info("measuring the e2b SDK through the gateway", "url", cfg.E2BURL)
	dir, err := os.MkdirTemp("", "corral-bench-e2b-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src, err := os.ReadFile(cfg.Script)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.mjs"), src, 0o644); err != nil {
		return nil, err
	}
	if err := os.Symlink(filepath.Join(cfg.SDKDir, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		return nil, err
	}
	floorURL, stopFloor, err := instantEnvd()
	if err != nil {
		return nil, err
	}
	defer stopFloor()
	cmd := exec.CommandContext(ctx, cfg.NodePath, "bench.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+cfg.E2BURL, "E2B_SANDBOX_URL="+cfg.E2BURL, "E2B_API_KEY="+cfg.APIKey, "BENCH_FLOOR_URL="+floorURL,
		"E2B_TEMPLATE="+cfg.Base, "BENCH_CREATES="+strconv.Itoa(cfg.Creates), "BENCH_RUNS="+strconv.Itoa(cfg.Runs),
		"BENCH_BUILDS="+strconv.Itoa(cfg.Builds))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("the e2b SDK side: %v: %s", err, stderr.String())
	}
	var sdk struct {
		Create      []float64 `json:"create_to_first_run_ms"`
		Run         []float64 `json:"run_true_ms"`
		RunFloor    []float64 `json:"run_true_floor_ms"`
		BuildCold   []float64 `json:"build_cold_ms"`
		BuildCached []float64 `json:"build_cached_ms"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &sdk); err != nil {
		return nil, fmt.Errorf("the e2b SDK side printed %q: %w", stdout.String(), err)
	}
	res.SDK = E2BSide{CreateToFirstRun: summarise(millis(sdk.Create)), RunTrue: summarise(millis(sdk.Run)), RunTrueFloor: summarise(millis(sdk.RunFloor))}
	res.SDK.BuildCold, res.SDK.BuildCached = summarise(millis(sdk.BuildCold)), summarise(millis(sdk.BuildCached))
	res.CreateRatioP50 = res.SDK.CreateToFirstRun.P50 / res.Native.CreateToFirstRun.P50
	res.RunRatioP50 = res.SDK.RunTrue.P50 / res.Native.RunTrue.P50
	res.LoginShellRatioP50 = res.SDK.RunTrue.P50 / res.Native.RunLoginShell.P50
	log.Info("measuring the gateway's Start with a Go client")
	if err := gatewayStarts(ctx, c, cfg, res); err != nil {
		return nil, err
	}
	if cfg.Builds > 0 {
		res.BuildColdRatioP50 = res.SDK.BuildCold.P50 / res.Native.BuildCold.P50
		res.BuildCachedRatioP50 = res.SDK.BuildCached.P50 / res.Native.BuildCached.P50
	}
	return res, nil
}

// instantEnvd serves envd's process.Process/Start on a loopback port of its own, answering
// every command at once with a start event, an exit 0 end event and the end of the stream, in
// one response: what the SDK's side costs with nothing behind it.
func instantEnvd() (string, func(), error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	var body bytes.Buffer
	for _, m := range []struct {
		flag byte
		json string
	}{{0, `{"event":{"start":{"pid":1}}}`}, {0, `{"event":{"end":{"exited":true,"status":"exit status 0"}}}`}, {2, `{}`}} {
		body.WriteByte(m.flag)
		binary.Write(&body, binary.BigEndian, uint32(len(m.json)))
		body.WriteString(m.json)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/process.Process/Start" {
			http.Error(w, "the instant envd serves process.Process/Start only", http.StatusNotFound)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write(body.Bytes())
	}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(lis)
	return "http://" + lis.Addr().String(), func() { srv.Close() }, nil
}

// gatewayStarts times envd's Start of the SDK's run('true') command line sent to the gateway by
// a Go HTTP client, in turn with Corral's exec of the command line the gateway runs for it, on a
// sandbox created through the gateway.
func gatewayStarts(ctx context.Context, c *corral.Client, cfg E2BConfig, res *E2BResult) error {
	hc := &http.Client{}
	do := func(method, url string, body []byte, hdr map[string]string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode/100 != 2 {
			err = fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, b)
		}
		return b, err
	}
	b, err := do("POST", cfg.E2BURL+"/sandboxes", []byte(`{"templateID":`+strconv.Quote(cfg.Base)+`}`),
		map[string]string{"X-API-Key": cfg.APIKey, "Content-Type": "application/json"})
	if err != nil {
		return fmt.Errorf("create a sandbox through the gateway: %w", err)
	}
	var sb struct {
		ID    string `json:"sandboxID"`
		Token string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(b, &sb); err != nil || sb.ID == "" {
		return fmt.Errorf("create a sandbox through the gateway: %q: %v", b, err)
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	// The SDK's request for run('true'), as the Connect protocol frames it.
	msg := []byte(`{"process":{"cmd":"/bin/bash","args":["-l","-c","true"]},"stdin":false}`)
	start := append([]byte{0}, binary.BigEndian.AppendUint32(nil, uint32(len(msg)))...)
	start = append(start, msg...)
	hdr := map[string]string{"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1",
		"Connect-Timeout-Ms": "60000", "Keepalive-Ping-Interval": "50",
		"E2b-Sandbox-Id": sb.ID, "E2b-Sandbox-Port": "49983", "X-Access-Token": sb.Token}
	var gw, native []time.Duration
	for range cfg.Runs {
		t0 := time.Now()
		b, err := do("POST", cfg.E2BURL+"/process.Process/Start", start, hdr)
		if err != nil {
			return err
		}
		if !bytes.Contains(b, []byte(`"exitCode"`)) && !bytes.Contains(b, []byte(`"exited":true`)) {
			return fmt.Errorf("gateway Start of true: no end event in %q", b)
		}
		gw = append(gw, time.Since(t0))
		t0 = time.Now()
		if _, _, _, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: res.LoginShellArgv}); err != nil {
			return err
		}
		native = append(native, time.Since(t0))
	}
	res.GatewayStart, res.GatewayLoginShell = summarise(gw), summarise(native)
	res.GatewayRatioP50 = res.GatewayStart.P50 / res.GatewayLoginShell.P50
	return nil
}

// benchDockerfile is what the gateway writes for bench.mjs's template (internal/e2b
// planTemplate), so that both ways build the same steps.
const benchDockerfile = `ENV GREETING="hi"
WORKDIR /app
RUN ["/bin/sh","-c","echo made \u003e /app/made.txt"]
COPY ["hello.txt","/app/hello.txt"]
`

// nativeBuilds builds benchDockerfile with Corral's own API: cfg.Builds times without the
// cache, then as many times unchanged, each to its end.
func nativeBuilds(ctx context.Context, c *corral.Client, cfg E2BConfig) (cold, cached Stats, err error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := []byte("hello from the bench\n")
	tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write(body)
	tw.Close()
	one := func(noCache bool) (time.Duration, error) {
		t0 := time.Now()
		b, err := c.StartBuild(ctx, corral.BuildRequest{Name: "bench-native-build", Dockerfile: "FROM " + cfg.Base + "\n" + benchDockerfile, NoCache: noCache},
			bytes.NewReader(buf.Bytes()))
		if err != nil {
			return 0, err
		}
		logs, err := c.BuildLogs(ctx, b.ID, true)
		if err != nil {
			return 0, err
		}
		defer logs.Close()
		for {
			ev, err := logs.Next()
			if err != nil {
				return 0, fmt.Errorf("follow build %s: %w", b.ID, err)
			}
			if ev.Type == "end" {
				if ev.Build == nil || ev.Build.State != corral.BuildSucceeded {
					return 0, fmt.Errorf("build %s did not succeed: %+v", b.ID, ev.Build)
				}
				return time.Since(t0), nil
			}
		}
	}
	var c0, c1 []time.Duration
	for range cfg.Builds {
		d, err := one(true)
		if err != nil {
			return cold, cached, err
		}
		c0 = append(c0, d)
	}
	for range cfg.Builds {
		d, err := one(false)
		if err != nil {
			return cold, cached, err
		}
		c1 = append(c1, d)
	}
	return summarise(c0), summarise(c1), nil
}

func millis(ms []float64) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = time.Duration(m * float64(time.Millisecond))
	}
	return out
}
