//! The test's PostgreSQL (`KODER_TEST_PG_URL`, a server `scripts/setup-postgres.sh` starts):
//! a database of a test's own, dropped at the end, and polling queries on it.

#![allow(dead_code)] // each test binary uses a different subset

use std::process::Command;

/// A database of this test's own on the test server, dropped at the end (also on panic).
pub struct TestDatabase {
    server: String,
    name: String,
    pub url: String,
}

impl TestDatabase {
    pub fn create(server: &str, tag: &str) -> TestDatabase {
        let base = server
            .rsplit_once('/')
            .map(|(b, _)| b)
            .expect("KODER_TEST_PG_URL ends in /<database>");
        let name = format!("koder_test_{tag}_{}", std::process::id());
        let db = TestDatabase {
            server: server.into(),
            url: format!("{base}/{name}"),
            name,
        };
        db.psql(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", db.name));
        db.psql(&format!("CREATE DATABASE {}", db.name));
        db
    }

    fn psql_on(url: &str, sql: &str) -> String {
        let out = Command::new("psql")
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", url, "-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn psql(&self, sql: &str) -> String {
        Self::psql_on(&self.server, sql)
    }

    /// A query on the test's own database.
    pub fn query(&self, sql: &str) -> String {
        Self::psql_on(&self.url, sql)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args(["-X", "-q", &self.server, "-c"])
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .output();
    }
}

pub fn pg_server_or_skip() -> Option<String> {
    let url = std::env::var("KODER_TEST_PG_URL").ok();
    if url.is_none() {
        assert!(
            std::env::var_os("KODER_TEST_REQUIRE_PG").is_none(),
            "KODER_TEST_REQUIRE_PG is set but KODER_TEST_PG_URL is not"
        );
        eprintln!("skipped: KODER_TEST_PG_URL is unset (scripts/setup-postgres.sh)");
    }
    url
}

/// Polls `sql` until its output equals `want`, for at most `secs`.
pub async fn eventually(db: &TestDatabase, sql: &str, want: &str, secs: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let got = db.query(sql);
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sql}: {got:?}, want {want:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
