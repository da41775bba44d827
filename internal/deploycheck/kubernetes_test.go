package deploycheck

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const kubernetesDir = "../../deploy/kubernetes"

// kubeconform runs scripts/kubeconform.sh on args. Its first run on a machine builds kubeconform
// and the Kubernetes schemas (both through the Go module proxy) and caches them: about 30 s on two
// cores with a warm Go build cache, up to two minutes with a cold one. Later runs take half a
// second.
func kubeconform(t *testing.T, args ...string) (string, error) {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("scripts/kubeconform.sh needs the go command on PATH (it builds kubeconform and the schemas)")
	}
	start := time.Now()
	out, err := exec.Command("bash", append([]string{"../../scripts/kubeconform.sh"}, args...)...).CombinedOutput()
	t.Logf("scripts/kubeconform.sh took %v", time.Since(start).Round(time.Millisecond))
	return string(out), err
}

// TestKubernetesManifests validates deploy/kubernetes against the Kubernetes API's schemas in
// strict mode (an unknown field is an error), and checks that every resource was validated.
func TestKubernetesManifests(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the first run on a machine builds kubeconform and the Kubernetes schemas")
	}
	out, err := kubeconform(t)
	if err != nil {
		t.Fatalf("scripts/kubeconform.sh: %v\n%s", err, out)
	}
	files, resources := manifests(t)
	want := fmt.Sprintf("Summary: %d resources found in %d files - Valid: %d, Invalid: 0, Errors: 0, Skipped: 0",
		resources, files, resources)
	if !strings.Contains(out, want) {
		t.Errorf("scripts/kubeconform.sh did not validate every resource of deploy/kubernetes:\n%s\nwant the line %q", out, want)
	}
}

// TestKubeconformRejects proves the validator refuses what the API server would: each broken
// manifest is a valid one with one fault, and the valid one passes in the same run.
func TestKubeconformRejects(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the first run on a machine builds kubeconform and the Kubernetes schemas")
	}
	const valid = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: probe
spec:
  replicas: 2
  selector:
    matchLabels: {app: probe}
  template:
    metadata:
      labels: {app: probe}
    spec:
      containers:
        - name: probe
          image: corral
          resources:
            requests: {cpu: 1, memory: 1Gi}
`
	tests := []struct {
		name      string
		from, to  string // the fault: from replaced by to
		wantInOut []string
	}{
		{"valid", "", "", nil},
		{"unknown-field", "          image: corral\n", "          image: corral\n          imagePullPolice: Always\n",
			[]string{"/spec/template/spec/containers/0", "imagePullPolice"}},
		{"wrong-type", "  replicas: 2\n", "  replicas: two\n", []string{"/spec/replicas", "string"}},
		{"missing-required", "        - name: probe\n          image: corral\n", "        - image: corral\n",
			[]string{"/spec/template/spec/containers/0", "name"}},
		{"duplicate-key", "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n", []string{`key "replicas" already set`}},
		{"unknown-version", "apiVersion: apps/v1\n", "apiVersion: apps/v1beta7\n", []string{"could not find schema"}},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		m := strings.Replace(valid, tt.from, tt.to, 1)
		if tt.from != "" && m == valid {
			t.Fatalf("%s: %q is not in the manifest", tt.name, tt.from)
		}
		if err := os.WriteFile(filepath.Join(dir, tt.name+".yaml"), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := kubeconform(t, dir)
	if err == nil {
		t.Errorf("scripts/kubeconform.sh accepted broken manifests:\n%s", out)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// kubeconform's report on this file: a line naming it and any indented lines after it
			// (a YAML error's details). Valid files get none.
			var report string
			in := false
			for _, line := range strings.Split(out, "\n") {
				switch {
				case strings.HasPrefix(line, filepath.Join(dir, tt.name+".yaml")+" "):
					report, in = line, true
				case in && strings.HasPrefix(line, " "):
					report += "\n" + line
				default:
					in = false
				}
			}
			switch {
			case tt.wantInOut == nil && report != "":
				t.Errorf("the valid manifest was refused: %s", report)
			case tt.wantInOut != nil && report == "":
				t.Errorf("not refused; the output was:\n%s", out)
			}
			for _, w := range tt.wantInOut {
				if report != "" && !strings.Contains(report, w) {
					t.Errorf("refused, but the reason does not mention %q: %s", w, report)
				}
			}
		})
	}
}

// TestKustomization checks that kustomization.yaml applies every manifest of deploy/kubernetes
// but the Secret templates (which would reset real Secrets at each apply), and names no other.
func TestKustomization(t *testing.T) {
	f, err := os.Open(filepath.Join(kubernetesDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "resources:":
			in = true
		case in && strings.HasPrefix(line, "  - "):
			got = append(got, strings.TrimPrefix(line, "  - "))
		case in && !strings.HasPrefix(line, " "):
			in = false
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	paths, _ := filepath.Glob(filepath.Join(kubernetesDir, "*.yaml"))
	var want []string
	for _, p := range paths {
		if b := filepath.Base(p); b != "kustomization.yaml" && b != "secrets.yaml" {
			want = append(want, b)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("kustomization.yaml resources = %v, want %v", got, want)
	}
}

// manifests counts the files scripts/kubeconform.sh validates in deploy/kubernetes and the
// resources (YAML documents with a kind) in them.
func manifests(t *testing.T) (files, resources int) {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(kubernetesDir, "*.yaml"))
	for _, p := range paths {
		if filepath.Base(p) == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files++
		for _, doc := range strings.Split(string(b), "\n---\n") {
			if strings.HasPrefix(doc, "kind: ") || strings.Contains(doc, "\nkind: ") {
				resources++
			}
		}
	}
	if files == 0 {
		t.Fatal("no manifests under deploy/kubernetes")
	}
	return files, resources
}
