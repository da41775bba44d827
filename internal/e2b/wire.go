package e2b

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
)

// The JSON shapes of E2B's control plane. Field names are E2B's, spelled as the SDK spells them
// (mixed camelCase and snake_case). Pointers mark the fields whose absence means something.

// newSandbox is the body of POST /v2/sandboxes (NewSandboxV2) and POST /sandboxes (NewSandbox).
type newSandbox struct {
	TemplateID          *string           `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkConfig    `json:"network"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *autoResume       `json:"autoResume"`
	// Secure is sent by older SDKs (v1 create). Corral always issues an envd access token.
	Secure       *bool             `json:"secure"`
	MCP          json.RawMessage   `json:"mcp"`
	IAM          json.RawMessage   `json:"iam"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
}

type autoResume struct {
	Enabled *bool `json:"enabled"`
}

// networkConfig is SandboxNetworkConfig: in a create request, and as GET reports it.
type networkConfig struct {
	AllowOut           []string                   `json:"allowOut,omitempty"`
	DenyOut            []string                   `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool                      `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    *string                    `json:"maskRequestHost,omitempty"`
	HTTPSPorts         []int                      `json:"httpsPorts,omitempty"`
	Rules              map[string]json.RawMessage `json:"rules,omitempty"`
	EgressProxy        json.RawMessage            `json:"egressProxy,omitempty"`
}

// networkUpdate is SandboxNetworkUpdateConfig, the body of PUT /sandboxes/{id}/network.
type networkUpdate struct {
	AllowOut            []string                   `json:"allowOut"`
	DenyOut             []string                   `json:"denyOut"`
	Rules               map[string]json.RawMessage `json:"rules"`
	EgressProxy         json.RawMessage            `json:"egressProxy"`
	AllowInternetAccess *bool                      `json:"allow_internet_access"`
}

// connectBody is the body of POST /v2/sandboxes/{id}/connect and POST /sandboxes/{id}/connect.
type connectBody struct {
	Timeout *int64 `json:"timeout"`
	Memory  *bool  `json:"memory"`
}

// resumeBody is ResumedSandbox, the body of the deprecated POST /sandboxes/{id}/resume.
type resumeBody struct {
	Timeout   *int64 `json:"timeout"`
	AutoPause *bool  `json:"autoPause"`
	Memory    *bool  `json:"memory"`
}

type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

type refreshBody struct {
	Duration *int64 `json:"duration"`
}

type pauseBody struct {
	Memory *bool `json:"memory"`
}

// sandboxJSON is Sandbox, the answer of create, connect and resume. The SDK reads sandboxID,
// domain, envdVersion, envdAccessToken and trafficAccessToken.
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	Alias              string  `json:"alias,omitempty"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             string  `json:"domain"`
}

// sandboxDetail is SandboxDetail (GET one) and, without its optional tail, ListedSandbox.
type sandboxDetail struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int32             `json:"cpuCount"`
	MemoryMB    int32             `json:"memoryMB"`
	DiskSizeMB  int32             `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`

	AllowInternetAccess *bool          `json:"allowInternetAccess,omitempty"`
	Domain              string         `json:"domain,omitempty"`
	Network             *networkConfig `json:"network,omitempty"`
	Lifecycle           *lifecycle     `json:"lifecycle,omitempty"`
}

type lifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// metric is SandboxMetric.
type metric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int32     `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// logEntry is SandboxLogEntry (v2 logs, and logEntries of v1).
type logEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// logLine is SandboxLog (logs of v1).
type logLine struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

// decodeBody reads a JSON object into v. Unknown fields are refused, naming the field: a field
// the gateway does not know is a field it cannot honour. With allowEmpty an empty body (older
// SDKs send none for pause) decodes as {}.
func decodeBody(r *http.Request, v any, allowEmpty bool) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return err
		}
		return errorf(http.StatusBadRequest, "read request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if allowEmpty {
			return nil
		}
		return errorf(http.StatusBadRequest, "request body: empty, expected a JSON object")
	}
	return decodeJSON(body, v)
}

// decodeJSON decodes one JSON object, refusing unknown fields and trailing data.
func decodeJSON(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			return errorf(http.StatusBadRequest, "request body: malformed JSON at byte %d", syn.Offset)
		case errors.As(err, &typ):
			field := typ.Field
			if field == "" {
				field = "request body"
			}
			return invalid(field, "must be a JSON %s, not %s", jsonKind(typ.Type.Kind().String()), typ.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return invalid(field, "not supported by Corral's E2B gateway, so it cannot be honoured")
		}
		return errorf(http.StatusBadRequest, "request body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errorf(http.StatusBadRequest, "request body: trailing data after the JSON object")
	}
	return nil
}

// jsonKind names a Go kind the way a JSON user knows it.
func jsonKind(k string) string {
	switch k {
	case "int", "int32", "int64", "uint", "uint32", "float64":
		return "number"
	case "map", "struct":
		return "object"
	case "slice":
		return "array"
	case "bool":
		return "boolean"
	}
	return k
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{e.status, e.msg})
}
