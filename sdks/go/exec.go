package sandbox

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// Event types of an exec stream.
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr"
	// EventTruncated: this follower fell behind and DroppedChunks chunks of output were lost.
	EventTruncated = "truncated"
	EventExit      = "exit"
)

// ErrStreamTruncated is returned (wrapped) by a stream that ended before its exit event: the
// connection broke or the server went away mid-exec.
var ErrStreamTruncated = errors.New("koder-sandbox: exec stream ended before its exit event")

// ExecEvent is one event of an exec stream.
type ExecEvent struct {
	Type string
	// ExecID is set on EventStart.
	ExecID string
	// Data is a chunk of output on EventStdout/EventStderr (raw bytes, not necessarily UTF-8).
	Data []byte
	// DroppedChunks is set on EventTruncated.
	DroppedChunks int
	// Result is set on EventExit; its Stdout/Stderr are empty when the output came as events.
	Result *ExecResult
}

// Exec runs a command to its end and returns its result with its (bounded) output.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	p, err := sessionPath(id, "/exec")
	if err != nil {
		return nil, err
	}
	var out ExecResult
	if err := c.doJSON(ctx, http.MethodPost, p, nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// StreamExec runs a command and streams its output as it is produced (Server-Sent Events).
// Iterate with Next/Event, then check Err; Close the stream when done with it (closing it
// early, or cancelling ctx, cancels the exec). A server that answers with a plain JSON result
// instead of a stream (an intermediary that drops the Accept header, an older daemon) is
// handled as a synchronous exec: the stream then yields start, stdout, stderr and exit events
// made from that result.
func (c *Client) StreamExec(ctx context.Context, id string, req ExecRequest) (*ExecStream, error) {
	p, err := sessionPath(id, "/exec")
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("koder-sandbox: encoding request: %w", err)
	}
	hr, err := c.newRequest(ctx, http.MethodPost, p, nil, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "text/event-stream")
	resp, err := c.send(hr)
	if err != nil {
		return nil, err
	}
	if isEventStream(resp.Header.Get("Content-Type")) {
		return &ExecStream{body: resp.Body, sse: newSSEReader(resp.Body, c.maxEvent)}, nil
	}
	defer resp.Body.Close()
	var result ExecResult
	if err := c.decodeBody(resp.Body, &result); err != nil {
		return nil, err
	}
	return &ExecStream{queue: eventsOf(&result)}, nil
}

func isEventStream(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "text/event-stream"
}

// eventsOf replays a finished exec as the events a stream would have carried.
func eventsOf(r *ExecResult) []ExecEvent {
	events := []ExecEvent{{Type: EventStart, ExecID: r.ExecID}}
	if r.Stdout != "" {
		events = append(events, ExecEvent{Type: EventStdout, Data: []byte(r.Stdout)})
	}
	if r.Stderr != "" {
		events = append(events, ExecEvent{Type: EventStderr, Data: []byte(r.Stderr)})
	}
	return append(events, ExecEvent{Type: EventExit, ExecID: r.ExecID, Result: r})
}

// ExecStream is the output of a running exec, event by event:
//
//	for st.Next() {
//		ev := st.Event()
//		...
//	}
//	if err := st.Err(); err != nil { ... }
type ExecStream struct {
	body   io.ReadCloser // nil once closed, and for a replayed result
	sse    *sseReader
	queue  []ExecEvent
	cur    ExecEvent
	result *ExecResult
	err    error
	done   bool
}

// Next advances to the next event; false once the exit event was delivered, or on an error
// (see Err).
func (s *ExecStream) Next() bool {
	if s.done {
		return false
	}
	ev, err := s.read()
	if err != nil {
		s.fail(err)
		return false
	}
	s.cur = ev
	if ev.Type == EventExit {
		s.result = ev.Result
		s.done = true
		s.closeBody()
	}
	return true
}

func (s *ExecStream) read() (ExecEvent, error) {
	if s.sse == nil {
		if len(s.queue) == 0 {
			return ExecEvent{}, ErrStreamTruncated
		}
		ev := s.queue[0]
		s.queue = s.queue[1:]
		return ev, nil
	}
	for {
		raw, err := s.sse.next()
		if err == io.EOF {
			return ExecEvent{}, ErrStreamTruncated
		}
		if err != nil {
			return ExecEvent{}, err
		}
		ev, known, err := decodeEvent(raw)
		if err != nil {
			return ExecEvent{}, err
		}
		// Event types added by later servers are skipped.
		if known {
			return ev, nil
		}
	}
}

func (s *ExecStream) fail(err error) {
	s.err = err
	s.done = true
	s.closeBody()
}

// Event is the event Next advanced to.
func (s *ExecStream) Event() ExecEvent { return s.cur }

// Err is the error that ended the stream early, or nil after a complete stream.
func (s *ExecStream) Err() error { return s.err }

// Result is the exec's result once its exit event was delivered, else nil.
func (s *ExecStream) Result() *ExecResult { return s.result }

// Close releases the connection; a stream closed before its exit event cancels the exec.
func (s *ExecStream) Close() error {
	s.done = true
	return s.closeBody()
}

func (s *ExecStream) closeBody() error {
	if s.body == nil {
		return nil
	}
	err := s.body.Close()
	s.body = nil
	return err
}

// decodeEvent turns one SSE event into an ExecEvent; known is false for event types this
// client does not know.
func decodeEvent(raw sseEvent) (ev ExecEvent, known bool, err error) {
	ev.Type = raw.name
	switch raw.name {
	case EventStart:
		var p struct {
			ExecID string `json:"exec_id"`
		}
		err = json.Unmarshal(raw.data, &p)
		ev.ExecID = p.ExecID
	case EventStdout, EventStderr:
		ev.Data, err = decodeChunk(raw.data)
	case EventTruncated:
		var p struct {
			DroppedChunks int `json:"dropped_chunks"`
		}
		err = json.Unmarshal(raw.data, &p)
		ev.DroppedChunks = p.DroppedChunks
	case EventExit:
		var r ExecResult
		err = json.Unmarshal(raw.data, &r)
		ev.ExecID, ev.Result = r.ExecID, &r
	default:
		return ev, false, nil
	}
	if err != nil {
		return ExecEvent{}, true, fmt.Errorf("koder-sandbox: bad %q event: %w", raw.name, err)
	}
	return ev, true, nil
}

// decodeChunk reads an output chunk: {"data": text} or, for bytes that are not UTF-8,
// {"data_b64": base64}.
func decodeChunk(data []byte) ([]byte, error) {
	var p struct {
		Data    *string `json:"data"`
		DataB64 *string `json:"data_b64"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, err
	}
	switch {
	case p.Data != nil:
		return []byte(*p.Data), nil
	case p.DataB64 != nil:
		return base64.StdEncoding.DecodeString(*p.DataB64)
	default:
		return nil, errors.New("neither data nor data_b64")
	}
}
