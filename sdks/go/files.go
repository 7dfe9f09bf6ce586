package sandbox

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// Paths name files inside the sandbox; relative ones are below /workspace. Nothing outside the
// sandbox's root is reachable whatever the path.

// WriteFile uploads r's bytes to path (created or replaced atomically: a failed upload leaves
// nothing), streaming them without holding them in memory. A *bytes.Reader, *bytes.Buffer or
// *strings.Reader is sent with its length, which lets the server refuse an upload over the
// disk quota before it starts. r is not closed (an *os.File stays the caller's).
func (c *Client) WriteFile(ctx context.Context, id, filePath string, r io.Reader) (*FileEntry, error) {
	p, err := sessionPath(id, "/files")
	if err != nil {
		return nil, err
	}
	if _, ok := r.(io.Closer); ok {
		// net/http closes a request body that is an io.Closer.
		r = struct{ io.Reader }{r}
	}
	req, err := c.newRequest(ctx, http.MethodPut, p, url.Values{"path": {filePath}}, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var entry FileEntry
	if err := c.decodeBody(resp.Body, &entry); err != nil {
		return nil, err
	}
	return &entry, nil
}

// ReadFile downloads path. The caller reads and closes the body; a transfer the server breaks
// off midway fails the read rather than ending it early.
func (c *Client) ReadFile(ctx context.Context, id, filePath string) (io.ReadCloser, error) {
	p, err := sessionPath(id, "/files")
	if err != nil {
		return nil, err
	}
	req, err := c.newRequest(ctx, http.MethodGet, p, url.Values{"path": {filePath}}, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ListFiles lists a directory down to depth levels (0 means the server's default, 1).
func (c *Client) ListFiles(ctx context.Context, id, dir string, depth int) (*FileList, error) {
	p, err := sessionPath(id, "/files/list")
	if err != nil {
		return nil, err
	}
	q := url.Values{"path": {dir}}
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	var out FileList
	if err := c.doJSON(ctx, http.MethodGet, p, q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// StatFile describes one path (a symlink itself, not its target); a missing one answers
// CodeNotFound.
func (c *Client) StatFile(ctx context.Context, id, filePath string) (*FileEntry, error) {
	p, err := sessionPath(id, "/files/stat")
	if err != nil {
		return nil, err
	}
	var out FileEntry
	if err := c.doJSON(ctx, http.MethodGet, p, url.Values{"path": {filePath}}, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteFile removes a file, or a directory (an empty one unless recursive).
func (c *Client) DeleteFile(ctx context.Context, id, filePath string, recursive bool) error {
	p, err := sessionPath(id, "/files")
	if err != nil {
		return err
	}
	q := url.Values{"path": {filePath}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.doJSON(ctx, http.MethodDelete, p, q, nil, nil)
}

// MakeDir creates a directory and its missing parents.
func (c *Client) MakeDir(ctx context.Context, id, dir string) (*FileEntry, error) {
	return c.fileCall(ctx, id, "/files/mkdir", struct {
		Path string `json:"path"`
	}{dir})
}

// MoveFile renames from to to inside the sandbox.
func (c *Client) MoveFile(ctx context.Context, id, from, to string) (*FileEntry, error) {
	return c.fileCall(ctx, id, "/files/move", struct {
		From string `json:"from"`
		To   string `json:"to"`
	}{from, to})
}

func (c *Client) fileCall(ctx context.Context, id, suffix string, in interface{}) (*FileEntry, error) {
	p, err := sessionPath(id, suffix)
	if err != nil {
		return nil, err
	}
	return call[FileEntry](ctx, c, http.MethodPost, p, in)
}
