package sandbox

import (
	"net/http"
	"net/http/httptest"
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

// answer writes status with a body of the given content type.
func answer(w http.ResponseWriter, status int, contentType, body string) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
