//! Every store test runs on both backends: [`on_both_backends!`] turns `async fn name(db:
//! TestDb)` into the tests `name::sqlite` (a private in-memory database) and `name::postgres`
//! (a fresh database of its own on the server `KODER_TEST_PG_URL` names, e.g. the one
//! `scripts/setup-postgres.sh` starts, dropped when the test passes), so tests run in parallel.
//! Without `KODER_TEST_PG_URL` the Postgres half says so and passes without testing anything,
//! unless `KODER_TEST_REQUIRE_PG` is set (as `scripts/test.sh` does), which makes it fail.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::{Connection, PgConnection};

use crate::{Backend, Store};

/// The database one test runs on.
pub(crate) enum TestDb {
    Sqlite,
    Postgres { url: String },
}

impl TestDb {
    /// A store on this test's database: for Postgres every call is one more client of the same
    /// database (as another daemon would be), for SQLite a separate in-memory database.
    pub(crate) async fn open(&self) -> Store {
        match self {
            TestDb::Sqlite => Store::open_in_memory().await.expect("open sqlite"),
            TestDb::Postgres { url } => Store::open_postgres(url).await.expect("open postgres"),
        }
    }

    pub(crate) fn backend(&self) -> Backend {
        match self {
            TestDb::Sqlite => Backend::Sqlite,
            TestDb::Postgres { .. } => Backend::Postgres,
        }
    }
}

/// Runs `body` on a fresh database of `backend`.
pub(crate) async fn run<F, Fut>(backend: Backend, body: F)
where
    F: FnOnce(TestDb) -> Fut,
    Fut: Future<Output = ()>,
{
    match backend {
        Backend::Sqlite => body(TestDb::Sqlite).await,
        Backend::Postgres => {
            let Some(server) = std::env::var("KODER_TEST_PG_URL").ok() else {
                assert!(
                    std::env::var_os("KODER_TEST_REQUIRE_PG").is_none(),
                    "KODER_TEST_REQUIRE_PG is set but KODER_TEST_PG_URL is not"
                );
                eprintln!("skipped: KODER_TEST_PG_URL is unset (scripts/setup-postgres.sh)");
                return;
            };
            let db = PgTestDb::create(&server).await;
            body(TestDb::Postgres {
                url: db.url.clone(),
            })
            .await;
            db.drop_database().await;
        }
    }
}

/// A database made for one test on the server at `server` (a URL ending in `/<database>`).
struct PgTestDb {
    server: String,
    name: String,
    url: String,
}

impl PgTestDb {
    async fn create(server: &str) -> PgTestDb {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "koder_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let base = server
            .rsplit_once('/')
            .map(|(base, _)| base)
            .expect("KODER_TEST_PG_URL ends in /<database>");
        let db = PgTestDb {
            server: server.to_owned(),
            url: format!("{base}/{name}"),
            name,
        };
        // Left over by an earlier run of a process with this pid that panicked.
        db.admin(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", db.name))
            .await;
        db.admin(&format!("CREATE DATABASE {}", db.name)).await;
        db
    }

    async fn admin(&self, sql: &str) {
        let mut conn = PgConnection::connect(&self.server)
            .await
            .expect("connect to KODER_TEST_PG_URL");
        sqlx::raw_sql(sql).execute(&mut conn).await.expect(sql);
        conn.close().await.ok();
    }

    /// `FORCE`: the test's pools may still hold connections.
    async fn drop_database(&self) {
        self.admin(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .await;
    }
}

/// `on_both_backends!(a, b)`: tests `a::sqlite`, `a::postgres`, `b::sqlite`... each calling
/// `async fn a(db: TestDb)` of the enclosing module.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                $crate::testing::run($crate::Backend::Sqlite, super::$name).await
            }

            #[tokio::test]
            async fn postgres() {
                $crate::testing::run($crate::Backend::Postgres, super::$name).await
            }
        }
    )*};
}
pub(crate) use on_both_backends;
