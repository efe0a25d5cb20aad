//! Events out of a real server: notifications delivered to a real receiver
//! on loopback, through a SIGKILL of the server, with retries.

mod common;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::*;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

/// One request a receiver got: its headers (names in lower case) and body.
#[derive(Clone, Debug)]
struct Got {
    headers: Vec<(String, String)>,
    body: String,
}

impl Got {
    fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// A webhook receiver on loopback: answers the codes it is given in turn,
/// then 200, and keeps every request.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Receiver {
    fn start(codes: &[u16]) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let codes = Arc::new(Mutex::new(codes.iter().copied().collect::<VecDeque<u16>>()));
        let keep = got.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut headers = Vec::new();
                let mut line = String::new();
                // The request line, then headers up to the blank line.
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    continue;
                }
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                        break;
                    }
                    if let Some((n, v)) = line.trim_end().split_once(':') {
                        headers.push((n.to_ascii_lowercase(), v.trim().to_string()));
                    }
                }
                let length: usize = headers
                    .iter()
                    .find(|(n, _)| n == "content-length")
                    .map_or(0, |(_, v)| v.parse().unwrap());
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                keep.lock().unwrap().push(Got {
                    headers,
                    body: String::from_utf8(body).unwrap(),
                });
                let code = codes.lock().unwrap().pop_front().unwrap_or(200);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {code} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                );
            }
        });
        Receiver { url, got }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

/// The hex HMAC-SHA-256 of `body` under `key`, as `sha256=...`.
fn signed(key: &str, body: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

fn job_file(url: &str) -> String {
    format!(
        r#"
namespace: billing
notifiers:
  - name: oncall
    webhook: {{ url: "{url}", secret: {{ secret: hook-key }} }}
jobs:
  - name: nightly
    notify: [{{ on: [failed, recovered], to: [oncall] }}]
    tasks: [{{ id: a, shell: "exit 3" }}]
"#
    )
}

/// The one notification of namespace `billing`, once `ready` holds of it.
fn the_notification(server: &Api, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let mut found = Value::Null;
    until(what, || {
        let page = server.get("/api/v1/namespaces/billing/notifications");
        found = page["items"][0].clone();
        page["items"].as_array().is_some_and(|i| i.len() == 1) && ready(&found)
    });
    found
}

fn allow_loopback(server: &Api) {
    let (status, body) = server.put(
        "/api/v1/namespaces/billing/policy",
        &json!({ "http_allow": ["127.0.0.1/32"] }),
    );
    assert_eq!(status, 200, "{body}");
}

fn set_secret(server: &Api) {
    let (status, body) = server.put(
        "/api/v1/namespaces/billing/secrets/hook-key",
        &json!({ "value": "s3cret" }),
    );
    assert_eq!(status, 200, "{body}");
}

/// A run fails while its namespace's policy keeps the notifier out of
/// reach; the server is killed with SIGKILL before the notification is
/// delivered; after the restart (and the policy opened) it arrives once,
/// signed, with the key it was made with.
#[test]
fn a_notification_made_before_a_sigkill_is_delivered_once_after_the_restart() {
    let (_dir, data) = setup();
    let receiver = Receiver::start(&[]);
    let mut server = Server::start(&data, &[]);
    server.namespace = "billing".into();
    set_secret(&server);
    server.apply(&job_file(&receiver.url));
    let run = server.trigger("nightly");
    let first = the_notification(&server, "a refused delivery attempt", |n| {
        n["attempts"].as_i64() >= Some(1)
    });
    assert_eq!(first["state"], "pending", "{first}");
    assert!(
        first["last_error"]
            .as_str()
            .unwrap()
            .contains("refused by the namespace's execution policy"),
        "{first}"
    );
    assert!(receiver.got().is_empty(), "nothing reached the receiver");
    let key = first["key"].as_str().unwrap().to_string();
    assert_eq!(key, format!("billing/nightly/run-{run}/failed/oncall"));

    server.signal(Signal::SIGKILL);
    let mut server = Server::start(&data, &[]);
    server.namespace = "billing".into();
    allow_loopback(&server);
    let done = the_notification(&server, "the notification delivered", |n| {
        n["state"] == "delivered"
    });
    assert_eq!(done["key"], key.as_str());
    let got = receiver.got();
    assert_eq!(got.len(), 1, "delivered once: {got:?}");
    let request = &got[0];
    assert_eq!(request.header("idempotency-key"), key);
    assert_eq!(request.header("x-dagcron-event"), "failed");
    assert_eq!(
        request.header("x-dagcron-signature-256"),
        signed("s3cret", &request.body)
    );
    let body: Value = serde_json::from_str(&request.body).unwrap();
    assert_eq!(body["schema"], "dagcron.notification/v1");
    assert_eq!(body["id"], key.as_str());
    assert_eq!(
        (&body["event"], &body["namespace"], &body["job"]),
        (&json!("failed"), &json!("billing"), &json!("nightly"))
    );
    assert_eq!(body["run"]["id"], run);
    // Every attempt is recorded: the refused ones, then the one delivered.
    let one = server.get(&format!(
        "/api/v1/namespaces/billing/notifications/{}",
        done["id"]
    ));
    let deliveries = one["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len() as i64, one["attempts"].as_i64().unwrap());
    assert!(deliveries.len() >= 2, "{one}");
    let last = deliveries.last().unwrap();
    assert_eq!(
        (&last["status"], &last["error"]),
        (&json!(200), &Value::Null)
    );
    assert!(
        deliveries[..deliveries.len() - 1]
            .iter()
            .all(|d| d["status"].is_null() && d["error"].as_str().is_some())
    );
    // The command line shows it, and nothing given up.
    let out = server
        .cli()
        .args(["notifications", "list", "billing"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("delivered") && text.contains(&format!("{run}")),
        "{text}"
    );
    let out = server
        .cli()
        .args(["notifications", "list", "billing", "--failed"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        1,
        "only the heading"
    );
    let metrics = server.metrics();
    assert!(
        metrics.contains("dagcron_notifications_total{outcome=\"delivered\"} 1"),
        "{metrics}"
    );
}

/// A receiver that answers 500 three times, then 200: four attempts
/// recorded with their answers, one delivery, the same body and key each
/// time.
#[test]
fn a_failing_receiver_is_tried_again_until_it_takes_the_notification() {
    let (_dir, data) = setup();
    let receiver = Receiver::start(&[500, 500, 500]);
    let mut server = Server::start(&data, &[]);
    server.namespace = "billing".into();
    set_secret(&server);
    allow_loopback(&server);
    server.apply(&job_file(&receiver.url));
    server.trigger("nightly");
    let done = the_notification(&server, "the notification delivered", |n| {
        n["state"] == "delivered"
    });
    assert_eq!(done["attempts"], 4, "{done}");
    let one = server.get(&format!(
        "/api/v1/namespaces/billing/notifications/{}",
        done["id"]
    ));
    let statuses: Vec<&Value> = one["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["status"])
        .collect();
    assert_eq!(
        statuses,
        [&json!(500), &json!(500), &json!(500), &json!(200)]
    );
    let got = receiver.got();
    assert_eq!(got.len(), 4);
    assert!(
        got.iter().all(|g| g.body == got[0].body
            && g.header("idempotency-key") == done["key"].as_str().unwrap())
    );
}

/// A job that fails every second with `breaker: { after_failures: 2 }`:
/// its breaker opens after two failed runs, the receiver hears
/// `breaker_opened`, the next fires are recorded `skipped_breaker` with no
/// run, the API and the CLI say why; a resume through the API closes it,
/// the receiver hears `breaker_closed`, and the job fires again.
#[test]
fn the_breaker_opens_after_two_failures_and_a_resume_closes_it() {
    let (_dir, data) = setup();
    let receiver = Receiver::start(&[]);
    let mut server = Server::start(&data, &[]);
    server.namespace = "billing".into();
    set_secret(&server);
    allow_loopback(&server);
    let url = &receiver.url;
    server.apply(&format!(
        r#"
namespace: billing
notifiers:
  - name: oncall
    webhook: {{ url: "{url}", secret: {{ secret: hook-key }} }}
jobs:
  - name: flaky
    schedule: "* * * * * *"
    concurrency: forbid
    breaker: {{ after_failures: 2 }}
    notify: [{{ on: [breaker_opened, breaker_closed], to: [oncall] }}]
    tasks: [{{ id: a, shell: "exit 3" }}]
"#
    ));
    let job = "/api/v1/namespaces/billing/jobs/flaky";
    let mut answer = Value::Null;
    until("the breaker open", || {
        answer = server.get(job);
        !answer["breaker"].is_null()
    });
    assert_eq!(answer["breaker"]["failures"], 2, "{answer}");
    assert!(answer["next_fire"].is_null(), "{answer}");
    assert!(
        answer["breaker"]["reason"]
            .as_str()
            .unwrap()
            .contains("2 consecutive failed runs"),
        "{answer}"
    );
    let opened_by = answer["breaker"]["run"].as_i64().unwrap();
    let fires = |server: &Api| -> Vec<Value> {
        server.get(&format!("{job}/fires?limit=1000"))["items"]
            .as_array()
            .unwrap()
            .clone()
    };
    until("two fires skipped by the breaker", || {
        fires(&server)
            .iter()
            .filter(|f| f["outcome"] == "skipped_breaker")
            .count()
            >= 2
    });
    let skipped = fires(&server);
    assert!(
        skipped
            .iter()
            .filter(|f| f["outcome"] == "skipped_breaker")
            .all(|f| f["run_id"].is_null()),
        "{skipped:?}"
    );
    // Once a fire is skipped by the breaker, every later one is.
    let outcomes: Vec<&str> = skipped
        .iter()
        .map(|f| f["outcome"].as_str().unwrap())
        .collect();
    let first = outcomes
        .iter()
        .position(|o| *o == "skipped_breaker")
        .unwrap();
    assert!(
        outcomes[first..].iter().all(|o| *o == "skipped_breaker"),
        "{outcomes:?}"
    );
    until("breaker_opened delivered", || {
        receiver
            .got()
            .iter()
            .any(|g| g.header("x-dagcron-event") == "breaker_opened")
    });
    let opened = receiver.got();
    let body: Value = serde_json::from_str(&opened[0].body).unwrap();
    assert_eq!(body["breaker"]["run"], opened_by);
    assert_eq!(body["run"]["id"], opened_by);
    let out = server
        .cli()
        .args(["jobs", "show", "billing/flaky"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("breaker open"), "{text}");

    let (status, resumed) = server.post(&format!("{job}/resume"), "", "application/json");
    assert_eq!(status, 200, "{resumed}");
    assert!(resumed["breaker"].is_null(), "{resumed}");
    until("a run after the resume", || {
        server.get(&format!("{job}/runs?limit=1"))["items"][0]["id"].as_i64() > Some(opened_by)
    });
    until("breaker_closed delivered", || {
        receiver
            .got()
            .iter()
            .any(|g| g.header("x-dagcron-event") == "breaker_closed")
    });
    let events: Vec<String> = receiver
        .got()
        .iter()
        .map(|g| g.header("x-dagcron-event").to_string())
        .collect();
    // (It fails again after the resume, and may open again.)
    assert_eq!(
        events.iter().filter(|e| *e == "breaker_closed").count(),
        1,
        "{events:?}"
    );
}

/// A job that succeeds every second and a job that starts after each of
/// its runs; the server is killed with SIGKILL while they run, and
/// started again. Once the upstream job is paused and everything has
/// ended, there is exactly one downstream run per upstream run that
/// succeeded: none lost in the crash, none made twice.
#[test]
fn after_triggers_make_one_run_per_upstream_end_through_a_sigkill() {
    let (_dir, data) = setup();
    let mut server = Server::start(&data, &[]);
    server.namespace = "chain".into();
    server.apply(
        r#"
namespace: chain
jobs:
  - name: extract
    schedule: "* * * * * *"
    tasks: [{ id: a, shell: "sleep 0.2" }]
  - name: load
    after: { job: extract }
    tasks: [{ id: a, shell: "sleep 0.1" }]
"#,
    );
    let runs = |server: &Api, job: &str| -> Vec<Value> {
        server.get(&format!(
            "/api/v1/namespaces/chain/jobs/{job}/runs?limit=500"
        ))["items"]
            .as_array()
            .unwrap()
            .clone()
    };
    until("three downstream runs", || runs(&server, "load").len() >= 3);
    server.signal(Signal::SIGKILL);
    let mut server = Server::start(&data, &[]);
    server.namespace = "chain".into();
    let before = runs(&server, "load").len();
    until("more downstream runs after the restart", || {
        runs(&server, "load").len() >= before + 2
    });
    let (status, body) = server.post(
        "/api/v1/namespaces/chain/jobs/extract/pause",
        "",
        "application/json",
    );
    assert_eq!(status, 200, "{body}");
    let ended =
        |r: &Value| ["succeeded", "failed", "cancelled"].contains(&r["state"].as_str().unwrap());
    until("everything ended", || {
        runs(&server, "extract").iter().all(ended) && runs(&server, "load").iter().all(ended)
    });
    let upstream = runs(&server, "extract");
    let succeeded = upstream
        .iter()
        .filter(|r| r["state"] == "succeeded")
        .count();
    let downstream = runs(&server, "load");
    assert_eq!(
        downstream.len(),
        succeeded,
        "one load per extract that succeeded: {} upstream ({succeeded} succeeded), {} downstream",
        upstream.len(),
        downstream.len()
    );
    assert!(downstream.iter().all(|r| r["trigger"] == "after"));
}

/// A real SMTP server (aiosmtpd) on loopback, killed with the test.
struct SmtpServer {
    child: std::process::Child,
    port: u16,
    out: std::path::PathBuf,
}

impl SmtpServer {
    fn start(dir: &std::path::Path) -> SmtpServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = dir.join("smtp.out");
        let child = std::process::Command::new("python3")
            .args([
                "-u",
                "-m",
                "aiosmtpd",
                "-n",
                "-c",
                "aiosmtpd.handlers.Debugging",
            ])
            .args(["-l", &format!("127.0.0.1:{port}")])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("python3 with aiosmtpd (scripts/test installs it)");
        until("the SMTP server listening", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        SmtpServer { child, port, out }
    }

    fn received(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An e-mail notifier, through a real SMTP server: a failed run's
/// notification arrives once, to each recipient, with the run in its
/// subject and the notification's body in its text.
#[test]
fn a_failed_run_is_mailed_through_the_smtp_relay() {
    let (dir, data) = setup();
    let smtp = SmtpServer::start(dir.path());
    let url = format!("smtp://127.0.0.1:{}", smtp.port);
    let mut server = Server::start(
        &data,
        &["--smtp-url", &url, "--smtp-from", "dagcron@example.com"],
    );
    server.namespace = "billing".into();
    server.apply(
        r#"
namespace: billing
notifiers:
  - name: team
    email: { to: [ops@example.com, oncall@example.org] }
jobs:
  - name: nightly
    notify: [{ on: [failed], to: [team] }]
    tasks: [{ id: a, shell: "exit 3" }]
"#,
    );
    let run = server.trigger("nightly");
    let done = the_notification(&server, "the e-mail delivered", |n| {
        n["state"] == "delivered"
    });
    assert_eq!(done["attempts"], 1, "{done}");
    let mail = smtp.received();
    assert_eq!(mail.matches("MESSAGE FOLLOWS").count(), 1, "{mail}");
    assert!(
        mail.contains(&format!("Subject: [dagcron] run {run} of billing/nightly")),
        "{mail}"
    );
    assert!(
        mail.contains("To: ops@example.com, oncall@example.org"),
        "{mail}"
    );
    assert!(mail.contains("From: dagcron@example.com"), "{mail}");
    assert!(
        mail.contains("\"schema\": \"dagcron.notification/v1\""),
        "{mail}"
    );
}

/// A JetStream stream of its own on the NATS server at 127.0.0.1:4222,
/// deleted with the test.
struct Stream {
    rt: tokio::runtime::Runtime,
    js: async_nats::jetstream::Context,
    name: String,
    subject: String,
}

impl Stream {
    fn create() -> Stream {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let unique = format!(
            "{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let name = format!("DAGCRON_TEST_{unique}");
        let subject = format!("dagcron_test_{unique}.orders");
        let js = rt.block_on(async {
            let client = async_nats::connect("nats://127.0.0.1:4222")
                .await
                .expect("NATS with JetStream at 127.0.0.1:4222 (scripts/test checks it)");
            let js = async_nats::jetstream::new(client);
            js.create_stream(async_nats::jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                ..Default::default()
            })
            .await
            .unwrap();
            js
        });
        Stream {
            rt,
            js,
            name,
            subject,
        }
    }

    /// How many consumers the stream has.
    fn consumers(&self) -> usize {
        self.rt.block_on(async {
            let mut stream = self.js.get_stream(&self.name).await.unwrap();
            stream.info().await.unwrap().state.consumer_count
        })
    }

    fn publish(&self, payload: &str) {
        self.rt.block_on(async {
            self.js
                .publish(self.subject.clone(), payload.to_string().into())
                .await
                .unwrap()
                .await
                .unwrap();
        });
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.rt.block_on(self.js.delete_stream(&self.name));
    }
}

/// Messages of a real JetStream stream start runs, each once, with the
/// parameters mapped from their payload; a message published while the
/// server is down (killed with SIGKILL) makes its run once it is back.
/// Another namespace's job on the same stream, whose execution policy
/// does not list it, reads nothing.
#[test]
fn nats_messages_make_one_run_each_also_published_while_the_server_is_down() {
    let (_dir, data) = setup();
    let stream = Stream::create();
    let flags = ["--nats-url", "nats://127.0.0.1:4222"];
    let mut server = Server::start(&data, &flags);
    server.namespace = "shop".into();
    let (status, body) = server.put(
        "/api/v1/namespaces/shop/policy",
        &json!({ "nats_streams": [stream.name] }),
    );
    assert_eq!(status, 200, "{body}");
    for ns in ["shop", "spy"] {
        server.apply(&format!(
            r#"
namespace: {ns}
jobs:
  - name: on-order
    nats: {{ subject: "{}", stream: {}, params: {{ order: "$.id" }} }}
    tasks: [{{ id: a, noop: true }}]
"#,
            stream.subject, stream.name
        ));
    }
    let runs = |server: &Api| -> Vec<Value> {
        server.get("/api/v1/namespaces/shop/jobs/on-order/runs?limit=100")["items"]
            .as_array()
            .unwrap()
            .clone()
    };
    // A job's consumer takes the messages published once it exists.
    until("the job's consumer", || stream.consumers() >= 1);
    stream.publish(r#"{"id": 1}"#);
    stream.publish(r#"{"id": 2}"#);
    until("two runs", || runs(&server).len() == 2);
    server.signal(Signal::SIGKILL);
    stream.publish(r#"{"id": 3}"#);
    let mut server = Server::start(&data, &flags);
    server.namespace = "shop".into();
    until("the third run", || runs(&server).len() >= 3);
    // Nothing more comes: each message made one run.
    let ended = |r: &Value| r["state"] == "succeeded";
    until("every run ended", || runs(&server).iter().all(ended));
    let all = runs(&server);
    let mut orders: Vec<&str> = all
        .iter()
        .map(|r| r["params"]["order"].as_str().unwrap())
        .collect();
    orders.sort();
    assert_eq!(orders, ["1", "2", "3"], "{all:?}");
    assert!(all.iter().all(|r| r["trigger"] == "message"));
    assert_eq!(all[0]["params"]["nats_subject"], stream.subject.as_str());
    let spied = server.get("/api/v1/namespaces/spy/jobs/on-order/runs");
    assert_eq!(spied["items"], json!([]), "{spied}");
}
