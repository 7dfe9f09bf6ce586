package sandbox

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
)

const sessionsPath = "/v1/sandbox/sessions"

// CreateSession starts a session.
func (c *Client) CreateSession(ctx context.Context, req CreateSessionRequest) (*Session, error) {
	return c.sessionCall(ctx, http.MethodPost, sessionsPath, req)
}

// GetSession reports a session of this tenant. A deleted or expired one is still reported
// (State "stopped") for a while; another tenant's answers CodeNotFound like an unknown id.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	return c.onSession(ctx, http.MethodGet, id, "", nil)
}

// ListSessions lists this tenant's sessions that have not ended.
func (c *Client) ListSessions(ctx context.Context) ([]Session, error) {
	var out struct {
		Sessions []Session `json:"sessions"`
	}
	if err := c.doJSON(ctx, http.MethodGet, sessionsPath, nil, nil, &out); err != nil {
		return nil, err
	}
	for i := range out.Sessions {
		out.Sessions[i].client = c
	}
	return out.Sessions, nil
}

// DeleteSession ends a session and destroys its sandbox.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	p, err := sessionPath(id, "")
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, nil)
}

// SetTimeout makes the session expire timeoutS seconds from now.
func (c *Client) SetTimeout(ctx context.Context, id string, timeoutS int64) (*Session, error) {
	return c.onSession(ctx, http.MethodPost, id, "/timeout", struct {
		TimeoutS int64 `json:"timeout_s"`
	}{timeoutS})
}

// PauseSession pauses a session. With keepMemory its processes are kept (frozen in place; a
// QEMU microVM is saved to a file); without, only its filesystem is kept, durably, and resume
// boots it afresh. Operations on a paused session answer CodeConflict.
func (c *Client) PauseSession(ctx context.Context, id string, keepMemory bool) (*Session, error) {
	return c.onSession(ctx, http.MethodPost, id, "/pause", struct {
		Memory bool `json:"memory"`
	}{keepMemory})
}

// ResumeSession resumes a paused session.
func (c *Client) ResumeSession(ctx context.Context, id string) (*Session, error) {
	return c.onSession(ctx, http.MethodPost, id, "/resume", nil)
}

// Metrics reports a session's live resource use.
func (c *Client) Metrics(ctx context.Context, id string) (*SessionMetrics, error) {
	p, err := sessionPath(id, "/metrics")
	if err != nil {
		return nil, err
	}
	return call[SessionMetrics](ctx, c, http.MethodGet, p, nil)
}

// SessionEvents reads a session's event log (a stopped session's too), oldest first: the
// events numbered above after, at most limit (1–500; 0 means the server's default, 500). The
// log is written just behind the calls that make its events, so an event may show up a moment
// after the answer of its call.
func (c *Client) SessionEvents(ctx context.Context, id string, after uint64, limit int) (*SessionEventList, error) {
	p, err := sessionPath(id, "/events")
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatUint(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out SessionEventList
	if err := c.doJSON(ctx, http.MethodGet, p, q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// KillProcesses SIGKILLs every process in the session (a fork bomb, runaway children), keeps
// the session running and says how many processes it killed.
func (c *Client) KillProcesses(ctx context.Context, id string) (int, error) {
	p, err := sessionPath(id, "/kill-processes")
	if err != nil {
		return 0, err
	}
	var out struct {
		Killed int `json:"killed"`
	}
	if err := c.doJSON(ctx, http.MethodPost, p, nil, nil, &out); err != nil {
		return 0, err
	}
	return out.Killed, nil
}

// onSession calls a session's resource that answers with the session.
func (c *Client) onSession(ctx context.Context, method, id, suffix string, in interface{}) (*Session, error) {
	p, err := sessionPath(id, suffix)
	if err != nil {
		return nil, err
	}
	return c.sessionCall(ctx, method, p, in)
}

func (c *Client) sessionCall(ctx context.Context, method, path string, in interface{}) (*Session, error) {
	var s Session
	if err := c.doJSON(ctx, method, path, nil, in, &s); err != nil {
		return nil, err
	}
	s.client = c
	return &s, nil
}
