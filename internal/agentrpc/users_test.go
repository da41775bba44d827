package agentrpc

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

const testPasswd = `root:x:0:0:root:/root:/bin/bash
# a comment
daemon:x:1:1::/usr/sbin:/usr/sbin/nologin
alice:x:1000:1000:Alice:/home/alice:/bin/sh
bob:x:1001:100::/home/bob:/bin/sh
+nis::::::
broken:x:notanumber:1::/:/bin/sh
short:x:5
`

const testGroup = `root:x:0:
users:x:100:alice
alice:x:1000:
dev:x:2000:alice,bob
docker:x:2001: bob , alice
`

func writeEtc(t testing.TB, passwd, group string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "group"), []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestResolveUser(t *testing.T) {
	db := &userDB{dir: writeEtc(t, testPasswd, testGroup)}
	tests := []struct {
		spec    string
		want    identity
		wantErr error
	}{
		{"", identity{name: "root", uid: 0, gid: 0, groups: []uint32{0}, home: "/root"}, nil},
		{"root", identity{name: "root", uid: 0, gid: 0, groups: []uint32{0}, home: "/root"}, nil},
		{"alice", identity{name: "alice", uid: 1000, gid: 1000, groups: []uint32{1000, 100, 2000, 2001}, home: "/home/alice"}, nil},
		{"1001", identity{name: "bob", uid: 1001, gid: 100, groups: []uint32{100, 2000, 2001}, home: "/home/bob"}, nil},
		{"bob:dev", identity{name: "bob", uid: 1001, gid: 2000, groups: []uint32{2000, 2001}, home: "/home/bob"}, nil},
		{"alice:5", identity{name: "alice", uid: 1000, gid: 5, groups: []uint32{5, 100, 2000, 2001}, home: "/home/alice"}, nil},
		{"4242", identity{uid: 4242, gid: 0, groups: []uint32{0}, home: "/"}, nil},
		{"4242:4343", identity{uid: 4242, gid: 4343, groups: []uint32{4343}, home: "/"}, nil},
		{"mallory", identity{}, errdefs.ErrInvalid},
		{"alice:nogroup", identity{}, errdefs.ErrInvalid},
		{":100", identity{}, errdefs.ErrInvalid},
		{"alice:", identity{}, errdefs.ErrInvalid},
		{"4294967295", identity{}, errdefs.ErrInvalid}, // -1 is no uid: looked up as a name
		{"broken", identity{}, errdefs.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := db.resolve(tt.spec)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestUserDBReloadsChangedFiles(t *testing.T) {
	dir := writeEtc(t, testPasswd, testGroup)
	db := &userDB{dir: dir}
	if _, err := db.resolve("carol"); err == nil {
		t.Fatal("carol resolved before she was added")
	}
	if err := os.WriteFile(filepath.Join(dir, "passwd"), []byte(testPasswd+"carol:x:1500:1500::/home/carol:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := db.resolve("carol")
	if err != nil || got.uid != 1500 {
		t.Errorf("after adding carol: %+v, %v", got, err)
	}
}

func TestUserDBMissingFiles(t *testing.T) {
	db := &userDB{dir: t.TempDir()}
	got, err := db.resolve("")
	if err != nil || got.uid != 0 || got.home != "/" {
		t.Errorf("root without /etc/passwd: %+v, %v", got, err)
	}
}

// FuzzParseUserDB parses arbitrary passwd and group files (the sandbox's root can write them) and
// resolves a spec against them: no panic, and a resolved identity is consistent.
func FuzzParseUserDB(f *testing.F) {
	f.Add([]byte(testPasswd), []byte(testGroup), "alice")
	f.Add([]byte("a:b:1:2:c:d:e\n"), []byte("g:x:3:a,a,a\n"), "a:g")
	f.Fuzz(func(t *testing.T, passwd, group []byte, spec string) {
		pw := parsePasswd(bytes.NewReader(passwd))
		gr := parseGroup(bytes.NewReader(group))
		for _, e := range pw {
			if e.name == "" || e.uid == 1<<32-1 {
				t.Fatalf("bad entry %+v", e)
			}
		}
		u, g, hasGroup := strings.Cut(spec, ":")
		id, err := resolveIn(pw, gr, "/etc", u, g, hasGroup)
		if err == nil && (len(id.groups) == 0 || id.groups[0] != id.gid) {
			t.Fatalf("resolved %q to %+v", spec, id)
		}
	})
}
