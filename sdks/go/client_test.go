package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestNewClientRefusesUnusableBaseURLs(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:7070", "ftp://host", "http://", "http://h/?q=1", "http://u:p@h", "http://h/#f", "http://[::1"} {
		if _, err := NewClient(u, "k"); err == nil {
			t.Errorf("NewClient(%q) accepted", u)
		}
	}
}

func TestRequestsCarryKeyAndKeepThePathPrefix(t *testing.T) {
	var got *http.Request
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		got = r
		answer(w, 200, "application/json", `{"sessions":[{"id":"s1","state":"running"}]}`)
	})
	prefixed, err := NewClient(c.base+"/proxy/", testKey)
	if err != nil {
		t.Fatal(err)
	}
	list, err := prefixed.ListSessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got.URL.Path != "/proxy/v1/sandbox/sessions" {
		t.Errorf("path %q", got.URL.Path)
	}
	if a := got.Header.Get("Authorization"); a != "Bearer "+testKey {
		t.Errorf("Authorization %q", a)
	}
	if ua := got.Header.Get("User-Agent"); !strings.HasPrefix(ua, "koder-sandbox-go/") {
		t.Errorf("User-Agent %q", ua)
	}
	if len(list) != 1 || list[0].ID != "s1" || list[0].client != prefixed {
		t.Errorf("list %+v", list)
	}
}

func TestSessionIDsAreEscapedAndPathChangingOnesRefused(t *testing.T) {
	var raw string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		raw = r.URL.EscapedPath()
		answer(w, 200, "application/json", `{"id":"a/b?c"}`)
	})
	ctx := context.Background()
	if _, err := c.GetSession(ctx, "a/b?c"); err != nil {
		t.Fatal(err)
	}
	if raw != "/v1/sandbox/sessions/a%2Fb%3Fc" {
		t.Errorf("escaped path %q", raw)
	}
	for _, id := range []string{"", ".", ".."} {
		raw = ""
		if _, err := c.GetSession(ctx, id); err == nil || raw != "" {
			t.Errorf("id %q: err %v, sent %q", id, err, raw)
		}
	}
}

func TestWithHTTPClientIsUsed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer(w, 200, "application/json", `{"id":"s"}`)
	}))
	defer srv.Close()
	used := false
	hc := &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		used = true
		return http.DefaultTransport.RoundTrip(r)
	})}
	c, err := NewClient(srv.URL, "k", WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSession(context.Background(), "s"); err != nil || !used {
		t.Fatalf("err %v, custom client used: %v", err, used)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestCreateSessionSendsOnlyWhatIsSet(t *testing.T) {
	var body string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		body = string(raw)
		answer(w, 201, "application/json", `{"id":"s1","limits":{"cpu_millis":500,"memory_mib":256,"disk_mib":1024,"pids":64},"network":{"mode":"none"},"created_at":"2026-01-02T03:04:05.5Z"}`)
	})
	s, err := c.CreateSession(context.Background(), CreateSessionRequest{
		Language: "python", Limits: &Limits{MemoryMiB: 256}, Network: &Network{Mode: NetworkNone},
		Env: map[string]string{"K": "V"}, TimeoutS: 60,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"language":"python","limits":{"memory_mib":256},"network":{"mode":"none"},"env":{"K":"V"},"timeout_s":60}`
	if body != want {
		t.Errorf("body\n got %s\nwant %s", body, want)
	}
	if s.Limits.MemoryMiB != 256 || s.Limits.CPUMillis != 500 || s.CreatedAt.Nanosecond() != 5e8 {
		t.Errorf("session %+v", s)
	}
}

func TestBadJSONInASuccessIsAPlainError(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		answer(w, 200, "application/json", `{"id": "s1", "state": `)
	})
	_, err := c.GetSession(context.Background(), "s1")
	var se *SandboxError
	if err == nil || errors.As(err, &se) {
		t.Fatalf("want a decoding error, got %v", err)
	}
}

func TestAnswerOverTheBoundIsRefused(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		answer(w, 200, "application/json", `{"exec_id":"x","stdout":"`+strings.Repeat("a", 4096)+`"}`)
	}, WithMaxResponseBytes(1024))
	_, err := c.Exec(context.Background(), "s1", ExecRequest{Cmd: []string{"true"}})
	if !errors.Is(err, errAnswerTooLarge) {
		t.Fatalf("want errAnswerTooLarge, got %v", err)
	}
}

func TestSessionCloseDeletes(t *testing.T) {
	var method, path string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			answer(w, 201, "application/json", `{"id":"s9"}`)
			return
		}
		method, path = r.Method, r.URL.Path
		w.WriteHeader(http.StatusNoContent)
	})
	ctx := context.Background()
	s, err := c.CreateSession(ctx, CreateSessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil || method != http.MethodDelete || path != "/v1/sandbox/sessions/s9" {
		t.Fatalf("close: %v, %s %s", err, method, path)
	}
	if err := (&Session{ID: "x"}).Close(ctx); err == nil {
		t.Fatal("a Session without a client closed")
	}
}

func TestSessionEventsPagesWithItsQuery(t *testing.T) {
	var asked []string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.Method+" "+r.URL.EscapedPath()+"?"+r.URL.RawQuery)
		if r.URL.Query().Get("limit") == "501" {
			answer(w, 400, "application/json", `{"error":{"code":"SANDBOX-INVALID-ARGUMENT","message":"limit must be 1 to 500, not 501"}}`)
			return
		}
		answer(w, 200, "application/json", `{"events":[`+
			`{"seq":2,"id":"evt_2","type":"exec.verdict","created_at":"2026-12-07T20:00:00.123Z","data":{"session_id":"a/b","verdict":"SANDBOX-EXEC-TIMEOUT","exit_code":null,"signal":9,"duration_ms":201}},`+
			`{"seq":3,"id":"evt_3","type":"session.stopped","created_at":"2026-12-07T20:00:01Z","data":{"session_id":"a/b","cause":"deleted","reason":"deleted"}}`+
			`],"more":true}`)
	})
	ctx := context.Background()
	page, err := c.SessionEvents(ctx, "a/b", 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 2 || !page.More {
		t.Fatalf("page %+v", page)
	}
	e := page.Events[0]
	if e.Seq != 2 || e.ID != "evt_2" || e.Type != SessionEventVerdict || e.CreatedAt.Nanosecond() != 123e6 {
		t.Errorf("event %+v", e)
	}
	var verdict struct {
		Verdict  string `json:"verdict"`
		ExitCode *int   `json:"exit_code"`
		Signal   int    `json:"signal"`
	}
	if err := json.Unmarshal(e.Data, &verdict); err != nil || verdict.Verdict != VerdictTimeout ||
		verdict.ExitCode != nil || verdict.Signal != 9 {
		t.Errorf("data %s: %v %+v", e.Data, err, verdict)
	}
	if page.Events[1].Type != SessionEventStopped {
		t.Errorf("second event %+v", page.Events[1])
	}
	if _, err := c.SessionEvents(ctx, "s1", 0, 0); err != nil {
		t.Fatal(err)
	}
	_, err = c.SessionEvents(ctx, "s1", 0, 501)
	if ErrorCode(err) != CodeInvalidArgument {
		t.Fatalf("limit 501: %v", err)
	}
	want := []string{
		"GET /v1/sandbox/sessions/a%2Fb/events?after=1&limit=2",
		"GET /v1/sandbox/sessions/s1/events?",
		"GET /v1/sandbox/sessions/s1/events?limit=501",
	}
	if strings.Join(asked, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests\n%s", strings.Join(asked, "\n"))
	}
}
