package edge

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	corral "github.com/corral-dev/corral/sdk/go"
)

func TestCheckCodeRequest(t *testing.T) {
	ok := []corral.CodeRequest{{Code: "1"}, {Code: "", Language: "python"}, {Code: "1", Context: "ab-12_x", Timeout: "90s"},
		{Code: "1", Env: map[string]string{"A_1": "x"}}}
	for _, req := range ok {
		if _, err := checkCodeRequest(&req); err != nil {
			t.Errorf("checkCodeRequest(%+v): %v", req, err)
		}
	}
	bad := []corral.CodeRequest{{Language: "r"}, {Context: "a", Language: "python"}, {Context: "a/b"}, {Context: strings.Repeat("a", 65)},
		{Timeout: "0s"}, {Timeout: "2h"}, {Timeout: "x"}, {Env: map[string]string{"1A": "x"}}, {Env: map[string]string{"A=B": ""}}}
	for _, req := range bad {
		if _, err := checkCodeRequest(&req); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("checkCodeRequest(%+v): %v, want invalid", req, err)
		}
	}
}

func TestReadLine(t *testing.T) {
	long := strings.Repeat("x", 200)
	br := bufio.NewReaderSize(strings.NewReader("a\n"+long+"\n"+long+long+"\nlast"), 16)
	for _, want := range []string{"a\n", long + "\n"} {
		if got, err := readLine(br, 300); err != nil || string(got) != want {
			t.Fatalf("readLine = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := readLine(br, 300); !errors.Is(err, errLineTooLong) {
		t.Errorf("a line over the limit: %v", err)
	}
	br = bufio.NewReader(strings.NewReader("last"))
	if got, err := readLine(br, 300); err != nil || string(got) != "last" {
		t.Errorf("an unterminated last line: %q, %v", got, err)
	}
	if _, err := readLine(br, 300); err != io.EOF {
		t.Errorf("at the end: %v, want EOF", err)
	}
}

func TestValidateServices(t *testing.T) {
	good := []corral.Service{{Name: "code-interpreter", Command: []string{"/usr/bin/python3", "s.py"}, Env: []string{"A=1"}, Port: 49999}}
	if err := validateServices(good); err != nil {
		t.Error(err)
	}
	for _, s := range []corral.Service{{Name: "Bad", Command: []string{"x"}}, {Name: "x"}, {Name: "x", Command: []string{"x"}, Port: 70000},
		{Name: "x", Command: []string{"x"}, Env: []string{"=x"}}} {
		if err := validateServices([]corral.Service{s}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("validateServices(%+v): %v, want invalid", s, err)
		}
	}
	if err := validateServices(make([]corral.Service, maxServices+1)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("too many services: %v", err)
	}
}
