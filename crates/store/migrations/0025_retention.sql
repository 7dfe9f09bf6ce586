-- Retention prunes what only grows (stopped sessions' records, the network audit, the webhook
-- delivery log) by age: each finds its old rows by an index instead of reading the table.
CREATE INDEX sessions_stopped_ended ON sessions (state, ended_at_ms);
CREATE INDEX network_audit_at ON network_audit (at_ms);
CREATE INDEX webhook_deliveries_updated ON webhook_deliveries (state, updated_at_ms);
