//go:build linux

package blobstore

import (
	"errors"
	"path"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

func TestDocComments(t *testing.T) {
	doccheck.Exported(t, ".")
}

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want string // "dir:<path>" or "s3:<bucket>|<prefix>|<endpoint>|<region>|<key file>"; "" for an error
	}{
		{"dir:/var/lib/corral/blobs", "dir:/var/lib/corral/blobs"},
		{"dir:/var/lib/corral/blobs/", "dir:/var/lib/corral/blobs"},
		{"/mnt/shared//blobs/./x/..", "dir:/mnt/shared/blobs"},
		{"dir:relative", ""},
		{"dir:", ""},
		{"relative", ""},
		{"", ""},
		{"file:///x", ""},
		{"s3://bucket", "s3:bucket||https://s3.amazonaws.com|us-east-1|"},
		{"s3://my.bucket-1/a/b/?endpoint=http://127.0.0.1:9000&region=eu-west-1&access_key_file=/etc/k",
			"s3:my.bucket-1|a/b|http://127.0.0.1:9000|eu-west-1|/etc/k"},
		{"s3://bucket?endpoint=https://minio.example:443/", "s3:bucket||https://minio.example:443|us-east-1|"},
		{"s3://bucket/a//b", ""},
		{"s3://bucket/../x", ""},
		{"s3://bucket/a b", ""},
		{"s3://Bucket", ""},
		{"s3://b", ""},
		{"s3://bucket:9000", ""},
		{"s3://", ""},
		{"s3://user:secret@bucket", ""},
		{"s3://bucket#frag", ""},
		{"s3://bucket?endpoint=ftp://host", ""},
		{"s3://bucket?endpoint=http://host/path", ""},
		{"s3://bucket?endpoint=http://user:pw@host", ""},
		{"s3://bucket?endpoint=127.0.0.1:9000", ""},
		{"s3://bucket?region=", ""},
		{"s3://bucket?access_key_file=relative", ""},
		{"s3://bucket?region=a&region=b", ""},
		{"s3://bucket?secret=x", ""},
		{"s3://bucket?%zz", ""},
	} {
		got, err := parseSpec(tc.spec)
		if tc.want == "" {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("parseSpec(%q) = %+v, %v; want ErrInvalid", tc.spec, got, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseSpec(%q): %v", tc.spec, err)
			continue
		}
		if s := specString(got); s != tc.want {
			t.Errorf("parseSpec(%q) = %s, want %s", tc.spec, s, tc.want)
		}
	}
}

func specString(s storeSpec) string {
	if s.s3 == nil {
		return "dir:" + s.dir
	}
	return "s3:" + strings.Join([]string{s.s3.bucket, s.s3.prefix, s.s3.endpoint.String(), s.s3.region, s.s3.accessKeyFile}, "|")
}

func TestSpecErrorsHideSecrets(t *testing.T) {
	for _, spec := range []string{"s3://AKIA:topsecret@bucket", "s3://AKIA:topsecret@bu cket/x", "s3://AKIA:topsecret@bucket?%zz"} {
		_, err := parseSpec(spec)
		if err == nil || strings.Contains(err.Error(), "topsecret") {
			t.Errorf("parseSpec(%q) error = %v, want an error without the secret", spec, err)
		}
	}
}

func TestCheckKeyAccepts(t *testing.T) {
	for _, key := range []string{
		"a", "A-Z_a-z.0-9:x", "layers/sha256:0123abcd/image.erofs", ".hidden", "a/.tmp", "..a", "a..", "...",
		".tmpx", strings.Repeat("a", MaxSegmentLen), strings.Repeat("a/", MaxKeyLen/2-1) + "ab",
	} {
		if err := CheckKey(key); err != nil {
			t.Errorf("CheckKey(%q): %v", key, err)
		}
	}
	for _, key := range badKeys {
		if err := CheckKey(key); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("CheckKey(%q) = %v, want ErrInvalid", key, err)
		}
	}
}

// FuzzCheckKey checks that every key CheckKey accepts is a clean relative path that stays below
// the directory backend's root and is not its staging directory.
func FuzzCheckKey(f *testing.F) {
	for _, k := range append([]string{"a", "a/b", "layers/sha256:00/x.erofs", ".tmp/x", "a/../b"}, badKeys...) {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if CheckKey(key) != nil {
			return
		}
		if len(key) > MaxKeyLen || path.Clean(key) != key || path.IsAbs(key) || strings.HasPrefix(key, "../") ||
			key == tmpDir || strings.HasPrefix(key, tmpDir+"/") {
			t.Errorf("CheckKey accepted %q", key)
		}
		if checkPrefix(key) != nil || len(key) < MaxKeyLen && checkPrefix(key+"/") != nil {
			t.Errorf("checkPrefix refused the valid key %q as a prefix", key)
		}
	})
}

// FuzzParseSpec checks that parseSpec never panics, that what it accepts is well formed, and that
// it never repeats a password from the spec in an error.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"dir:/x", "/x/y", "s3://bucket/p?endpoint=http://127.0.0.1:9000&region=r&access_key_file=/k", "s3://u:pw@bucket", "s3://"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		got, err := parseSpec(spec)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("parseSpec(%q) error %v is not ErrInvalid", spec, err)
			}
			if u, p, ok := strings.Cut(strings.TrimPrefix(spec, "s3://"), "@"); ok && strings.HasPrefix(spec, "s3://") {
				if _, pw, ok := strings.Cut(u, ":"); ok && len(pw) > 3 && !strings.ContainsAny(u, "/?#") && strings.Contains(err.Error(), pw) && !strings.Contains(p, pw) {
					t.Errorf("parseSpec(%q) error shows the password: %v", spec, err)
				}
			}
			return
		}
		switch {
		case got.s3 == nil && (!path.IsAbs(got.dir) || path.Clean(got.dir) != got.dir):
			t.Errorf("parseSpec(%q) accepted directory %q", spec, got.dir)
		case got.s3 != nil && got.s3.prefix != "" && CheckKey(got.s3.prefix) != nil:
			t.Errorf("parseSpec(%q) accepted prefix %q", spec, got.s3.prefix)
		case got.s3 != nil && got.s3.endpoint.Host == "":
			t.Errorf("parseSpec(%q) accepted an endpoint without a host", spec)
		}
	})
}
