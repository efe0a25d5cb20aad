//! What an operator watches: `/metrics` scraped from a real server (with a
//! token on the API's address, without one on `--metrics-listen`), checked
//! by `promtool`; and the spans of runs and attempts, received by an OTLP
//! receiver in the test (gRPC on loopback) from a server process.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use common::{InProcess, Killed, Server, join_token, setup, until};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;

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

/// Every series of a scrape is of a metric `examples/prometheus-metrics.txt`
/// lists (the list the dashboard and the alert rules are checked against),
/// with labels it declares.
fn assert_listed(scrape: &str) {
    let list = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/prometheus-metrics.txt"
    ))
    .unwrap();
    let declared: std::collections::BTreeMap<&str, (&str, Vec<&str>)> = list
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let labels = if w[2] == "-" {
                vec![]
            } else {
                w[2].split(',').collect()
            };
            (w[0], (w[1], labels))
        })
        .collect();
    for line in scrape.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap();
        let (base, histogram_part) = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| declared.contains_key(b)))
            .map_or((name, false), |b| (b, true));
        let (kind, labels) = declared.get(base).unwrap_or_else(|| {
            panic!("{base} is exported but not in examples/prometheus-metrics.txt")
        });
        assert_eq!(histogram_part, *kind == "histogram", "{line}");
        let inside = line
            .split_once('{')
            .map_or("", |(_, r)| r.split_once('}').unwrap().0);
        for pair in inside.split("\",").filter(|p| !p.is_empty()) {
            let key = pair.split('=').next().unwrap();
            assert!(
                labels.contains(&key) || (key == "le" && histogram_part),
                "{base} has label {key}, which the list does not declare"
            );
        }
    }
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
    // A trigger refused by a quota is counted (of a job that does not
    // exist, so that the one allowed makes no run).
    let quota = server
        .http()
        .put(format!("{}/api/v1/namespaces/e2e/quotas", server.url))
        .header("content-type", "application/json")
        .body(r#"{"max_triggers_per_second": 1}"#)
        .send()
        .unwrap();
    assert_eq!(quota.status(), 200);
    let refused = (0..3)
        .map(|_| {
            server
                .http()
                .post(format!(
                    "{}/api/v1/namespaces/e2e/jobs/nope/trigger",
                    server.url
                ))
                .body("{}")
                .send()
                .unwrap()
                .status()
        })
        .filter(|s| *s == 429)
        .count();
    assert!(refused >= 1, "three triggers at once, one a second allowed");

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
        "dagcron_quota_refusals_total{namespace=\"e2e\",quota=\"max_triggers_per_second\"}",
    ] {
        assert!(text.contains(series), "{series} is not in:\n{text}");
    }
    assert_listed(&text);
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

    // The peak of fires due in one second over the next hour is counted
    // when the server starts (then every minute): two jobs at second 0 of
    // every minute make 2.
    let (status, _) = server.post(
        "/api/v1/apply",
        "namespace: e2e\njobs:\n  - { name: m1, schedule: '0 * * * * *', tasks: [{ id: a, noop: true }] }\n  - { name: m2, schedule: '0 * * * * *', tasks: [{ id: a, noop: true }] }\n",
        "application/yaml",
    );
    assert_eq!(status, 200);
    server.stop();
    let server = InProcess::start(&data, &[]);
    until("the metrics show a peak of 2 fires a second", || {
        let text = server.metrics();
        if text.contains("dagcron_schedule_peak_fires_per_second 2") {
            Ok(())
        } else {
            Err(text)
        }
    });
    server.stop();
    drop(dir);
}

/// An OTLP/gRPC trace receiver: keeps every span it is sent, with the
/// service name of its resource.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .map(|a| text(&a.value))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    kept.push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn text(value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        other => format!("{other:?}"),
    }
}

fn attribute(span: &Span, key: &str) -> String {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .map(|a| text(&a.value))
        .unwrap_or_default()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts the receiver on loopback (on a thread of its own); returns its
/// address and what it received.
fn receiver() -> (String, Receiver) {
    let receiver = Receiver::default();
    let served = receiver.clone();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app =
                tonic::service::Routes::new(TraceServiceServer::new(served)).into_axum_router();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (format!("http://{address}"), receiver)
}

impl Receiver {
    /// Waits (bounded) until `n` spans of trace `trace` have come.
    fn trace(&self, trace: &str, n: usize) -> Vec<(String, Span)> {
        until(&format!("{n} spans of trace {trace} have come"), || {
            let spans: Vec<(String, Span)> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, s)| hex(&s.trace_id) == trace)
                .cloned()
                .collect();
            if spans.len() >= n {
                Ok(spans)
            } else {
                Err(format!("{} came", spans.len()))
            }
        })
    }
}

/// A run triggered with a caller's `traceparent` makes a span, a child of
/// the caller's, with a child span per attempt (the retry a sibling of the
/// failed attempt); each shell task sees a TRACEPARENT of the run's trace
/// whose parent is its attempt's span. A run triggered without one starts
/// a trace of its own.
#[test]
fn a_run_s_trace_reaches_its_tasks_and_the_receiver() {
    let (dir, data) = setup();
    let (endpoint, received) = receiver();
    let server = Server::start_env(
        &data,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "dagcron-under-test"),
        ],
    );
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // The server's shell tasks write here as an unprivileged user.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    // Task b runs on a remote agent.
    let token = join_token(&server, None, None);
    let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    let _agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_dagcron"))
            .args(["worker", "--server", &server.url, "--id", "tracer"])
            .args(["--labels", "role=tracer", "--token", &token])
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap(),
    );
    until("the agent is connected", || {
        server.get("/api/v1/workers")["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["id"] == "tracer" && w["connected"] == true)
    });
    let job = format!(
        concat!(
            "namespace: e2e\njobs:\n  - name: traced\n",
            "    retry: {{ max_attempts: 2, initial: 1s }}\n",
            "    tasks:\n",
            "      - {{ id: a, shell: 'echo \"$TRACEPARENT\" >> {out}/a-$DAGCRON_RUN_ID; test \"$DAGCRON_ATTEMPT\" -ge 2' }}\n",
            "      - {{ id: b, depends_on: [a], run_on: {{ labels: {{ role: tracer }} }}, shell: 'echo \"$TRACEPARENT\" > {out}/b-$DAGCRON_RUN_ID' }}\n",
        ),
        out = out.display()
    );
    let (status, answer) = server.post("/api/v1/apply", &job, "application/yaml");
    assert_eq!(status, 200, "{answer}");

    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let run = server.trigger_traced(
        "traced",
        &format!("00-{caller_trace}-{caller_span}-01"),
        "vendor=x",
    );
    server.wait_run(run, "succeeded");

    let spans = received.trace(caller_trace, 4);
    assert_eq!(spans.len(), 4, "one run span and three attempt spans");
    assert!(
        spans
            .iter()
            .all(|(service, _)| service == "dagcron-under-test")
    );
    let (_, root) = spans
        .iter()
        .find(|(_, s)| s.name == "RUN e2e/traced")
        .expect("the run's span");
    assert_eq!(
        hex(&root.parent_span_id),
        caller_span,
        "a child of the caller's span"
    );
    assert_eq!(root.trace_state, "vendor=x");
    assert_eq!(attribute(root, "cicd.pipeline.name"), "traced");
    assert_eq!(attribute(root, "cicd.pipeline.run.id"), run.to_string());
    assert_eq!(attribute(root, "cicd.pipeline.result"), "success");
    assert_eq!(attribute(root, "dagcron.namespace"), "e2e");
    let mut attempts: Vec<(String, String, String, String)> = spans
        .iter()
        .filter(|(_, s)| s.span_id != root.span_id)
        .map(|(_, s)| {
            assert_eq!(
                s.parent_span_id, root.span_id,
                "{} is a child of the run",
                s.name
            );
            assert!(s.start_time_unix_nano >= root.start_time_unix_nano);
            assert!(s.end_time_unix_nano <= root.end_time_unix_nano);
            (
                attribute(s, "cicd.pipeline.task.name"),
                attribute(s, "dagcron.attempt"),
                format!(
                    "{} {}",
                    attribute(s, "cicd.pipeline.task.run.result"),
                    attribute(s, "dagcron.agent")
                ),
                hex(&s.span_id),
            )
        })
        .collect();
    attempts.sort();
    let results: Vec<(&str, &str, &str)> = attempts
        .iter()
        .map(|(t, n, r, _)| (t.as_str(), n.as_str(), r.as_str()))
        .collect();
    assert_eq!(
        results,
        [
            ("a", "1", "failure "),
            ("a", "2", "success "),
            ("b", "1", "success tracer")
        ]
    );
    // Each task saw its attempt's span as its parent, in the run's trace.
    let seen = |file: &str| std::fs::read_to_string(out.join(file)).unwrap();
    let expected: Vec<String> = attempts
        .iter()
        .map(|(_, _, _, span)| format!("00-{caller_trace}-{span}-01"))
        .collect();
    assert_eq!(
        seen(&format!("a-{run}")).lines().collect::<Vec<_>>(),
        [expected[0].as_str(), expected[1].as_str()]
    );
    assert_eq!(seen(&format!("b-{run}")).trim(), expected[2]);

    // Without a caller: a trace of the run's own, its span a root.
    let second = server.trigger("traced");
    server.wait_run(second, "succeeded");
    let first_line = seen(&format!("b-{second}"));
    let trace = first_line.trim().split('-').nth(1).unwrap().to_string();
    assert_ne!(trace, caller_trace);
    let spans = received.trace(&trace, 4);
    let (_, root) = spans
        .iter()
        .find(|(_, s)| s.name == "RUN e2e/traced")
        .expect("the second run's span");
    assert!(root.parent_span_id.is_empty(), "a root span");
    drop(server);
}
