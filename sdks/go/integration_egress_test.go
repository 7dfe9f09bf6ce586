package sandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sandbox "github.com/koder-ai/koder-sandbox/sdks/go"
)

// Network policy updates, secrets and webhooks against the real daemon (see
// integration_test.go for its set-up; scripts/go-sdk-tests.sh lets it deliver webhooks to
// loopback with [webhooks] allow_private).

// recordingClient is a client that keeps every answer body it reads, to show a secret's value
// is in none of them.
func recordingClient(t *testing.T, url, key string) (*sandbox.Client, *answerLog) {
	t.Helper()
	log := &answerLog{}
	c, err := sandbox.NewClient(url, key, sandbox.WithHTTPClient(&http.Client{Transport: log}))
	if err != nil {
		t.Fatal(err)
	}
	return c, log
}

type answerLog struct {
	mu     sync.Mutex
	bodies bytes.Buffer
}

func (l *answerLog) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.bodies.Write(raw)
	l.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	return resp, nil
}

func (l *answerLog) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Contains(l.bodies.Bytes(), []byte(s))
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// newSecret stores a secret that is deleted when the test ends (unless the test did).
func newSecret(t *testing.T, c *sandbox.Client, req sandbox.CreateSecretRequest) *sandbox.Secret {
	t.Helper()
	s, err := c.PutSecret(testContext(t), req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := c.DeleteSecret(context.Background(), req.Name)
		if err != nil && sandbox.ErrorCode(err) != sandbox.CodeSecretNotFound {
			t.Errorf("deleting secret %s: %v", req.Name, err)
		}
	})
	return s
}

func findSecret(all []sandbox.Secret, name string) []sandbox.Secret {
	var found []sandbox.Secret
	for _, s := range all {
		if s.Name == name {
			found = append(found, s)
		}
	}
	return found
}

func TestIntegrationSecrets(t *testing.T) {
	d := realDaemon(t)
	c, answers := recordingClient(t, d.url, d.key)
	other := client(t, d.url, d.otherKey)
	ctx := testContext(t)
	name := "GO_SDK_" + randomHex(t, 6)
	value, rotated := "v1-"+randomHex(t, 16), "v2-"+randomHex(t, 16)

	sec := newSecret(t, c, sandbox.CreateSecretRequest{Name: name, Value: value, Hosts: []string{"api.example.com"}})
	if sec.Name != name || strings.Join(sec.Hosts, ",") != "api.example.com" || sec.CreatedAt.IsZero() {
		t.Fatalf("put: %+v", sec)
	}
	replaced, err := c.PutSecret(ctx, sandbox.CreateSecretRequest{
		Name: name, Value: rotated, Hosts: []string{"api.example.com", "*.example.org:443"},
	})
	if err != nil || replaced.Name != name || len(replaced.Hosts) != 2 {
		t.Fatalf("replace: %v %+v", err, replaced)
	}
	all, err := c.ListSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if found := findSecret(all, name); len(found) != 1 || strings.Join(found[0].Hosts, ",") != "api.example.com,*.example.org:443" {
		t.Fatalf("listed after the replace: %+v", found)
	}

	mine, err := other.ListSecrets(ctx)
	if err != nil || len(findSecret(mine, name)) != 0 {
		t.Fatalf("another tenant's list: %v %+v", err, mine)
	}
	wantCode(t, other.DeleteSecret(ctx, name), 404, sandbox.CodeSecretNotFound)

	_, err = c.PutSecret(ctx, sandbox.CreateSecretRequest{Name: "1BAD", Value: "v", Hosts: []string{"api.example.com"}})
	wantCode(t, err, 400, sandbox.CodeInvalidArgument)

	if err := c.DeleteSecret(ctx, name); err != nil {
		t.Fatal(err)
	}
	wantCode(t, c.DeleteSecret(ctx, name), 404, sandbox.CodeSecretNotFound)
	all, err = c.ListSecrets(ctx)
	if err != nil || len(findSecret(all, name)) != 0 {
		t.Fatalf("deleted secret still listed: %v", err)
	}
	if !answers.contains(name) || answers.contains(value) || answers.contains(rotated) {
		t.Error("the answers name the secret but never carry its value")
	}
}

func TestIntegrationSessionSeesASecretsPlaceholderOnly(t *testing.T) {
	d := realDaemon(t)
	c, answers := recordingClient(t, d.url, d.key)
	ctx := testContext(t)
	name := "GO_SDK_" + randomHex(t, 6)
	value := "v-" + randomHex(t, 16)
	newSecret(t, c, sandbox.CreateSecretRequest{Name: name, Value: value, Hosts: []string{"api.example.com"}})

	s := newSession(t, c, sandbox.CreateSessionRequest{
		Network: &sandbox.Network{Mode: sandbox.NetworkOpen},
		Secrets: []string{name},
	})
	placeholder := strings.TrimSpace(mustExec(t, c, s.ID, "printenv "+name))
	if !strings.HasPrefix(placeholder, "KSECRET_") || len(placeholder) != len("KSECRET_")+32 {
		t.Errorf("the session's %s is %q, want a KSECRET_ placeholder", name, placeholder)
	}
	if answers.contains(value) {
		t.Error("the secret's value reached an answer")
	}

	_, err := c.CreateSession(ctx, sandbox.CreateSessionRequest{Secrets: []string{name}})
	wantCode(t, err, 400, sandbox.CodeInvalidArgument)
	_, err = c.CreateSession(ctx, sandbox.CreateSessionRequest{
		Network: &sandbox.Network{Mode: sandbox.NetworkOpen},
		Secrets: []string{"GO_SDK_NO_SUCH_SECRET"},
	})
	wantCode(t, err, 404, sandbox.CodeSecretNotFound)
}

func TestIntegrationSetNetwork(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	ctx := testContext(t)
	s := newSession(t, c, sandbox.CreateSessionRequest{Network: &sandbox.Network{Mode: sandbox.NetworkOpen}})
	if s.Network.Mode != sandbox.NetworkOpen {
		t.Fatalf("created %+v", s.Network)
	}

	got, err := c.SetNetwork(ctx, s.ID, sandbox.Network{Mode: sandbox.NetworkAllowlist, Allow: []string{"1.1.1.0/24:443"}})
	if err != nil || got.ID != s.ID || got.Network.Mode != sandbox.NetworkAllowlist ||
		strings.Join(got.Network.Allow, ",") != "1.1.1.0/24:443" || len(got.Network.Deny) != 0 {
		t.Fatalf("to allowlist: %v %+v", err, got)
	}
	got, err = c.SetNetwork(ctx, s.ID, sandbox.Network{Mode: sandbox.NetworkOpen, Deny: []string{"10.0.0.0/8"}})
	if err != nil || got.Network.Mode != sandbox.NetworkOpen || len(got.Network.Allow) != 0 ||
		strings.Join(got.Network.Deny, ",") != "10.0.0.0/8" {
		t.Fatalf("to open with a deny rule: %v %+v", err, got)
	}
	if now, err := c.GetSession(ctx, s.ID); err != nil || now.Network.Mode != sandbox.NetworkOpen ||
		strings.Join(now.Network.Deny, ",") != "10.0.0.0/8" {
		t.Fatalf("get after the change: %v %+v", err, now)
	}

	_, err = c.SetNetwork(ctx, s.ID, sandbox.Network{Mode: sandbox.NetworkAllowlist, Allow: []string{"127.0.0.1"}})
	wantCode(t, err, 400, sandbox.CodeNetworkRule)
	_, err = client(t, d.url, d.otherKey).SetNetwork(ctx, s.ID, sandbox.Network{Mode: sandbox.NetworkOpen})
	wantCode(t, err, 404, sandbox.CodeNotFound)
	offline := newSession(t, c, sandbox.CreateSessionRequest{})
	_, err = c.SetNetwork(ctx, offline.ID, sandbox.Network{Mode: sandbox.NetworkOpen})
	wantCode(t, err, 409, sandbox.CodeConflict)
}

// delivery is one POST a webhook receiver got.
type delivery struct {
	header http.Header
	body   []byte
}

// webhookReceiver serves on loopback and hands over what it is sent, answering 200.
func webhookReceiver(t *testing.T) (url string, got <-chan delivery) {
	t.Helper()
	ch := make(chan delivery, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || r.Method != http.MethodPost {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		select {
		case ch <- delivery{r.Header.Clone(), body}:
		default:
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/hook", ch
}

func TestIntegrationWebhooks(t *testing.T) {
	d := realDaemon(t)
	c := client(t, d.url, d.key)
	other := client(t, d.url, d.otherKey)
	ctx := testContext(t)
	url, received := webhookReceiver(t)
	_, err := c.CreateWebhook(ctx, sandbox.CreateWebhookRequest{URL: url, Secret: "too-short"})
	wantCode(t, err, 400, sandbox.CodeInvalidArgument)
	hook, err := c.CreateWebhook(ctx, sandbox.CreateWebhookRequest{URL: url, Events: []string{sandbox.SessionEventCreated}})
	if err != nil || hook.URL != url || strings.Join(hook.Events, ",") != sandbox.SessionEventCreated ||
		!strings.HasPrefix(hook.Secret, "whsec_") {
		t.Fatalf("create: %v %+v", err, hook)
	}
	t.Cleanup(func() {
		err := c.DeleteWebhook(context.Background(), hook.ID)
		if err != nil && sandbox.ErrorCode(err) != sandbox.CodeNotFound {
			t.Errorf("deleting webhook %s: %v", hook.ID, err)
		}
	})

	s := newSession(t, c, sandbox.CreateSessionRequest{})
	var event struct {
		ID     string `json:"id"`
		Type   string `json:"type"`
		Tenant string `json:"tenant"`
		Data   struct {
			SessionID string `json:"session_id"`
		} `json:"data"`
	}
	var got delivery
	for timeout := time.After(20 * time.Second); event.Data.SessionID != s.ID; {
		select {
		case got = <-received:
			if err := json.Unmarshal(got.body, &event); err != nil {
				t.Fatalf("delivery body %s: %v", got.body, err)
			}
		case <-timeout:
			t.Fatalf("no %s delivery for %s", sandbox.SessionEventCreated, s.ID)
		}
	}
	if err := sandbox.VerifyWebhook(hook.Secret, got.header.Get("Koder-Signature"), got.body, time.Now()); err != nil {
		t.Error(err)
	}
	if event.Type != sandbox.SessionEventCreated || event.Tenant == "" || got.header.Get("Koder-Event-Id") != event.ID ||
		got.header.Get("Koder-Event-Type") != event.Type || !strings.HasPrefix(got.header.Get("Content-Type"), "application/json") {
		t.Errorf("delivery %v %s", got.header, got.body)
	}

	// The receiver's answer is recorded just after it is sent.
	var delivered *sandbox.WebhookDelivery
	for deadline := time.Now().Add(10 * time.Second); delivered == nil; time.Sleep(100 * time.Millisecond) {
		all, err := c.WebhookDeliveries(ctx, hook.ID)
		if err != nil {
			t.Fatal(err)
		}
		for i := range all {
			if all[i].EventID == event.ID && all[i].State == sandbox.DeliveryDelivered {
				delivered = &all[i]
			}
		}
		if delivered == nil && time.Now().After(deadline) {
			t.Fatalf("delivery of %s not recorded as delivered: %+v", event.ID, all)
		}
	}
	if delivered.EventType != sandbox.SessionEventCreated || delivered.Attempts < 1 ||
		delivered.LastStatus == nil || *delivered.LastStatus != 200 {
		t.Errorf("delivered %+v", delivered)
	}

	hooks, err := c.ListWebhooks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var listed *sandbox.Webhook
	for i := range hooks {
		if hooks[i].ID == hook.ID {
			listed = &hooks[i]
		}
	}
	if listed == nil || listed.URL != url || listed.Secret != "" {
		t.Fatalf("listed %+v", hooks)
	}

	theirs, err := other.ListWebhooks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range theirs {
		if h.ID == hook.ID {
			t.Errorf("another tenant lists %+v", h)
		}
	}
	_, err = other.WebhookDeliveries(ctx, hook.ID)
	wantCode(t, err, 404, sandbox.CodeNotFound)
	wantCode(t, other.DeleteWebhook(ctx, hook.ID), 404, sandbox.CodeNotFound)

	if err := c.DeleteWebhook(ctx, hook.ID); err != nil {
		t.Fatal(err)
	}
	wantCode(t, c.DeleteWebhook(ctx, hook.ID), 404, sandbox.CodeNotFound)
	hooks, err = c.ListWebhooks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		if h.ID == hook.ID {
			t.Errorf("deleted webhook still listed: %+v", h)
		}
	}
}
