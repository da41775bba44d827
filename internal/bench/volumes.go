package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// VolumesConfig sizes a volume I/O benchmark run.
type VolumesConfig struct {
	Base string // the base layer NAME:VERSION
	// FIO is a toolkit layer NAME:VERSION holding fio at /opt/fio/fio with its libraries
	// (scripts/fio-toolkit.sh makes one from the host's fio).
	FIO      string
	Runtimes []string // runc, gvisor, microvm (the microvm tier)
	SizeMiB  int      // the file each job writes and reads
	Seconds  int      // the random-write job's run time
}

// VolumesResult compares, per runtime, fio in a volume against fio in the sandbox's writable
// layer, in the same sandbox, one after the other.
type VolumesResult struct {
	Date     string                  `json:"date"`
	SizeMiB  int                     `json:"size_mib"`
	Runtimes map[string]VolumeFigure `json:"runtimes"`
}

// VolumeFigure is one runtime's measure; each job's figure in the volume and in the writable
// layer, and the ratio volume / writable layer.
type VolumeFigure struct {
	Jobs  map[string]VolumeJob `json:"jobs"`
	Error string               `json:"error,omitempty"`
}

// VolumeJob is one fio job in both places.
type VolumeJob struct {
	Volume, Layer FIOFigure
	// RatioBW is the volume's bandwidth over the writable layer's; RatioP50 and RatioP99 the
	// same for completion latency (above 1: the volume is slower).
	RatioBW, RatioP50, RatioP99 float64
}

// FIOFigure is what one fio job reports.
type FIOFigure struct {
	MiBps float64 `json:"mib_per_s"`
	IOPS  float64 `json:"iops"`
	P50us float64 `json:"clat_p50_us"`
	P99us float64 `json:"clat_p99_us"`
}

// volumeJobs are the fio jobs: sequential write (1 MiB blocks, fsync at the end), sequential
// read of it (O_DIRECT, so neither page cache answers), random 4 KiB writes (O_DIRECT, one at a
// time).
var volumeJobs = []struct{ name, args string }{
	{"seq-write", "--rw=write --bs=1M --end_fsync=1"},
	{"seq-read", "--rw=read --bs=1M --direct=1"},
	{"rand-write-4k", "--rw=randwrite --bs=4k --direct=1 --time_based --runtime=%d"},
}

// Volumes measures sequential and random I/O in a volume against the sandbox's writable layer.
func Volumes(ctx context.Context, c *corral.Client, cfg VolumesConfig, log *slog.Logger) (*VolumesResult, error) {
	res := &VolumesResult{Date: time.Now().UTC().Format(time.RFC3339), SizeMiB: cfg.SizeMiB, Runtimes: map[string]VolumeFigure{}}
	for _, rt := range cfg.Runtimes {
		name := fmt.Sprintf("bench-%s-%d", rt, time.Now().UnixNano()%1e6)
		if _, err := c.CreateVolume(ctx, corral.CreateVolumeRequest{Name: name, SizeBytes: int64(cfg.SizeMiB)*3<<20 + 64<<20}); err != nil {
			return nil, fmt.Errorf("create a volume: %w", err)
		}
		fig, err := volumeRuntime(ctx, c, cfg, rt, name, log)
		if err != nil {
			log.Error("runtime not measured", "runtime", rt, "err", err)
			fig.Error = err.Error()
		}
		res.Runtimes[rt] = fig
		if err := c.DeleteVolume(context.WithoutCancel(ctx), "", name); err != nil {
			log.Error("delete the benchmark's volume", "volume", name, "err", err)
		}
	}
	return res, nil
}

func volumeRuntime(ctx context.Context, c *corral.Client, cfg VolumesConfig, rt, vol string, log *slog.Logger) (VolumeFigure, error) {
	fig := VolumeFigure{Jobs: map[string]VolumeJob{}}
	req := corral.CreateRequest{Base: cfg.Base, Toolkits: []string{cfg.FIO}, Runtime: rt,
		Limits:  corral.Limits{MemoryBytes: 1 << 30, DiskBytes: int64(cfg.SizeMiB)*3<<20 + 256<<20},
		Volumes: []corral.VolumeMount{{Name: vol, Path: "/vol"}}}
	if rt == "microvm" {
		req.Runtime, req.Tier = "", "microvm"
	}
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		return fig, fmt.Errorf("create a %s sandbox: %w", rt, err)
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	for _, job := range volumeJobs {
		args := job.args
		if strings.Contains(args, "%d") {
			args = fmt.Sprintf(args, cfg.Seconds)
		}
		var j VolumeJob
		for _, where := range []struct {
			dir string
			dst *FIOFigure
		}{{"/vol", &j.Volume}, {"/root/fio", &j.Layer}} {
			log.Info("fio", "runtime", rt, "job", job.name, "dir", where.dir)
			cmd := fmt.Sprintf("mkdir -p %s && /opt/fio/lib/ld-linux-x86-64.so.2 --library-path /opt/fio/lib /opt/fio/fio --name=%s --directory=%s --filename=bench --size=%dM --ioengine=psync --output-format=json %s",
				where.dir, job.name, where.dir, cfg.SizeMiB, args)
			out, errOut, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{cmd}, Shell: true, Timeout: "10m"})
			if err != nil || exit == nil || exit.Code != 0 {
				return fig, fmt.Errorf("fio %s in %s: %v %+v: %s", job.name, where.dir, err, exit, errOut)
			}
			f, err := parseFIO(out)
			if err != nil {
				return fig, fmt.Errorf("fio %s in %s: %w", job.name, where.dir, err)
			}
			*where.dst = f
		}
		j.RatioBW = ratio(j.Volume.MiBps, j.Layer.MiBps)
		j.RatioP50 = ratio(j.Volume.P50us, j.Layer.P50us)
		j.RatioP99 = ratio(j.Volume.P99us, j.Layer.P99us)
		fig.Jobs[job.name] = j
	}
	return fig, nil
}

// parseFIO reads fio's JSON output: the one job's read or write side, whichever did the I/O.
func parseFIO(out []byte) (FIOFigure, error) {
	type side struct {
		BW   float64 `json:"bw_bytes"`
		IOPS float64 `json:"iops"`
		Clat struct {
			Percentile map[string]float64 `json:"percentile"`
		} `json:"clat_ns"`
	}
	var r struct {
		Jobs []struct {
			Read  side `json:"read"`
			Write side `json:"write"`
		} `json:"jobs"`
	}
	// fio may print notes before the JSON.
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Jobs) != 1 {
		return FIOFigure{}, fmt.Errorf("parse fio output: %v: %.200s", err, out)
	}
	s := r.Jobs[0].Write
	if r.Jobs[0].Read.BW > s.BW {
		s = r.Jobs[0].Read
	}
	return FIOFigure{MiBps: s.BW / (1 << 20), IOPS: s.IOPS, P50us: s.Clat.Percentile["50.000000"] / 1e3, P99us: s.Clat.Percentile["99.000000"] / 1e3}, nil
}
