package sandbox_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	sandbox "github.com/koder-ai/koder-sandbox/sdks/go"
)

// The code interpreter, snapshots, fork and volumes against the real daemon (see
// integration_test.go for its set-up).

func TestIntegrationCodeContexts(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	ctx := testContext(t)
	s := newSession(t, c, sandbox.CreateSessionRequest{Language: "python"})

	if _, err := c.RunCode(ctx, s.ID, sandbox.DefaultContext, sandbox.RunCodeRequest{Code: "x = 41"}); err != nil {
		t.Fatal(err)
	}
	r, err := c.RunCode(ctx, s.ID, sandbox.DefaultContext, sandbox.RunCodeRequest{Code: "x + 1"})
	if err != nil || r.Main() == nil || r.Main().Text != "42" || string(r.Main().JSON) != "42" {
		t.Fatalf("state kept between runs: %v %+v", err, r)
	}
	code := "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.title('t')\nplt.show()"
	r, err = c.RunCode(ctx, s.ID, sandbox.DefaultContext, sandbox.RunCodeRequest{Code: code})
	if err != nil || len(r.Results) != 1 || r.Results[0].PNG == "" {
		t.Fatalf("figure: %v %+v", err, r)
	}
	var chart struct {
		Type, Title string
		Elements    []struct{ Label string }
	}
	if err := json.Unmarshal(r.Results[0].Chart, &chart); err != nil || chart.Type != "bar" ||
		chart.Title != "t" || len(chart.Elements) != 2 || chart.Elements[1].Label != "b" {
		t.Errorf("chart %s: %v", r.Results[0].Chart, err)
	}
	r, err = c.RunCode(ctx, s.ID, sandbox.DefaultContext, sandbox.RunCodeRequest{Code: "1 / 0"})
	if err != nil || r.Error == nil || r.Error.Name != "ZeroDivisionError" {
		t.Fatalf("an exception is the run's error, not the call's: %v %+v", err, r)
	}

	st, err := c.StreamRunCode(ctx, s.ID, sandbox.DefaultContext, sandbox.RunCodeRequest{
		Code: "import sys, time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.05)\nprint('e', file=sys.stderr)\nx",
	})
	if err != nil {
		t.Fatal(err)
	}
	var out, errs strings.Builder
	for st.Next() {
		switch ev := st.Event(); ev.Type {
		case sandbox.EventStdout:
			out.WriteString(ev.Data)
		case sandbox.EventStderr:
			errs.WriteString(ev.Data)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if out.String() != "0\n1\n2\n" || errs.String() != "e\n" || st.Result().Main().Text != "41" {
		t.Errorf("streamed %q %q %+v", out.String(), errs.String(), st.Result())
	}

	js, err := c.CreateContext(ctx, s.ID, sandbox.CreateContextRequest{
		Language: sandbox.LanguageTypeScript, Cwd: "/tmp", Env: map[string]string{"WHO": "go"},
	})
	if err != nil || js.Language != sandbox.LanguageTypeScript || js.Cwd != "/tmp" {
		t.Fatalf("create: %v %+v", err, js)
	}
	tsCode := "const who: string = process.env.WHO as string\n`${who} ${process.cwd()}`"
	r, err = c.RunCode(ctx, s.ID, js.ContextID, sandbox.RunCodeRequest{Code: tsCode})
	if err != nil || r.Main() == nil || r.Main().Text != "'go /tmp'" {
		t.Fatalf("typescript: %v %+v", err, r)
	}
	all, err := c.ListContexts(ctx, s.ID)
	if err != nil || len(all) != 2 || all[1].ContextID != js.ContextID || all[1].ExecutionCount != 1 {
		t.Fatalf("list: %v %+v", err, all)
	}
	if _, err := c.RestartContext(ctx, s.ID, js.ContextID); err != nil {
		t.Fatal(err)
	}
	r, err = c.RunCode(ctx, s.ID, js.ContextID, sandbox.RunCodeRequest{Code: "typeof who"})
	if err != nil || r.Main().Text != "'undefined'" {
		t.Fatalf("a restart forgets: %v %+v", err, r)
	}
	if err := c.DeleteContext(ctx, s.ID, js.ContextID); err != nil {
		t.Fatal(err)
	}
	_, err = c.RunCode(ctx, s.ID, js.ContextID, sandbox.RunCodeRequest{Code: "1"})
	wantCode(t, err, 404, sandbox.CodeNotFound)
	_, err = c.CreateContext(ctx, s.ID, sandbox.CreateContextRequest{Language: "cobol"})
	wantCode(t, err, 400, sandbox.CodeInvalidArgument)
}

func TestIntegrationSnapshotsAndFork(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	ctx := testContext(t)
	s := newSession(t, c, sandbox.CreateSessionRequest{})
	write := func(id, text string) {
		t.Helper()
		if _, err := c.WriteFile(ctx, id, "state.txt", strings.NewReader(text)); err != nil {
			t.Fatal(err)
		}
	}
	read := func(id string) string {
		t.Helper()
		r, err := c.Exec(ctx, id, sandbox.ExecRequest{Cmd: []string{"cat", "/workspace/state.txt"}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Stdout
	}
	write(s.ID, "before")
	name := fmt.Sprintf("go-sdk-%d", time.Now().UnixNano())
	snap, err := c.TakeSnapshot(ctx, s.ID, name)
	if err != nil || snap.Name != name || snap.SessionID != s.ID || snap.SizeBytes == 0 {
		t.Fatalf("snapshot: %v %+v", err, snap)
	}
	t.Cleanup(func() { _ = c.DeleteSnapshot(ctx, snap.SnapshotID) })
	write(s.ID, "after")
	restored, err := c.Restore(ctx, s.ID, snap.SnapshotID)
	if err != nil || restored.ID != s.ID || read(s.ID) != "before" {
		t.Fatalf("restore: %v %+v", err, restored)
	}
	started := newSession(t, c, sandbox.CreateSessionRequest{FromSnapshot: snap.SnapshotID})
	if read(started.ID) != "before" {
		t.Error("a session started from the snapshot has its files")
	}

	write(s.ID, "forked")
	forks, err := c.Fork(ctx, s.ID, 2)
	if err != nil || len(forks) != 2 {
		t.Fatalf("fork: %v %+v", err, forks)
	}
	for _, f := range forks {
		f := f
		t.Cleanup(func() { _ = f.Close(ctx) })
		if f.ID == s.ID || read(f.ID) != "forked" {
			t.Errorf("fork %s", f.ID)
		}
	}
	write(forks[0].ID, "diverged")
	if read(s.ID) != "forked" || read(forks[1].ID) != "forked" {
		t.Error("forks are copies, not shares")
	}

	all, err := c.ListSnapshots(ctx)
	if err != nil || !hasSnapshot(all, snap.SnapshotID) {
		t.Fatalf("list: %v", err)
	}
	if err := c.DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSnapshot(ctx, snap.SnapshotID)
	wantCode(t, err, 404, sandbox.CodeNotFound)
	_, err = c.Fork(ctx, s.ID, 101)
	wantCode(t, err, 400, sandbox.CodeInvalidArgument)
}

func hasSnapshot(all []sandbox.Snapshot, id string) bool {
	for _, s := range all {
		if s.SnapshotID == id {
			return true
		}
	}
	return false
}

func TestIntegrationVolumes(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	ctx := testContext(t)
	name := fmt.Sprintf("go-sdk-%d", time.Now().UnixNano())
	v, err := c.CreateVolume(ctx, sandbox.CreateVolumeRequest{Name: name, SizeMiB: 64})
	if err != nil || v.Name != name || v.SizeMiB != 64 || len(v.Mounts) != 0 {
		t.Fatalf("create: %v %+v", err, v)
	}
	t.Cleanup(func() { _ = c.DeleteVolume(ctx, v.VolumeID) })
	s := newSession(t, c, sandbox.CreateSessionRequest{
		Volumes: []sandbox.VolumeMount{{Name: name, Path: "/data"}},
	})
	r, err := c.Exec(ctx, s.ID, sandbox.ExecRequest{Shell: "echo kept > /data/f && cat /data/f"})
	if err != nil || r.Stdout != "kept\n" {
		t.Fatalf("write: %v %+v", err, r)
	}
	got, err := c.GetVolume(ctx, name)
	if err != nil || len(got.Mounts) != 1 || got.Mounts[0].SessionID != s.ID || got.Mounts[0].Path != "/data" {
		t.Fatalf("get: %v %+v", err, got)
	}
	err = c.DeleteVolume(ctx, name)
	wantCode(t, err, 409, sandbox.CodeVolumeBusy)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	later := newSession(t, c, sandbox.CreateSessionRequest{
		Volumes: []sandbox.VolumeMount{{Name: v.VolumeID, Path: "/mnt/v", ReadOnly: true}},
	})
	r, err = c.Exec(ctx, later.ID, sandbox.ExecRequest{Shell: "cat /mnt/v/f; echo x > /mnt/v/g"})
	if err != nil || r.Stdout != "kept\n" || *r.ExitCode == 0 {
		t.Fatalf("a later session sees the files, read-only: %v %+v", err, r)
	}
	all, err := c.ListVolumes(ctx)
	if err != nil || len(all) == 0 {
		t.Fatalf("list: %v %+v", err, all)
	}
	_, err = c.GetVolume(ctx, "no-such-volume")
	wantCode(t, err, 404, sandbox.CodeNotFound)
}
