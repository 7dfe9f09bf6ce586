package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode"
)

// Error codes the daemon answers with (docs/API.md "Errors"); SandboxError.Code holds one.
const (
	CodeAuth               = "SANDBOX-AUTH-001"
	CodeNotFound           = "SANDBOX-NOT-FOUND"
	CodeInvalidArgument    = "SANDBOX-INVALID-ARGUMENT"
	CodeConflict           = "SANDBOX-CONFLICT"
	CodePermissionDenied   = "SANDBOX-PERMISSION-DENIED"
	CodePlanRequired       = "SANDBOX-PLAN-REQUIRED"
	CodeQuotaSessions      = "SANDBOX-QUOTA-SESSIONS"
	CodeQuotaMinutes       = "SANDBOX-QUOTA-MINUTES"
	CodePayloadTooLarge    = "SANDBOX-PAYLOAD-TOO-LARGE"
	CodeFSQuotaExceeded    = "SANDBOX-FS-QUOTA-EXCEEDED"
	CodeSessionStopped     = "SANDBOX-SESSION-STOPPED"
	CodeAgentTimeout       = "SANDBOX-AGENT-TIMEOUT"
	CodeNotImplemented     = "SANDBOX-NOT-IMPLEMENTED"
	CodeRuntimeUnavailable = "SANDBOX-RUNTIME-UNAVAILABLE-001"
	CodeInternal           = "SANDBOX-INTERNAL"
	// CodeQuotaSnapshotStorage: the tenant's snapshot storage is full (HTTP 507).
	CodeQuotaSnapshotStorage = "SANDBOX-QUOTA-SNAPSHOT-STORAGE"
	// CodeQuotaVolumeStorage: the tenant's volume storage is full (HTTP 507).
	CodeQuotaVolumeStorage = "SANDBOX-QUOTA-VOLUME-STORAGE"
	// CodeVolumeBusy: a session has the volume mounted (HTTP 409).
	CodeVolumeBusy = "SANDBOX-VOLUME-BUSY"
	// CodeNetworkRule: a network allow or deny entry is malformed or can never be reached
	// (loopback, or a private range the server does not open) (HTTP 400).
	CodeNetworkRule = "SANDBOX-NETWORK-RULE"
	// CodeSecretNotFound: the tenant has no secret of that name (HTTP 404).
	CodeSecretNotFound = "SANDBOX-SECRET-NOT-FOUND"
	// CodeWebhookURLRefused: a webhook URL reaches a loopback, private or reserved address
	// (HTTP 400).
	CodeWebhookURLRefused = "SANDBOX-WEBHOOK-URL-REFUSED"
)

const (
	// maxErrorBody bounds how much of an error answer is read.
	maxErrorBody = 64 << 10
	// maxErrorSnippet bounds how much of a non-JSON error body ends up in Message.
	maxErrorSnippet = 512
)

// SandboxError is every non-2xx answer of the daemon: its SANDBOX-... code, message and HTTP
// status. An answer that is not the daemon's error shape (a proxy's HTML page, say) still gives
// a SandboxError, with an empty Code, the status and the start of the body as Message.
//
//	var se *sandbox.SandboxError
//	if errors.As(err, &se) && se.Code == sandbox.CodeNotFound { ... }
type SandboxError struct {
	Status  int
	Code    string
	Message string
	// Details is the error's optional "details" object, undecoded.
	Details json.RawMessage
}

func (e *SandboxError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("koder-sandbox: HTTP %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("koder-sandbox: %s (HTTP %d): %s", e.Code, e.Status, e.Message)
}

// ErrorCode is the SANDBOX-... code of err if it is (or wraps) a *SandboxError, else "".
func ErrorCode(err error) string {
	var se *SandboxError
	if errors.As(err, &se) {
		return se.Code
	}
	return ""
}

type errorBody struct {
	Error *struct {
		Code    string          `json:"code"`
		Message string          `json:"message"`
		Details json.RawMessage `json:"details"`
	} `json:"error"`
}

// errorFrom reads (a bounded part of) a non-2xx answer into a SandboxError.
func errorFrom(resp *http.Response) *SandboxError {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	se := &SandboxError{Status: resp.StatusCode}
	var body errorBody
	if json.Unmarshal(raw, &body) == nil && body.Error != nil && body.Error.Code != "" {
		se.Code = body.Error.Code
		se.Message = body.Error.Message
		se.Details = body.Error.Details
		return se
	}
	se.Message = snippet(raw)
	if se.Message == "" {
		se.Message = http.StatusText(resp.StatusCode)
	}
	return se
}

// snippet is the start of a foreign body made safe to print: valid UTF-8, no control
// characters (a terminal escape in a proxy's page must not reach the user's terminal).
func snippet(raw []byte) string {
	if len(raw) > maxErrorSnippet {
		raw = raw[:maxErrorSnippet]
	}
	s := strings.ToValidUTF8(string(raw), "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return strings.TrimSpace(s)
}
