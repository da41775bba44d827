package e2b

// Template builds: the e2b SDK's template builder (Template().fromImage(...).runCmd(...)...,
// Template.build) onto Corral's Dockerfile builds (internal/build, POST /v1/builds). A build is
// four kinds of call:
//
//	POST /v3/templates                           request a build of template NAME: the gateway
//	                                             hands out a build ID and an upload area
//	GET  /templates/{t}/files/{hash}             per COPY step: whether its files are here, and
//	                                             a signed URL to PUT them to (a tar, gzipped or not)
//	POST /v2/templates/{t}/builds/{b}            the steps: translated into a Dockerfile whose
//	                                             context is the uploads, started as a Corral build
//	GET  /templates/{t}/builds/{b}/status        the Corral build's state and its log as E2B log
//	                                             entries, from logsOffset on
//
// The template ID is the template's name, which is the Corral environment the build saves, so
// Sandbox.create(NAME) starts it. The only state the gateway keeps is the pending builds (ID,
// caller, template, the Corral build once started) and the uploads, in memory and in a spool
// directory, for a bounded time; a restart of the gateway forgets them (as a restart of Corral
// forgets build jobs), never the environments and layers made.

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/build"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	corral "github.com/corral-dev/corral/sdk/go"
)

// Bounds of template builds.
const (
	// maxUploadBytes bounds one upload (compressed as sent, and again as it expands) and what one
	// caller's uploads hold together: Corral's bound on a build context.
	maxUploadBytes = build.DefaultMaxContextBytes
	// maxUploadEntries bounds the entries of one upload.
	maxUploadEntries = build.DefaultMaxContextEntries
	// uploadKeep is how long a template's uploads stay after their last use: a rebuild within it
	// finds its unchanged files present and uploads nothing.
	uploadKeep = time.Hour
	// buildKeep is how long the gateway remembers a build (its ID and Corral build).
	buildKeep = 24 * time.Hour
	// uploadURLTTL is how long a signed upload URL is good for.
	uploadURLTTL = time.Hour
	// maxPendingBuilds bounds the builds remembered; the oldest ended ones go first.
	maxPendingBuilds = 1024
)

// E2B's default resources of a template, which E2B's CLI (`e2b template create`) sends when the
// user gave none. Corral environments carry no resources, so these are accepted meaning "the
// default" (Corral's limits) and any other value is refused.
const (
	e2bDefaultCPUs     = 2
	e2bDefaultMemoryMB = 1024
)

// e2bBaseImage is the image the SDK's Template() starts from unless told otherwise
// (fromBaseImage); it stands for the template "base".
const e2bBaseImage = "e2bdev/base"

// templateNameRE is Corral's rule for environment names.
var templateNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?$`)

var filesHashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// templateBuilds holds the pending builds and the uploads. Lock order: mu only; file I/O is
// done outside it, with the results recorded under it.
type templateBuilds struct {
	root string // where the spool directory is made

	mu     sync.Mutex                // protects the fields below
	dir    string                    // the spool: one directory per upload area ("" until used)
	builds map[string]*templateBuild // by E2B build ID
	areas  map[string]*uploadArea    // by areaKey(owner, template)
}

// templateBuild is one requested build. Its fields are protected by templateBuilds.mu.
type templateBuild struct {
	id, template, owner string
	created             time.Time
	started             bool     // the trigger came (and is being or was served)
	corralID            string   // the Corral build, once started
	stepOf              []string // E2B step name of Corral step N at index N-1
}

// uploadArea holds the uploads of one caller's template. Its fields are protected by
// templateBuilds.mu.
type uploadArea struct {
	owner string
	dir   string
	used  time.Time
	bytes int64
	files map[string]int64 // files hash -> bytes of its normalized tar
}

func newTemplateBuilds(root string) *templateBuilds {
	if root == "" {
		root = os.TempDir()
	}
	return &templateBuilds{root: root, builds: map[string]*templateBuild{}, areas: map[string]*uploadArea{}}
}

// spoolLocked returns the spool directory, made on first use (a gateway that builds nothing
// leaves nothing behind). Preconditions: tb.mu is held.
func (tb *templateBuilds) spoolLocked() (string, error) {
	if tb.dir == "" {
		d, err := os.MkdirTemp(tb.root, "corral-e2b-templates-")
		if err != nil {
			return "", fmt.Errorf("make the template upload spool: %w", err)
		}
		tb.dir = d
	}
	return tb.dir, nil
}

// close removes the uploads.
func (tb *templateBuilds) close() {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.dir != "" {
		os.RemoveAll(tb.dir)
		tb.dir = ""
		clear(tb.areas)
	}
}

func areaKey(owner, template string) string { return owner + "/" + template }

// ownerOf names a caller by its API key without keeping the key: builds and uploads are only
// the business of the key that asked for them.
func ownerOf(key string) string {
	h := sha256.Sum256([]byte("corral e2b template owner\x00" + key))
	return hex.EncodeToString(h[:16])
}

// newBuild records a requested build of template by owner and makes sure its upload area
// exists. It prunes what has expired first.
func (tb *templateBuilds) newBuild(owner, template string) (*templateBuild, error) {
	now := time.Now()
	var drop []string
	tb.mu.Lock()
	defer func() {
		tb.mu.Unlock()
		for _, d := range drop {
			os.RemoveAll(d)
		}
	}()
	for id, b := range tb.builds {
		if now.Sub(b.created) > buildKeep {
			delete(tb.builds, id)
		}
	}
	for k, a := range tb.areas {
		if now.Sub(a.used) > uploadKeep {
			delete(tb.areas, k)
			drop = append(drop, a.dir)
		}
	}
	if len(tb.builds) >= maxPendingBuilds {
		// The oldest first; running ones too: their Corral builds go on, only the E2B view
		// of them is forgotten.
		var oldest *templateBuild
		for _, b := range tb.builds {
			if oldest == nil || b.created.Before(oldest.created) {
				oldest = b
			}
		}
		delete(tb.builds, oldest.id)
	}
	k := areaKey(owner, template)
	a := tb.areas[k]
	if a == nil {
		spool, err := tb.spoolLocked()
		if err != nil {
			return nil, err
		}
		d := filepath.Join(spool, owner+"-"+template)
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("make an upload area: %w", err)
		}
		a = &uploadArea{owner: owner, dir: d, files: map[string]int64{}}
		tb.areas[k] = a
	}
	a.used = now
	b := &templateBuild{id: newUUID(), template: template, owner: owner, created: now}
	tb.builds[b.id] = b
	return b, nil
}

// build returns owner's build id of template, or a 404.
func (tb *templateBuilds) build(owner, template, id string) (*templateBuild, error) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	b, ok := tb.builds[id]
	if !ok || b.owner != owner || b.template != template {
		return nil, errorf(http.StatusNotFound, "build %s of template %s not found (the gateway remembers builds for %s, and forgets them when it restarts)", id, template, buildKeep)
	}
	return b, nil
}

// heldLocked is the bytes owner's uploads hold, over all its templates. Preconditions: tb.mu
// is held.
func (tb *templateBuilds) heldLocked(owner string) int64 {
	var n int64
	for _, a := range tb.areas {
		if a.owner == owner {
			n += a.bytes
		}
	}
	return n
}

// area returns owner's upload area of template, or a 404.
func (tb *templateBuilds) area(owner, template string) (*uploadArea, error) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	a, ok := tb.areas[areaKey(owner, template)]
	if !ok {
		return nil, errorf(http.StatusNotFound, "template %s has no build waiting for files: request a build first (POST /v3/templates)", template)
	}
	a.used = time.Now()
	return a, nil
}

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// apiKey is the caller's key: the X-API-Key header the SDK sends, or an "Authorization: Bearer"
// header, its e2b_ alias turned into the Corral token.
func apiKey(r *http.Request) string {
	key := strings.TrimSpace(r.Header.Get("X-API-Key"))
	if key == "" {
		key, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		key = strings.TrimSpace(key)
	}
	if key == "" {
		return ""
	}
	return iam.CanonicalToken(key)
}

// requestBuild serves POST /v3/templates (TemplateBuildRequestV3): a build ID for template
// name, to which the SDK then uploads files and sends the steps.
func (g *Gateway) requestBuild(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	var in struct {
		Name          *string  `json:"name"`
		Alias         *string  `json:"alias"`
		Tags          []string `json:"tags"`
		CPUCount      *int     `json:"cpuCount"`
		MemoryMB      *int     `json:"memoryMB"`
		MinFreeDiskMB *int     `json:"minFreeDiskMb"`
		TeamID        *string  `json:"teamID"`
	}
	if err := decodeBody(r, &in, false); err != nil {
		return err
	}
	name, field := "", "name"
	switch {
	case in.Name != nil && in.Alias != nil && *in.Name != *in.Alias:
		return invalid("alias", "differs from name: give one")
	case in.Name != nil:
		name = *in.Name
	case in.Alias != nil:
		name, field = *in.Alias, "alias"
	}
	if err := checkTemplateName(field, name); err != nil {
		return err
	}
	switch {
	case len(in.Tags) > 0:
		return invalid("tags", "not supported: a Corral environment has one version, its last build")
	case in.CPUCount != nil && *in.CPUCount != e2bDefaultCPUs:
		return invalid("cpuCount", "%d not supported: Corral environments carry no resources, so sandboxes get Corral's limits; only E2B's default, %d, is accepted", *in.CPUCount, e2bDefaultCPUs)
	case in.MemoryMB != nil && *in.MemoryMB != e2bDefaultMemoryMB:
		return invalid("memoryMB", "%d not supported: Corral environments carry no resources, so sandboxes get Corral's limits; only E2B's default, %d, is accepted", *in.MemoryMB, e2bDefaultMemoryMB)
	case in.MinFreeDiskMB != nil:
		return invalid("minFreeDiskMb", "not supported: Corral environments carry no resources; sandboxes get Corral's limits")
	case in.TeamID != nil && *in.TeamID != "":
		return invalid("teamID", "not supported: the API key's Corral project owns the template")
	}
	// Nothing is kept for a key that cannot build: a build makes sandboxes, publishes layers
	// and saves an environment in the key's project.
	who, err := c.Whoami(r.Context())
	if err != nil {
		return err
	}
	if !slices.Contains(who.Permissions, corral.PermLayerPublish) || !slices.Contains(who.Permissions, corral.PermSandboxAdmin) {
		return errorf(http.StatusForbidden, "the API key may not build templates: a build needs %s and %s in the key's project", corral.PermLayerPublish, corral.PermSandboxAdmin)
	}
	b, err := g.tpl.newBuild(ownerOf(apiKey(r)), name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": name, "buildID": b.id, "names": []string{name}, "aliases": []string{name},
		"tags": []string{}, "public": false,
	})
	return nil
}

// checkTemplateName checks a template name: a Corral environment name.
func checkTemplateName(field, name string) error {
	if name == "" {
		return invalid(field, "required: the template's name (a Corral environment)")
	}
	if base, tag, ok := strings.Cut(name, ":"); ok {
		return invalid(field, "%q: tag %q not supported: a Corral environment has one version, its last build; build %q", name, tag, base)
	}
	if !templateNameRE.MatchString(name) {
		return invalid(field, "%q: a template is a Corral environment, whose name is 1-128 of lowercase letters, digits, '.', '_' or '-', alphanumeric at both ends", name)
	}
	return nil
}

// fileUploadLink serves GET /templates/{t}/files/{hash}: whether the files of a COPY step are
// here already, and where to PUT them.
func (g *Gateway) fileUploadLink(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	t, hash := r.PathValue("templateID"), r.PathValue("hash")
	if !filesHashRE.MatchString(hash) {
		return invalid("hash", "%q: want the SDK's files hash, 64 lowercase hex digits", hash)
	}
	owner := ownerOf(apiKey(r))
	a, err := g.tpl.area(owner, t)
	if err != nil {
		return err
	}
	g.tpl.mu.Lock()
	_, present := a.files[hash]
	g.tpl.mu.Unlock()
	// A URL even when present: forceUpload uploads whenever there is one.
	writeJSON(w, http.StatusOK, map[string]any{"present": present, "url": g.uploadURL(r, owner, t, hash, time.Now().Add(uploadURLTTL))})
	return nil
}

// uploadURL is the signed URL the SDK PUTs one COPY step's files to. It carries no API key (the
// SDK sends none there): the signature, over owner, template, hash and expiry, is the proof.
func (g *Gateway) uploadURL(r *http.Request, owner, template, hash string, expires time.Time) string {
	// The URL goes back to the caller as it reached the gateway (a TLS proxy in front says so).
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	exp := strconv.FormatInt(expires.Unix(), 10)
	q := url.Values{"owner": {owner}, "expires": {exp}, "signature": {g.uploadSignature(owner, template, hash, exp)}}
	return scheme + "://" + r.Host + "/templates/" + url.PathEscape(template) + "/files/" + hash + "/upload?" + q.Encode()
}

func (g *Gateway) uploadSignature(owner, template, hash, expires string) string {
	m := hmac.New(sha256.New, g.cfg.TokenKey)
	m.Write([]byte("corral e2b template upload\x00" + owner + "\x00" + template + "\x00" + hash + "\x00" + expires))
	return hex.EncodeToString(m.Sum(nil))
}

// uploadFiles serves PUT /templates/{t}/files/{hash}/upload: the tar of one COPY step's files
// (gzipped or not). Every entry is checked as in any build context (relative names, no "..",
// only files, directories and symbolic links, sizes bounded) and kept as a plain tar.
func (g *Gateway) uploadFiles(w http.ResponseWriter, r *http.Request) {
	if err := g.serveUpload(r); err != nil {
		ae, ok := errors.AsType[*apiError](err)
		if !ok {
			g.log.Error("keep a template upload", "path", r.URL.Path, "err", err)
			ae = errorf(http.StatusInternalServerError, "the upload could not be kept; see the gateway's log")
		}
		writeError(w, ae)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (g *Gateway) serveUpload(r *http.Request) error {
	t, hash := r.PathValue("templateID"), r.PathValue("hash")
	q := r.URL.Query()
	owner, exp, sig := q.Get("owner"), q.Get("expires"), q.Get("signature")
	if !hmac.Equal([]byte(sig), []byte(g.uploadSignature(owner, t, hash, exp))) {
		return errorf(http.StatusForbidden, "upload URL: bad signature (ask for a new one: GET /templates/%s/files/%s)", t, hash)
	}
	if n, err := strconv.ParseInt(exp, 10, 64); err != nil || time.Now().Unix() > n {
		return errorf(http.StatusForbidden, "upload URL: expired (ask for a new one: GET /templates/%s/files/%s)", t, hash)
	}
	a, err := g.tpl.area(owner, t)
	if err != nil {
		return err
	}
	body := bufio.NewReader(http.MaxBytesReader(nil, r.Body, maxUploadBytes))
	var src io.Reader = body
	if magic, _ := body.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(body)
		if err != nil {
			return invalid("upload", "read gzip: %v", err)
		}
		src = zr
	}
	bctx, err := build.ReadContext(src, a.dir, maxUploadBytes, maxUploadEntries)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok || errors.Is(err, errdefs.ErrTooLarge) {
			return errorf(http.StatusRequestEntityTooLarge, "upload of %s is larger than %d bytes", hash, int64(maxUploadBytes))
		}
		return invalid("upload", "%s", strings.TrimPrefix(err.Error(), "context: "))
	}
	defer bctx.Close()
	f, err := os.CreateTemp(a.dir, "upload-*")
	if err != nil {
		return fmt.Errorf("spool an upload: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := writeEntries(bctx, f); err != nil {
		return fmt.Errorf("spool an upload: %w", err)
	}
	size, _ := f.Seek(0, io.SeekCurrent)
	g.tpl.mu.Lock()
	defer g.tpl.mu.Unlock()
	old := a.files[hash]
	if held := g.tpl.heldLocked(owner); held-old+size > maxUploadBytes {
		return errorf(http.StatusRequestEntityTooLarge, "the caller's template uploads would hold more than %d bytes (they are kept for %s after their last use)", int64(maxUploadBytes), uploadKeep)
	}
	if err := os.Rename(f.Name(), filepath.Join(a.dir, hash+".tar")); err != nil {
		return fmt.Errorf("keep an upload: %w", err)
	}
	a.files[hash], a.bytes, a.used = size, a.bytes-old+size, time.Now()
	return nil
}

// writeEntries writes the entries of bctx to w as a plain tar owned by root.
func writeEntries(bctx *build.Context, w io.Writer) error {
	tw := tar.NewWriter(w)
	for _, e := range bctx.Entries() {
		h := e.Hdr
		h.Name = e.Name
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.PAXRecords, h.Xattrs = nil, nil //nolint:staticcheck // drop what the upload carried
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.CopyN(tw, bctx.Open(e), h.Size); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// templateStart is the body of POST /v2/templates/{t}/builds/{b} (TemplateBuildStartV2).
type templateStart struct {
	Force             *bool           `json:"force"`
	FromImage         *string         `json:"fromImage"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	FromTemplate      *string         `json:"fromTemplate"`
	ReadyCmd          *string         `json:"readyCmd"`
	StartCmd          *string         `json:"startCmd"`
	Steps             []templateStep  `json:"steps"`
}

// templateStep is one TemplateStep; the SDK sends its COPY options along.
type templateStep struct {
	Type            string   `json:"type"`
	Args            []string `json:"args"`
	FilesHash       string   `json:"filesHash"`
	Force           bool     `json:"force"`
	ForceUpload     *bool    `json:"forceUpload"`
	ResolveSymlinks *bool    `json:"resolveSymlinks"`
	Gzip            *bool    `json:"gzip"`
}

// triggerBuild serves POST /v2/templates/{t}/builds/{b}: the steps become a Dockerfile whose
// context is the uploads, built by Corral into environment t.
func (g *Gateway) triggerBuild(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	t, id := r.PathValue("templateID"), r.PathValue("buildID")
	owner := ownerOf(apiKey(r))
	b, err := g.tpl.build(owner, t, id)
	if err != nil {
		return err
	}
	var in templateStart
	if err := decodeBody(r, &in, false); err != nil {
		return err
	}
	switch {
	case len(in.FromImageRegistry) > 0 && string(in.FromImageRegistry) != "null":
		return invalid("fromImageRegistry", "not supported: Corral pulls from no registry; import the image (corral layer import) and name the layer in fromImage as NAME:TAG")
	case in.StartCmd != nil && *in.StartCmd != "":
		return invalid("startCmd", "not supported: Corral runs no start command when a sandbox starts (run it with commands.run after Sandbox.create)")
	case in.ReadyCmd != nil && *in.ReadyCmd != "":
		return invalid("readyCmd", "not supported: Corral runs no start command to wait for")
	}
	from, baseUser, err := g.templateFrom(r.Context(), c, in)
	if err != nil {
		return err
	}
	plan, err := planTemplate(in, from, baseUser)
	if err != nil {
		return err
	}
	a, err := g.tpl.area(owner, t)
	if err != nil {
		return err
	}
	g.tpl.mu.Lock()
	if b.started {
		g.tpl.mu.Unlock()
		return errorf(http.StatusConflict, "build %s of template %s was started already: request a new build", id, t)
	}
	for _, h := range plan.hashes {
		if _, ok := a.files[h.hash]; !ok {
			g.tpl.mu.Unlock()
			return invalid(h.field, "files %s were not uploaded: ask for an upload link (GET /templates/%s/files/%s) and PUT them", h.hash, t, h.hash)
		}
	}
	b.started, b.stepOf = true, plan.stepOf
	a.used = time.Now()
	g.tpl.mu.Unlock()

	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTemplateContext(a.dir, plan.hashes, pw)) }()
	started, err := c.StartBuild(r.Context(), corral.BuildRequest{Name: t, Dockerfile: plan.dockerfile, NoCache: plan.noCache}, pr)
	pr.CloseWithError(errors.New("the build request ended"))
	if err != nil {
		g.tpl.mu.Lock()
		b.started = false
		g.tpl.mu.Unlock()
		return buildError(err, plan.stepOf)
	}
	g.tpl.mu.Lock()
	b.corralID = started.ID
	g.tpl.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// templateFrom resolves the base of a build into a FROM reference (an environment or a layer
// NAME:VERSION) and the user its configuration runs as.
func (g *Gateway) templateFrom(ctx context.Context, c *corral.Client, in templateStart) (string, string, error) {
	img, tpl := "", ""
	if in.FromImage != nil {
		img = strings.TrimSpace(*in.FromImage)
	}
	if in.FromTemplate != nil {
		tpl = strings.TrimSpace(*in.FromTemplate)
	}
	var req corral.CreateRequest
	switch {
	case img != "" && tpl != "":
		return "", "", invalid("fromTemplate", "give fromImage or fromTemplate, not both")
	case img == "" && tpl == "":
		return "", "", invalid("fromImage", "required (or fromTemplate): the template's base")
	case tpl != "" || img == e2bBaseImage || strings.HasPrefix(img, e2bBaseImage+":"):
		field, id := "fromTemplate", tpl
		if tpl == "" {
			field, id = "fromImage", "base" // E2B's base image is its template "base"
		}
		if err := g.resolveTemplate(ctx, c, id, &req); err != nil {
			if ae, ok := errors.AsType[*apiError](err); ok && ae.status == http.StatusNotFound {
				return "", "", invalid(field, "%s", ae.msg)
			}
			return "", "", err
		}
	default:
		ref, err := imageLayerRef(img)
		if err != nil {
			return "", "", invalid("fromImage", "%v", err)
		}
		req.Base = ref
	}
	var base corral.LayerRef
	if req.Environment != "" {
		env, err := c.Environment(ctx, req.Environment)
		if err != nil {
			return "", "", templateError(req.Environment, err)
		}
		base = env.Base
	} else {
		base = req.Base
	}
	name, ver, _ := strings.Cut(base, ":")
	l, err := c.Layer(ctx, name, ver)
	if corral.IsNotFound(err) && req.Environment == "" {
		if tpl != "" {
			return "", "", invalid("fromTemplate", "%q: no layer %s here", tpl, base)
		}
		return "", "", invalid("fromImage", "%q: no layer %s here, and Corral pulls from no registry: import the image as that layer (corral layer import %s --kind base --docker-archive FILE, or --oci-archive, --dir) or build fromTemplate(<a Corral environment>)", img, base, base)
	} else if err != nil {
		return "", "", templateError(base, err)
	}
	user := ""
	if l.ImageConfig != nil {
		user = l.ImageConfig.User
	}
	if req.Environment != "" {
		return req.Environment, user, nil
	}
	return base, user, nil
}

// writeTemplateContext writes the build context: the entries of the uploads, in order; a name
// two uploads hold is written once (they come from one file context).
func writeTemplateContext(dir string, hashes []uploadRef, w io.Writer) error {
	tw := tar.NewWriter(w)
	seen := map[string]bool{}
	for _, h := range hashes {
		if err := func() error {
			f, err := os.Open(filepath.Join(dir, h.hash+".tar"))
			if err != nil {
				return err
			}
			defer f.Close()
			tr := tar.NewReader(f)
			for {
				hdr, err := tr.Next()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				if seen[hdr.Name] {
					continue
				}
				seen[hdr.Name] = true
				if err := tw.WriteHeader(hdr); err != nil {
					return err
				}
				if _, err := io.Copy(tw, tr); err != nil {
					return err
				}
			}
		}(); err != nil {
			return fmt.Errorf("write the build context from upload %s: %w", h.hash, err)
		}
	}
	return tw.Close()
}

var dockerfileLineRE = regexp.MustCompile(`^line (\d+): `)

// buildError names the E2B step a refused Corral build's Dockerfile line came from.
func buildError(err error, stepOf []string) error {
	ce, ok := errors.AsType[*corral.APIError](err)
	if !ok || ce.Status != http.StatusBadRequest {
		return err
	}
	msg := ce.Message
	if ce.Field != "" {
		msg = strings.TrimPrefix(msg, ce.Field+": ")
	}
	if m := dockerfileLineRE.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		if n >= 1 && n <= len(stepOf) {
			return &apiError{ce.Status, stepName(stepOf[n-1]) + ": " + strings.TrimPrefix(msg, m[0])}
		}
	}
	if ce.Field == "from" {
		return &apiError{ce.Status, "base: " + msg}
	}
	return &apiError{ce.Status, msg}
}

func stepName(s string) string {
	if s == "base" {
		return "the base (fromImage/fromTemplate)"
	}
	n, _ := strconv.Atoi(s)
	return fmt.Sprintf("steps[%d]", n-1)
}

// buildLogEntry is E2B's BuildLogEntry.
type buildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

var logLevels = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

// buildStatus serves GET /templates/{t}/builds/{b}/status: the Corral build's state (waiting
// before the steps came, building, ready, error) and its log from logsOffset on.
func (g *Gateway) buildStatus(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	t, id := r.PathValue("templateID"), r.PathValue("buildID")
	offset, limit, level := 0, -1, 0
	for k, v := range r.URL.Query() {
		val := v[len(v)-1]
		switch k {
		case "logsOffset":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return invalid("logsOffset", "%q: want a number ≥ 0", val)
			}
			offset = n
		case "limit":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return invalid("limit", "%q: want a number ≥ 0", val)
			}
			limit = n
		case "level":
			l, ok := logLevels[val]
			if !ok {
				return invalid("level", "%q: want debug, info, warn or error", val)
			}
			level = l
		default:
			return invalid(k, "unknown query parameter")
		}
	}
	b, err := g.tpl.build(ownerOf(apiKey(r)), t, id)
	if err != nil {
		return err
	}
	g.tpl.mu.Lock()
	corralID, stepOf := b.corralID, b.stepOf
	g.tpl.mu.Unlock()
	out := map[string]any{"buildID": id, "templateID": t, "status": "waiting", "logEntries": []buildLogEntry{}, "logs": []string{}}
	if corralID == "" {
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	logs, err := c.BuildLogs(r.Context(), corralID, false)
	if err != nil {
		return err
	}
	var events []corral.BuildEvent
	for {
		ev, err := logs.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			logs.Close()
			return err
		}
		events = append(events, ev)
	}
	logs.Close()
	bd, err := c.Build(r.Context(), corralID)
	if err != nil {
		return err
	}
	entries := buildLogEntries(events, *bd, stepOf)
	status, reason := statusOf(*bd, entries, stepOf)
	out["status"] = status
	if reason != nil {
		out["reason"] = reason
	}
	entries = entries[min(offset, len(entries)):]
	kept := []buildLogEntry{}
	for _, e := range entries {
		if logLevels[e.Level] >= level && (limit < 0 || len(kept) < limit) {
			kept = append(kept, e)
		}
	}
	out["logEntries"] = kept
	writeJSON(w, http.StatusOK, out)
	return nil
}

// logEntries turns a Corral build's events into E2B log entries, one per event, so that an
// offset into them stays valid while the build goes on.
func buildLogEntries(events []corral.BuildEvent, b corral.Build, stepOf []string) []buildLogEntry {
	out := make([]buildLogEntry, 0, len(events))
	at := b.CreatedAt
	for _, ev := range events {
		e := buildLogEntry{Timestamp: at, Level: "info", Step: stepAt(stepOf, ev.Step)}
		switch ev.Type {
		case "step":
			e.Message = ev.Text
		case "log":
			e.Message = strings.TrimRight(string(ev.Data), "\n")
		case "end":
			e.Step = ""
			if ev.Build != nil && ev.Build.FinishedAt != nil {
				e.Timestamp = *ev.Build.FinishedAt
			}
			if ev.Build != nil && ev.Build.State == corral.BuildFailed {
				e.Level, e.Message = "error", "Build failed: "+ev.Build.Error
			} else if ev.Build != nil {
				e.Message = "Build succeeded: environment " + ev.Build.Name + " (layer " + ev.Build.Layer + ")"
			}
		default:
			e.Message = ev.Text
		}
		out = append(out, e)
	}
	return out
}

// stepAt is the E2B step of Corral step n ("" when unknown).
func stepAt(stepOf []string, n int) string {
	if n >= 1 && n <= len(stepOf) {
		return stepOf[n-1]
	}
	return ""
}

// statusOf maps a Corral build's state onto E2B's; a failure's reason names the E2B step that
// failed ("base" for FROM, "finalize" after the last step) with that step's log entries.
func statusOf(b corral.Build, entries []buildLogEntry, stepOf []string) (string, map[string]any) {
	switch b.State {
	case corral.BuildSucceeded:
		return "ready", nil
	case corral.BuildFailed:
		step := "finalize"
		for _, s := range b.Steps {
			if s.State == "failed" {
				step = stepAt(stepOf, s.N)
			}
		}
		if step == "" {
			step = "finalize"
		}
		var related []buildLogEntry
		for _, e := range entries {
			if e.Step == step {
				related = append(related, e)
			}
		}
		if len(related) > 20 {
			related = related[len(related)-20:]
		}
		if related == nil {
			related = []buildLogEntry{}
		}
		return "error", map[string]any{"message": e2bStepError(b.Error, stepOf), "step": step, "logEntries": related}
	}
	return "building", nil
}

var corralStepRE = regexp.MustCompile(`^step (\d+) \(`)

// e2bStepError renames the Corral step a build error starts with ("step 4 (RUN ...): ") to the
// E2B step it came from ("steps[2] (RUN ...): ").
func e2bStepError(msg string, stepOf []string) string {
	m := corralStepRE.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	n, _ := strconv.Atoi(m[1])
	if n < 1 || n > len(stepOf) {
		return msg
	}
	return stepName(stepOf[n-1]) + " (" + strings.TrimPrefix(msg, m[0])
}

// templateExists serves GET /templates/aliases/{alias}: 200 when a Corral environment of that
// name is usable with the key, 404 when not.
func (g *Gateway) templateExists(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	alias := r.PathValue("alias")
	if _, err := c.Environment(r.Context(), alias); err != nil {
		if corral.IsNotFound(err) || corral.IsInvalid(err) {
			return errorf(http.StatusNotFound, "template %s not found", alias)
		}
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": alias, "public": false})
	return nil
}

// deleteTemplate serves DELETE /templates/{t}: the environment goes; its layers stay until
// `corral layer gc` (sandboxes may run on them).
func (g *Gateway) deleteTemplate(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	t := r.PathValue("templateID")
	if err := c.DeleteEnvironment(r.Context(), t); err != nil {
		if corral.IsNotFound(err) {
			return errorf(http.StatusNotFound, "template %s not found", t)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
