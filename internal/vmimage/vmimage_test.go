package vmimage

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
)

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

// TestScript: the embedded recipe is the one Build runs, and bash can parse it.
func TestScript(t *testing.T) {
	if !bytes.Contains(Script(), []byte("debootstrap")) || !bytes.Contains(Script(), []byte("corral-agent.service")) {
		t.Fatalf("the embedded build.sh is not the vm image recipe")
	}
	cmd := exec.Command("bash", "-n")
	cmd.Stdin = bytes.NewReader(Script())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bash -n build.sh: %v: %s", err, out)
	}
}

// TestTar: a disk image becomes a layer of one file, named by its format; images QEMU could not
// use alone are refused before anything is sent.
func TestTar(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "d.img")
	os.WriteFile(raw, nil, 0o644)
	os.Truncate(raw, 2<<20)
	if f, err := Detect(raw); err != nil || f != "raw" {
		t.Fatalf("Detect(raw) = %q, %v", f, err)
	}
	r, size, err := Tar(raw, "raw")
	if err != nil || size != 2<<20 {
		t.Fatalf("Tar: %d, %v", size, err)
	}
	tr := tar.NewReader(r)
	h, err := tr.Next()
	if err != nil || h.Name != "disk.raw" || h.Size != 2<<20 {
		t.Fatalf("first entry: %+v, %v", h, err)
	}
	io.Copy(io.Discard, tr)
	if _, err := tr.Next(); err != io.EOF {
		t.Fatalf("more than one entry: %v", err)
	}
	r.Close()
	if _, err := exec.LookPath("qemu-img"); err == nil {
		q := filepath.Join(dir, "d.qcow2")
		exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", raw, q).Run()
		if f, _ := Detect(q); f != "qcow2" {
			t.Fatalf("Detect(qcow2) = %q", f)
		}
		if _, _, err := Tar(q, "qcow2"); err == nil || !strings.Contains(err.Error(), "backing file") {
			t.Fatalf("Tar of a qcow2 with a backing file: %v", err)
		}
	}
}
