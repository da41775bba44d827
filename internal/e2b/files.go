package e2b

import (
	"compress/gzip"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// envd's /files (docs/e2b-protocol.md §7). GET downloads one file. POST uploads one or more:
// as multipart/form-data, every part named "file" (others are skipped) going to the path query
// parameter when there is one (so, as in envd, a second part is then refused: one path twice),
// else to its own filename, read raw from Content-Disposition because it is a full path; or as
// an application/octet-stream body to the path query parameter (required). Content-Encoding:
// gzip is undone. Parts stream one by one into Corral's WriteFile, creating missing parent
// directories; what is created belongs to the request's user (the username query parameter,
// else an HTTP Basic user; none: root). One request carries at most maxUpload bytes, before and
// after decompression (413 past it; the file being written is left cut short, as envd leaves a
// failed write). Answers are envd's: 200 with [{"name", "type": "file", "path"}] for an
// upload, the bytes for a download, and {"code": <HTTP status>, "message"} otherwise: 400 for
// a bad request, a directory or a path that cannot be made, 401 for a user the sandbox does not
// have, 404 for a missing file, 507 when Corral says the disk or a quota is full.
//
// Differences from envd: a download is always sent whole and uncompressed (Range, conditional
// requests and Accept-Encoding are not honoured; all are optional in HTTP), with a
// Content-Length when it is at most 32 KiB (always for an empty file, which the SDK needs) and
// chunked otherwise; its Content-Type is guessed from the file's extension only
// (application/octet-stream when unknown), and no Content-Disposition is sent (envd sends none).
// Corral gives a created file to the user but does not change the owner of a file it replaces.

// maxUpload bounds the bytes of one upload request, before and after decompression (a
// variable for tests).
var maxUpload int64 = 1 << 30

// fileWritten is one element of an upload's answer.
type fileWritten struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// files serves envd's /files: GET downloads a file, POST uploads (multipart or octet-stream).
func (g *Gateway) files(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	var err error
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		err = g.download(w, r, t)
	case http.MethodPost:
		err = g.upload(w, r, t)
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		err = errorf(http.StatusMethodNotAllowed, "%s /files: use GET to download or POST to upload", r.Method)
	}
	if err != nil {
		writeFilesError(w, err)
	}
}

// writeFilesError answers err as envd's /files does: {"code": <status>, "message": ...}, the
// shape of the control plane's errors.
func writeFilesError(w http.ResponseWriter, err error) {
	ae, ok := errors.AsType[*apiError](err)
	if !ok {
		ae = filesFromRPC(err)
	}
	writeError(w, ae)
}

// filesFromRPC gives a Connect error (of the user lookup, of a Corral call mapped by fsError)
// its /files status. The SDK maps 400, 401, 404, 429, 502 and 507 onto its own errors.
func filesFromRPC(err error) *apiError {
	re := asRPCError(err)
	status := http.StatusInternalServerError
	switch re.Code {
	case codeNotFound:
		status = http.StatusNotFound
	case codeInvalidArgument, codeFailedPrecond, codeAlreadyExists:
		status = http.StatusBadRequest
	case codeUnauthenticated:
		status = http.StatusUnauthorized
	case codePermissionDenied:
		status = http.StatusForbidden
	case codeResourceExhaust:
		status = http.StatusTooManyRequests
	case codeUnavailable:
		status = http.StatusBadGateway
	case codeDeadlineExceeded, codeCanceled:
		status = http.StatusGatewayTimeout
	}
	return &apiError{status: status, msg: re.Message}
}

// filesUser is the user of a /files request: the username query parameter (what the SDK
// sends, and what a signature covers), else an HTTP Basic user.
func filesUser(r *http.Request, t *sandboxTarget) string {
	if u := r.URL.Query().Get("username"); u != "" {
		return u
	}
	return t.user
}

func (g *Gateway) download(w http.ResponseWriter, r *http.Request, t *sandboxTarget) error {
	c, err := g.fsCallFor(r.Context(), t, filesUser(r, t))
	if err != nil {
		return err
	}
	p, err := c.abs(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	rc, err := t.c.ReadFile(r.Context(), t.id, p)
	if err != nil {
		if ce, ok := errors.AsType[*corral.APIError](err); ok && ce.Status == http.StatusNotFound {
			return errorf(http.StatusNotFound, "path '%s' does not exist", p)
		}
		return fsError(err, "read "+p)
	}
	defer rc.Close()
	// Send a Content-Length when the whole file fits in the first read (the SDK reads an empty
	// file only from "Content-Length: 0"); stream larger ones.
	buf := make([]byte, 32<<10)
	n, rerr := io.ReadFull(rc, buf)
	whole := errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF)
	if rerr != nil && !whole {
		return fsError(rerr, "read "+p)
	}
	ctype := mime.TypeByExtension(path.Ext(p))
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ctype)
	if whole {
		w.Header().Set("Content-Length", strconv.Itoa(n))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	if _, err := w.Write(buf[:n]); err != nil || whole {
		return nil
	}
	if _, err := io.Copy(w, rc); err != nil {
		// The status is sent: all that is left is to cut the response short.
		g.log.Debug("e2b download cut short", "sandbox", t.id, "path", p, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

func (g *Gateway) upload(w http.ResponseWriter, r *http.Request, t *sandboxTarget) error {
	q := r.URL.Query()
	c, err := g.fsCallFor(r.Context(), t, filesUser(r, t))
	if err != nil {
		return err
	}
	budget := &uploadBudget{}
	var body io.Reader = &uploadLimit{r: http.MaxBytesReader(w, r.Body, maxUpload+1), budget: budget}
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return errorf(http.StatusBadRequest, "error decompressing request body: %v", err)
		}
		defer zr.Close()
		// Bound what the body expands to as well.
		body = &uploadLimit{r: zr, budget: budget}
	default:
		return errorf(http.StatusBadRequest, "unsupported Content-Encoding %q: send gzip or none", enc)
	}

	var dest *string
	if q.Has("path") {
		p := q.Get("path")
		dest = &p
	}
	mediaType, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []fileWritten
	switch {
	case mediaType == "application/octet-stream":
		if dest == nil {
			return errorf(http.StatusBadRequest, "path query parameter is required for raw body upload")
		}
		p, err := c.abs(*dest)
		if err != nil {
			return err
		}
		if err := g.writeUploaded(r, c, p, body, budget); err != nil {
			return err
		}
		out = append(out, fileWritten{Name: path.Base(p), Type: "file", Path: p})
	case strings.HasPrefix(mediaType, "multipart/"):
		if params["boundary"] == "" {
			return errorf(http.StatusBadRequest, "multipart body without a boundary")
		}
		out = []fileWritten{}
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextRawPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				if budget.hit {
					return errorf(http.StatusRequestEntityTooLarge, "upload larger than %d bytes", maxUpload)
				}
				return errorf(http.StatusBadRequest, "error reading form: %v", err)
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			// The filename is the destination path; Part.FileName would strip its directories.
			var target string
			if dest != nil {
				target = *dest
			} else {
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				target = dp["filename"]
				if target == "" {
					part.Close()
					return errorf(http.StatusBadRequest, "a part named file has no filename and there is no path query parameter: name the destination in either")
				}
			}
			p, err := c.abs(target)
			if err != nil {
				part.Close()
				return err
			}
			for _, f := range out {
				if f.Path == p {
					part.Close()
					return errorf(http.StatusBadRequest, "you cannot upload multiple files to the same path '%s' in one upload request, only the first specified file was uploaded", p)
				}
			}
			err = g.writeUploaded(r, c, p, part, budget)
			part.Close()
			if err != nil {
				return err
			}
			out = append(out, fileWritten{Name: path.Base(p), Type: "file", Path: p})
		}
	default:
		return errorf(http.StatusBadRequest, "unsupported content type: %q, expected multipart/form-data or application/octet-stream", r.Header.Get("Content-Type"))
	}
	if budget.hit {
		return errorf(http.StatusRequestEntityTooLarge, "upload larger than %d bytes", maxUpload)
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(out)
}

// writeUploaded writes one uploaded file, creating its parent directories as envd does.
func (g *Gateway) writeUploaded(r *http.Request, c *fsCall, p string, body io.Reader, budget *uploadBudget) error {
	_, err := c.t.c.WriteFile(r.Context(), c.t.id, p, body, corral.WriteFileOptions{Parents: true, User: c.owner})
	g.fsState().touched(c.t.id, p)
	switch {
	case err == nil:
		return nil
	case budget.hit:
		return errorf(http.StatusRequestEntityTooLarge, "upload larger than %d bytes: %s is cut short", maxUpload, p)
	}
	if ce, ok := errors.AsType[*corral.APIError](err); ok {
		switch ce.Status {
		case http.StatusConflict, http.StatusBadRequest:
			return errorf(http.StatusBadRequest, "write %s: %s", p, ce.Error())
		case http.StatusTooManyRequests, http.StatusRequestEntityTooLarge:
			// Corral's "exhausted" on a write is a full disk or quota: the SDK's NotEnoughSpaceError.
			return errorf(http.StatusInsufficientStorage, "write %s: %s", p, ce.Error())
		}
	}
	return fsError(err, "write "+p)
}

// uploadLimit fails a read once more than maxUpload bytes came through it, and records that
// in budget, which the limits of one request share (the body, and what it decompresses to).
type uploadLimit struct {
	r      io.Reader
	read   int64
	budget *uploadBudget
}

// uploadBudget records whether a request's upload passed maxUpload.
type uploadBudget struct{ hit bool }

// Read reads from the reader below, failing once the request is past maxUpload.
func (l *uploadLimit) Read(b []byte) (int, error) {
	if l.budget.hit {
		return 0, fmt.Errorf("upload larger than %d bytes", maxUpload)
	}
	n, err := l.r.Read(b)
	l.read += int64(n)
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok || l.read > maxUpload {
		l.budget.hit = true
		return 0, fmt.Errorf("upload larger than %d bytes", maxUpload)
	}
	return n, err
}

// checkFileSignature checks the signature of a signed /files URL (uploadUrl, downloadUrl):
// "v1_" and the unpadded standard base64 of SHA-256 over "path:operation:username:token" or,
// with an expiration, "path:operation:username:token:expiration" — path and username exactly
// as in the query (each empty when absent), operation "read" for GET and "write" for POST, the
// token the sandbox's envd access token (docs/e2b-protocol.md §7.2). An expiration in the past
// is refused.
func (g *Gateway) checkFileSignature(r *http.Request, sandboxID string) bool {
	q := r.URL.Query()
	var op string
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		op = "read"
	case http.MethodPost:
		op = "write"
	default:
		return false
	}
	parts := []string{q.Get("path"), op, q.Get("username"), g.EnvdAccessToken(sandboxID)}
	if q.Has("signature_expiration") {
		exp, err := strconv.ParseInt(q.Get("signature_expiration"), 10, 64)
		if err != nil || exp < time.Now().Unix() {
			return false
		}
		parts = append(parts, strconv.FormatInt(exp, 10))
	}
	want := fileSignature(parts)
	return subtle.ConstantTimeCompare([]byte(want), []byte(q.Get("signature"))) == 1
}

// fileSignature is the signature of the joined parts.
func fileSignature(parts []string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, ":")))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
