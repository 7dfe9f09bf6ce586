package sandbox

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

func TestSnapshotForkAndVolumeCallsUseTheirRoutes(t *testing.T) {
	c, rec := recordingClient(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case strings.HasSuffix(r.URL.Path, "/fork"):
			answer(w, 201, "application/json", `{"sessions":[{"id":"s2"},{"id":"s3"}]}`)
		case strings.HasSuffix(r.URL.Path, "/restore"):
			answer(w, 200, "application/json", `{"id":"s1","state":"running"}`)
		case r.URL.Path == "/v1/sandbox/snapshots":
			answer(w, 200, "application/json", `{"snapshots":[{"snapshot_id":"p1","size_bytes":9}]}`)
		case strings.HasPrefix(r.URL.Path, "/v1/sandbox/volumes"):
			answer(w, 200, "application/json", `{"volume_id":"v1","name":"data","size_mib":64,"used_bytes":null,"backend":"ext4","mounts":[{"session_id":"s1","path":"/data","read_only":true}]}`)
		default:
			answer(w, 201, "application/json", `{"snapshot_id":"p1","name":"n","size_bytes":9}`)
		}
	})
	ctx := context.Background()
	snap, err := c.TakeSnapshot(ctx, "s1", "")
	if err != nil || snap.SnapshotID != "p1" {
		t.Fatalf("%+v %v", snap, err)
	}
	if _, err := c.TakeSnapshot(ctx, "s1", "n"); err != nil {
		t.Fatal(err)
	}
	if all, err := c.ListSnapshots(ctx); err != nil || len(all) != 1 || all[0].SizeBytes != 9 {
		t.Fatalf("%+v %v", all, err)
	}
	if _, err := c.GetSnapshot(ctx, "p/1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if s, err := c.Restore(ctx, "s1", "p1"); err != nil || s.State != StateRunning {
		t.Fatalf("%+v %v", s, err)
	}
	forks, err := c.Fork(ctx, "s1", 2)
	if err != nil || len(forks) != 2 || forks[1].ID != "s3" {
		t.Fatalf("%+v %v", forks, err)
	}
	if err := forks[0].Close(ctx); err != nil {
		t.Errorf("a fork closes through the client that made it: %v", err)
	}
	v, err := c.CreateVolume(ctx, CreateVolumeRequest{Name: "data", SizeMiB: 64})
	if err != nil || v.UsedBytes != nil || !v.Mounts[0].ReadOnly {
		t.Fatalf("%+v %v", v, err)
	}
	if _, err := c.GetVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"POST /v1/sandbox/sessions/s1/snapshot {}",
		`POST /v1/sandbox/sessions/s1/snapshot {"name":"n"}`,
		"GET /v1/sandbox/snapshots ",
		"GET /v1/sandbox/snapshots/p%2F1 ",
		"DELETE /v1/sandbox/snapshots/p1 ",
		`POST /v1/sandbox/sessions/s1/restore {"snapshot_id":"p1"}`,
		`POST /v1/sandbox/sessions/s1/fork {"count":2}`,
		"DELETE /v1/sandbox/sessions/s2 ",
		`POST /v1/sandbox/volumes {"name":"data","size_mib":64}`,
		"GET /v1/sandbox/volumes/data ",
		"DELETE /v1/sandbox/volumes/data ",
	}
	rec.expect(t, want)
}

func TestSnapshotAndVolumeIDsThatWouldChangeThePathAreRefused(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("no request should be sent: %s", r.URL)
	})
	ctx := context.Background()
	for _, id := range []string{"", ".", ".."} {
		if _, err := c.GetSnapshot(ctx, id); err == nil {
			t.Errorf("snapshot id %q accepted", id)
		}
		if err := c.DeleteVolume(ctx, id); err == nil {
			t.Errorf("volume %q accepted", id)
		}
	}
}
