package rlimitenv

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

func TestEncodeDecode(t *testing.T) {
	in := []Limit{{"RLIMIT_NOFILE", 100, 200}, {"RLIMIT_NPROC", 50, 50}, {"RLIMIT_MSGQUEUE", 0, 8192}}
	env, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	name, val, _ := strings.Cut(env, "=")
	if name != EnvVar {
		t.Fatalf("Encode = %q", env)
	}
	out, err := Decode(val)
	if err != nil || len(out) != len(in) {
		t.Fatalf("Decode(%q) = %v, %v", val, out, err)
	}
	for i := range in {
		if out[i] != in[i] {
			t.Errorf("limit %d: %+v, want %+v", i, out[i], in[i])
		}
	}
	if _, err := Encode([]Limit{{"RLIMIT_CORE", 1, 1}}); err == nil {
		t.Error("Encode took a limit the agent does not set")
	}
	if _, err := Encode([]Limit{{"RLIMIT_NOFILE", 2, 1}}); err == nil {
		t.Error("Encode took soft over hard")
	}
	for _, bad := range []string{"", "RLIMIT_NOFILE", "RLIMIT_NOFILE=1", "RLIMIT_NOFILE=x:1", "RLIMIT_NOFILE=2:1",
		"RLIMIT_CORE=1:1", "RLIMIT_NOFILE=1:1,", "RLIMIT_NOFILE=-1:1"} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%q) took it", bad)
		}
	}
}

// TestApplyFromEnv runs this test binary again with the variable set: the child sets the limits
// on itself, drops the variable, and reports them as a program it starts sees them.
func TestApplyFromEnv(t *testing.T) {
	if os.Getenv("RLIMITENV_CHILD") == "1" {
		if err := ApplyFromEnv(); err != nil {
			os.Stdout.WriteString("error: " + err.Error())
			os.Exit(0)
		}
		out, err := exec.Command("sh", "-c", "ulimit -n; ulimit -Hn; env | grep -c "+EnvVar).CombinedOutput()
		if err != nil && len(out) == 0 {
			os.Stdout.WriteString("error: " + err.Error())
		}
		os.Stdout.Write(out)
		os.Exit(0)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Max < 64 {
		t.Skipf("RLIMIT_NOFILE here: %+v %v", lim, err)
	}
	run := func(val string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestApplyFromEnv$")
		cmd.Env = append(os.Environ(), "RLIMITENV_CHILD=1", EnvVar+"="+val)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v: %s", err, out)
		}
		return strings.Join(strings.Fields(string(out)), " ")
	}
	if got := run("RLIMIT_NOFILE=40:60"); got != "40 60 0" {
		t.Errorf("child with RLIMIT_NOFILE=40:60 reports %q, want \"40 60 0\" (soft, hard, variable seen)", got)
	}
	// A limit it cannot read is an error, not skipped: the agent must not run without it.
	if got := run("RLIMIT_NOFILE=1:x"); !strings.HasPrefix(got, "error:") {
		t.Errorf("bad value: %q", got)
	}
}
