//! A fresh PostgreSQL database per test.
//!
//! Tests that need PostgreSQL call [`TestDatabase::create`]; the database is
//! dropped when the value is. The server is found through
//! `DAGCRON_TEST_POSTGRES` (a connection URL to any database of the server,
//! default `postgres://postgres@127.0.0.1:5432/postgres`). A server that
//! cannot be reached fails the test: these tests never skip.

use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::Connection;
use sqlx::postgres::PgConnection;

/// The variable naming the PostgreSQL server used by tests.
pub const URL_VARIABLE: &str = "DAGCRON_TEST_POSTGRES";

/// The server URL tests use.
pub fn server_url() -> String {
    std::env::var(URL_VARIABLE)
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// A database created for one test and dropped with this value.
#[derive(Debug)]
pub struct TestDatabase {
    /// Connection URL of the new database.
    pub url: String,
    name: String,
    admin: String,
}

fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{database}", &base[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

impl TestDatabase {
    /// Creates an empty database with a name unique to this process and test.
    pub async fn create(label: &str) -> TestDatabase {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let admin = server_url();
        let label: String = label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(30)
            .collect();
        let name = format!(
            "dagcron_t_{label}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = PgConnection::connect(&admin).await.unwrap_or_else(|e| {
            panic!(
                "PostgreSQL is needed by this test and {admin} cannot be reached: {e}. \
                 Start PostgreSQL or set {URL_VARIABLE} to a server URL."
            )
        });
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        let _ = conn.close().await;
        TestDatabase {
            url: with_database(&admin, &name),
            name,
            admin,
        }
    }

    /// Runs a query returning one integer (a count, say), from a test
    /// without a runtime.
    pub fn scalar(&self, sql: &str) -> i64 {
        let (url, sql) = (self.url.clone(), sql.to_string());
        std::thread::spawn(move || {
            runtime().block_on(async {
                let mut conn = PgConnection::connect(&url).await.expect("connect");
                sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.clone()))
                    .fetch_one(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            })
        })
        .join()
        .expect("query thread")
    }

    /// [`TestDatabase::create`] for tests without a runtime.
    pub fn create_blocking(label: &str) -> TestDatabase {
        runtime().block_on(TestDatabase::create(label))
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        // Dropping may happen inside a runtime: do it on a thread of its own.
        let _ = std::thread::spawn(move || {
            runtime().block_on(async {
                if let Ok(mut conn) = PgConnection::connect(&admin).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_of_a_url() {
        assert_eq!(
            with_database("postgres://u@h:5432/postgres", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
        assert_eq!(
            with_database("postgres://h/db?sslmode=disable", "x"),
            "postgres://h/x?sslmode=disable"
        );
    }
}
