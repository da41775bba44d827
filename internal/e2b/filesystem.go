package e2b

import "net/http"

// filesystemMethod returns the handler of a method of envd's filesystem.Filesystem service.
func (g *Gateway) filesystemMethod(name string) envdHandler {
	return func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
		writeUnary(w, nil, rpcErrorf(codeUnimplemented, "filesystem.Filesystem/%s is not served yet", name))
	}
}
