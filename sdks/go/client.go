package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

const (
	// DefaultMaxResponseBytes bounds a JSON answer (an exec result carries up to the server's
	// output limit per stream, 1 MiB by default, so this leaves ample room).
	DefaultMaxResponseBytes int64 = 64 << 20
	// DefaultMaxEventBytes bounds one Server-Sent Event (its lines and its data together).
	// The daemon's output chunks are at most 1 MiB before base64.
	DefaultMaxEventBytes = 8 << 20

	userAgent = "koder-sandbox-go/0.1"
)

// Client talks to one koder-sandbox daemon as one tenant. It is safe for concurrent use.
type Client struct {
	base        string // scheme://host[/prefix], no trailing slash
	apiKey      string
	hc          *http.Client
	userAgent   string
	maxResponse int64
	maxEvent    int
}

// Option adjusts a Client made by NewClient.
type Option func(*Client)

// WithHTTPClient makes the client send its requests with hc (custom transport, TLS roots,
// proxies). Its Timeout, if any, also cuts streams short; prefer contexts for deadlines.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithUserAgent replaces the User-Agent header the client sends.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// WithMaxResponseBytes bounds every JSON answer the client reads (default
// DefaultMaxResponseBytes); a larger one fails with an error instead of filling memory.
func WithMaxResponseBytes(n int64) Option {
	return func(c *Client) {
		if n > 0 {
			c.maxResponse = n
		}
	}
}

// WithMaxEventBytes bounds one event of an exec stream (default DefaultMaxEventBytes).
func WithMaxEventBytes(n int) Option {
	return func(c *Client) {
		if n > 0 {
			c.maxEvent = n
		}
	}
}

// NewClient makes a client for the daemon at baseURL (e.g. "http://127.0.0.1:7070", a path
// prefix is kept) authenticating with apiKey as a bearer token.
func NewClient(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("koder-sandbox: base URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("koder-sandbox: base URL %q: want http(s)://host[:port]", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("koder-sandbox: base URL %q: no query, fragment or credentials", baseURL)
	}
	c := &Client{
		base:        strings.TrimRight(u.String(), "/"),
		apiKey:      apiKey,
		hc:          &http.Client{},
		userAgent:   userAgent,
		maxResponse: DefaultMaxResponseBytes,
		maxEvent:    DefaultMaxEventBytes,
	}
	for _, opt := range opts {
		opt(c)
	}
	return c, nil
}

// sessionPath is the path of a session's resource; ids that would change the path's meaning
// are refused before anything is sent.
func sessionPath(id, suffix string) (string, error) {
	if id == "" || id == "." || id == ".." {
		return "", fmt.Errorf("koder-sandbox: invalid session id %q", id)
	}
	return "/v1/sandbox/sessions/" + url.PathEscape(id) + suffix, nil
}

func (c *Client) newRequest(ctx context.Context, method, path string, query url.Values, body io.Reader) (*http.Request, error) {
	target := c.base + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return nil, fmt.Errorf("koder-sandbox: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("User-Agent", c.userAgent)
	return req, nil
}

// send performs req; a non-2xx answer becomes a *SandboxError (its body read and closed),
// a 2xx answer's body is the caller's to close.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("koder-sandbox: %s %s: %w", req.Method, req.URL.Path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, errorFrom(resp)
	}
	return resp, nil
}

// call sends in (none when nil) to path and decodes the answer as a T.
func call[T any](ctx context.Context, c *Client, method, path string, in interface{}) (*T, error) {
	var out T
	if err := c.doJSON(ctx, method, path, nil, in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// doJSON sends in as a JSON body (none when nil) and decodes the answer into out (ignored
// when nil).
func (c *Client) doJSON(ctx context.Context, method, path string, query url.Values, in, out interface{}) error {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("koder-sandbox: encoding request: %w", err)
		}
		body = bytes.NewReader(raw)
	}
	req, err := c.newRequest(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		// Drained so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return nil
	}
	return c.decodeBody(resp.Body, out)
}

// errAnswerTooLarge is returned (wrapped) when an answer exceeds the client's bound.
var errAnswerTooLarge = errors.New("answer larger than the client's limit")

func (c *Client) decodeBody(r io.Reader, out interface{}) error {
	raw, err := io.ReadAll(io.LimitReader(r, c.maxResponse+1))
	if err != nil {
		return fmt.Errorf("koder-sandbox: reading answer: %w", err)
	}
	if int64(len(raw)) > c.maxResponse {
		return fmt.Errorf("koder-sandbox: %w (%d bytes)", errAnswerTooLarge, c.maxResponse)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("koder-sandbox: decoding answer: %w", err)
	}
	return nil
}
