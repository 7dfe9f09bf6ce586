package sandbox

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestSecretNetworkAndWebhookCallsUseTheirRoutes(t *testing.T) {
	c, rec := recordingClient(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case strings.HasSuffix(r.URL.Path, "/network"):
			answer(w, 200, "application/json", `{"id":"s1","state":"running","network":{"mode":"allowlist","allow":["pypi.org=151.101.0.223"],"deny":["10.0.0.0/8"]}}`)
		case r.URL.Path == "/v1/sandbox/secrets" && r.Method == http.MethodGet:
			answer(w, 200, "application/json", `{"secrets":[{"name":"API_KEY","hosts":["api.example.com"],"created_at":"2026-01-02T03:04:05Z"}]}`)
		case r.URL.Path == "/v1/sandbox/secrets":
			answer(w, 201, "application/json", `{"name":"API_KEY","hosts":["api.example.com"],"created_at":"2026-01-02T03:04:05Z"}`)
		case strings.HasSuffix(r.URL.Path, "/deliveries"):
			answer(w, 200, "application/json", `{"deliveries":[`+
				`{"id":"d2","event_id":"evt_2","event_type":"session.stopped","state":"pending","attempts":1,"next_attempt_at":"2026-01-02T03:05:00Z","last_status":500,"last_error":"HTTP 500","created_at":"2026-01-02T03:04:06Z","updated_at":"2026-01-02T03:04:07Z"},`+
				`{"id":"d1","event_id":"evt_1","event_type":"session.created","state":"delivered","attempts":1,"last_status":200,"created_at":"2026-01-02T03:04:05Z","updated_at":"2026-01-02T03:04:05Z"}]}`)
		case r.Method == http.MethodGet:
			answer(w, 200, "application/json", `{"webhooks":[{"id":"wh1","url":"https://hooks.example.com/k","events":[],"created_at":"2026-01-02T03:04:05Z"}]}`)
		default:
			answer(w, 201, "application/json", `{"id":"wh1","url":"https://hooks.example.com/k","events":["session.created"],"created_at":"2026-01-02T03:04:05Z","secret":"whsec_abc"}`)
		}
	})
	ctx := context.Background()
	sec, err := c.PutSecret(ctx, CreateSecretRequest{Name: "API_KEY", Value: "v4lue", Hosts: []string{"api.example.com"}})
	if err != nil || sec.Name != "API_KEY" || len(sec.Hosts) != 1 || sec.CreatedAt.Year() != 2026 {
		t.Fatalf("%+v %v", sec, err)
	}
	if all, err := c.ListSecrets(ctx); err != nil || len(all) != 1 || all[0].Hosts[0] != "api.example.com" {
		t.Fatalf("%+v %v", all, err)
	}
	if err := c.DeleteSecret(ctx, "a/b"); err != nil {
		t.Fatal(err)
	}
	s, err := c.SetNetwork(ctx, "s1", Network{Mode: NetworkAllowlist, Allow: []string{"pypi.org"}, Deny: []string{"10.0.0.0/8"}})
	if err != nil || s.Network.Mode != NetworkAllowlist || s.Network.Deny[0] != "10.0.0.0/8" || s.client != c {
		t.Fatalf("%+v %v", s, err)
	}
	hook, err := c.CreateWebhook(ctx, CreateWebhookRequest{
		URL: "https://hooks.example.com/k", Events: []string{SessionEventCreated}, Secret: "0123456789abcdef",
	})
	if err != nil || hook.ID != "wh1" || hook.Secret != "whsec_abc" || hook.Events[0] != SessionEventCreated {
		t.Fatalf("%+v %v", hook, err)
	}
	if _, err := c.CreateWebhook(ctx, CreateWebhookRequest{URL: "https://hooks.example.com/k"}); err != nil {
		t.Fatal(err)
	}
	hooks, err := c.ListWebhooks(ctx)
	if err != nil || len(hooks) != 1 || hooks[0].Secret != "" || len(hooks[0].Events) != 0 {
		t.Fatalf("%+v %v", hooks, err)
	}
	ds, err := c.WebhookDeliveries(ctx, "wh/1")
	if err != nil || len(ds) != 2 {
		t.Fatalf("%+v %v", ds, err)
	}
	if d := ds[0]; d.State != DeliveryPending || d.NextAttemptAt == nil || d.NextAttemptAt.Minute() != 5 ||
		d.LastStatus == nil || *d.LastStatus != 500 || d.LastError != "HTTP 500" || d.EventID != "evt_2" {
		t.Errorf("pending delivery %+v", d)
	}
	if d := ds[1]; d.State != DeliveryDelivered || d.NextAttemptAt != nil || *d.LastStatus != 200 || d.EventType != SessionEventCreated {
		t.Errorf("delivered %+v", d)
	}
	if err := c.DeleteWebhook(ctx, "wh1"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`POST /v1/sandbox/secrets {"name":"API_KEY","value":"v4lue","hosts":["api.example.com"]}`,
		"GET /v1/sandbox/secrets ",
		"DELETE /v1/sandbox/secrets/a%2Fb ",
		`PUT /v1/sandbox/sessions/s1/network {"mode":"allowlist","allow":["pypi.org"],"deny":["10.0.0.0/8"]}`,
		`POST /v1/sandbox/webhooks {"url":"https://hooks.example.com/k","events":["session.created"],"secret":"0123456789abcdef"}`,
		`POST /v1/sandbox/webhooks {"url":"https://hooks.example.com/k"}`,
		"GET /v1/sandbox/webhooks ",
		"GET /v1/sandbox/webhooks/wh%2F1/deliveries ",
		"DELETE /v1/sandbox/webhooks/wh1 ",
	}
	rec.expect(t, want)
}

func TestCreateSessionSendsSecretsAndDenyRules(t *testing.T) {
	var body string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		body = string(raw)
		answer(w, 201, "application/json", `{"id":"s1"}`)
	})
	_, err := c.CreateSession(context.Background(), CreateSessionRequest{
		Network: &Network{Mode: NetworkOpen, Deny: []string{"*.internal.example"}},
		Secrets: []string{"API_KEY"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"network":{"mode":"open","deny":["*.internal.example"]},"secrets":["API_KEY"]}`
	if body != want {
		t.Errorf("body\n got %s\nwant %s", body, want)
	}
}

func TestEgressRefusalsAreTyped(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/v1/sandbox/secrets/"):
			answer(w, 404, "application/json", `{"error":{"code":"SANDBOX-SECRET-NOT-FOUND","message":"secret not found"}}`)
		case strings.HasSuffix(r.URL.Path, "/network"):
			answer(w, 400, "application/json", `{"error":{"code":"SANDBOX-NETWORK-RULE","message":"127.0.0.1: loopback"}}`)
		default:
			answer(w, 400, "application/json", `{"error":{"code":"SANDBOX-WEBHOOK-URL-REFUSED","message":"private address"}}`)
		}
	})
	ctx := context.Background()
	if err := c.DeleteSecret(ctx, "NOPE"); ErrorCode(err) != CodeSecretNotFound {
		t.Errorf("delete secret: %v", err)
	}
	if _, err := c.SetNetwork(ctx, "s1", Network{Mode: NetworkAllowlist, Allow: []string{"127.0.0.1"}}); ErrorCode(err) != CodeNetworkRule {
		t.Errorf("set network: %v", err)
	}
	if _, err := c.CreateWebhook(ctx, CreateWebhookRequest{URL: "http://10.0.0.1/"}); ErrorCode(err) != CodeWebhookURLRefused {
		t.Errorf("create webhook: %v", err)
	}
}

func TestSecretAndWebhookIDsThatWouldChangeThePathAreRefused(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("no request should be sent: %s", r.URL)
	})
	ctx := context.Background()
	for _, id := range []string{"", ".", ".."} {
		if err := c.DeleteSecret(ctx, id); err == nil {
			t.Errorf("secret %q accepted", id)
		}
		if _, err := c.WebhookDeliveries(ctx, id); err == nil {
			t.Errorf("webhook %q accepted", id)
		}
		if err := c.DeleteWebhook(ctx, id); err == nil {
			t.Errorf("webhook %q accepted", id)
		}
		if _, err := c.SetNetwork(ctx, id, Network{Mode: NetworkOpen}); err == nil {
			t.Errorf("session %q accepted", id)
		}
	}
}

func TestVerifyWebhookAcceptsOnlyTheSecretsFreshSignature(t *testing.T) {
	// The example of docs/API-ADDITIONS.md "Webhooks".
	const header = "t=1,v1=3dd49b2593d0f9a349e9e71c4bde3e2b862c2be4003fe9b4ba81332029310158"
	at := time.Unix(1, 0)
	if err := VerifyWebhook("k", header, []byte("{}"), at); err != nil {
		t.Fatal(err)
	}
	if err := VerifyWebhook("k", "v1=00,"+header+",v2=x", []byte("{}"), at.Add(WebhookTolerance)); err != nil {
		t.Errorf("one matching v1 among others, at the edge of the tolerance: %v", err)
	}
	for name, tc := range map[string]struct {
		secret, header, body string
		at                   time.Time
	}{
		"another secret":  {"K", header, "{}", at},
		"an altered body": {"k", header, "{ }", at},
		"too old":         {"k", header, "{}", at.Add(WebhookTolerance + time.Second)},
		"from the future": {"k", header, "{}", at.Add(-WebhookTolerance - time.Second)},
		"no timestamp":    {"k", "v1=3dd49b2593d0f9a349e9e71c4bde3e2b862c2be4003fe9b4ba81332029310158", "{}", at},
		"no signature":    {"k", "t=1", "{}", at},
		"another t":       {"k", strings.Replace(header, "t=1", "t=2", 1), "{}", time.Unix(2, 0)},
		"an empty header": {"k", "", "{}", at},
		"garbage":         {"k", "t=one,v1=zz", "{}", at},
	} {
		if err := VerifyWebhook(tc.secret, tc.header, []byte(tc.body), tc.at); !errors.Is(err, ErrWebhookSignature) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
