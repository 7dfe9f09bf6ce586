package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"strings"
	"testing"
)

const entryJSON = `{"name":"a b&c.txt","path":"/workspace/a b&c.txt","type":"file","size":5,"mode":420,"modified_at":"2026-01-01T00:00:00Z","uid":1000,"gid":1000}`

func TestWriteFileStreamsAnUnknownLengthBody(t *testing.T) {
	const size = 8 << 20
	var got struct {
		query, contentType string
		length             int64
		sum                [32]byte
	}
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		_, _ = io.Copy(h, r.Body)
		copy(got.sum[:], h.Sum(nil))
		got.query, got.contentType, got.length = r.URL.RawQuery, r.Header.Get("Content-Type"), r.ContentLength
		answer(w, 201, "application/json", entryJSON)
	})
	// A pipe has no length: the body must go out chunked, as it is produced.
	pr, pw := io.Pipe()
	want := sha256.New()
	go func() {
		chunk := bytes.Repeat([]byte{'z'}, 64<<10)
		for i := 0; i < size/len(chunk); i++ {
			want.Write(chunk)
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
		pw.Close()
	}()
	e, err := c.WriteFile(context.Background(), "s1", "a b&c.txt", pr)
	if err != nil {
		t.Fatal(err)
	}
	if got.query != "path=a+b%26c.txt" || got.contentType != "application/octet-stream" || got.length != -1 {
		t.Errorf("request %+v", got)
	}
	if !bytes.Equal(got.sum[:], want.Sum(nil)) {
		t.Error("the server got other bytes")
	}
	if e.Name != "a b&c.txt" || e.UID != 1000 || e.Mode != 0o644 {
		t.Errorf("entry %+v", e)
	}
}

// closeSpy records whether it was closed.
type closeSpy struct {
	io.Reader
	closed bool
}

func (c *closeSpy) Close() error { c.closed = true; return nil }

func TestWriteFileSendsKnownLengthsAndLeavesClosersOpen(t *testing.T) {
	var length int64
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		length = r.ContentLength
		answer(w, 201, "application/json", entryJSON)
	})
	ctx := context.Background()
	if _, err := c.WriteFile(ctx, "s1", "f", strings.NewReader("hello")); err != nil || length != 5 {
		t.Fatalf("err %v, length %d", err, length)
	}
	spy := &closeSpy{Reader: strings.NewReader("abc")}
	if _, err := c.WriteFile(ctx, "s1", "f", spy); err != nil || spy.closed {
		t.Fatalf("err %v, closed %v", err, spy.closed)
	}
}

func TestWriteFileOverQuotaIsASandboxError(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		answer(w, 507, "application/json", `{"error":{"code":"SANDBOX-FS-QUOTA-EXCEEDED","message":"disk quota exceeded"}}`)
	})
	_, err := c.WriteFile(context.Background(), "s1", "f", strings.NewReader("x"))
	if ErrorCode(err) != CodeFSQuotaExceeded {
		t.Fatalf("got %v", err)
	}
}

func TestReadFileStreamsTheBody(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") != "/etc/x y" {
			t.Errorf("query %q", r.URL.RawQuery)
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write([]byte{0, 1, 2, 0xff})
	})
	rc, err := c.ReadFile(context.Background(), "s1", "/etc/x y")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(b, []byte{0, 1, 2, 0xff}) {
		t.Fatalf("err %v, %v", err, b)
	}
}

func TestReadFileCutShortFailsTheRead(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		_, _ = w.Write([]byte("only ten b"))
	})
	rc, err := c.ReadFile(context.Background(), "s1", "f")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadAll(rc); err == nil {
		t.Fatal("a short transfer read as complete")
	}
}

func TestStatFileAsksForOnePath(t *testing.T) {
	var queries []string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.Path+"?"+r.URL.RawQuery)
		if r.URL.Query().Get("path") == "sub/missing" {
			answer(w, 404, "application/json", `{"error":{"code":"SANDBOX-NOT-FOUND","message":"no such file"}}`)
			return
		}
		answer(w, 200, "application/json", entryJSON)
	})
	ctx := context.Background()
	e, err := c.StatFile(ctx, "s1", "/workspace/a b&c.txt")
	if err != nil || e.Path != "/workspace/a b&c.txt" {
		t.Fatalf("err %v, entry %+v", err, e)
	}
	if _, err := c.StatFile(ctx, "s1", "sub/missing"); ErrorCode(err) != CodeNotFound {
		t.Fatalf("missing: %v", err)
	}
	want := []string{
		"/v1/sandbox/sessions/s1/files/stat?path=%2Fworkspace%2Fa+b%26c.txt",
		"/v1/sandbox/sessions/s1/files/stat?path=sub%2Fmissing",
	}
	if strings.Join(queries, " ") != strings.Join(want, " ") {
		t.Errorf("queries %q", queries)
	}
}

func TestFileCallsShapeTheirRequests(t *testing.T) {
	var got []string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+" "+string(body))
		switch r.Method {
		case http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case http.MethodGet:
			answer(w, 200, "application/json", `{"entries":[],"truncated":true}`)
		default:
			answer(w, 200, "application/json", entryJSON)
		}
	})
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.DeleteFile(ctx, "s1", "d", true))
	must(c.DeleteFile(ctx, "s1", "f", false))
	_, err := c.MakeDir(ctx, "s1", "d/e")
	must(err)
	_, err = c.MoveFile(ctx, "s1", "a", "b")
	must(err)
	l, err := c.ListFiles(ctx, "s1", "/", 0)
	must(err)
	if !l.Truncated {
		t.Error("truncated lost")
	}
	want := []string{
		"DELETE /v1/sandbox/sessions/s1/files?path=d&recursive=true ",
		"DELETE /v1/sandbox/sessions/s1/files?path=f ",
		`POST /v1/sandbox/sessions/s1/files/mkdir? {"path":"d/e"}`,
		`POST /v1/sandbox/sessions/s1/files/move? {"from":"a","to":"b"}`,
		"GET /v1/sandbox/sessions/s1/files/list?path=%2F ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests\n%s", strings.Join(got, "\n"))
	}
}
