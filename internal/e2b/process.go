package e2b

import "net/http"

// processMethod returns the handler of a method of envd's process.Process service.
func (g *Gateway) processMethod(name string) envdHandler {
	return func(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
		writeUnary(w, nil, rpcErrorf(codeUnimplemented, "process.Process/%s is not served yet", name))
	}
}
