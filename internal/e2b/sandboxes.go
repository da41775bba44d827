package e2b

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// The lifecycle routes: create, get, kill, timeouts, pause, resume and connect, network.

func (g *Gateway) createV2(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	return g.create(w, r, c, g.cfg.DefaultTimeout)
}

func (g *Gateway) createV1(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	return g.create(w, r, c, v1DefaultTimeout)
}

// create serves POST /v2/sandboxes and POST /sandboxes; def is the lifetime when the body gives
// no timeout.
func (g *Gateway) create(w http.ResponseWriter, r *http.Request, c *corral.Client, def time.Duration) error {
	var in newSandbox
	if err := decodeBody(r, &in, false); err != nil {
		return err
	}
	req, opt, err := translateCreate(in)
	if err != nil {
		return err
	}
	if opt.timeout == 0 {
		opt.timeout = def
	}
	req.TTL = opt.timeout.String()
	if err := g.resolveTemplate(r.Context(), c, opt.templateID, &req); err != nil {
		return err
	}
	sb, err := c.CreateSandbox(r.Context(), req)
	if err != nil {
		explicitNet := in.AllowInternetAccess != nil || in.Network != nil
		return createError(err, opt.templateID, explicitNet)
	}
	writeJSON(w, http.StatusCreated, g.sandboxJSON(r, sb))
	return nil
}

// resolveTemplate points req at what an E2B template ID names:
//  1. a Corral environment of that name (IDs without ':');
//  2. for "base" (the SDK's default) when no environment is called so, Config.DefaultTemplate;
//  3. a layer NAME:VERSION (IDs with ':', as environment names cannot contain one), used as the
//     sandbox's base.
//
// Anything else is a 404 saying what the ID may be.
func (g *Gateway) resolveTemplate(ctx context.Context, c *corral.Client, id string, req *corral.CreateRequest) error {
	ref := id
	if !strings.Contains(id, ":") {
		_, err := c.Environment(ctx, id)
		switch {
		case err == nil:
			req.Environment = id
			return nil
		case corral.IsNotFound(err), corral.IsInvalid(err):
		default:
			return templateError(id, err)
		}
		if id != "base" {
			return errorf(http.StatusNotFound, "template %q not found: a template is the name of a Corral environment (corral env create %s --base NAME:VERSION) or a layer NAME:VERSION", id, id)
		}
		ref = g.cfg.DefaultTemplate
		if !strings.Contains(ref, ":") {
			req.Environment = ref
			return nil
		}
	}
	req.Base = ref
	return nil
}

// templateError is a Corral error about a template's environment or layers.
func templateError(id string, err error) error {
	ce, ok := errors.AsType[*corral.APIError](err)
	if !ok || ce.Status >= 500 || ce.Status == http.StatusUnauthorized {
		return err
	}
	msg := ce.Message
	if ce.Field != "" {
		msg = strings.TrimPrefix(msg, ce.Field+": ")
	}
	return errorf(ce.Status, "template %q: %s", id, msg)
}

// createError renames the fields of a refused Corral create to the E2B fields they came from.
func createError(err error, templateID string, explicitNet bool) error {
	ce, ok := errors.AsType[*corral.APIError](err)
	if !ok || ce.Field == "" {
		return err
	}
	msg := strings.TrimPrefix(ce.Message, ce.Field+": ")
	f := ce.Field
	switch {
	case f == "ttl":
		return &apiError{ce.Status, "timeout: " + msg}
	case f == "labels" || strings.HasPrefix(f, "labels."):
		return &apiError{ce.Status, "metadata" + strings.TrimPrefix(f, "labels") + ": " + msg}
	case f == "env" || strings.HasPrefix(f, "env["):
		return &apiError{ce.Status, "envVars: " + msg}
	case f == "network" || strings.HasPrefix(f, "network."):
		if !explicitNet {
			return &apiError{ce.Status, "allow_internet_access: E2B sandboxes reach the internet unless told otherwise, and Corral refused that: " + msg +
				" (create with allowInternetAccess: false for a sandbox without network)"}
		}
		f = strings.Replace(strings.Replace(f, "network.allow", "network.allowOut", 1), "network.deny", "network.denyOut", 1)
		return &apiError{ce.Status, f + ": " + msg}
	case f == "base" || f == "environment" || f == "workspace" || strings.HasPrefix(f, "toolkits") || f == "from_snapshot":
		return templateError(templateID, err)
	}
	return err
}

// sandboxJSON is the answer of create, connect and resume.
func (g *Gateway) sandboxJSON(r *http.Request, sb *corral.Sandbox) sandboxJSON {
	tpl := templateOf(sb)
	return sandboxJSON{
		SandboxID:       sb.ID,
		TemplateID:      tpl,
		ClientID:        clientID(sb),
		Alias:           tpl,
		EnvdVersion:     g.cfg.EnvdVersion,
		EnvdAccessToken: g.EnvdAccessToken(sb.ID),
		Domain:          g.domain(r),
	}
}

// live returns a sandbox E2B would show: running (or being created) or paused. Others — unknown,
// stopped, failed — are E2B's 404.
func live(ctx context.Context, c *corral.Client, id string) (*corral.Sandbox, error) {
	sb, err := c.GetSandbox(ctx, id)
	if err != nil {
		if gone(err) {
			return nil, notFound(id)
		}
		return nil, err
	}
	if _, ok := state(sb.State); !ok {
		reason := sb.Reason
		if reason == "" {
			reason = sb.State
		}
		return nil, errorf(http.StatusNotFound, "sandbox %s not found (it ended: %s)", id, reason)
	}
	return sb, nil
}

// gone reports whether a Corral error says there is no such sandbox (an ID that is not one is
// refused as invalid by Corral; to E2B it is just not found).
func gone(err error) bool {
	ce, ok := errors.AsType[*corral.APIError](err)
	return ok && (ce.Code == corral.CodeNotFound || ce.Code == corral.CodeInvalid && ce.Field == "id")
}

// sandboxError turns the error of a call on sandbox id into E2B's terms: a 404 when the sandbox
// is unknown or ended (Corral answers a call on an ended sandbox with a conflict), else the
// error itself (a 409 stays a 409: pause of a paused sandbox).
func sandboxError(ctx context.Context, c *corral.Client, id string, err error) error {
	if gone(err) {
		return notFound(id)
	}
	if corral.IsConflict(err) {
		if _, lerr := live(ctx, c, id); lerr != nil {
			return lerr
		}
	}
	return err
}

func (g *Gateway) get(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	sb, err := live(r.Context(), c, r.PathValue("sandboxID"))
	if err != nil {
		return err
	}
	d := g.detail(sb, true)
	d.Domain = g.domain(r)
	writeJSON(w, http.StatusOK, d)
	return nil
}

func (g *Gateway) kill(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	id := r.PathValue("sandboxID")
	if _, err := live(r.Context(), c, id); err != nil {
		return err
	}
	if _, err := c.DeleteSandbox(r.Context(), id); err != nil {
		return sandboxError(r.Context(), c, id, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// setTimeout serves POST /sandboxes/{id}/timeout: the sandbox now ends timeout seconds from now,
// sooner or later than before.
func (g *Gateway) setTimeout(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	id := r.PathValue("sandboxID")
	var in timeoutBody
	if err := decodeBody(r, &in, false); err != nil {
		return err
	}
	if in.Timeout == nil {
		return invalid("timeout", "required (seconds)")
	}
	d, err := seconds("timeout", *in.Timeout)
	if err != nil {
		return err
	}
	if _, err := c.SetTTL(r.Context(), id, d); err != nil {
		return ttlError(sandboxError(r.Context(), c, id, err), "timeout")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ttlError names the E2B field of a refused TTL.
func ttlError(err error, field string) error {
	if ce, ok := errors.AsType[*corral.APIError](err); ok && ce.Field == "ttl" {
		return &apiError{ce.Status, field + ": " + strings.TrimPrefix(ce.Message, "ttl: ")}
	}
	return err
}

// refresh serves POST /sandboxes/{id}/refreshes: keep the sandbox alive at least duration
// seconds (default 15) from now.
func (g *Gateway) refresh(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	id := r.PathValue("sandboxID")
	var in refreshBody
	if err := decodeBody(r, &in, true); err != nil {
		return err
	}
	d := v1DefaultTimeout
	if in.Duration != nil {
		var err error
		if d, err = seconds("duration", *in.Duration); err != nil {
			return err
		}
	}
	sb, err := live(r.Context(), c, id)
	if err != nil {
		return err
	}
	if _, err := extend(r.Context(), c, sb, d); err != nil {
		return ttlError(err, "duration")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// extend makes sb live at least d from now, never shortening its life. It always sets the TTL,
// even to what it was, so that Corral checks the caller may change the sandbox (connect hands out
// the envd access token, which must take more than the right to read the sandbox).
func extend(ctx context.Context, c *corral.Client, sb *corral.Sandbox, d time.Duration) (*corral.Sandbox, error) {
	left := time.Until(sb.ExpiresAt).Round(time.Second) + time.Second
	out, err := c.SetTTL(ctx, sb.ID, max(d, left))
	if err != nil {
		return nil, sandboxError(ctx, c, sb.ID, err)
	}
	return out, nil
}

func (g *Gateway) pause(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	id := r.PathValue("sandboxID")
	var in pauseBody
	if err := decodeBody(r, &in, true); err != nil {
		return err
	}
	if in.Memory != nil && !*in.Memory {
		return invalid("memory", "Corral always keeps a paused sandbox's memory and processes; a pause without memory (resume by reboot) is not available")
	}
	if _, err := c.PauseSandbox(r.Context(), id); err != nil {
		return sandboxError(r.Context(), c, id, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connectV2 serves POST /v2/sandboxes/{id}/connect, the 2.x SDK's connect and resume.
func (g *Gateway) connectV2(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	var in connectBody
	if err := decodeBody(r, &in, true); err != nil {
		return err
	}
	return g.connect(w, r, c, in)
}

// connectV1 serves POST /sandboxes/{id}/connect, whose timeout is required.
func (g *Gateway) connectV1(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	var in connectBody
	if err := decodeBody(r, &in, false); err != nil {
		return err
	}
	if in.Timeout == nil {
		return invalid("timeout", "required (seconds)")
	}
	return g.connect(w, r, c, in)
}

// connect resumes a paused sandbox (201) or finds a running one (200), makes it live at least
// the timeout (default Config.DefaultTimeout) from now without shortening its life, and hands
// out the sandbox's envd access token.
func (g *Gateway) connect(w http.ResponseWriter, r *http.Request, c *corral.Client, in connectBody) error {
	ctx, id := r.Context(), r.PathValue("sandboxID")
	d := g.cfg.DefaultTimeout
	if in.Timeout != nil {
		var err error
		if d, err = seconds("timeout", *in.Timeout); err != nil {
			return err
		}
	}
	if in.Memory != nil && !*in.Memory {
		return invalid("memory", "Corral always resumes a sandbox with its memory and processes; resuming by reboot is not available")
	}
	sb, err := live(ctx, c, id)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if sb.State == corral.StatePaused {
		if sb, err = resume(ctx, c, id); err != nil {
			return err
		}
		status = http.StatusCreated
	}
	if sb, err = extend(ctx, c, sb, d); err != nil {
		return ttlError(err, "timeout")
	}
	writeJSON(w, status, g.sandboxJSON(r, sb))
	return nil
}

// resume resumes a paused sandbox; one that another call resumed meanwhile is fine.
func resume(ctx context.Context, c *corral.Client, id string) (*corral.Sandbox, error) {
	sb, err := c.ResumeSandbox(ctx, id)
	if err == nil {
		return sb, nil
	}
	if !corral.IsConflict(err) {
		return nil, sandboxError(ctx, c, id, err)
	}
	sb, lerr := live(ctx, c, id)
	if lerr != nil {
		return nil, lerr
	}
	if sb.State == corral.StatePaused {
		return nil, err
	}
	return sb, nil
}

// resumeV1 serves the deprecated POST /sandboxes/{id}/resume: a paused sandbox only (409
// otherwise), whose timeout becomes the given one (default 15 s).
func (g *Gateway) resumeV1(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	ctx, id := r.Context(), r.PathValue("sandboxID")
	var in resumeBody
	if err := decodeBody(r, &in, true); err != nil {
		return err
	}
	d := v1DefaultTimeout
	if in.Timeout != nil {
		var err error
		if d, err = seconds("timeout", *in.Timeout); err != nil {
			return err
		}
	}
	if in.AutoPause != nil && *in.AutoPause {
		return invalid("autoPause", "Corral cannot pause a sandbox when its timeout passes; it stops it")
	}
	if in.Memory != nil && !*in.Memory {
		return invalid("memory", "Corral always resumes a sandbox with its memory and processes; resuming by reboot is not available")
	}
	sb, err := live(ctx, c, id)
	if err != nil {
		return err
	}
	if sb.State != corral.StatePaused {
		return errorf(http.StatusConflict, "sandbox %s is already running", id)
	}
	if _, err = resume(ctx, c, id); err != nil {
		return err
	}
	if sb, err = c.SetTTL(ctx, id, d); err != nil {
		return ttlError(sandboxError(ctx, c, id, err), "timeout")
	}
	writeJSON(w, http.StatusCreated, g.sandboxJSON(r, sb))
	return nil
}

// updateNetwork serves PUT /sandboxes/{id}/network: the sandbox's egress policy is replaced
// (omitted fields are cleared, so an empty body means internet access without deny rules).
func (g *Gateway) updateNetwork(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	id := r.PathValue("sandboxID")
	var in networkUpdate
	if err := decodeBody(r, &in, true); err != nil {
		return err
	}
	if err := refuseNetworkExtras("network", false, false, len(in.Rules) > 0, present(in.EgressProxy)); err != nil {
		return err
	}
	pol, err := networkPolicy(in.AllowInternetAccess, in.AllowOut, in.DenyOut)
	if err != nil {
		return err
	}
	if _, err := c.SetNetwork(r.Context(), id, pol); err != nil {
		err = sandboxError(r.Context(), c, id, err)
		if ce, ok := errors.AsType[*corral.APIError](err); ok && strings.HasPrefix(ce.Field, "network") {
			return createError(err, "", true)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
