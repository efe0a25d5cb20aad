//! The web UI in a real headless Chromium, driven over WebDriver
//! (`chromedriver`), against a real `dagcron serve --demo` process.
//!
//! It signs in, sees the demo jobs, triggers a run and watches it finish,
//! opens its Gantt timeline and a log followed live, sees an error drawn in
//! the playground, and checks that a viewer is offered no action. Each view
//! is photographed; with `UPDATE_SCREENSHOTS=N` the demo runs N seconds
//! first and the pictures replace those of `docs/ui/`.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{Server, setup};
use serde_json::{Value, json};

/// The W3C element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one browser session of it.
struct Browser {
    driver: Child,
    http: reqwest::blocking::Client,
    session: String,
    shots: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.http.delete(&self.session).send();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Polls `f` for up to `secs` seconds; panics with `what`.
fn wait_for<T>(secs: u64, what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::until_within(Duration::from_secs(secs), what, f)
}

impl Browser {
    fn start(shots: PathBuf) -> Browser {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver) is installed; .ci/run installs it");
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        wait_for(20, "chromedriver to answer", || {
            let v: Value = http
                .get(format!("{base}/status"))
                .send()
                .ok()?
                .json()
                .ok()?;
            v["value"]["ready"].as_bool().filter(|r| *r)
        });
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1000",
                         "--force-device-scale-factor=1"]
            }
        }}});
        let v: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let id = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {v}"));
        std::fs::create_dir_all(&shots).unwrap();
        Browser {
            driver,
            http,
            session: format!("{base}/session/{id}"),
            shots,
        }
    }

    fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.session));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().unwrap().json().unwrap();
        v["value"].clone()
    }

    fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })));
    }

    fn find_all(&self, css: &str) -> Vec<String> {
        let v = self.call(
            reqwest::Method::POST,
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        );
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits for an element matching `css`.
    fn find(&self, css: &str) -> String {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(e) = self.find_all(css).into_iter().next() {
                return e;
            }
            if Instant::now() > end {
                let page = self.call(reqwest::Method::GET, "/source", None);
                panic!("no {css} at {} within 20 s; the page:\n{page}", self.url());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn text(&self, css: &str) -> String {
        let e = self.find(css);
        self.call(reqwest::Method::GET, &format!("/element/{e}/text"), None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The text of `css` once it satisfies `ok`.
    fn text_until(&self, secs: u64, css: &str, ok: impl Fn(&str) -> bool) -> String {
        wait_for(secs, &format!("{css} to read as expected"), || {
            let t =
                self.find_all(css).into_iter().next().map(|e| {
                    self.call(reqwest::Method::GET, &format!("/element/{e}/text"), None)
                })?;
            let t = t.as_str()?.to_string();
            ok(&t).then_some(t)
        })
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.call(
            reqwest::Method::POST,
            &format!("/element/{e}/click"),
            Some(json!({})),
        );
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.call(
            reqwest::Method::POST,
            &format!("/element/{e}/clear"),
            Some(json!({})),
        );
        self.call(
            reqwest::Method::POST,
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        );
    }

    fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .as_str()
            .unwrap()
            .to_string()
    }

    fn dark(&self, on: bool) {
        let scheme = if on { "dark" } else { "light" };
        self.call(
            reqwest::Method::POST,
            "/goog/cdp/execute",
            Some(json!({"cmd": "Emulation.setEmulatedMedia", "params": {
                "features": [{"name": "prefers-color-scheme", "value": scheme}]}})),
        );
    }

    /// A picture of the whole page (the window grown to the page's height).
    fn shot(&self, name: &str) {
        // From a short window, so that the page's height is its own.
        self.call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": 1280, "height": 600})),
        );
        let h = self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": "return document.documentElement.scrollHeight", "args": []})),
        );
        let h = h.as_i64().unwrap_or(1000).clamp(600, 3000);
        self.call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": 1280, "height": h + 120})),
        );
        let png = self.call(reqwest::Method::GET, "/screenshot", None);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(self.shots.join(format!("{name}.png")), bytes).unwrap();
    }
}

fn shots_dir(tmp: &Path) -> PathBuf {
    if std::env::var_os("UPDATE_SCREENSHOTS").is_some() {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ui")
    } else {
        tmp.join("shots")
    }
}

fn sign_in(b: &Browser, url: &str, token: &str) {
    b.goto(&format!("{url}/"));
    b.type_into("#token", token);
    b.click("button[type=submit]");
    b.find("header.top");
}

#[test]
fn the_ui_in_a_browser_signs_in_runs_a_job_follows_its_log_and_hides_actions_from_viewers() {
    let (dir, data) = setup();
    let server = Server::start(&data, &["--demo"]);
    let token = server.token.clone().unwrap();
    let url = server.url.clone();
    // A job whose log grows for a few seconds, to follow live.
    let (status, _) = server.post(
        "/api/v1/apply",
        "namespace: demo\njobs:\n  - name: slow-log\n    tasks:\n      - id: count\n        shell: 'for i in 1 2 3 4 5 6 7 8; do echo line $i; sleep 0.4; done'\n",
        "application/yaml",
    );
    assert_eq!(status, 200);
    let b = Browser::start(shots_dir(dir.path()));
    // Pictures for the docs show a demo that has run for a while: every
    // demo job has fired, failed or held a few times.
    if let Some(secs) = std::env::var("UPDATE_SCREENSHOTS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(Duration::from_secs(secs.min(600)));
    }

    // Signing in.
    b.goto(&format!("{url}/"));
    b.find("#token");
    b.shot("signin");
    b.type_into("#token", "dgc_wrong");
    b.click("button[type=submit]");
    assert!(b.text("#signin-error").contains("unknown token"));
    sign_in(&b, &url, &token);

    // The demo jobs, with runs of the heartbeat in its strip.
    b.goto(&format!("{url}/jobs"));
    for job in ["heartbeat", "flaky-pipeline", "weekday-report", "slow-log"] {
        b.find(&format!("a[href='/jobs/demo/{job}']"));
    }
    wait_for(30, "a heartbeat run in the strip", || {
        b.goto(&format!("{url}/jobs"));
        (!b.find_all(".strip a").is_empty()).then_some(())
    });
    b.shot("jobs");

    // Triggering the pipeline and watching it finish.
    b.goto(&format!("{url}/jobs/demo/flaky-pipeline"));
    b.find("svg.dag");
    b.type_into("#params", "who=browser");
    b.click("#trigger");
    wait_for(10, "the run's page", || {
        b.url().contains("/runs/").then_some(())
    });
    let state = b.text_until(90, "#run-state", |s| {
        s == "succeeded" || s == "failed" || s == "cancelled"
    });
    assert_eq!(state, "succeeded");
    // Its Gantt timeline: four tasks, the transform's two attempts.
    b.find("svg.gantt");
    assert!(
        b.find_all("svg.gantt .bar").len() >= 5,
        "an attempt bar each, a retry"
    );
    assert!(
        !b.find_all("svg.gantt .waitbar").is_empty(),
        "waits are drawn"
    );
    assert!(b.text("main").contains("who=browser"));
    b.shot("run");
    b.goto(&format!("{url}/jobs/demo/flaky-pipeline"));
    b.find(".grid .cell.s-succeeded");
    b.find("svg.dag .node.s-succeeded");
    b.shot("job");
    b.dark(true);
    b.shot("job-dark");
    b.dark(false);

    // A fan-out: the instances of `load` grouped under it, with their
    // items; `report` got their outputs as a list.
    b.goto(&format!("{url}/jobs/demo/partitions"));
    b.click("#trigger");
    wait_for(10, "the run's page", || {
        b.url().contains("/runs/").then_some(())
    });
    let state = b.text_until(60, "#run-state", |s| {
        s == "succeeded" || s == "failed" || s == "cancelled"
    });
    assert_eq!(state, "succeeded");
    let group = b.text("#instances-load summary");
    assert_eq!(group, "4 instances: 4 succeeded");
    let instances = b.text("#instances-load");
    for item in ["load[0]", "\"eu-west\"", "load[3]", "\"ap-south\""] {
        assert!(instances.contains(item), "{item} in {instances}");
    }
    assert!(
        b.text("#tasks ~ table")
            .contains(r#"rows = ["7","107","207","307"]"#),
        "the gathered outputs are shown"
    );
    b.shot("run-fan-out");

    // A log followed live: its lines come while the page stays.
    b.goto(&format!("{url}/jobs/demo/slow-log"));
    b.click("#trigger");
    b.text_until(20, "#log", |t| t.contains("Following the output live"));
    b.text_until(20, "pre.log", |t| t.contains("line 2"));
    let full = b.text_until(30, "#log", |t| {
        t.contains("line 8") && t.contains("has ended")
    });
    assert!(full.contains("line 1"), "{full}");
    // Once ended, each line has its time and stream; a search finds lines.
    b.goto(&b.url());
    b.find("#log-lines .stream.out");
    b.type_into("#grep", "LINE 3");
    b.click("form[role=search] button[type=submit]");
    let found = b.text_until(10, "#found", |t| t.starts_with("1 line"));
    assert!(found.contains("LINE 3"), "{found}");
    assert!(b.text("#log pre").contains("line 3"));
    b.find("#download");

    // A task held for an operator, retried from its run's page: a third
    // attempt, held again.
    // Refused while a run of its own schedule holds (it forbids overlaps):
    // that run serves then.
    let (status, body) = server.post(
        "/api/v1/namespaces/demo/jobs/settle-payments/trigger",
        "{}",
        "application/json",
    );
    assert!(status == 201 || status == 409, "{status} {body}");
    let held = wait_for(60, "a settle task held", || {
        server.get("/api/v1/namespaces/demo/held")["items"]
            .as_array()?
            .first()?["run"]
            .as_i64()
    });
    wait_for(30, "the settle task held, with its actions", || {
        b.goto(&format!("{url}/runs/{held}"));
        (!b.find_all("#task-settle button[data-action=retry]")
            .is_empty())
        .then_some(())
    });
    b.shot("run-held");
    b.click("#task-settle button[data-action=retry]");
    b.text_until(30, "#tasks ~ table", |t| t.contains("3: failed"));
    b.find("#task-settle button[data-action=retry]");

    // The overview names what needs an operator and what failed.
    let (status, failing) = server.post(
        "/api/v1/namespaces/demo/jobs/export-ledger/trigger",
        "{}",
        "application/json",
    );
    assert_eq!(status, 201, "{failing}");
    let failing = failing["id"].as_i64().unwrap();
    wait_for(
        30,
        "the failed run and the held task on the overview",
        || {
            b.goto(&format!("{url}/"));
            let text = b.text("#ns-demo");
            (text.contains("settle held")
                && !b
                    .find_all(&format!("#ns-demo a[href='/runs/{failing}']"))
                    .is_empty())
            .then_some(())
        },
    );
    b.find("#ns-demo table.calendar");
    b.shot("overview");

    // The runs browser, filtered by the form: failed runs only.
    b.goto(&format!("{url}/runs"));
    b.click("select[name=state] option[value=failed]");
    b.click("form.filters button[type=submit]");
    wait_for(10, "the filtered address", || {
        b.url().contains("state=failed").then_some(())
    });
    b.find(&format!("#runs-table a[href='/runs/{failing}']"));
    let badges = b.find_all("#runs-table .badge");
    assert!(!badges.is_empty());
    for e in badges {
        let t = b.call(reqwest::Method::GET, &format!("/element/{e}/text"), None);
        assert_eq!(t.as_str(), Some("failed"));
    }
    b.shot("runs");

    // Preferences: a dark theme and a time zone, remembered by the browser.
    b.goto(&format!("{url}/preferences"));
    b.click("input[name=theme][value=dark]");
    b.click("select[name=zone] option[value='Asia/Tokyo']");
    b.click("#save");
    b.find("#saved");
    b.find("html[data-theme=dark]");
    assert!(b.text("header.top").contains("Asia/Tokyo"));
    b.goto(&format!("{url}/runs"));
    b.find("html[data-theme=dark]");
    b.goto(&format!("{url}/preferences"));
    b.click("input[name=theme][value='']");
    b.click("select[name=zone] option[value='']");
    b.click("#save");
    b.find("#saved");
    assert!(b.find_all("html[data-theme]").is_empty());

    // The playground draws an error under the expression as it is typed.
    b.goto(&format!("{url}/playground"));
    b.text_until(10, "#explanation", |t| t.contains("09:30"));
    b.type_into("#expr", "0 61 * * *");
    let drawn = b.text_until(10, "#expr-error", |t| t.contains("^^"));
    assert!(drawn.contains("0 61 * * *"), "{drawn}");
    assert!(
        b.url().contains("expr=0%2061"),
        "the address shares it: {}",
        b.url()
    );
    b.shot("playground");
    b.type_into("#expr", "0 30 2 * * *");
    b.text_until(10, "#explanation", |t| t.contains("02:30"));

    b.goto(&format!("{url}/cluster"));
    b.find("main h1");
    b.shot("cluster");
    b.goto(&format!("{url}/audit"));
    b.find("main table");
    assert!(b.text("main").contains("trigger of job demo/"));
    b.shot("audit");

    // A viewer: the same pages, no action.
    let (status, created) = server.post(
        "/api/v1/tokens",
        r#"{"name": "a viewer", "role": "viewer"}"#,
        "application/json",
    );
    assert_eq!(status, 201, "{created}");
    b.click("header form button");
    b.find("#token");
    sign_in(&b, &url, created["token"].as_str().unwrap());
    b.goto(&format!("{url}/jobs/demo/flaky-pipeline"));
    b.find("svg.dag");
    assert!(
        b.find_all("main form[method=post]").is_empty(),
        "no action offered"
    );
    assert!(b.find_all("#trigger, #pause, #resume").is_empty());
    let run = b.find_all(".grid thead a");
    assert!(!run.is_empty());
    b.click(".grid thead a");
    b.find("svg.gantt");
    assert!(
        b.find_all("main form[method=post]").is_empty(),
        "no cancel, no re-run"
    );
    assert!(
        b.find_all("a[href='/audit']").is_empty(),
        "no audit log for a viewer"
    );
}
