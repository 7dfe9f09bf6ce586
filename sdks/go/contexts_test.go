package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

const runResultJSON = `{"stdout":"","stderr":"","stdout_truncated":false,"stderr_truncated":false,` +
	`"results":[{"is_main_result":false,"text":"<Figure>","png":"iVBO","chart":{"type":"bar","elements":[]}},` +
	`{"is_main_result":false,"pdf":"JVBE","javascript":"alert(1)","extra":{"application/x-t":{"a":1}}},` +
	`{"is_main_result":true,"text":"42","json":42}],"error":null,"execution_count":2,"duration_ms":7,` +
	`"verdict":null,"restarted":false}`

func TestRunCodeSendsTheRunAndDecodesItsResults(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.EscapedPath() != "/v1/sandbox/sessions/s1/contexts/c%2F1/run" {
			t.Errorf("%s %s", r.Method, r.URL.EscapedPath())
		}
		var body map[string]interface{}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Error(err)
		}
		if body["code"] != "x + 1" || body["timeout_ms"] != 900.0 || len(body) != 3 {
			t.Errorf("body %v", body)
		}
		answer(w, 200, "application/json", runResultJSON)
	})
	req := RunCodeRequest{Code: "x + 1", TimeoutMs: 900, Env: map[string]string{"A": "1"}}
	r, err := c.RunCode(context.Background(), "s1", "c/1", req)
	if err != nil {
		t.Fatal(err)
	}
	main := r.Main()
	if main == nil || main.Text != "42" || string(main.JSON) != "42" || r.ExecutionCount != 2 {
		t.Fatalf("result %+v", r)
	}
	var chart struct{ Type string }
	if err := json.Unmarshal(r.Results[0].Chart, &chart); err != nil || chart.Type != "bar" {
		t.Errorf("chart %s: %v", r.Results[0].Chart, err)
	}
	if o := r.Results[1]; o.PDF != "JVBE" || o.JavaScript != "alert(1)" || string(o.Extra) != `{"application/x-t":{"a":1}}` {
		t.Errorf("pdf, javascript, extra: %+v", o)
	}
	if (&RunResult{}).Main() != nil {
		t.Error("a run without a value has no main result")
	}
}

func TestContextCallsUseTheirRoutes(t *testing.T) {
	var seen []string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.Path)
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case r.URL.Path == "/v1/sandbox/sessions/s1/contexts" && r.Method == http.MethodGet:
			answer(w, 200, "application/json", `{"contexts":[{"context_id":"c1","language":"typescript","execution_count":0,"cwd":"/tmp"}]}`)
		default:
			if r.URL.Path == "/v1/sandbox/sessions/s1/contexts" && string(body) != `{"language":"typescript","cwd":"/tmp"}` {
				t.Errorf("create body %s", body)
			}
			answer(w, 200, "application/json", `{"context_id":"c1","language":"typescript","execution_count":0,"cwd":"/tmp"}`)
		}
	})
	ctx := context.Background()
	made, err := c.CreateContext(ctx, "s1", CreateContextRequest{Language: LanguageTypeScript, Cwd: "/tmp"})
	if err != nil || made.ContextID != "c1" || made.Language != LanguageTypeScript {
		t.Fatalf("%+v %v", made, err)
	}
	all, err := c.ListContexts(ctx, "s1")
	if err != nil || len(all) != 1 || all[0].Cwd != "/tmp" {
		t.Fatalf("%+v %v", all, err)
	}
	if _, err := c.RestartContext(ctx, "s1", "c1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteContext(ctx, "s1", "c1"); err != nil {
		t.Fatal(err)
	}
	want := "POST /v1/sandbox/sessions/s1/contexts,GET /v1/sandbox/sessions/s1/contexts," +
		"POST /v1/sandbox/sessions/s1/contexts/c1/restart,DELETE /v1/sandbox/sessions/s1/contexts/c1"
	if strings.Join(seen, ",") != want {
		t.Errorf("calls %q", seen)
	}
}

func TestContextIDsThatWouldChangeThePathAreRefused(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("no request should be sent: %s", r.URL)
	})
	ctx := context.Background()
	for _, id := range []string{"", ".", ".."} {
		if _, err := c.RunCode(ctx, "s1", id, RunCodeRequest{Code: "1"}); err == nil {
			t.Errorf("context id %q accepted", id)
		}
		if err := c.DeleteContext(ctx, "s1", id); err == nil {
			t.Errorf("context id %q accepted", id)
		}
	}
}

func drainRun(t *testing.T, st *RunStream) ([]RunEvent, error) {
	t.Helper()
	return drainAll[RunEvent](t, st)
}

func streamRun(t *testing.T, c *Client) *RunStream {
	t.Helper()
	st, err := c.StreamRunCode(context.Background(), "s1", DefaultContext, RunCodeRequest{Code: "x"})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStreamRunCodeParsesTheDaemonsEvents(t *testing.T) {
	body := "event: stdout\ndata: {\"data\":\"0\\n\"}\n\n" +
		"event: later\ndata: {}\n\n" + // unknown: skipped
		"event: stderr\ndata: {\"data\":\"warn\\n\"}\n\n" +
		"event: result\ndata: " + runResultJSON + "\n\n"
	c := sseServer(t, body)
	st := streamRun(t, c)
	events, err := drainRun(t, st)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range events {
		got = append(got, ev.Type+"="+ev.Data)
	}
	if strings.Join(got, ",") != "stdout=0\n,stderr=warn\n,result=" {
		t.Errorf("events %q", got)
	}
	if r := st.Result(); r == nil || r.Main().Text != "42" {
		t.Errorf("result %+v", r)
	}
}

func TestAFailureInTheStreamIsItsError(t *testing.T) {
	body := "event: stdout\ndata: {\"data\":\"so far\"}\n\n" +
		"event: error\ndata: {\"error\":{\"code\":\"SANDBOX-SESSION-STOPPED\",\"message\":\"gone\"}}\n\n"
	st := streamRun(t, sseServer(t, body))
	events, err := drainRun(t, st)
	if len(events) != 2 || ErrorCode(err) != CodeSessionStopped || st.Result() != nil {
		t.Fatalf("events %+v, err %v", events, err)
	}
}

func TestARunStreamCutShortIsTruncated(t *testing.T) {
	for _, body := range []string{
		"event: stdout\ndata: {\"data\":\"a\"}\n\n",
		"event: stdout\ndata: {\"data\":\"a\"}\n\nevent: result\ndata: {\"stdout\":", // cut mid-event
		"event: stdout\ndata: {\"nodata\":1}\n\n",                                    // malformed
	} {
		st := streamRun(t, sseServer(t, body))
		_, err := drainRun(t, st)
		if err == nil || st.Result() != nil {
			t.Errorf("%q: err %v", body, err)
		}
		if strings.HasPrefix(body, "event: stdout\ndata: {\"data\"") && !errors.Is(err, ErrStreamTruncated) {
			t.Errorf("%q: want ErrStreamTruncated, got %v", body, err)
		}
	}
}

func TestStreamRunCodeFallsBackToAJSONAnswer(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		answer(w, 200, "application/json", strings.Replace(runResultJSON, `"stdout":""`, `"stdout":"out"`, 1))
	})
	st := streamRun(t, c)
	events, err := drainRun(t, st)
	if err != nil || len(events) != 2 || events[0].Data != "out" || st.Result().Stdout != "out" {
		t.Fatalf("events %+v, err %v", events, err)
	}
}
