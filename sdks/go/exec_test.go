package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// sseServer answers every exec with the given event-stream body.
func sseServer(t *testing.T, body string, opts ...Option) *Client {
	return testClient(t, func(w http.ResponseWriter, r *http.Request) {
		answer(w, 200, "text/event-stream", body)
	}, opts...)
}

// drainable is what ExecStream and RunStream have in common.
type drainable[E any] interface {
	Next() bool
	Event() E
	Err() error
	Close() error
}

// drainAll collects a stream's events and its final error.
func drainAll[E any](t *testing.T, st drainable[E]) ([]E, error) {
	t.Helper()
	defer st.Close()
	var events []E
	for st.Next() {
		events = append(events, st.Event())
	}
	return events, st.Err()
}

func drain(t *testing.T, st *ExecStream) ([]ExecEvent, error) {
	t.Helper()
	return drainAll[ExecEvent](t, st)
}

func stream(t *testing.T, c *Client) *ExecStream {
	t.Helper()
	st, err := c.StreamExec(context.Background(), "s1", ExecRequest{Shell: "x"})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

const exitEvent = "event: exit\ndata: {\"exec_id\":\"e1\",\"exit_code\":3,\"signal\":null,\"duration_ms\":5,\"verdict\":null,\"stdout_truncated\":false,\"stderr_truncated\":false}\n\n"

func TestStreamExecParsesTheDaemonsEvents(t *testing.T) {
	body := ": keep-alive\n\n" +
		"event: start\ndata: {\"exec_id\":\"e1\"}\n\n" +
		"event: stdout\r\ndata: {\"data\":\"hi\\n\"}\r\n\r\n" +
		"event: stdout\ndata: {\"data_b64\":\"//4=\"}\n\n" +
		"event: progress\ndata: {\"later\":\"server\"}\n\n" + // unknown: skipped
		"id: 7\nretry: 10\nevent: stderr\ndata:{\"data\":\ndata: \"err\"}\n\n" + // split data, no space
		"event: truncated\ndata: {\"dropped_chunks\":4}\n\n" +
		exitEvent
	// One byte at a time: no event may depend on arriving in one read.
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "text/event-stream" {
			t.Errorf("Accept %q", r.Header.Get("Accept"))
		}
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		_, _ = io.Copy(flushWriter{w}, iotest.OneByteReader(strings.NewReader(body)))
	})
	events, err := drain(t, stream(t, c))
	if err != nil {
		t.Fatal(err)
	}
	want := []ExecEvent{
		{Type: EventStart, ExecID: "e1"},
		{Type: EventStdout, Data: []byte("hi\n")},
		{Type: EventStdout, Data: []byte{0xff, 0xfe}},
		{Type: EventStderr, Data: []byte("err")},
		{Type: EventTruncated, DroppedChunks: 4},
	}
	if len(events) != len(want)+1 {
		t.Fatalf("events %+v", events)
	}
	for i, w := range want {
		g := events[i]
		if g.Type != w.Type || g.ExecID != w.ExecID || string(g.Data) != string(w.Data) || g.DroppedChunks != w.DroppedChunks {
			t.Errorf("event %d: got %+v want %+v", i, g, w)
		}
	}
	exit := events[len(events)-1]
	if exit.Type != EventExit || exit.Result == nil || *exit.Result.ExitCode != 3 || exit.Result.Signal != nil || exit.ExecID != "e1" {
		t.Errorf("exit %+v", exit)
	}
}

type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	f.w.(http.Flusher).Flush()
	return n, err
}

func TestStreamExecFallsBackToAJSONAnswer(t *testing.T) {
	var asked string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		asked = r.Header.Get("Accept")
		answer(w, 200, "application/json", `{"exec_id":"e2","exit_code":0,"signal":null,"stdout":"out\n","stderr":"err\n","stdout_truncated":false,"stderr_truncated":false,"duration_ms":3,"peak_memory_kib":100,"verdict":null}`)
	})
	st := stream(t, c)
	events, err := drain(t, st)
	if err != nil {
		t.Fatal(err)
	}
	if asked != "text/event-stream" {
		t.Errorf("Accept %q", asked)
	}
	var got []string
	for _, ev := range events {
		got = append(got, ev.Type+"="+string(ev.Data)+ev.ExecID)
	}
	if strings.Join(got, ",") != "start=e2,stdout=out\n,stderr=err\n,exit=e2" {
		t.Errorf("events %q", got)
	}
	r := st.Result()
	if r == nil || r.Stdout != "out\n" || *r.ExitCode != 0 || *r.PeakMemoryKiB != 100 {
		t.Errorf("result %+v", r)
	}
}

func TestStreamExecFallbackWithBadJSONFails(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		answer(w, 200, "application/json", `{"exec_id":`)
	})
	if st, err := c.StreamExec(context.Background(), "s1", ExecRequest{Cmd: []string{"true"}}); err == nil {
		st.Close()
		t.Fatal("bad JSON accepted")
	}
}

func TestStreamExecErrorBeforeTheStreamIsASandboxError(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		answer(w, 409, "application/json", `{"error":{"code":"SANDBOX-CONFLICT","message":"the session is paused; resume it first"}}`)
	})
	_, err := c.StreamExec(context.Background(), "s1", ExecRequest{Cmd: []string{"true"}})
	if ErrorCode(err) != CodeConflict {
		t.Fatalf("got %v", err)
	}
}

func TestStreamEndingBeforeExitIsTruncated(t *testing.T) {
	for name, body := range map[string]string{
		"empty":              "",
		"after output":       "event: start\ndata: {\"exec_id\":\"e\"}\n\nevent: stdout\ndata: {\"data\":\"a\"}\n\n",
		"mid event":          "event: exit\ndata: {\"exec_id\":\"e\",\"exit_code\":0}\n",
		"mid line":           "event: exit\ndata: {\"exec_id\":\"e\",\"exit_co",
		"exit without blank": "event: exit\ndata: {\"exec_id\":\"e\",\"exit_code\":0}",
	} {
		t.Run(name, func(t *testing.T) {
			events, err := drain(t, stream(t, sseServer(t, body)))
			if !errors.Is(err, ErrStreamTruncated) {
				t.Fatalf("err %v", err)
			}
			for _, ev := range events {
				if ev.Type == EventExit {
					t.Fatal("an incomplete exit event was delivered")
				}
			}
		})
	}
}

func TestChunkedBodyCutShortIsTruncated(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: start\ndata: {\"exec_id\":\"e\"}\n\n")
		w.(http.Flusher).Flush()
		// Kill the connection mid-chunk-stream: the client sees an unexpected EOF.
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	if _, err := drain(t, stream(t, c)); !errors.Is(err, ErrStreamTruncated) {
		t.Fatalf("err %v", err)
	}
}

func TestBadEventsFailTheStream(t *testing.T) {
	for name, body := range map[string]string{
		"bad JSON":         "event: stdout\ndata: {\"data\": nope}\n\n" + exitEvent,
		"bad base64":       "event: stdout\ndata: {\"data_b64\":\"%%%\"}\n\n" + exitEvent,
		"no data field":    "event: stderr\ndata: {\"text\":\"x\"}\n\n" + exitEvent,
		"exit not an obj":  "event: exit\ndata: [1,2]\n\n",
		"start bad type":   "event: start\ndata: {\"exec_id\":7}\n\n" + exitEvent,
		"truncated string": "event: truncated\ndata: {\"dropped_chunks\":\"many\"}\n\n" + exitEvent,
	} {
		t.Run(name, func(t *testing.T) {
			events, err := drain(t, stream(t, sseServer(t, body)))
			if err == nil || errors.Is(err, ErrStreamTruncated) {
				t.Fatalf("err %v", err)
			}
			if len(events) != 0 {
				t.Fatalf("events before the bad one only: %+v", events)
			}
		})
	}
}

// endless is a reader that never ends and never sends a newline.
type endless struct{ read int64 }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	e.read += int64(len(p))
	return len(p), nil
}

func TestHugeLineIsRefusedWithoutBufferingIt(t *testing.T) {
	src := &endless{}
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: stdout\ndata: ")
		_, _ = io.Copy(w, src) // ends when the client hangs up
	}, WithMaxEventBytes(256<<10))
	done := make(chan error, 1)
	go func() {
		_, err := drain(t, stream(t, c))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrEventTooLarge) {
			t.Fatalf("err %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an endless line was still being read")
	}
}

func TestManySmallLinesCannotMakeAHugeEvent(t *testing.T) {
	body := "event: stdout\n" + strings.Repeat("data: aaaaaaaaaaaaaaaa\n", 4096) + "\n" + exitEvent
	_, err := drain(t, stream(t, sseServer(t, body, WithMaxEventBytes(8<<10))))
	if !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("err %v", err)
	}
}

func TestLargeEventsUnderTheBoundPass(t *testing.T) {
	big := strings.Repeat("x", 200<<10) // longer than the reader's buffer
	payload, _ := json.Marshal(map[string]string{"data": big})
	body := "event: stdout\ndata: " + string(payload) + "\n\n" + exitEvent
	events, err := drain(t, stream(t, sseServer(t, body)))
	if err != nil || len(events) != 2 || string(events[0].Data) != big {
		t.Fatalf("err %v, %d events", err, len(events))
	}
}

func TestClosingAStreamHangsUp(t *testing.T) {
	gone := make(chan struct{})
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: start\ndata: {\"exec_id\":\"e\"}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	})
	st := stream(t, c)
	if !st.Next() || st.Event().Type != EventStart {
		t.Fatalf("first event: %v", st.Err())
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if st.Next() || st.Err() != nil {
		t.Fatal("a closed stream went on")
	}
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not see the client go")
	}
}

func TestCancelledContextEndsTheStream(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.StreamExec(ctx, "s1", ExecRequest{Cmd: []string{"sleep", "9"}})
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := drain(t, st); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}
