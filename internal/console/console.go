package console

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

// dist holds the bundled console (index.html, app.js, app.css and what they load), built from
// web/ by ./bundle; SOURCES.sha256 records the hash of the sources it was built from.
//
//go:embed dist
var dist embed.FS

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// CSP is the Content-Security-Policy of every console response. Scripts, styles, images, fonts
// and connections come from the console's origin only: no inline script, no eval, no remote
// origin. Styles allow 'unsafe-inline' because xterm.js sizes its rows with style elements it
// creates at run time; a style cannot run code, and script-src stays strict. blob: images are
// the screen's screenshots; data: fonts and images are those the bundled CSS carries.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' blob: data:; font-src 'self' data:; connect-src 'self'; worker-src 'none'; " +
	"frame-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// Handler serves the console's files under Prefix. Any path under it that names no file serves
// index.html (the pages route on the URL's fragment, so this is only the entry point).
func Handler() http.Handler {
	files, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // the embed directive guarantees dist exists
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cache-Control", "no-cache")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "the console's files are read-only", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path+"/" == Prefix {
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
			return
		}
		name := strings.TrimPrefix(path.Clean(r.URL.Path), strings.TrimSuffix(Prefix, "/"))
		name = strings.TrimPrefix(name, "/")
		if name == "" || name == "SOURCES.sha256" {
			name = "index.html"
		}
		if st, err := fs.Stat(files, name); err != nil || st.IsDir() {
			name = "index.html"
		}
		http.ServeFileFS(w, r, files, name)
	})
}
