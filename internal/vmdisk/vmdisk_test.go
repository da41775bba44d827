package vmdisk

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestFileNames: the layer's file names are the API's.
func TestFileNames(t *testing.T) {
	if FileName(QCOW2) != corral.VMDiskQCOW2 || FileName(Raw) != corral.VMDiskRaw {
		t.Errorf("FileName: %q, %q; the API says %q, %q", FileName(QCOW2), FileName(Raw), corral.VMDiskQCOW2, corral.VMDiskRaw)
	}
}

func qemuImg(t *testing.T, args ...string) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("needs qemu-img (Debian's qemu-utils; scripts/setup.sh installs it)")
	}
	if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v: %s", args, err, out)
	}
}

func TestInspect(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", good, "64M")
	info, err := Inspect(good, QCOW2)
	if err != nil || info.VirtualBytes != 64<<20 || info.Format != QCOW2 {
		t.Fatalf("Inspect(good) = %+v, %v", info, err)
	}
	// A backing file is a host path QEMU would open: refused.
	backed := filepath.Join(dir, "backed.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", good, backed)
	if _, err := Inspect(backed, QCOW2); err == nil || !strings.Contains(err.Error(), "backing file") {
		t.Errorf("Inspect(backed) = %v; want the backing file refused", err)
	}
	// So is an external data file.
	ext := filepath.Join(dir, "ext.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+filepath.Join(dir, "ext.data"), ext, "64M")
	if _, err := Inspect(ext, QCOW2); err == nil || !strings.Contains(err.Error(), "external data file") {
		t.Errorf("Inspect(external data file) = %v", err)
	}
	// Encrypted images are refused.
	// (crypt_method 2, LUKS, set in a copy of the header: creating one needs a PBKDF benchmark.)
	b, _ := os.ReadFile(good)
	b[35] = 2
	enc := filepath.Join(dir, "enc.qcow2")
	os.WriteFile(enc, b, 0o644)
	if _, err := Inspect(enc, QCOW2); err == nil || !strings.Contains(err.Error(), "encrypted") {
		t.Errorf("Inspect(encrypted) accepted it")
	}
	// A raw file is its own size, in whole sectors.
	raw := filepath.Join(dir, "disk.raw")
	os.WriteFile(raw, nil, 0o644)
	os.Truncate(raw, 8<<20)
	if info, err := Inspect(raw, Raw); err != nil || info.VirtualBytes != 8<<20 {
		t.Errorf("Inspect(raw) = %+v, %v", info, err)
	}
	os.Truncate(raw, 8<<20+1)
	if _, err := Inspect(raw, Raw); err == nil {
		t.Errorf("Inspect accepted a raw disk of a partial sector")
	}
	if _, err := Inspect(raw, QCOW2); err == nil || !strings.Contains(err.Error(), "qcow2") {
		t.Errorf("Inspect(raw as qcow2) = %v", err)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("QFI\xfb"), 0o644)
	if _, err := Inspect(short, QCOW2); err == nil {
		t.Errorf("Inspect accepted a truncated header")
	}
	if _, err := Inspect(good, "vmdk"); err == nil {
		t.Errorf("Inspect accepted the format vmdk")
	}
}

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }
