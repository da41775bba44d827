//go:build linux

package blobstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/corral-dev/corral/internal/errdefs"
)

// s3PartSize is the part size of multipart uploads, and so the memory one Put of an object larger
// than it (or of unknown size) holds. 10,000 parts of it allow objects up to 160 GiB.
const s3PartSize = 16 << 20

// s3Store is the S3 backend. The minio client is safe for concurrent use and retries failed
// requests by itself, each call bounded by the caller's ctx.
type s3Store struct {
	client   *minio.Client
	bucket   string
	prefix   string // "" or ends with "/"
	location string // for String
}

// openS3 resolves the credentials, connects and checks that the bucket exists.
func openS3(ctx context.Context, spec s3Spec) (*s3Store, error) {
	location := "s3://" + spec.bucket
	if spec.prefix != "" {
		location += "/" + spec.prefix
	}
	location += "?endpoint=" + spec.endpoint.String() + "&region=" + spec.region
	creds, err := s3Credentials(spec.accessKeyFile)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", location, err)
	}
	client, err := minio.New(spec.endpoint.Host, &minio.Options{
		Creds:        creds,
		Secure:       spec.endpoint.Scheme == "https",
		Region:       spec.region,
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, errdefs.Invalid("store", "%s: %v", location, err)
	}
	s := &s3Store{client: client, bucket: spec.bucket, location: location}
	if spec.prefix != "" {
		s.prefix = spec.prefix + "/"
	}
	ok, err := client.BucketExists(ctx, spec.bucket)
	if err == nil && !ok {
		// A HEAD answer has no body and so no error code, and some servers (versitygw) answer an
		// unknown access key with 404: a listing's error tells a missing bucket from refused
		// credentials.
		err = s.probeList(ctx)
		if err == nil {
			return s, nil // listable after all
		}
		if minio.ToErrorResponse(err).Code == minio.NoSuchBucket {
			return nil, errdefs.NotFound("open %s: bucket %q does not exist at %s; create it first", location, spec.bucket, spec.endpoint)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", location, s.classify(err))
	}
	return s, nil
}

// probeList lists at most one object of the store and returns the error, if any.
func (s *s3Store) probeList(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for oi := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix, MaxKeys: 1}) {
		return oi.Err
	}
	return ctx.Err()
}

// s3Credentials reads access_key_file when given and the AWS_* environment variables otherwise.
func s3Credentials(file string) (*credentials.Credentials, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, errdefs.Invalid("access_key_file", "read %s: %v", file, err)
		}
		lines := strings.Split(strings.TrimRight(string(b), "\r\n"), "\n")
		if len(lines) != 2 {
			return nil, errdefs.Invalid("access_key_file", "%s has %d lines; want two, the access key and then the secret", file, len(lines))
		}
		access, secret := strings.TrimSpace(lines[0]), strings.TrimSpace(lines[1])
		if access == "" || secret == "" {
			return nil, errdefs.Invalid("access_key_file", "%s has an empty line; want the access key and then the secret", file)
		}
		return credentials.NewStaticV4(access, secret, ""), nil
	}
	access, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	if access == "" || secret == "" {
		return nil, errdefs.Invalid("credentials", "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or add access_key_file=/path to the spec")
	}
	return credentials.NewStaticV4(access, secret, os.Getenv("AWS_SESSION_TOKEN")), nil
}

// String returns the spec without credentials or key file.
func (s *s3Store) String() string { return s.location }

// classify adds an error kind to an error from the S3 client.
func (s *s3Store) classify(err error) error {
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case minio.AccessDenied, minio.InvalidAccessKeyID, minio.SignatureDoesNotMatch, "InvalidToken", "ExpiredToken",
		"XAdminUserNotFound": // versitygw's answer to an unknown access key
		return fmt.Errorf("%s refused the credentials or denied access to bucket %q (%s); check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or access_key_file: %w",
			s.endpoint(), s.bucket, resp.Code, errdefs.ErrDenied)
	case minio.NoSuchBucket:
		return errdefs.NotFound("bucket %q at %s", s.bucket, s.endpoint())
	case "SlowDown", "ServiceUnavailable", minio.InternalError:
		return s.transient("the blob store is busy or failing", fmt.Errorf("%s: %w", s.endpoint(), err))
	}
	if resp.StatusCode >= http.StatusInternalServerError {
		return s.transient("the blob store is failing", fmt.Errorf("%s: %w", s.endpoint(), err))
	}
	var netErr *net.OpError
	if errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) {
		// The client retries refused connections until ctx ends, so an endpoint that is down
		// mostly shows as the deadline.
		return s.transient("the blob store did not answer", fmt.Errorf("no answer from %s (is it up and reachable?): %w", s.endpoint(), err))
	}
	return err
}

// transient is an outage of the blob store: a retryable ErrUnavailable (503 with Retry-After)
// whose message names no internal address; cause, with the endpoint, goes to the server's log.
func (s *s3Store) transient(what string, cause error) error {
	return errdefs.RetryableCause(fmt.Errorf("%s; retry: %w", what, errdefs.ErrUnavailable), cause, 2*time.Second)
}

func (s *s3Store) endpoint() string { return s.client.EndpointURL().String() }

// Put implements Store.Put with a single PUT or a multipart upload.
func (s *s3Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	src := newPutReader(ctx, r, size)
	if size == 0 {
		// The HTTP client sends no body for a zero length and would never read r.
		if err := src.checkEnd(); err != io.EOF {
			return fmt.Errorf("put %s: %w", key, err)
		}
	}
	// A single PUT up to s3PartSize, multipart above it or for an unknown size; both commit the
	// object only once the server has all of it. A failed multipart upload is aborted by minio-go.
	_, err := s.client.PutObject(ctx, s.bucket, s.prefix+key, src, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		PartSize:    s3PartSize,
	})
	if err != nil {
		switch {
		case src.err != nil:
			err = src.err
		case ctx.Err() != nil:
			// Cancelled after the whole body was sent: the server may still commit the object.
			err = ctx.Err()
		default:
			err = s.classify(err)
		}
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// Get implements Store.Get with one GET; ctx bounds the whole read.
func (s *s3Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	body, err := s.get(ctx, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.objectErr("get", key, err)
	}
	return body, nil
}

// get sends one GET and returns its body. One request streams one version of the object, where
// minio.Object would stat first and fail a read that raced a replacing Put. The error is the
// client's, unclassified.
func (s *s3Store) get(ctx context.Context, key string, opts minio.GetObjectOptions) (io.ReadCloser, error) {
	body, _, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, s.prefix+key, opts)
	return body, err
}

// objectErr reports an error about key.
func (s *s3Store) objectErr(op, key string, err error) error {
	if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
		return errdefs.NotFound("%s %s in %s", op, key, s)
	}
	return fmt.Errorf("%s %s: %w", op, key, s.classify(err))
}

// GetRange implements Store.GetRange with a ranged GET.
func (s *s3Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	if err := checkRange(off, length); err != nil {
		return nil, err
	}
	if length == 0 {
		// HTTP cannot ask for zero bytes; check that the key exists and read nothing.
		if _, err := s.Stat(ctx, key); err != nil {
			return nil, err
		}
		return io.NopCloser(strings.NewReader("")), nil
	}
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+length-1); err != nil {
		return nil, errdefs.Invalid("range", "offset %d, length %d: %v", off, length, err)
	}
	body, err := s.get(ctx, key, opts)
	if resp := minio.ToErrorResponse(err); resp.Code == minio.InvalidRange || resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
		// The object exists and off is at or past its end.
		return io.NopCloser(strings.NewReader("")), nil
	}
	if err != nil {
		return nil, s.objectErr("get", key, err)
	}
	return body, nil
}

// Stat implements Store.Stat with a HEAD.
func (s *s3Store) Stat(ctx context.Context, key string) (Info, error) {
	if err := CheckKey(key); err != nil {
		return Info{}, err
	}
	oi, err := s.client.StatObject(ctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, s.objectErr("stat", key, err)
	}
	return Info{Key: key, Size: oi.Size, ModTime: oi.LastModified}, nil
}

// Delete implements Store.Delete.
func (s *s3Store) Delete(ctx context.Context, key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	// S3 answers a DELETE of a missing key with success, as the contract wants.
	if err := s.client.RemoveObject(ctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("delete %s: %w", key, s.classify(err))
	}
	return nil
}

// List implements Store.List with a recursive listing of the prefix.
func (s *s3Store) List(ctx context.Context, prefix string) ([]Info, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	// Cancelling stops the client's listing goroutine when we return early.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out []Info
	for oi := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if oi.Err != nil {
			return nil, fmt.Errorf("list %q: %w", prefix, s.classify(oi.Err))
		}
		key := strings.TrimPrefix(oi.Key, s.prefix)
		// Objects that other tools put in the bucket under names no key can have are not ours.
		if CheckKey(key) != nil {
			continue
		}
		out = append(out, Info{Key: key, Size: oi.Size, ModTime: oi.LastModified})
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	// S3 lists in UTF-8 binary order, which for our ASCII keys is already key order; some
	// S3-compatible servers walk directories instead.
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}
