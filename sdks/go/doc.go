// Package sandbox is the Go client of koder-sandbox, a self-hosted daemon that runs untrusted,
// AI-generated code in sandboxes it controls.
//
// It speaks the daemon's REST API (docs/API.md, GET /openapi.json) with the standard library
// only: sessions and their event logs, exec (JSON or streamed over Server-Sent Events), files,
// pause and resume, code-interpreter contexts (runs JSON or streamed), snapshots, fork,
// volumes, network policy updates, secrets injected at egress and webhooks.
// Every call takes a context.Context; every non-2xx answer is a *SandboxError carrying the
// daemon's SANDBOX-... code and the HTTP status.
//
//	c, err := sandbox.NewClient("http://127.0.0.1:7070", apiKey)
//	s, err := c.CreateSession(ctx, sandbox.CreateSessionRequest{Language: "python"})
//	defer s.Close(ctx)
//	r, err := c.Exec(ctx, s.ID, sandbox.ExecRequest{Code: "print(6 * 7)"})
//
// Everything the daemon sends back was partly produced by sandboxed code, so the client treats
// answers as hostile: JSON answers and stream events are read up to configurable bounds
// (WithMaxResponseBytes, WithMaxEventBytes) and error bodies are cut short.
package sandbox
