package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

func TestErrorBodyBecomesSandboxError(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		answer(w, 404, "application/json", `{"error":{"code":"SANDBOX-NOT-FOUND","message":"session not found","details":{"id":"x"}}}`)
	})
	_, err := c.GetSession(context.Background(), "x")
	var se *SandboxError
	if !errors.As(fmt.Errorf("wrapped: %w", err), &se) {
		t.Fatalf("not a SandboxError: %v", err)
	}
	if se.Status != 404 || se.Code != CodeNotFound || se.Message != "session not found" || string(se.Details) != `{"id":"x"}` {
		t.Errorf("%+v", se)
	}
	if ErrorCode(err) != CodeNotFound || ErrorCode(errors.New("other")) != "" {
		t.Error("ErrorCode")
	}
	if got := se.Error(); got != "koder-sandbox: SANDBOX-NOT-FOUND (HTTP 404): session not found" {
		t.Errorf("Error() %q", got)
	}
}

func TestForeignErrorBodiesStillGiveSandboxErrors(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	cases := []struct {
		name, contentType, body string
		status                  int
		message                 string
	}{
		{"html page", "text/html", "<html>\x1b[31mBad\tGateway\x00</html>", 502, "<html> [31mBad Gateway </html>"},
		{"empty", "text/plain", "", 503, "Service Unavailable"},
		{"other JSON", "application/json", `{"detail":"nope"}`, 400, `{"detail":"nope"}`},
		{"error without code", "application/json", `{"error":{"message":"m"}}`, 500, `{"error":{"message":"m"}}`},
		{"truncated JSON", "application/json", `{"error":{"code":"SANDBOX-`, 500, `{"error":{"code":"SANDBOX-`},
		{"invalid UTF-8", "text/plain", "bad \xff\xfe bytes", 500, "bad \uFFFD bytes"},
		{"huge", "text/plain", huge, 500, huge[:maxErrorSnippet]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
				answer(w, tc.status, tc.contentType, tc.body)
			})
			err := c.DeleteSession(context.Background(), "s")
			var se *SandboxError
			if !errors.As(err, &se) {
				t.Fatalf("not a SandboxError: %v", err)
			}
			if se.Status != tc.status || se.Code != "" || se.Message != tc.message {
				t.Errorf("got %+v", se)
			}
			if !strings.HasPrefix(se.Error(), fmt.Sprintf("koder-sandbox: HTTP %d: ", tc.status)) {
				t.Errorf("Error() %q", se.Error())
			}
		})
	}
}
