package sandbox

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	secretsPath  = "/v1/sandbox/secrets"
	webhooksPath = "/v1/sandbox/webhooks"
)

// States of a WebhookDelivery.
const (
	// DeliveryPending: queued, or waiting to be retried after a failed attempt.
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	// DeliveryFailed: every attempt failed; it is not tried again.
	DeliveryFailed = "failed"
)

// CreateSecretRequest is the body of POST /v1/sandbox/secrets. Name is also the environment
// variable of the sessions that bind it (1–64 of [A-Za-z0-9_], not starting with a digit).
// Value never comes back from the daemon and has no control characters, since it is sent in
// HTTP headers. Hosts (1–16, the syntax of Network's entries) are the only places egress sends
// it to.
type CreateSecretRequest struct {
	Name  string   `json:"name"`
	Value string   `json:"value"`
	Hosts []string `json:"hosts"`
}

// Secret is a secret as the daemon shows it: never with its value.
type Secret struct {
	Name      string    `json:"name"`
	Hosts     []string  `json:"hosts"`
	CreatedAt time.Time `json:"created_at"`
}

// CreateWebhookRequest is the body of POST /v1/sandbox/webhooks. Empty Events means every
// type (the SessionEvent... constants); empty Secret lets the daemon make the signing secret
// (16–256 characters otherwise).
type CreateWebhookRequest struct {
	URL    string   `json:"url"`
	Events []string `json:"events,omitempty"`
	Secret string   `json:"secret,omitempty"`
}

// Webhook is an endpoint the daemon delivers the tenant's session events to. Secret signs
// each delivery (the Koder-Signature header) and is filled only in CreateWebhook's answer:
// keep it then, it cannot be read again.
type Webhook struct {
	ID  string `json:"id"`
	URL string `json:"url"`
	// Events is empty when the webhook gets every type.
	Events    []string  `json:"events"`
	CreatedAt time.Time `json:"created_at"`
	Secret    string    `json:"secret,omitempty"`
}

// WebhookDelivery is one event's delivery to one webhook, across its attempts. EventID is the
// body's "id", the same on every attempt, to deduplicate on (delivery is at least once).
// State is one of the Delivery... constants.
type WebhookDelivery struct {
	ID        string `json:"id"`
	EventID   string `json:"event_id"`
	EventType string `json:"event_type"`
	State     string `json:"state"`
	Attempts  int    `json:"attempts"`
	// NextAttemptAt is set while a delivery is pending.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	// LastStatus is the receiver's last HTTP status; nil when it never answered.
	LastStatus *int      `json:"last_status,omitempty"`
	LastError  string    `json:"last_error,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// SetNetwork replaces a running session's network policy, the whole of it: new connections
// and lookups follow it, open ones keep going. A session created with NetworkNone has no
// egress path to change, so it answers CodeConflict (create with NetworkAllowlist and no
// entries instead to keep the policy changeable); a bad entry answers CodeNetworkRule.
func (c *Client) SetNetwork(ctx context.Context, id string, policy Network) (*Session, error) {
	return c.onSession(ctx, http.MethodPut, id, "/network", policy)
}

// PutSecret creates the tenant's secret of that name or replaces it: running sessions that
// bound it send the new value from their next connection on.
func (c *Client) PutSecret(ctx context.Context, req CreateSecretRequest) (*Secret, error) {
	return call[Secret](ctx, c, http.MethodPost, secretsPath, req)
}

// ListSecrets lists this tenant's secrets.
func (c *Client) ListSecrets(ctx context.Context) ([]Secret, error) {
	var out struct {
		Secrets []Secret `json:"secrets"`
	}
	if err := c.doJSON(ctx, http.MethodGet, secretsPath, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Secrets, nil
}

// DeleteSecret deletes a secret; sessions that bound it no longer get it injected. An unknown
// name answers CodeSecretNotFound.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	p, err := resourcePath(secretsPath, "secret", name)
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, nil)
}

// CreateWebhook registers an endpoint for the tenant's session events. A URL reaching a
// loopback, private or reserved address answers CodeWebhookURLRefused unless the daemon's
// operator allowed it.
func (c *Client) CreateWebhook(ctx context.Context, req CreateWebhookRequest) (*Webhook, error) {
	return call[Webhook](ctx, c, http.MethodPost, webhooksPath, req)
}

// ListWebhooks lists this tenant's webhooks.
func (c *Client) ListWebhooks(ctx context.Context) ([]Webhook, error) {
	var out struct {
		Webhooks []Webhook `json:"webhooks"`
	}
	if err := c.doJSON(ctx, http.MethodGet, webhooksPath, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Webhooks, nil
}

// WebhookDeliveries lists a webhook's latest deliveries (at most 100), newest first.
func (c *Client) WebhookDeliveries(ctx context.Context, id string) ([]WebhookDelivery, error) {
	p, err := resourcePath(webhooksPath, "webhook", id)
	if err != nil {
		return nil, err
	}
	var out struct {
		Deliveries []WebhookDelivery `json:"deliveries"`
	}
	if err := c.doJSON(ctx, http.MethodGet, p+"/deliveries", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Deliveries, nil
}

// DeleteWebhook deletes a webhook and drops its queued deliveries.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	p, err := resourcePath(webhooksPath, "webhook", id)
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, nil)
}

// WebhookTolerance is how far from now a delivery's signed time may be for VerifyWebhook: a
// delivery replayed later than that is refused.
const WebhookTolerance = 5 * time.Minute

// ErrWebhookSignature is what VerifyWebhook's errors wrap: the delivery was not signed with the
// secret, was altered, or is too old (or too far ahead) to trust.
var ErrWebhookSignature = errors.New("webhook signature refused")

// VerifyWebhook checks a delivery as its receiver must before trusting it: header is its
// Koder-Signature ("t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>"), body the
// raw request body, exactly as received (not re-encoded JSON), secret the one CreateWebhook
// answered. The HMAC is compared in constant time, and t must be within WebhookTolerance of
// now.
func VerifyWebhook(secret, header string, body []byte, now time.Time) error {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sent, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return fmt.Errorf("%w: %q is not t=<seconds>,v1=<hex>", ErrWebhookSignature, header)
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	want := []byte(hex.EncodeToString(mac.Sum(nil)))
	matched := false
	for _, sig := range sigs {
		matched = hmac.Equal([]byte(sig), want) || matched
	}
	if !matched {
		return fmt.Errorf("%w: no signature matches the body under this secret", ErrWebhookSignature)
	}
	if d := now.Sub(time.Unix(sent, 0)); d < -WebhookTolerance || d > WebhookTolerance {
		return fmt.Errorf("%w: signed %v from now", ErrWebhookSignature, d)
	}
	return nil
}
