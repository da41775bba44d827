package cli

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
)

func TestParseVolumeMount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want corral.VolumeMount
		bad  bool
	}{
		{in: "data:/data", want: corral.VolumeMount{Name: "data", Path: "/data"}},
		{in: "data:/data:ro", want: corral.VolumeMount{Name: "data", Path: "/data", ReadOnly: true}},
		{in: "data:/data:rw", want: corral.VolumeMount{Name: "data", Path: "/data"}},
		{in: "data", bad: true}, {in: ":/data", bad: true}, {in: "data:data", bad: true}, {in: "data:/d:x", bad: true},
	} {
		got, err := parseVolumeMount(tc.in)
		if tc.bad != (err != nil) || !tc.bad && got != tc.want {
			t.Errorf("parseVolumeMount(%q) = %+v, %v", tc.in, got, err)
		}
	}
}

func TestExtractOCIArchive(t *testing.T) {
	write := func(entries map[string]string) string {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for name, body := range entries {
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
			tw.Write([]byte(body))
		}
		tw.Close()
		p := filepath.Join(t.TempDir(), "a.tar")
		os.WriteFile(p, buf.Bytes(), 0o644)
		return p
	}
	dir, err := extractOCIArchive(write(map[string]string{"oci-layout": "{}", "index.json": "{}", "blobs/sha256/ab": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if b, err := os.ReadFile(filepath.Join(dir, "blobs/sha256/ab")); err != nil || string(b) != "x" {
		t.Fatalf("blob: %q %v", b, err)
	}
	for _, bad := range []map[string]string{
		{"index.json": "{}", "../escape": "x"},
		{"index.json": "{}", "blobs/../../escape": "x"},
		{"index.json": "{}", "etc/passwd": "x"},
		{"oci-layout": "{}"},
	} {
		if dir, err := extractOCIArchive(write(bad)); err == nil {
			os.RemoveAll(dir)
			t.Errorf("accepted %v", bad)
		}
	}
}
