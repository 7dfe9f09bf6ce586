package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Network modes of a session (docs/API.md "Sessions").
const (
	NetworkNone      = "none"
	NetworkOpen      = "open"
	NetworkAllowlist = "allowlist"
)

// Session states.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StatePaused   = "paused"
	StateStopped  = "stopped"
	// StateLost: ended with the node that held it (a cluster); listed until deleted.
	StateLost = "lost"
)

// Types of a SessionEvent (the webhook event types).
const (
	SessionEventCreated = "session.created"
	SessionEventPaused  = "session.paused"
	SessionEventResumed = "session.resumed"
	SessionEventStopped = "session.stopped"
	// SessionEventVerdict: an exec ended by its limits or a signal, not by itself.
	SessionEventVerdict = "exec.verdict"
)

// Exec verdicts: why an exec was ended by the sandbox rather than by itself.
const (
	VerdictOOM     = "SANDBOX-EXEC-KILLED-OOM"
	VerdictTimeout = "SANDBOX-EXEC-TIMEOUT"
	VerdictCPU     = "SANDBOX-EXEC-KILLED-CPU"
	VerdictPids    = "SANDBOX-EXEC-KILLED-PIDS"
	VerdictKilled  = "SANDBOX-EXEC-KILLED"
)

// Limits are a session's resource limits. In a request a zero field means the server's
// default; in a Session they are the effective limits.
type Limits struct {
	CPUMillis int64 `json:"cpu_millis,omitempty"`
	MemoryMiB int64 `json:"memory_mib,omitempty"`
	DiskMiB   int64 `json:"disk_mib,omitempty"`
	Pids      int64 `json:"pids,omitempty"`
}

// Network is a session's network policy: Mode is one of NetworkNone (the default),
// NetworkOpen or NetworkAllowlist with Allow entries ("pypi.org", "10.1.0.0/16:443"). A
// Session shows each entry with the addresses it was pinned to.
type Network struct {
	Mode  string   `json:"mode,omitempty"`
	Allow []string `json:"allow,omitempty"`
	// Deny entries (same syntax, with NetworkOpen or NetworkAllowlist) beat every allow, so
	// an open session can still be kept from a range or a name.
	Deny []string `json:"deny,omitempty"`
}

// Lifecycle says what a session's timeout does ("kill" or "pause") and whether requests to a
// paused session resume it first.
type Lifecycle struct {
	OnTimeout  string `json:"on_timeout,omitempty"`
	AutoResume bool   `json:"auto_resume,omitempty"`
	KeepMemory bool   `json:"keep_memory,omitempty"`
}

// VolumeMount asks for a volume (by name or id) mounted at Path in a new session.
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// CreateSessionRequest is the body of POST /v1/sandbox/sessions; zero fields take the
// server's defaults.
type CreateSessionRequest struct {
	// Language is "python", "node" or "bash" (the default).
	Language string `json:"language,omitempty"`
	Image    string `json:"image,omitempty"`
	// Runtime is "jail" (the default) or "microvm".
	Runtime   string            `json:"runtime,omitempty"`
	Limits    *Limits           `json:"limits,omitempty"`
	Network   *Network          `json:"network,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	TimeoutS  int64             `json:"timeout_s,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Lifecycle *Lifecycle        `json:"lifecycle,omitempty"`
	Volumes   []VolumeMount     `json:"volumes,omitempty"`
	// FromSnapshot starts the session on a snapshot's filesystem.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Secrets names secrets (PutSecret) the session may use without seeing them: its
	// environment has NAME=KSECRET_<hex>, a placeholder egress swaps for the value in request
	// headers to the secret's hosts. Needs Network mode NetworkOpen or NetworkAllowlist.
	Secrets []string `json:"secrets,omitempty"`
}

// SessionVolume is a volume as a session has it mounted.
type SessionVolume struct {
	VolumeID string `json:"volume_id"`
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
}

// Session is a sandbox session as the daemon reports it.
type Session struct {
	ID        string            `json:"id"`
	TenantID  string            `json:"tenant_id"`
	Language  string            `json:"language"`
	Image     string            `json:"image"`
	Runtime   string            `json:"runtime"`
	State     string            `json:"state"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	Limits    Limits            `json:"limits"`
	Network   Network           `json:"network"`
	Metadata  map[string]string `json:"metadata"`
	// EndReason says why a stopped session ended ("deleted", "expired", "agent exited"...).
	EndReason string          `json:"end_reason,omitempty"`
	Volumes   []SessionVolume `json:"volumes,omitempty"`

	client *Client
}

// Close deletes the session through the client that returned it.
func (s *Session) Close(ctx context.Context) error {
	if s.client == nil {
		return errNoClient
	}
	return s.client.DeleteSession(ctx, s.ID)
}

// ExecRequest is one command for Exec or StreamExec: exactly one of Cmd (argv, no shell),
// Shell (run by /bin/bash -c) or Code (run by Language's interpreter, default the session's).
type ExecRequest struct {
	Cmd      []string          `json:"cmd,omitempty"`
	Shell    string            `json:"shell,omitempty"`
	Code     string            `json:"code,omitempty"`
	Language string            `json:"language,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	Stdin    string            `json:"stdin,omitempty"`
	// TimeoutMs of zero means the server's default.
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// User is "root" (the default) or "user" (uid 1000).
	User string `json:"user,omitempty"`
}

// ExecResult is a finished exec. ExitCode is nil when a signal (Signal) ended it; Verdict is
// empty for a normal exit, else one of the Verdict... codes. A killed exec keeps what it
// printed before the kill.
type ExecResult struct {
	ExecID          string `json:"exec_id"`
	ExitCode        *int   `json:"exit_code"`
	Signal          *int   `json:"signal"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	DurationMs      int64  `json:"duration_ms"`
	PeakMemoryKiB   *int64 `json:"peak_memory_kib"`
	Verdict         string `json:"verdict"`
}

// FileEntry describes one file inside a sandbox. Type is "file", "dir", "symlink" or "other".
type FileEntry struct {
	Name          string    `json:"name"`
	Path          string    `json:"path"`
	Type          string    `json:"type"`
	Size          int64     `json:"size"`
	Mode          uint32    `json:"mode"`
	ModifiedAt    time.Time `json:"modified_at"`
	UID           uint32    `json:"uid"`
	GID           uint32    `json:"gid"`
	SymlinkTarget string    `json:"symlink_target,omitempty"`
}

// FileList is a directory listing; Truncated is set when the server cut it at its entry limit.
type FileList struct {
	Entries   []FileEntry `json:"entries"`
	Truncated bool        `json:"truncated"`
}

// SessionMetrics is a session's live resource use.
type SessionMetrics struct {
	CPUUsedMs        int64  `json:"cpu_used_ms"`
	MemoryCurrentKiB int64  `json:"memory_current_kib"`
	MemoryPeakKiB    int64  `json:"memory_peak_kib"`
	MemoryLimitKiB   *int64 `json:"memory_limit_kib"`
	OOMKills         int64  `json:"oom_kills"`
	PidsCurrent      int64  `json:"pids_current"`
	PidsLimit        *int64 `json:"pids_limit"`
	DiskUsedKiB      int64  `json:"disk_used_kib"`
	DiskTotalKiB     int64  `json:"disk_total_kib"`
}

// SessionEvent is one entry of a session's event log, as its webhook delivers it. Seq numbers
// the session's events from 1; ID is the webhook delivery's. Data's fields depend on Type
// (docs/API-ADDITIONS.md "Webhooks"): SessionEventStopped has "cause" and "reason",
// SessionEventVerdict "verdict", "exit_code", "signal" and "duration_ms"; every one has
// "session_id".
type SessionEvent struct {
	Seq       uint64          `json:"seq"`
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	CreatedAt time.Time       `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

// SessionEventList is a page of a session's event log, oldest first. More is set when another
// page follows: ask again with after the last event's Seq.
type SessionEventList struct {
	Events []SessionEvent `json:"events"`
	More   bool           `json:"more"`
}

// errNoClient is what Close says on a Session that no Client returned.
var errNoClient = errors.New("koder-sandbox: this Session did not come from a Client")
