package e2b

import "net/http"

// files serves envd's /files: GET downloads a file, POST uploads (multipart or octet-stream).
func (g *Gateway) files(w http.ResponseWriter, r *http.Request, t *sandboxTarget) {
	writeUnary(w, nil, rpcErrorf(codeUnimplemented, "/files is not served yet"))
}

// checkFileSignature checks the signature of a signed /files URL (uploadUrl, downloadUrl).
func (g *Gateway) checkFileSignature(r *http.Request, sandboxID string) bool { return false }
