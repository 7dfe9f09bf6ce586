package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// Languages of an interpreter context (docs/API.md "Code interpreter").
const (
	LanguagePython = "python"
	LanguageNode   = "node"
	// LanguageTypeScript runs in Node with each cell's types stripped, not checked (the image
	// needs the typescript package; the host image has the host's).
	LanguageTypeScript = "typescript"
	// LanguageBash is one long-lived shell: variables, functions and the directory persist.
	LanguageBash = "bash"
	// LanguageJava is JShell in one JVM (the image needs a JDK).
	LanguageJava = "java"
	// LanguageR is one R session (the image needs R).
	LanguageR = "r"
)

// DefaultContext names the session's Python context, made by its first run.
const DefaultContext = "default"

// Event types of a run stream (StreamRunCode), besides EventStdout and EventStderr.
const (
	// EventResult ends a run: Run carries its outcome, without the output that came as events.
	EventResult = "result"
	// EventError ends a run that failed after output had gone out: Err carries the failure.
	EventError = "error"
)

// CreateContextRequest is the body of POST .../contexts; a zero Language is Python and a zero
// Cwd the session's working directory.
type CreateContextRequest struct {
	Language string            `json:"language,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
}

// CodeContext is one long-lived interpreter in a session's sandbox; its variables persist
// from one run to the next.
type CodeContext struct {
	ContextID string `json:"context_id"`
	Language  string `json:"language"`
	// ExecutionCount is the number of runs so far (0 after a restart).
	ExecutionCount uint64 `json:"execution_count"`
	Cwd            string `json:"cwd"`
}

// RunCodeRequest is one run of code in a context. TimeoutMs of zero means the server's
// default; on expiry the interpreter is killed and restarted (its state is lost).
type RunCodeRequest struct {
	Code      string            `json:"code"`
	TimeoutMs int64             `json:"timeout_ms,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
}

// RichOutput is one displayable value (a figure, a displayed object, the last expression's
// value) in every representation it offered. PNG, JPEG and PDF are base64; JSON, Data, Chart and
// Extra are JSON as the interpreter made them.
type RichOutput struct {
	IsMainResult bool   `json:"is_main_result"`
	Text         string `json:"text,omitempty"`
	HTML         string `json:"html,omitempty"`
	Markdown     string `json:"markdown,omitempty"`
	// JSON is the value as JSON, where it has a JSON form.
	JSON  json.RawMessage `json:"json,omitempty"`
	PNG   string          `json:"png,omitempty"`
	SVG   string          `json:"svg,omitempty"`
	JPEG  string          `json:"jpeg,omitempty"`
	LaTeX string          `json:"latex,omitempty"`
	// Data is a pandas DataFrame's columns: each column's name → its values.
	Data json.RawMessage `json:"data,omitempty"`
	// Chart is the chart a matplotlib figure draws, in E2B's chart format (docs/API.md).
	Chart json.RawMessage `json:"chart,omitempty"`
	// PDF is base64, JavaScript its source.
	PDF        string `json:"pdf,omitempty"`
	JavaScript string `json:"javascript,omitempty"`
	// Extra holds the other MIME types a displayed bundle offered: each type → its value.
	Extra json.RawMessage `json:"extra,omitempty"`
}

// RunError is the exception a run raised: Name is its class ("ValueError"), "TimeoutError" or
// "InterpreterDied" when the interpreter was killed.
type RunError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// RunResult is a finished run. Error is the exception the code raised, not a failure of the
// call; Verdict is empty for a run that ended by itself, else one of the Verdict... codes.
type RunResult struct {
	Stdout          string       `json:"stdout"`
	Stderr          string       `json:"stderr"`
	StdoutTruncated bool         `json:"stdout_truncated"`
	StderrTruncated bool         `json:"stderr_truncated"`
	Results         []RichOutput `json:"results"`
	Error           *RunError    `json:"error"`
	ExecutionCount  uint64       `json:"execution_count"`
	DurationMs      uint64       `json:"duration_ms"`
	Verdict         string       `json:"verdict"`
	// Restarted says the interpreter was killed (timeout, crash, OOM) and started afresh.
	Restarted bool `json:"restarted"`
}

// Main is the value of the run's last expression, or nil when it had none.
func (r *RunResult) Main() *RichOutput {
	for i := range r.Results {
		if r.Results[i].IsMainResult {
			return &r.Results[i]
		}
	}
	return nil
}

// CreateContext starts an interpreter in a session.
func (c *Client) CreateContext(ctx context.Context, id string, req CreateContextRequest) (*CodeContext, error) {
	p, err := sessionPath(id, "/contexts")
	if err != nil {
		return nil, err
	}
	return call[CodeContext](ctx, c, http.MethodPost, p, req)
}

// ListContexts lists a session's contexts in creation order.
func (c *Client) ListContexts(ctx context.Context, id string) ([]CodeContext, error) {
	p, err := sessionPath(id, "/contexts")
	if err != nil {
		return nil, err
	}
	var out struct {
		Contexts []CodeContext `json:"contexts"`
	}
	if err := c.doJSON(ctx, http.MethodGet, p, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Contexts, nil
}

// RestartContext starts a context's interpreter afresh: its variables are gone.
func (c *Client) RestartContext(ctx context.Context, id, contextID string) (*CodeContext, error) {
	p, err := contextPath(id, contextID, "/restart")
	if err != nil {
		return nil, err
	}
	return call[CodeContext](ctx, c, http.MethodPost, p, nil)
}

// DeleteContext stops a context's interpreter.
func (c *Client) DeleteContext(ctx context.Context, id, contextID string) error {
	p, err := contextPath(id, contextID, "")
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, nil)
}

// RunCode runs code in a context (DefaultContext: the session's Python one) to its end.
func (c *Client) RunCode(ctx context.Context, id, contextID string, req RunCodeRequest) (*RunResult, error) {
	p, err := contextPath(id, contextID, "/run")
	if err != nil {
		return nil, err
	}
	return call[RunResult](ctx, c, http.MethodPost, p, req)
}

// StreamRunCode runs code in a context and streams its output as it is printed. Iterate with
// Next/Event, then check Err; Close the stream when done with it (closing it early, or
// cancelling ctx, interrupts the run, whose context keeps its state). An answer that is not a
// stream is replayed as stdout, stderr and result events.
func (c *Client) StreamRunCode(ctx context.Context, id, contextID string, req RunCodeRequest) (*RunStream, error) {
	p, err := contextPath(id, contextID, "/run")
	if err != nil {
		return nil, err
	}
	var result RunResult
	body, err := c.postStream(ctx, p, req, &result)
	if err != nil {
		return nil, err
	}
	st := &RunStream{core: eventStream[RunEvent]{
		decode: decodeRunEvent,
		last:   func(ev RunEvent) bool { return ev.Type == EventResult || ev.Type == EventError },
	}}
	if body == nil {
		st.core.queue = runEventsOf(&result)
	} else {
		st.core.body, st.core.sse = body, newSSEReader(body, c.maxEvent)
	}
	return st, nil
}

// RunEvent is one event of a run stream.
type RunEvent struct {
	Type string
	// Data is printed text on EventStdout/EventStderr.
	Data string
	// Run is set on EventResult; its Stdout/Stderr are empty when the output came as events.
	Run *RunResult
	// Err is set on EventError: the run failed after its output began (its context gone, the
	// session ended). Its Status is 0: the answer's own was 200.
	Err *SandboxError
}

// RunStream is the output of a running context run, event by event (as ExecStream).
type RunStream struct {
	core eventStream[RunEvent]
}

// Next advances to the next event; false once the result or error event was delivered, or on
// a broken stream (see Err).
func (s *RunStream) Next() bool { return s.core.next() }

// Event is the event Next advanced to.
func (s *RunStream) Event() RunEvent { return s.core.cur }

// Err is what ended the stream early, or the EventError's failure, or nil after a result.
func (s *RunStream) Err() error {
	if s.core.ended && s.core.cur.Err != nil {
		return s.core.cur.Err
	}
	return s.core.err
}

// Result is the run's outcome once its result event was delivered, else nil.
func (s *RunStream) Result() *RunResult {
	if !s.core.ended {
		return nil
	}
	return s.core.cur.Run
}

// Close releases the connection; a stream closed before its result interrupts the run.
func (s *RunStream) Close() error { return s.core.close() }

func decodeRunEvent(raw sseEvent) (ev RunEvent, known bool, err error) {
	ev.Type = raw.name
	switch raw.name {
	case EventStdout, EventStderr:
		var p struct {
			Data *string `json:"data"`
		}
		err = json.Unmarshal(raw.data, &p)
		if err == nil && p.Data == nil {
			err = fmt.Errorf("no data")
		}
		if err == nil {
			ev.Data = *p.Data
		}
	case EventResult:
		var r RunResult
		err = json.Unmarshal(raw.data, &r)
		ev.Run = &r
	case EventError:
		var p struct {
			Error *struct {
				Code    string          `json:"code"`
				Message string          `json:"message"`
				Details json.RawMessage `json:"details"`
			} `json:"error"`
		}
		err = json.Unmarshal(raw.data, &p)
		if err == nil && p.Error == nil {
			err = fmt.Errorf("no error object")
		}
		if err == nil {
			ev.Err = &SandboxError{Code: p.Error.Code, Message: p.Error.Message, Details: p.Error.Details}
		}
	default:
		return ev, false, nil
	}
	if err != nil {
		return RunEvent{}, true, fmt.Errorf("koder-sandbox: bad %q event: %w", raw.name, err)
	}
	return ev, true, nil
}

// runEventsOf replays a finished run as the events a stream would have carried.
func runEventsOf(r *RunResult) []RunEvent {
	var events []RunEvent
	if r.Stdout != "" {
		events = append(events, RunEvent{Type: EventStdout, Data: r.Stdout})
	}
	if r.Stderr != "" {
		events = append(events, RunEvent{Type: EventStderr, Data: r.Stderr})
	}
	return append(events, RunEvent{Type: EventResult, Run: r})
}

// contextPath is the path of a context's resource; as for sessions, ids that would change
// the path's meaning are refused.
func contextPath(id, contextID, suffix string) (string, error) {
	if contextID == "" || contextID == "." || contextID == ".." {
		return "", fmt.Errorf("koder-sandbox: invalid context id %q", contextID)
	}
	return sessionPath(id, "/contexts/"+url.PathEscape(contextID)+suffix)
}
