package sandbox

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const testKey = "test-key"

// testClient is a client of an httptest server answering with h.
func testClient(t *testing.T, h http.HandlerFunc, opts ...Option) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := NewClient(srv.URL, testKey, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// calls are the requests a recordingClient sent, each as "METHOD escaped-path body".
type calls struct{ seen []string }

// recordingClient is a testClient whose every request is recorded before answerFor answers
// it, so a test compares the calls its SDK calls made with the ones they should have made.
func recordingClient(t *testing.T, answerFor http.HandlerFunc) (*Client, *calls) {
	t.Helper()
	rec := &calls{}
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.seen = append(rec.seen, r.Method+" "+r.URL.EscapedPath()+" "+string(body))
		answerFor(w, r)
	})
	return c, rec
}

func (rec *calls) expect(t *testing.T, want []string) {
	t.Helper()
	if strings.Join(rec.seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("calls:\n%s", strings.Join(rec.seen, "\n"))
	}
}

// answer writes status with a body of the given content type.
func answer(w http.ResponseWriter, status int, contentType, body string) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
