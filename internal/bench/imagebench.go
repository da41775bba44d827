package bench

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/corral-dev/corral/internal/oci"
	corral "github.com/corral-dev/corral/sdk/go"
)

// ImportConfig sizes the image import benchmark.
type ImportConfig struct {
	MiB    int // image size (random, incompressible content)
	Layers int
}

// ImportResult is what one image import measured.
type ImportResult struct {
	Date   string  `json:"date"`
	MiB    int     `json:"image_mib"`
	Layers int     `json:"layers"`
	Ms     float64 `json:"import_ms"`
	MBps   float64 `json:"mb_per_s"`
	// WrittenPerByte is what `corral up` wrote to disk (/proc/<pid>/io write_bytes) per byte of
	// image content imported.
	WrittenPerByte float64 `json:"disk_bytes_written_per_imported_byte"`
}

// Import serves a random multi-layer image from go-containerregistry's in-memory registry on
// loopback and imports it through the CLI's path (pull, flatten, upload), timing it and reading
// how much corral up wrote to disk meanwhile.
func Import(ctx context.Context, c *corral.Client, cfg ImportConfig, lg *slog.Logger) (*ImportResult, error) {
	res := &ImportResult{Date: time.Now().UTC().Format(time.RFC3339), MiB: cfg.MiB, Layers: cfg.Layers}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, err
	}
	pid := findCorralUp(info.DataDir)
	if pid == 0 {
		return nil, fmt.Errorf("no corral up with data dir %s on this host", info.DataDir)
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	img, err := random.Image(int64(cfg.MiB)<<20/int64(cfg.Layers), int64(cfg.Layers))
	if err != nil {
		return nil, err
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	ref := strings.TrimPrefix(reg.URL, "http://") + "/bench/image:1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return nil, err
	}
	if err := remote.Write(r, img); err != nil {
		return nil, err
	}
	var content int64
	layers, _ := img.Layers()
	for _, l := range layers {
		if n, err := l.Size(); err == nil {
			content += n
		}
	}
	lg.Info("importing a random image from a loopback registry", "mib", cfg.MiB, "layers", cfg.Layers)
	before := writeBytes(pid)
	start := time.Now()
	rd, err := oci.Open(ctx, oci.Source{Image: ref}, oci.Options{Insecure: true})
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(rd.Flatten(ctx, pw)) }()
	_, err = c.ImportImageLayer(ctx, "bench-image", fmt.Sprintf("b%d", time.Now().UnixNano()), corral.KindBase, nil, pr)
	pr.Close()
	if err != nil {
		return nil, err
	}
	d := time.Since(start)
	res.Ms = ms(d)
	res.MBps = float64(content) / 1e6 / d.Seconds()
	if after := writeBytes(pid); after >= before && content > 0 {
		res.WrittenPerByte = float64(after-before) / float64(content)
	}
	return res, nil
}

// writeBytes reads write_bytes of /proc/<pid>/io (bytes this process caused to be written to
// storage).
func writeBytes(pid int64) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
