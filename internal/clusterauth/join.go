package clusterauth

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// ProofHeader is the HTTP header a join request carries its Proof in.
const ProofHeader = "Corral-Join-Proof"

// DefaultSkew is how far a proof's time may be from the verifier's clock when VerifyProof is
// given no skew.
const DefaultSkew = 5 * time.Minute

// MinTokenLen is the shortest join token accepted. A proof travels in the clear, so a short
// token could be guessed offline from one; Corral's tokens are 47 characters (256 random bits).
const MinTokenLen = 32

// The HKDF info strings keep the proof's and the seal's keys apart.
const (
	proofInfo = "corral join proof v1"
	sealInfo  = "corral join seal v1"
)

// maxProofLen bounds the header VerifyProof parses; a real one is about 60 characters.
const maxProofLen = 128

// Proof proves that the sender of body holds token, at time now, without revealing the token.
// The result, "t=UNIX,mac=BASE64URL", goes in the ProofHeader of the join request: mac is an
// HMAC-SHA256, under a key derived from token, of t and the SHA-256 of body. Everything the
// server must be able to trust (node name, CSR) belongs in body.
func Proof(token string, body []byte, now time.Time) (string, error) {
	if err := checkToken(token); err != nil {
		return "", fmt.Errorf("sign join request: %w", err)
	}
	t := now.Unix()
	mac := base64.RawURLEncoding.EncodeToString(proofMAC(token, t, body))
	return "t=" + strconv.FormatInt(t, 10) + ",mac=" + mac, nil
}

// VerifyProof checks that header is a Proof of body under token, made within skew of now
// (DefaultSkew when skew is not positive). The MAC is compared in constant time. A missing or
// wrong proof, or one made too long ago or ahead, is an errdefs.ErrUnauthorized error; a
// malformed header is errdefs.ErrInvalid. A proof can be replayed within skew with the same
// body: the join that answers it must do no harm when repeated.
func VerifyProof(token string, body []byte, header string, now time.Time, skew time.Duration) error {
	if len(token) < MinTokenLen {
		// The server's own token is wrong: a fault to log, not the edge's to fix.
		return fmt.Errorf("verify join proof: this server's join token has %d characters, fewer than %d", len(token), MinTokenLen)
	}
	if header == "" {
		return fmt.Errorf("join request has no %s header: upgrade the edge, or check that a proxy between it and the server keeps the header: %w", ProofHeader, errdefs.ErrUnauthorized)
	}
	t, mac, err := parseProof(header)
	if err != nil {
		return fmt.Errorf("join proof header is malformed (want t=UNIX,mac=BASE64URL): %s: %w", err, errdefs.ErrInvalid)
	}
	if !hmac.Equal(mac, proofMAC(token, t, body)) {
		return fmt.Errorf("join proof does not match: the edge's join token is not this cluster's, or the request was altered on the way: %w", errdefs.ErrUnauthorized)
	}
	if skew <= 0 {
		skew = DefaultSkew
	}
	switch age := now.Sub(time.Unix(t, 0)); {
	case age > skew:
		return fmt.Errorf("join proof is %s old (allowed skew %s): check the clocks of edge and server: %w", human(age), human(skew), errdefs.ErrUnauthorized)
	case age < -skew:
		return fmt.Errorf("join proof is dated %s ahead (allowed skew %s): check the clocks of edge and server: %w", human(-age), human(skew), errdefs.ErrUnauthorized)
	}
	return nil
}

// Seal encrypts plaintext, the server's answer to the join request that carried proof, with
// AES-256-GCM under a key derived from token: only a holder of the token can open it, and the
// opener knows that a holder of the token sealed it for this very request. The proof is the
// additional data; a random nonce is prepended.
func Seal(token, proof string, plaintext []byte) ([]byte, error) {
	aead, err := sealAEAD(token, proof)
	if err != nil {
		return nil, fmt.Errorf("seal join response: %w", err)
	}
	return aead.Seal(nil, nil, plaintext, []byte(proof)), nil
}

// Open decrypts a join response sealed by Seal under token for the request that carried proof.
// A response sealed under another token, for another request, or altered on the way is an
// errdefs.ErrUnauthorized error.
func Open(token, proof string, sealed []byte) ([]byte, error) {
	aead, err := sealAEAD(token, proof)
	if err != nil {
		return nil, fmt.Errorf("open join response: %w", err)
	}
	if len(sealed) < aead.Overhead() {
		return nil, fmt.Errorf("open join response: %d bytes is too short for a sealed response (at least %d): %w", len(sealed), aead.Overhead(), errdefs.ErrUnauthorized)
	}
	plain, err := aead.Open(nil, nil, sealed, []byte(proof))
	if err != nil {
		return nil, fmt.Errorf("open join response: it was not sealed for this request under this edge's join token (the server has another token, or the response was altered or replayed): %w", errdefs.ErrUnauthorized)
	}
	return plain, nil
}

func sealAEAD(token, proof string) (cipher.AEAD, error) {
	if err := checkToken(token); err != nil {
		return nil, err
	}
	if proof == "" {
		return nil, fmt.Errorf("the request's proof is required: %w", errdefs.ErrInvalid)
	}
	block, err := aes.NewCipher(deriveKey(token, sealInfo))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCMWithRandomNonce(block)
}

// proofMAC is the HMAC of the decimal time, a newline and the body's SHA-256.
func proofMAC(token string, t int64, body []byte) []byte {
	sum := sha256.Sum256(body)
	m := hmac.New(sha256.New, deriveKey(token, proofInfo))
	m.Write(strconv.AppendInt(nil, t, 10))
	m.Write([]byte{'\n'})
	m.Write(sum[:])
	return m.Sum(nil)
}

// deriveKey derives a 256-bit key for one use (info) from the token.
func deriveKey(token, info string) []byte {
	key, err := hkdf.Key(sha256.New, []byte(token), nil, info, 32)
	if err != nil {
		// Only an oversized length or, in FIPS-only mode, a secret under 112 bits fails;
		// checkToken rules out both.
		panic("clusterauth: derive key: " + err.Error())
	}
	return key
}

func checkToken(token string) error {
	if len(token) < MinTokenLen {
		return fmt.Errorf("join token has %d characters, fewer than %d: use the token `corral server` wrote to join.token: %w", len(token), MinTokenLen, errdefs.ErrInvalid)
	}
	return nil
}

// parseProof splits "t=UNIX,mac=BASE64URL" into the time and the 32-byte MAC.
func parseProof(header string) (int64, []byte, error) {
	if len(header) > maxProofLen {
		return 0, nil, fmt.Errorf("%d characters is longer than %d", len(header), maxProofLen)
	}
	ts, macs, ok := strings.Cut(header, ",")
	ts, okT := strings.CutPrefix(ts, "t=")
	macs, okM := strings.CutPrefix(macs, "mac=")
	if !ok || !okT || !okM {
		return 0, nil, fmt.Errorf("%q does not have the form", header)
	}
	if ts == "" || strings.TrimLeft(ts, "0123456789") != "" {
		return 0, nil, fmt.Errorf("time %q is not a decimal Unix time", ts)
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("time %q is out of range", ts)
	}
	mac, err := base64.RawURLEncoding.DecodeString(macs)
	if err != nil || len(mac) != sha256.Size {
		return 0, nil, fmt.Errorf("mac is not %d bytes in unpadded base64url", sha256.Size)
	}
	return t, mac, nil
}

// human writes d for an operator: "12m", "1h5m", "45s".
func human(d time.Duration) string {
	if d >= time.Minute {
		d = d.Round(time.Minute)
	} else {
		d = d.Round(time.Second)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
