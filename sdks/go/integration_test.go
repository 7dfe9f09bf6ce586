package sandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	sandbox "github.com/koder-ai/koder-sandbox/sdks/go"
)

// The integration tests drive a real daemon: KODER_URL, KODER_KEY (a tenant's key) and
// KODER_OTHER_KEY (another tenant's), as scripts/go-sdk-tests.sh sets them.

type daemon struct {
	url, key, otherKey string
}

func realDaemon(t *testing.T) daemon {
	t.Helper()
	d := daemon{os.Getenv("KODER_URL"), os.Getenv("KODER_KEY"), os.Getenv("KODER_OTHER_KEY")}
	if d.url == "" || d.key == "" || d.otherKey == "" {
		t.Skip("integration test: set KODER_URL, KODER_KEY and KODER_OTHER_KEY to run it against a daemon (scripts/go-sdk-tests.sh does)")
	}
	return d
}

func client(t *testing.T, url, key string) *sandbox.Client {
	t.Helper()
	c, err := sandbox.NewClient(url, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newSession creates a session that is deleted when the test ends.
func newSession(t *testing.T, c *sandbox.Client, req sandbox.CreateSessionRequest) *sandbox.Session {
	t.Helper()
	s, err := c.CreateSession(testContext(t), req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := s.Close(context.Background())
		if err != nil && sandbox.ErrorCode(err) != sandbox.CodeNotFound {
			t.Errorf("deleting %s: %v", s.ID, err)
		}
	})
	return s
}

func wantCode(t *testing.T, err error, status int, code string) *sandbox.SandboxError {
	t.Helper()
	var se *sandbox.SandboxError
	if !errors.As(err, &se) {
		t.Fatalf("want a SandboxError %s, got %v", code, err)
	}
	if se.Status != status || se.Code != code {
		t.Fatalf("want %d %s, got %d %s (%s)", status, code, se.Status, se.Code, se.Message)
	}
	return se
}

func TestIntegrationSessionLifecycle(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	ctx := testContext(t)
	s := newSession(t, c, sandbox.CreateSessionRequest{
		Language: "python",
		Limits:   &sandbox.Limits{MemoryMiB: 256, Pids: 64},
		Network:  &sandbox.Network{Mode: sandbox.NetworkNone},
		Env:      map[string]string{"GREETING": "hello"},
		TimeoutS: 120,
		Metadata: map[string]string{"suite": "go-sdk"},
	})
	if s.State != sandbox.StateRunning || s.Language != "python" || s.Limits.MemoryMiB != 256 ||
		s.Limits.Pids != 64 || s.Network.Mode != sandbox.NetworkNone || s.Metadata["suite"] != "go-sdk" {
		t.Errorf("created %+v", s)
	}
	if life := s.ExpiresAt.Sub(s.CreatedAt); life < 119*time.Second || life > 121*time.Second {
		t.Errorf("lifetime %v, want 120s", life)
	}

	got, err := c.GetSession(ctx, s.ID)
	if err != nil || got.ID != s.ID || got.TenantID != s.TenantID {
		t.Fatalf("get: %v %+v", err, got)
	}
	list, err := c.ListSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !listed(list, s.ID) {
		t.Errorf("%s not in %+v", s.ID, list)
	}

	longer, err := c.SetTimeout(ctx, s.ID, 600)
	if err != nil || !longer.ExpiresAt.After(s.ExpiresAt.Add(400*time.Second)) {
		t.Fatalf("set timeout: %v %+v", err, longer)
	}
	m, err := c.Metrics(ctx, s.ID)
	if err != nil || m.MemoryLimitKiB == nil || *m.MemoryLimitKiB != 256*1024 || m.DiskTotalKiB == 0 {
		t.Fatalf("metrics: %v %+v", err, m)
	}

	if err := c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	gone, err := c.GetSession(ctx, s.ID)
	if err != nil || gone.State != sandbox.StateStopped || gone.EndReason == "" {
		t.Fatalf("after delete: %v %+v", err, gone)
	}
	list, err = c.ListSessions(ctx)
	if err != nil || listed(list, s.ID) {
		t.Fatalf("deleted session still listed: %v", err)
	}
	_, err = c.Exec(ctx, s.ID, sandbox.ExecRequest{Cmd: []string{"true"}})
	wantCode(t, err, 404, sandbox.CodeNotFound)
	_, err = c.GetSession(ctx, "no-such-session")
	wantCode(t, err, 404, sandbox.CodeNotFound)
}

func listed(list []sandbox.Session, id string) bool {
	for _, s := range list {
		if s.ID == id {
			return true
		}
	}
	return false
}

func TestIntegrationExec(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	ctx := testContext(t)
	s := newSession(t, c, sandbox.CreateSessionRequest{Language: "python", Env: map[string]string{"GREETING": "hello"}})

	r, err := c.Exec(ctx, s.ID, sandbox.ExecRequest{Cmd: []string{"/usr/bin/python3", "-c", "print(6*7)"}})
	if err != nil || r.Stdout != "42\n" || r.ExitCode == nil || *r.ExitCode != 0 || r.Verdict != "" || r.ExecID == "" {
		t.Fatalf("cmd: %v %+v", err, r)
	}
	r, err = c.Exec(ctx, s.ID, sandbox.ExecRequest{Shell: "echo out; echo err >&2; exit 7"})
	if err != nil || r.Stdout != "out\n" || r.Stderr != "err\n" || *r.ExitCode != 7 {
		t.Fatalf("shell: %v %+v", err, r)
	}
	r, err = c.Exec(ctx, s.ID, sandbox.ExecRequest{
		Code:  "import os, sys; print(os.environ['GREETING'], os.environ['EXTRA'], sys.stdin.read(), os.getcwd())",
		Env:   map[string]string{"EXTRA": "world"},
		Stdin: "from stdin",
		Cwd:   "/tmp",
	})
	if err != nil || r.Stdout != "hello world from stdin /tmp\n" {
		t.Fatalf("code: %v %+v", err, r)
	}
	r, err = c.Exec(ctx, s.ID, sandbox.ExecRequest{Shell: "id -u", User: "user"})
	if err != nil || r.Stdout != "1000\n" {
		t.Fatalf("user: %v %+v", err, r)
	}
	r, err = c.Exec(ctx, s.ID, sandbox.ExecRequest{Shell: "echo before; sleep 5", TimeoutMs: 300})
	if err != nil || r.Verdict != sandbox.VerdictTimeout || r.ExitCode != nil || r.Signal == nil || r.Stdout != "before\n" {
		t.Fatalf("timeout: %v %+v", err, r)
	}
	_, err = c.Exec(ctx, s.ID, sandbox.ExecRequest{Cmd: []string{"no-such-program"}})
	wantCode(t, err, 400, sandbox.CodeInvalidArgument)
	_, err = c.Exec(ctx, s.ID, sandbox.ExecRequest{})
	wantCode(t, err, 400, sandbox.CodeInvalidArgument)
}

func TestIntegrationStreamExec(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	s := newSession(t, c, sandbox.CreateSessionRequest{})
	st, err := c.StreamExec(testContext(t), s.ID, sandbox.ExecRequest{
		Shell: `echo one; sleep 0.2; echo two >&2; sleep 0.2; printf '\377\376'; exit 3`,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var stdout, stderr bytes.Buffer
	var types []string
	var started string
	for st.Next() {
		ev := st.Event()
		types = append(types, ev.Type)
		switch ev.Type {
		case sandbox.EventStart:
			started = ev.ExecID
		case sandbox.EventStdout:
			stdout.Write(ev.Data)
		case sandbox.EventStderr:
			stderr.Write(ev.Data)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != "one\n\xff\xfe" || stderr.String() != "two\n" {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
	if len(types) < 4 || types[0] != sandbox.EventStart || types[len(types)-1] != sandbox.EventExit {
		t.Errorf("event order %v", types)
	}
	r := st.Result()
	if r == nil || r.ExitCode == nil || *r.ExitCode != 3 || r.ExecID != started {
		t.Errorf("result %+v", r)
	}
}

func TestIntegrationFiles(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	ctx := testContext(t)
	s := newSession(t, c, sandbox.CreateSessionRequest{})

	if _, err := c.MakeDir(ctx, s.ID, "data/sub"); err != nil {
		t.Fatal(err)
	}
	// An upload of unknown length, streamed through a pipe.
	const size = 3<<20 + 17
	pr, pw := io.Pipe()
	sum := sha256.New()
	go func() {
		_, err := io.CopyN(io.MultiWriter(pw, sum), rand.Reader, size)
		pw.CloseWithError(err)
	}()
	e, err := c.WriteFile(ctx, s.ID, "data/blob.bin", pr)
	if err != nil || e.Size != size || e.Path != "/workspace/data/blob.bin" || e.Type != "file" {
		t.Fatalf("write: %v %+v", err, e)
	}
	rc, err := c.ReadFile(ctx, s.ID, "/workspace/data/blob.bin")
	if err != nil {
		t.Fatal(err)
	}
	back := sha256.New()
	n, err := io.Copy(back, rc)
	rc.Close()
	if err != nil || n != size || !bytes.Equal(back.Sum(nil), sum.Sum(nil)) {
		t.Fatalf("read back %d bytes: %v (same: %v)", n, err, bytes.Equal(back.Sum(nil), sum.Sum(nil)))
	}

	if _, err := c.WriteFile(ctx, s.ID, "data/note.txt", strings.NewReader("note")); err != nil {
		t.Fatal(err)
	}
	st, err := c.StatFile(ctx, s.ID, "data/note.txt")
	if err != nil || st.Size != 4 || st.Type != "file" || st.Name != "note.txt" {
		t.Fatalf("stat: %v %+v", err, st)
	}
	list, err := c.ListFiles(ctx, s.ID, "data", 1)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, e := range list.Entries {
		names[e.Name] = e.Type
	}
	if names["blob.bin"] != "file" || names["note.txt"] != "file" || names["sub"] != "dir" || len(names) != 3 {
		t.Errorf("listing %v", names)
	}
	moved, err := c.MoveFile(ctx, s.ID, "data/note.txt", "data/sub/moved.txt")
	if err != nil || moved.Path != "/workspace/data/sub/moved.txt" {
		t.Fatalf("move: %v %+v", err, moved)
	}
	_, err = c.StatFile(ctx, s.ID, "data/note.txt")
	wantCode(t, err, 404, sandbox.CodeNotFound)
	_, err = c.ReadFile(ctx, s.ID, "data/nope")
	wantCode(t, err, 404, sandbox.CodeNotFound)

	wantCode(t, c.DeleteFile(ctx, s.ID, "data", false), 409, sandbox.CodeConflict)
	if err := c.DeleteFile(ctx, s.ID, "data", true); err != nil {
		t.Fatal(err)
	}
	_, err = c.StatFile(ctx, s.ID, "data")
	wantCode(t, err, 404, sandbox.CodeNotFound)
}

func TestIntegrationPauseResume(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	ctx := testContext(t)
	s := newSession(t, c, sandbox.CreateSessionRequest{})
	mustExec(t, c, s.ID, "echo mem > /tmp/t; echo disk > /workspace/w")

	for _, keepMemory := range []bool{true, false} {
		p, err := c.PauseSession(ctx, s.ID, keepMemory)
		if err != nil || p.State != sandbox.StatePaused {
			t.Fatalf("pause(memory=%v): %v %+v", keepMemory, err, p)
		}
		_, err = c.Exec(ctx, s.ID, sandbox.ExecRequest{Cmd: []string{"true"}})
		wantCode(t, err, 409, sandbox.CodeConflict)
		r, err := c.ResumeSession(ctx, s.ID)
		if err != nil || r.State != sandbox.StateRunning {
			t.Fatalf("resume: %v %+v", err, r)
		}
	}
	// The memory pause kept /tmp (a tmpfs); the disk pause kept only the filesystem.
	if out := mustExec(t, c, s.ID, "cat /workspace/w; cat /tmp/t 2>/dev/null || echo no-tmp"); out != "disk\nno-tmp\n" {
		t.Errorf("after the pauses: %q", out)
	}
}

func TestIntegrationKillProcesses(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	s := newSession(t, c, sandbox.CreateSessionRequest{})
	mustExec(t, c, s.ID, "setsid sleep 300 >/dev/null 2>&1 &")
	killed, err := c.KillProcesses(testContext(t), s.ID)
	if err != nil || killed < 1 {
		t.Fatalf("killed %d: %v", killed, err)
	}
	if out := mustExec(t, c, s.ID, "echo alive"); out != "alive\n" {
		t.Errorf("after kill: %q", out)
	}
}

func TestIntegrationSessionEvents(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	ctx := testContext(t)
	s := newSession(t, c, sandbox.CreateSessionRequest{})
	r, err := c.Exec(ctx, s.ID, sandbox.ExecRequest{Shell: "sleep 30", TimeoutMs: 200})
	if err != nil || r.Verdict != sandbox.VerdictTimeout {
		t.Fatalf("exec: %v %+v", err, r)
	}
	if err := c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	// The log is written just behind the answers of the calls that make its events.
	var log *sandbox.SessionEventList
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if log, err = c.SessionEvents(ctx, s.ID, 0, 0); err != nil {
			t.Fatal(err)
		}
		if len(log.Events) >= 3 || time.Now().After(deadline) {
			break
		}
	}
	var got []string
	for _, e := range log.Events {
		got = append(got, fmt.Sprintf("%d %s", e.Seq, e.Type))
	}
	want := []string{"1 " + sandbox.SessionEventCreated, "2 " + sandbox.SessionEventVerdict, "3 " + sandbox.SessionEventStopped}
	if strings.Join(got, ", ") != strings.Join(want, ", ") || log.More {
		t.Fatalf("events %v (more %v), want %v", got, log.More, want)
	}
	var verdict, stopped struct {
		SessionID string `json:"session_id"`
		Verdict   string `json:"verdict"`
		Cause     string `json:"cause"`
	}
	if err := json.Unmarshal(log.Events[1].Data, &verdict); err != nil || verdict.Verdict != sandbox.VerdictTimeout || verdict.SessionID != s.ID {
		t.Errorf("verdict data %s: %v", log.Events[1].Data, err)
	}
	if err := json.Unmarshal(log.Events[2].Data, &stopped); err != nil || stopped.Cause != "deleted" {
		t.Errorf("stop data %s: %v", log.Events[2].Data, err)
	}

	page, err := c.SessionEvents(ctx, s.ID, 1, 1)
	if err != nil || len(page.Events) != 1 || page.Events[0].Seq != 2 || !page.More || page.Events[0].ID != log.Events[1].ID {
		t.Fatalf("page after 1: %v %+v", err, page)
	}
	_, err = c.SessionEvents(ctx, s.ID, 0, 501)
	wantCode(t, err, 400, sandbox.CodeInvalidArgument)
	_, err = client(t, d.url, d.otherKey).SessionEvents(ctx, s.ID, 0, 0)
	wantCode(t, err, 404, sandbox.CodeNotFound)
}

func mustExec(t *testing.T, c *sandbox.Client, id, shell string) string {
	t.Helper()
	r, err := c.Exec(testContext(t), id, sandbox.ExecRequest{Shell: shell})
	if err != nil {
		t.Fatal(err)
	}
	return r.Stdout
}

func TestIntegrationOtherTenantSeesNothing(t *testing.T) {
	d := realDaemon(t)
	owner := client(t, d.url, d.key)
	other := client(t, d.url, d.otherKey)
	ctx := testContext(t)
	s := newSession(t, owner, sandbox.CreateSessionRequest{})
	if _, err := owner.WriteFile(ctx, s.ID, "secret.txt", strings.NewReader("s3cret")); err != nil {
		t.Fatal(err)
	}
	_, unknownErr := other.GetSession(ctx, "no-such-session")
	unknown := wantCode(t, unknownErr, 404, sandbox.CodeNotFound)

	_, err := other.GetSession(ctx, s.ID)
	if se := wantCode(t, err, 404, sandbox.CodeNotFound); se.Message != unknown.Message {
		t.Errorf("another tenant's session answers %q, an unknown one %q", se.Message, unknown.Message)
	}
	_, err = other.Exec(ctx, s.ID, sandbox.ExecRequest{Cmd: []string{"true"}})
	wantCode(t, err, 404, sandbox.CodeNotFound)
	_, err = other.StreamExec(ctx, s.ID, sandbox.ExecRequest{Cmd: []string{"true"}})
	wantCode(t, err, 404, sandbox.CodeNotFound)
	_, err = other.ReadFile(ctx, s.ID, "secret.txt")
	wantCode(t, err, 404, sandbox.CodeNotFound)
	_, err = other.WriteFile(ctx, s.ID, "x", strings.NewReader("x"))
	wantCode(t, err, 404, sandbox.CodeNotFound)
	_, err = other.ListFiles(ctx, s.ID, "/workspace", 1)
	wantCode(t, err, 404, sandbox.CodeNotFound)
	_, err = other.PauseSession(ctx, s.ID, true)
	wantCode(t, err, 404, sandbox.CodeNotFound)
	wantCode(t, other.DeleteSession(ctx, s.ID), 404, sandbox.CodeNotFound)
	list, err := other.ListSessions(ctx)
	if err != nil || listed(list, s.ID) {
		t.Fatalf("other tenant's list: %v", err)
	}

	// Still the owner's, untouched.
	if got, err := owner.GetSession(ctx, s.ID); err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("owner: %v %+v", err, got)
	}
}

func TestIntegrationBadKeyIsRefused(t *testing.T) {
	d := realDaemon(t)
	_, err := client(t, d.url, "not-a-key").ListSessions(testContext(t))
	wantCode(t, err, 401, sandbox.CodeAuth)
}
