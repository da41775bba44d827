package catalog

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
)

// What a layer's record may say of the image it holds: its configuration and the services it
// starts. An edge checks them when it imports or builds a layer, and a cluster's servers again
// when an edge publishes it (CheckRecord).

// maxReadyPath bounds a readiness check's path.
const maxReadyPath = 1024

var userRE = lazyregexp.New(`^([a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10}(:[0-9]{1,10})?)$`)

// ValidUser reports whether s names a user as a sandbox's processes may run as: a user name, or
// uid[:gid].
func ValidUser(s string) bool { return userRE.MatchString(s) }

// ValidateImageConfig checks an imported image's configuration before it is stored.
func ValidateImageConfig(c *model.ImageConfig) error {
	if err := ValidateEnv("image_config.env", c.Env); err != nil {
		return err
	}
	if c.WorkingDir != "" && !strings.HasPrefix(c.WorkingDir, "/") {
		return errdefs.Invalid("image_config.working_dir", "%q is not an absolute path", c.WorkingDir)
	}
	if c.User != "" && !ValidUser(c.User) {
		return errdefs.Invalid("image_config.user", "%q is not a user name or uid[:gid]", c.User)
	}
	return validateServices(c.Services)
}

// maxServices bounds the services one layer declares.
const maxServices = 8

var serviceNameRE = lazyregexp.New(`^[a-z0-9][a-z0-9-]{0,62}$`)

// validateServices checks the services of an imported layer's configuration.
func validateServices(svcs []model.Service) error {
	if len(svcs) > maxServices {
		return errdefs.Invalid("image_config.services", "at most %d services, got %d", maxServices, len(svcs))
	}
	for i, s := range svcs {
		field := fmt.Sprintf("image_config.services[%d]", i)
		if !serviceNameRE.MatchString(s.Name) {
			return errdefs.Invalid(field+".name", "%q: want lower-case letters, digits and dashes", s.Name)
		}
		if len(s.Command) == 0 || len(s.Command) > 64 {
			return errdefs.Invalid(field+".command", "want 1 to 64 arguments, got %d", len(s.Command))
		}
		for _, a := range s.Command {
			if len(a) > 4096 {
				return errdefs.Invalid(field+".command", "an argument is longer than 4096 bytes")
			}
		}
		if err := ValidateEnv(field+".env", s.Env); err != nil {
			return err
		}
		if s.Port < 0 || s.Port > 65535 {
			return errdefs.Invalid(field+".port", "%d: want 1-65535 (or 0: none)", s.Port)
		}
		if s.Ready != "" {
			if s.Port == 0 {
				return errdefs.Invalid(field+".ready", "a readiness check is a path on the service's port: set port too")
			}
			if !strings.HasPrefix(s.Ready, "/") || len(s.Ready) > maxReadyPath || strings.ContainsFunc(s.Ready, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
				return errdefs.Invalid(field+".ready", "%q: want an HTTP path such as /ready, at most %d bytes, without spaces", s.Ready, maxReadyPath)
			}
			if _, err := url.ParseRequestURI(s.Ready); err != nil {
				return errdefs.Invalid(field+".ready", "%q: not an HTTP path: %v", s.Ready, err)
			}
		}
	}
	return nil
}
