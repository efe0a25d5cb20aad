//! What an operator watches: `/metrics` scraped from a real server (with a
//! token on the API's address, without one on `--metrics-listen`), checked
//! by `promtool`.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{InProcess, setup};

/// Runs `promtool` with `args`, `input` on its standard input; fails the
/// test if it is missing (CI installs Debian's `prometheus` package).
pub fn promtool(args: &[&str], input: &[u8]) -> std::process::Output {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs (install Debian's `prometheus` package)");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// A port nobody listens on now (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn metrics_are_scraped_with_a_token_or_on_their_own_address() {
    let (dir, data) = setup();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = InProcess::start(&data, &["--metrics-listen", &listen]);
    let (status, _) = server.post(
        "/api/v1/apply",
        "namespace: e2e\njobs:\n  - { name: once, tasks: [{ id: a, shell: 'true' }] }\n",
        "application/yaml",
    );
    assert_eq!(status, 200);
    let run = server.trigger("once");
    server.wait_run(run, "succeeded");

    // On the API's address: a token is needed.
    let anonymous = reqwest::blocking::get(format!("{}/metrics", server.url)).unwrap();
    assert_eq!(anonymous.status(), 401);
    let scraped = server
        .http()
        .get(format!("{}/metrics", server.url))
        .send()
        .unwrap();
    assert_eq!(scraped.status(), 200);
    assert_eq!(
        scraped.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = scraped.text().unwrap();
    for series in [
        "dagcron_attempts_total{namespace=\"e2e\",executor=\"shell\",result=\"succeeded\"} 1",
        "dagcron_run_duration_seconds_count{namespace=\"e2e\",result=\"succeeded\"} 1",
        "dagcron_engine_up 1",
        "dagcron_build_info{version=",
        "dagcron_pool_slots 64",
    ] {
        assert!(text.contains(series), "{series} is not in:\n{text}");
    }
    let checked = promtool(&["check", "metrics"], text.as_bytes());
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // A scraper that asks for OpenMetrics gets it.
    let open = server
        .http()
        .get(format!("{}/metrics", server.url))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .unwrap();
    assert!(
        open.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    assert!(open.text().unwrap().ends_with("# EOF\n"));

    // On the address of its own: no token, and nothing else is served.
    let own = reqwest::blocking::get(format!("http://{listen}/metrics")).unwrap();
    assert_eq!(own.status(), 200);
    assert!(own.text().unwrap().contains("dagcron_attempts_total"));
    let other =
        reqwest::blocking::get(format!("http://{listen}/api/v1/namespaces/e2e/jobs")).unwrap();
    assert_eq!(other.status(), 404);
    server.stop();
    drop(dir);
}
