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
	return call[ExecResult](ctx, c, http.MethodPost, p, req)
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
	var result ExecResult
	body, err := c.postStream(ctx, p, req, &result)
	if err != nil {
		return nil, err
	}
	st := &ExecStream{core: eventStream[ExecEvent]{
		decode: decodeEvent,
		last:   func(ev ExecEvent) bool { return ev.Type == EventExit },
	}}
	if body == nil {
		st.core.queue = eventsOf(&result)
	} else {
		st.core.body, st.core.sse = body, newSSEReader(body, c.maxEvent)
	}
	return st, nil
}

// postStream POSTs in as JSON asking for Server-Sent Events and returns the event stream's
// body. An answer that is not a stream (an intermediary that drops the Accept header, an
// older daemon) is decoded into out as the synchronous result it is, and the body is nil.
func (c *Client) postStream(ctx context.Context, path string, in, out interface{}) (io.ReadCloser, error) {
	raw, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("koder-sandbox: encoding request: %w", err)
	}
	hr, err := c.newRequest(ctx, http.MethodPost, path, nil, bytes.NewReader(raw))
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
		return resp.Body, nil
	}
	defer resp.Body.Close()
	return nil, c.decodeBody(resp.Body, out)
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
	core eventStream[ExecEvent]
}

// Next advances to the next event; false once the exit event was delivered, or on an error
// (see Err).
func (s *ExecStream) Next() bool { return s.core.next() }

// Event is the event Next advanced to.
func (s *ExecStream) Event() ExecEvent { return s.core.cur }

// Err is the error that ended the stream early, or nil after a complete stream.
func (s *ExecStream) Err() error { return s.core.err }

// Result is the exec's result once its exit event was delivered, else nil.
func (s *ExecStream) Result() *ExecResult {
	if !s.core.ended {
		return nil
	}
	return s.core.cur.Result
}

// Close releases the connection; a stream closed before its exit event cancels the exec.
func (s *ExecStream) Close() error { return s.core.close() }

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
