//! Isolation between tenants, through the real server process: two
//! namespaces, `alpha` and `beta`, each with a developer token of its own;
//! `alpha`'s job author attacks the server and `beta` as issue reports
//! describe, and each attack finds nothing.

mod common;

use std::path::Path;

use common::{Api, Server, log, setup, until};
use serde_json::{Value, json};

/// The shared agent token, in the server's environment.
const AGENT_TOKEN: &str = "shared-agent-token-value-0123456789";
/// `beta`'s database password, a secret of its namespace.
const BETA_PASSWORD: &str = "beta-db-password-9876543210";

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A developer token of `namespace`, as the instance admin makes it.
fn developer(server: &Server, namespace: &str) -> Api {
    let (status, made) = server.post(
        "/api/v1/tokens",
        &json!({ "name": format!("dev-{namespace}"), "role": "developer", "namespace": namespace })
            .to_string(),
        "application/json",
    );
    assert_eq!(status, 201, "{made}");
    Api {
        url: server.url.clone(),
        namespace: namespace.into(),
        log: server.log.clone(),
        token: Some(made["token"].as_str().unwrap().to_string()),
        ca: None,
    }
}

fn apply(api: &Api, yaml: &str) -> (u16, Value) {
    api.post("/api/v1/apply", yaml, "application/yaml")
}

/// Waits for run `id` to end, whatever its end; returns it.
fn ended(api: &Api, id: i64) -> Value {
    let mut run = Value::Null;
    until("the run ends", || {
        run = api.get(&format!("/api/v1/runs/{id}"));
        matches!(
            run["state"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        )
    });
    run
}

fn reversed(s: &str) -> String {
    s.chars().rev().collect()
}

#[test]
fn an_alpha_developers_shell_task_reads_nothing_of_the_server_or_of_beta() {
    let (dir, data) = setup();
    // Tasks run as `nobody` under a root server: the place they write to
    // must be theirs to write.
    chmod(dir.path(), 0o755);
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o777);
    let ready = shared.join("beta-ready");
    let server = Server::start_env(&data, &[], &[("DAGCRON_AGENT_TOKEN", AGENT_TOKEN)]);
    let alpha = developer(&server, "alpha");
    let beta = developer(&server, "beta");

    // beta's task runs with its password in its environment.
    let (status, body) = beta.put(
        "/api/v1/namespaces/beta/secrets/db-password",
        &json!({ "value": BETA_PASSWORD }),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = apply(
        &beta,
        &format!(
            "namespace: beta\njobs:\n  - name: db\n    tasks:\n      - id: t\n        shell:\n          command: 'touch {}; sleep 30'\n          env: {{ PGPASSWORD: {{ secret: db-password }} }}\n",
            ready.display()
        ),
    );
    assert_eq!(status, 200, "{body}");
    let beta_run = beta.trigger("db");
    until("beta's task runs", || ready.exists());

    // alpha's author tries everything at once.
    let script = format!(
        "cat {d}/admin.token; echo; base64 {d}/master.key; echo; tr '\\0' '\\n' </proc/$PPID/environ; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | rev; ls {d}; echo END",
        d = data.display()
    );
    let (status, body) = apply(
        &alpha,
        &format!(
            "namespace: alpha\njobs:\n  - name: steal\n    tasks:\n      - id: t\n        shell: {}\n",
            serde_json::to_string(&script).unwrap()
        ),
    );
    assert_eq!(status, 200, "{body}");
    let id = alpha.trigger("steal");
    ended(&alpha, id);
    let out = log(&alpha, id, "t", 1);
    assert!(out.contains("END"), "the task ran: {out}");
    let admin = std::fs::read_to_string(data.join("admin.token")).unwrap();
    assert!(!out.contains(admin.trim()), "the admin token: {out}");
    let key = std::fs::read(data.join("master.key")).unwrap();
    let key_b64 = std::process::Command::new("base64")
        .arg(data.join("master.key"))
        .output()
        .unwrap()
        .stdout;
    assert!(!key.is_empty());
    let key_b64 = String::from_utf8(key_b64).unwrap();
    assert!(
        !out.contains(key_b64.lines().next().unwrap()),
        "the master key: {out}"
    );
    assert!(
        !out.contains(AGENT_TOKEN),
        "the server's environment: {out}"
    );
    assert!(
        !out.contains(&reversed(AGENT_TOKEN)),
        "the server's environment: {out}"
    );
    assert!(
        !out.contains(&reversed(BETA_PASSWORD)) && !out.contains(BETA_PASSWORD),
        "beta's running task's environment: {out}"
    );
    assert!(
        !out.contains("server.key"),
        "the data directory's listing: {out}"
    );
    // The server still works with its own files.
    assert_eq!(
        server.get(&format!("/api/v1/runs/{beta_run}"))["namespace"],
        "beta"
    );
}

#[test]
fn an_alpha_http_task_to_a_loopback_listener_is_refused() {
    let (_dir, data) = setup();
    let server = Server::start(&data, &[]);
    let alpha = developer(&server, "alpha");
    // The server's own API on loopback, by address and by name.
    let port = server.url.rsplit(':').next().unwrap().to_string();
    let yaml = format!(
        "namespace: alpha\njobs:\n  - name: ssrf\n    tasks:\n      - {{ id: direct, http: {{ url: 'http://127.0.0.1:{port}/metrics' }} }}\n      - {{ id: named, http: {{ url: 'http://localhost:{port}/metrics' }} }}\n",
    );
    // Known at apply: an address written in the URL.
    let (status, body) = apply(&alpha, &yaml);
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "policy_refused");
    assert_eq!(
        body["error"]["details"][0]["path"],
        "jobs[0].tasks[0].http.url"
    );
    // A name is resolved when the attempt connects.
    let yaml = format!(
        "namespace: alpha\njobs:\n  - name: ssrf\n    tasks:\n      - {{ id: named, http: {{ url: 'http://localhost:{port}/metrics' }} }}\n",
    );
    let (status, body) = apply(&alpha, &yaml);
    assert_eq!(status, 200, "{body}");
    let id = alpha.trigger("ssrf");
    let run = ended(&alpha, id);
    assert_eq!(run["state"], "failed", "{run}");
    let error = run["tasks"][0]["attempts"][0]["error"].as_str().unwrap();
    assert!(error.contains("loopback"), "{error}");
    // An instance admin may open the block for alpha.
    let (status, body) = server.put(
        "/api/v1/namespaces/alpha/policy",
        &json!({ "http_allow": ["127.0.0.1/32", "::1/128"] }),
    );
    assert_eq!(status, 200, "{body}");
    // ...but alpha's developer may not.
    let (status, _) = alpha.put(
        "/api/v1/namespaces/alpha/policy",
        &json!({ "http_allow": ["0.0.0.0/0"] }),
    );
    assert_eq!(status, 403);
    // The engine reads a changed policy within a few seconds.
    until("the new policy applies", || {
        let id = alpha.trigger("ssrf");
        let run = ended(&alpha, id);
        run["tasks"][0]["attempts"][0]["exit_code"] == 401
    });
}

#[test]
fn a_wasm_task_mounting_the_root_or_reading_host_variables_is_refused() {
    let (_dir, data) = setup();
    let server = Server::start(&data, &[]);
    let alpha = developer(&server, "alpha");
    let yaml = "namespace: alpha\njobs:\n  - name: w\n    tasks:\n      - id: t\n        wasm:\n          module: /tmp/dagcron-demo/hello.wat\n          grants: { dirs: [{ host: /, guest: /r }], env: [DAGCRON_AGENT_TOKEN] }\n";
    let (status, body) = apply(&alpha, yaml);
    assert_eq!(status, 403, "{body}");
    let rules: Vec<&str> = body["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["message"].as_str().unwrap())
        .collect();
    assert!(rules[0].contains("wasm_dirs"), "{body}");
    assert!(rules[1].contains("wasm_env"), "{body}");
    // A policy that allows every directory still never shows the server's
    // own files.
    let (status, body) = server.put(
        "/api/v1/namespaces/alpha/policy",
        &json!({ "wasm_dirs": ["/"] }),
    );
    assert_eq!(status, 200, "{body}");
    let yaml = "namespace: alpha\njobs:\n  - name: w\n    tasks:\n      - id: t\n        wasm:\n          module: /tmp/dagcron-demo/hello.wat\n          grants: { dirs: [{ host: /, guest: /r }] }\n";
    let (status, body) = apply(&alpha, yaml);
    assert_eq!(status, 200, "the policy allows it: {body}");
    let id = alpha.trigger("w");
    let run = ended(&alpha, id);
    assert_eq!(run["state"], "failed", "{run}");
    let error = run["tasks"][0]["attempts"][0]["error"].as_str().unwrap();
    assert!(error.contains("server's own files"), "{error}");
}
