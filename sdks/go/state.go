package sandbox

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

const (
	snapshotsPath = "/v1/sandbox/snapshots"
	volumesPath   = "/v1/sandbox/volumes"
)

// Snapshot is a session's filesystem as it was when taken, kept in the tenant's blob store
// until ExpiresAt. Start a session on it with CreateSessionRequest.FromSnapshot, or put a
// running session back to it with Restore.
type Snapshot struct {
	SnapshotID string `json:"snapshot_id"`
	Name       string `json:"name,omitempty"`
	// SizeBytes counts the stored bytes of every layer the snapshot needs.
	SizeBytes uint64 `json:"size_bytes"`
	Image     string `json:"image"`
	Language  string `json:"language"`
	Runtime   string `json:"runtime"`
	// SessionID is the session it was taken from.
	SessionID string    `json:"session_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Volume is storage of the tenant's that outlives sessions: mounted by CreateSessionRequest's
// Volumes, by name or id.
type Volume struct {
	VolumeID string `json:"volume_id"`
	Name     string `json:"name"`
	// SizeMiB is its quota: writes past it fail with ENOSPC in a sandbox.
	SizeMiB uint64 `json:"size_mib"`
	// UsedBytes is nil when the volume's filesystem could not be asked.
	UsedBytes *uint64 `json:"used_bytes"`
	// Backend is "btrfs" (a subvolume) or "ext4" (an image file of its own).
	Backend   string    `json:"backend"`
	CreatedAt time.Time `json:"created_at"`
	// Mounts are the sessions (running or paused) that have it mounted.
	Mounts []VolumeUse `json:"mounts"`
}

// VolumeUse is one session's mount of a volume.
type VolumeUse struct {
	SessionID string `json:"session_id"`
	Path      string `json:"path"`
	ReadOnly  bool   `json:"read_only"`
}

// CreateVolumeRequest is the body of POST /v1/sandbox/volumes. A zero SizeMiB is the server's
// default; FromVolume (an id or name) makes the new volume a copy of that one as it is now.
type CreateVolumeRequest struct {
	Name       string `json:"name"`
	SizeMiB    uint64 `json:"size_mib,omitempty"`
	FromVolume string `json:"from_volume,omitempty"`
}

// TakeSnapshot saves a session's filesystem (name is optional: 1–128 of [A-Za-z0-9._-]).
// Over the tenant's snapshot storage it fails with HTTP 507.
func (c *Client) TakeSnapshot(ctx context.Context, id, name string) (*Snapshot, error) {
	p, err := sessionPath(id, "/snapshot")
	if err != nil {
		return nil, err
	}
	return call[Snapshot](ctx, c, http.MethodPost, p, struct {
		Name string `json:"name,omitempty"`
	}{name})
}

// ListSnapshots lists this tenant's snapshots.
func (c *Client) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	var out struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	if err := c.doJSON(ctx, http.MethodGet, snapshotsPath, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Snapshots, nil
}

// GetSnapshot reports one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, snapshotID string) (*Snapshot, error) {
	p, err := resourcePath(snapshotsPath, "snapshot", snapshotID)
	if err != nil {
		return nil, err
	}
	return call[Snapshot](ctx, c, http.MethodGet, p, nil)
}

// DeleteSnapshot deletes a snapshot (sessions started from it are not affected).
func (c *Client) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	p, err := resourcePath(snapshotsPath, "snapshot", snapshotID)
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, nil)
}

// Restore puts a running session back to a snapshot: its sandbox restarts on the snapshot's
// filesystem and its processes end.
func (c *Client) Restore(ctx context.Context, id, snapshotID string) (*Session, error) {
	return c.onSession(ctx, http.MethodPost, id, "/restore", struct {
		SnapshotID string `json:"snapshot_id"`
	}{snapshotID})
}

// Fork makes count (1–100) new sessions, each a copy of the session's filesystem as it is now.
func (c *Client) Fork(ctx context.Context, id string, count int) ([]Session, error) {
	p, err := sessionPath(id, "/fork")
	if err != nil {
		return nil, err
	}
	var out struct {
		Sessions []Session `json:"sessions"`
	}
	in := struct {
		Count int `json:"count"`
	}{count}
	if err := c.doJSON(ctx, http.MethodPost, p, nil, in, &out); err != nil {
		return nil, err
	}
	for i := range out.Sessions {
		out.Sessions[i].client = c
	}
	return out.Sessions, nil
}

// CreateVolume creates a volume.
func (c *Client) CreateVolume(ctx context.Context, req CreateVolumeRequest) (*Volume, error) {
	return call[Volume](ctx, c, http.MethodPost, volumesPath, req)
}

// ListVolumes lists this tenant's volumes.
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var out struct {
		Volumes []Volume `json:"volumes"`
	}
	if err := c.doJSON(ctx, http.MethodGet, volumesPath, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Volumes, nil
}

// GetVolume reports a volume, by id or name.
func (c *Client) GetVolume(ctx context.Context, volume string) (*Volume, error) {
	p, err := resourcePath(volumesPath, "volume", volume)
	if err != nil {
		return nil, err
	}
	return call[Volume](ctx, c, http.MethodGet, p, nil)
}

// DeleteVolume deletes a volume and its files; while a session has it mounted it fails with
// CodeVolumeBusy.
func (c *Client) DeleteVolume(ctx context.Context, volume string) error {
	p, err := resourcePath(volumesPath, "volume", volume)
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, nil)
}

// resourcePath is collection/{key}, refusing keys that would change the path's meaning.
func resourcePath(collection, what, key string) (string, error) {
	if key == "" || key == "." || key == ".." {
		return "", fmt.Errorf("koder-sandbox: invalid %s id %q", what, key)
	}
	return collection + "/" + url.PathEscape(key), nil
}
