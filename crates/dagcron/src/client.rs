//! Commands that talk to a running server over its REST API.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

#[derive(Args, Clone)]
pub(crate) struct Conn {
    /// The server's URL.
    #[arg(
        long,
        global = true,
        env = "DAGCRON_SERVER",
        default_value = "http://127.0.0.1:7700"
    )]
    server: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// The API token to send [default: for a server on this machine, the
    /// admin.token file in $DAGCRON_DATA_DIR or ./dagcron-data].
    #[arg(long, global = true, env = "DAGCRON_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The certificate (PEM) of the authority that signed an https://
    /// server's certificate, when it is not publicly trusted.
    #[arg(long, global = true, env = "DAGCRON_CA")]
    ca: Option<PathBuf>,
}

/// The token to send: the one given, or for a server on this machine
/// (loopback), the instance-admin token its first start wrote.
fn token_for(conn: &Conn) -> Option<String> {
    if let Some(t) = &conn.token {
        return Some(t.trim().to_string());
    }
    let url = reqwest::Url::parse(&conn.server).ok()?;
    let local = match url.host()? {
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
        url::Host::Domain(name) => name == "localhost",
    };
    if !local {
        return None;
    }
    let dir = std::env::var_os("DAGCRON_DATA_DIR")
        .map_or_else(|| PathBuf::from("./dagcron-data"), PathBuf::from);
    let text = std::fs::read_to_string(dir.join("admin.token")).ok()?;
    Some(text.trim().to_string())
}

#[derive(Subcommand)]
pub(crate) enum ClientCommand {
    /// Create or update the jobs of a file (YAML or JSON); applying twice changes nothing.
    Apply {
        /// The job file.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Jobs: list, show, pause, resume, trigger, delete.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Runs: list, show, cancel.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Print the output of one attempt of a task (the latest attempt by default).
    Logs {
        /// Run id.
        run: i64,
        /// Task id.
        task: String,
        /// Attempt number (1-based).
        #[arg(long)]
        attempt: Option<u32>,
        /// Keep printing the output of a running attempt until it ends.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// The cluster: its nodes, their leases, epochs, clock skew and jobs.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Remote worker agents connected to the server.
    #[command(subcommand)]
    Workers(WorkersCommand),
    /// API tokens: create, list, revoke; bootstrap a cluster's first one.
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Secrets of a namespace: set (the value from standard input), list, delete.
    #[command(subcommand)]
    Secrets(SecretsCommand),
    /// The audit log: every change and every refused call.
    Audit {
        /// Only this namespace's rows.
        #[arg(long)]
        namespace: Option<String>,
        /// Check the whole log's hash chain instead of printing it: exit 1
        /// if a row was changed or deleted.
        #[arg(long)]
        verify: bool,
    },
    /// Create runs for every fire of a job in a time range.
    Backfill {
        /// NAMESPACE/JOB.
        job: String,
        /// Start (RFC 3339, inclusive).
        #[arg(long)]
        from: String,
        /// End (RFC 3339, exclusive).
        #[arg(long)]
        to: String,
    },
}

#[derive(Subcommand)]
pub(crate) enum SecretsCommand {
    /// Set a secret's value, read from standard input (a final newline is dropped).
    Set {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The names and versions of a namespace's secrets (never their values).
    List {
        /// Namespace.
        namespace: String,
    },
    /// Delete a secret.
    Delete {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The master keys and how many secrets each encrypts.
    Keys,
    /// Rotate the master key: a new key (an embedded server makes it), every
    /// secret re-encrypted under it in the background, the old key kept
    /// until no secret uses it.
    RotateKey,
}

#[derive(Subcommand)]
pub(crate) enum TokensCommand {
    /// Create a token and print its secret (shown this once).
    Create {
        /// What it is for.
        #[arg(long)]
        name: String,
        /// viewer, operator, developer or admin (at most your own).
        #[arg(long)]
        role: String,
        /// Limit it to one namespace (default: the whole instance).
        #[arg(long)]
        namespace: Option<String>,
        /// Valid for this long, such as 30d (default: until revoked).
        #[arg(long)]
        expires: Option<String>,
        /// For an agent's join token: the only labels an agent may claim,
        /// `k=v,...` (default: any).
        #[arg(long, value_delimiter = ',', value_parser = parse_kv)]
        labels: Vec<(String, String)>,
    },
    /// The tokens you administer (never their secrets).
    List,
    /// Revoke a token: it is refused from then on.
    Revoke {
        /// Its id (tok_...).
        id: String,
    },
    /// Create a cluster's server key file (if missing) and its first
    /// instance-admin token, directly in the database; prints the token.
    Bootstrap {
        /// The cluster's PostgreSQL URL.
        #[arg(long, env = "DAGCRON_DATABASE_URL")]
        database: String,
        /// The server key file every node is started with (--key-file).
        #[arg(long, env = "DAGCRON_KEY_FILE")]
        key_file: PathBuf,
    },
}

#[derive(Subcommand)]
pub(crate) enum WorkersCommand {
    /// Every agent: labels, capacity, running attempts, last heartbeat, clock offset, version.
    List,
}

#[derive(Subcommand)]
pub(crate) enum ClusterCommand {
    /// Every node, and this server's view of itself.
    Status,
}

#[derive(Subcommand)]
pub(crate) enum JobsCommand {
    /// The jobs of a namespace.
    List {
        /// Namespace.
        #[arg(default_value = "default")]
        namespace: String,
    },
    /// One job, with its next fire.
    Show { job: String },
    /// Stop firing (fires due while paused follow the misfire policy on resume).
    Pause { job: String },
    /// Fire again.
    Resume { job: String },
    /// Start a run now.
    Trigger {
        job: String,
        /// Parameters, `key=value`, overriding the job's defaults.
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
    },
    /// Delete a job (its history stays).
    Delete { job: String },
}

#[derive(Subcommand)]
pub(crate) enum RunsCommand {
    /// Runs of a job, newest first.
    List {
        job: String,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// One run with its tasks and attempts.
    Show { run: i64 },
    /// Cancel a run.
    Cancel { run: i64 },
}

pub(crate) fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}

/// `ns/name`, or `name` in namespace `default`.
fn job_path(job: &str) -> Result<String> {
    let (ns, name) = job.split_once('/').unwrap_or(("default", job));
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        bail!("expected NAMESPACE/JOB or JOB, got {job:?}");
    }
    Ok(format!("/api/v1/namespaces/{ns}/jobs/{name}"))
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    fn new(conn: &Conn) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token_for(conn) {
            if let Ok(mut value) =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            {
                value.set_sensitive(true);
                headers.insert(reqwest::header::AUTHORIZATION, value);
            }
        }
        let mut builder = reqwest::Client::builder().default_headers(headers);
        if let Some(ca) = conn
            .ca
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|pem| reqwest::Certificate::from_pem(&pem).ok())
        {
            builder = builder.add_root_certificate(ca);
        }
        Client {
            http: builder.build().unwrap_or_default(),
            base: conn.server.trim_end_matches('/').to_string(),
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let resp = req.send().await.with_context(|| {
            format!(
                "cannot reach the dagcron server at {} (set --server or DAGCRON_SERVER)",
                self.base
            )
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("no details")
            .to_string();
        let mut text = format!("{status}: {message}");
        if let Some(details) = body["error"]["details"].as_array() {
            for d in details {
                text.push_str(&format!(
                    "\n  {}: {}",
                    d["path"].as_str().unwrap_or("?"),
                    d["message"].as_str().unwrap_or("?")
                ));
            }
        }
        bail!(text)
    }

    async fn get(&self, path: &str) -> Result<Value> {
        Ok(self
            .send(self.http.get(format!("{}{path}", self.base)))
            .await?
            .json()
            .await?)
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value> {
        Ok(self
            .send(self.http.post(format!("{}{path}", self.base)).json(&body))
            .await?
            .json()
            .await?)
    }
}

fn print_json(out: &mut impl Write, v: &Value) -> Result<()> {
    writeln!(out, "{}", serde_json::to_string_pretty(v)?)?;
    Ok(())
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn print_run(out: &mut impl Write, run: &Value) -> Result<()> {
    writeln!(
        out,
        "run {}  {}/{}  {}  trigger={}  scheduled={}",
        s(&run["id"]),
        s(&run["namespace"]),
        s(&run["job"]),
        s(&run["state"]),
        s(&run["trigger"]),
        s(&run["scheduled_at"])
    )?;
    for t in run["tasks"].as_array().into_iter().flatten() {
        writeln!(out, "  {:<20} {}", s(&t["id"]), s(&t["state"]))?;
        for a in t["attempts"].as_array().into_iter().flatten() {
            writeln!(
                out,
                "    attempt {} {:<10} exit={} {} {}",
                s(&a["number"]),
                s(&a["state"]),
                s(&a["exit_code"]),
                s(&a["started_at"]),
                a["error"].as_str().unwrap_or("")
            )?;
        }
    }
    Ok(())
}

fn print_cluster(out: &mut impl Write, v: &Value) -> Result<()> {
    let me = &v["this_node"];
    writeln!(
        out,
        "this node: {} (epoch {}), {} jobs owned, ring of {}, clock {} ms off the database's{}",
        s(&me["node_id"]),
        s(&me["epoch"]),
        s(&me["owned_jobs"]),
        s(&me["ring_size"]),
        me["clock_skew_us"].as_i64().unwrap_or(0) as f64 / 1000.0,
        if me["clock_ok"] == true {
            ""
        } else {
            " (TOO FAR: owning no jobs)"
        }
    )?;
    writeln!(
        out,
        "{:<20} {:>6} {:<9} {:<6} {:>6} {:>10} {:<27} ADDRESS",
        "NODE", "EPOCH", "STATE", "LEASE", "JOBS", "SKEW_MS", "LEASE_UNTIL"
    )?;
    for n in v["nodes"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "{:<20} {:>6} {:<9} {:<6} {:>6} {:>10.1} {:<27} {}",
            s(&n["id"]),
            s(&n["epoch"]),
            s(&n["state"]),
            if n["lease_valid"] == true {
                "valid"
            } else {
                "ended"
            },
            s(&n["owned_jobs"]),
            n["clock_skew_us"].as_i64().unwrap_or(0) as f64 / 1000.0,
            s(&n["lease_until"]),
            s(&n["address"]),
        )?;
    }
    Ok(())
}

pub(crate) async fn run(cmd: ClientCommand, conn: Conn) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match cmd {
        ClientCommand::Apply { file } => {
            let c = Client::new(&conn);
            let (_, text) = crate::dag_cmd::read_file(&file)?;
            let content_type = if file.extension().is_some_and(|e| e == "json") {
                "application/json"
            } else {
                "application/yaml"
            };
            let resp: Value = c
                .send(
                    c.http
                        .post(format!("{}/api/v1/apply", c.base))
                        .header("content-type", content_type)
                        .body(text),
                )
                .await?
                .json()
                .await?;
            if conn.json {
                print_json(&mut out, &resp)?;
            } else {
                for j in resp["jobs"].as_array().into_iter().flatten() {
                    writeln!(
                        out,
                        "{:<40} {} (version {})",
                        s(&j["job"]),
                        s(&j["result"]["result"]),
                        s(&j["result"]["version"])
                    )?;
                }
            }
        }
        ClientCommand::Jobs(cmd) => match cmd {
            JobsCommand::List { namespace } => {
                let c = Client::new(&conn);
                let mut cursor: Option<String> = None;
                let mut all = Vec::new();
                loop {
                    let q = cursor
                        .as_ref()
                        .map(|c| format!("&cursor={c}"))
                        .unwrap_or_default();
                    let page = c
                        .get(&format!(
                            "/api/v1/namespaces/{namespace}/jobs?limit=1000{q}"
                        ))
                        .await?;
                    all.extend(page["items"].as_array().cloned().unwrap_or_default());
                    match page["next_cursor"].as_str() {
                        Some(next) => cursor = Some(next.to_string()),
                        None => break,
                    }
                }
                if conn.json {
                    print_json(&mut out, &Value::Array(all))?;
                } else {
                    writeln!(
                        out,
                        "{:<30} {:>7} {:<7} {:<30} next fire",
                        "job", "version", "paused", "schedule"
                    )?;
                    for j in &all {
                        writeln!(
                            out,
                            "{:<30} {:>7} {:<7} {:<30} {}",
                            s(&j["name"]),
                            s(&j["version"]),
                            s(&j["paused"]),
                            s(&j["spec"]["schedule"]),
                            s(&j["next_fire"])
                        )?;
                    }
                }
            }
            JobsCommand::Show { job } => {
                print_json(&mut out, &Client::new(&conn).get(&job_path(&job)?).await?)?
            }
            JobsCommand::Pause { job } => {
                let v = Client::new(&conn)
                    .post(&format!("{}/pause", job_path(&job)?), json!({}))
                    .await?;
                writeln!(out, "{}/{} paused", s(&v["namespace"]), s(&v["name"]))?;
            }
            JobsCommand::Resume { job } => {
                let v = Client::new(&conn)
                    .post(&format!("{}/resume", job_path(&job)?), json!({}))
                    .await?;
                writeln!(
                    out,
                    "{}/{} resumed; next fire {}",
                    s(&v["namespace"]),
                    s(&v["name"]),
                    s(&v["next_fire"])
                )?;
            }
            JobsCommand::Trigger { job, params } => {
                let params: serde_json::Map<String, Value> = params
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                let run = Client::new(&conn)
                    .post(
                        &format!("{}/trigger", job_path(&job)?),
                        json!({ "params": params }),
                    )
                    .await?;
                if conn.json {
                    print_json(&mut out, &run)?
                } else {
                    print_run(&mut out, &run)?
                }
            }
            JobsCommand::Delete { job } => {
                let c = Client::new(&conn);
                c.send(c.http.delete(format!("{}{}", c.base, job_path(&job)?)))
                    .await?;
                writeln!(out, "deleted {job}")?;
            }
        },
        ClientCommand::Runs(cmd) => match cmd {
            RunsCommand::List { job, limit } => {
                let page = Client::new(&conn)
                    .get(&format!("{}/runs?limit={limit}", job_path(&job)?))
                    .await?;
                if conn.json {
                    print_json(&mut out, &page)?;
                } else {
                    writeln!(
                        out,
                        "{:<18} {:<10} {:<9} {:<22} finished",
                        "run", "state", "trigger", "scheduled"
                    )?;
                    for r in page["items"].as_array().into_iter().flatten() {
                        writeln!(
                            out,
                            "{:<18} {:<10} {:<9} {:<22} {}",
                            s(&r["id"]),
                            s(&r["state"]),
                            s(&r["trigger"]),
                            s(&r["scheduled_at"]),
                            s(&r["finished_at"])
                        )?;
                    }
                }
            }
            RunsCommand::Show { run } => {
                let v = Client::new(&conn)
                    .get(&format!("/api/v1/runs/{run}"))
                    .await?;
                if conn.json {
                    print_json(&mut out, &v)?
                } else {
                    print_run(&mut out, &v)?
                }
            }
            RunsCommand::Cancel { run } => {
                let v = Client::new(&conn)
                    .post(&format!("/api/v1/runs/{run}/cancel"), json!({}))
                    .await?;
                writeln!(out, "run {} cancelling: {}", s(&v["id"]), s(&v["state"]))?;
            }
        },
        ClientCommand::Logs {
            run,
            task,
            attempt,
            follow,
        } => {
            let c = Client::new(&conn);
            let n = match attempt {
                Some(n) => n,
                None => {
                    let r = c.get(&format!("/api/v1/runs/{run}")).await?;
                    let t = r["tasks"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|t| t["id"] == task.as_str())
                        .with_context(|| format!("run {run} has no task {task}"))?;
                    t["attempts"].as_array().map_or(0, |a| a.len()) as u32
                }
            };
            if n == 0 {
                bail!("task {task} of run {run} has no attempt yet");
            }
            let mut resp = c
                .send(c.http.get(format!(
                    "{}/api/v1/runs/{run}/tasks/{task}/attempts/{n}/log{}",
                    c.base,
                    if follow { "?follow=true" } else { "" }
                )))
                .await?;
            while let Some(chunk) = resp.chunk().await? {
                out.write_all(&chunk)?;
                out.flush()?;
            }
        }
        ClientCommand::Workers(WorkersCommand::List) => {
            let v = Client::new(&conn).get("/api/v1/workers").await?;
            if conn.json {
                print_json(&mut out, &v)?;
            } else {
                writeln!(
                    out,
                    "{:<20} {:>8} {:<8} {:<27} {:>10} {:<8} LABELS",
                    "AGENT", "RUNNING", "STATE", "LAST_HEARTBEAT", "OFFSET_MS", "VERSION"
                )?;
                for w in v["items"].as_array().into_iter().flatten() {
                    let labels: Vec<String> = w["labels"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| format!("{k}={}", s(v)))
                        .collect();
                    let state = if w["connected"] != true {
                        "gone"
                    } else if w["draining"] == true {
                        "draining"
                    } else {
                        "ready"
                    };
                    writeln!(
                        out,
                        "{:<20} {:>8} {:<8} {:<27} {:>10.3} {:<8} {}",
                        s(&w["id"]),
                        format!("{}/{}", s(&w["running"]), s(&w["capacity"])),
                        state,
                        s(&w["last_heartbeat"]),
                        w["clock_offset_us"].as_i64().unwrap_or(0) as f64 / 1000.0,
                        s(&w["version"]),
                        labels.join(",")
                    )?;
                }
            }
        }
        ClientCommand::Cluster(ClusterCommand::Status) => {
            let v = Client::new(&conn).get("/api/v1/cluster").await?;
            if conn.json {
                print_json(&mut out, &v)?;
            } else {
                print_cluster(&mut out, &v)?;
            }
        }
        ClientCommand::Tokens(cmd) => tokens(cmd, &conn, &mut out).await?,
        ClientCommand::Secrets(cmd) => secrets(cmd, &conn, &mut out).await?,
        ClientCommand::Audit { namespace, verify } => {
            return audit(namespace, verify, &conn, &mut out).await;
        }
        ClientCommand::Backfill { job, from, to } => {
            let v = Client::new(&conn)
                .post(
                    &format!("{}/backfill", job_path(&job)?),
                    json!({ "from": from, "to": to }),
                )
                .await?;
            if conn.json {
                print_json(&mut out, &v)?;
            } else {
                writeln!(
                    out,
                    "created {} run(s)",
                    v["runs"].as_array().map_or(0, Vec::len)
                )?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn tokens(cmd: TokensCommand, conn: &Conn, out: &mut impl Write) -> Result<()> {
    match cmd {
        TokensCommand::Create {
            name,
            role,
            namespace,
            expires,
            labels,
        } => {
            let labels: Option<std::collections::BTreeMap<String, String>> =
                (!labels.is_empty()).then(|| labels.into_iter().collect());
            let v = Client::new(conn)
                .post(
                    "/api/v1/tokens",
                    json!({ "name": name, "role": role, "namespace": namespace, "expires_in": expires, "labels": labels }),
                )
                .await?;
            if conn.json {
                print_json(out, &v)?;
            } else {
                writeln!(out, "{}", s(&v["token"]))?;
                eprintln!(
                    "token {} ({} {}): the secret above is shown only this once",
                    s(&v["details"]["id"]),
                    s(&v["details"]["role"]),
                    v["details"]["namespace"]
                        .as_str()
                        .map_or("over the instance".to_string(), |n| format!(
                            "in namespace {n}"
                        ))
                );
            }
        }
        TokensCommand::List => {
            let v = Client::new(conn).get("/api/v1/tokens").await?;
            if conn.json {
                print_json(out, &v)?;
            } else {
                writeln!(
                    out,
                    "{:<18} {:<10} {:<16} {:<28} {:<28} NAME",
                    "ID", "ROLE", "NAMESPACE", "LAST_USED", "STATE"
                )?;
                for t in v["items"].as_array().into_iter().flatten() {
                    let state = if !t["revoked_at"].is_null() {
                        format!("revoked {}", s(&t["revoked_at"]))
                    } else if !t["expires_at"].is_null() {
                        format!("expires {}", s(&t["expires_at"]))
                    } else {
                        "valid".into()
                    };
                    writeln!(
                        out,
                        "{:<18} {:<10} {:<16} {:<28} {:<28} {}",
                        s(&t["id"]),
                        s(&t["role"]),
                        t["namespace"].as_str().unwrap_or("*"),
                        t["last_used_at"].as_str().unwrap_or("never"),
                        state,
                        s(&t["name"])
                    )?;
                }
            }
        }
        TokensCommand::Revoke { id } => {
            let c = Client::new(conn);
            c.send(c.http.delete(format!("{}/api/v1/tokens/{id}", c.base)))
                .await?;
            writeln!(out, "revoked {id}")?;
        }
        TokensCommand::Bootstrap { database, key_file } => {
            use dagcron_store::Store;
            let (keyring, created) = dagcron_api::auth::Keyring::load_or_create(&key_file)
                .with_context(|| format!("the server key {}", key_file.display()))?;
            if created {
                eprintln!(
                    "created the server key {} (0600): start every node with --key-file pointing at a copy of it",
                    key_file.display()
                );
            }
            let store = dagcron_store_postgres::PgStore::connect(&database, 2)
                .await
                .context("opening the PostgreSQL database")?;
            let (record, secret) = dagcron_api::auth::instance_admin_token(jiff::Timestamp::now());
            store
                .create_token(&record, &keyring.hash(&secret))
                .await
                .context("storing the token")?;
            writeln!(out, "{secret}")?;
            eprintln!(
                "instance-admin token {}: the secret above is shown only this once",
                record.id
            );
        }
    }
    Ok(())
}

/// Prints the audit log, or checks its chain.
async fn audit(
    namespace: Option<String>,
    verify: bool,
    conn: &Conn,
    out: &mut impl Write,
) -> Result<ExitCode> {
    let c = Client::new(conn);
    let mut rows: Vec<dagcron_api::audit::AuditAnswer> = Vec::new();
    let mut after = 0;
    loop {
        let ns = namespace
            .as_ref()
            .map(|n| format!("&namespace={n}"))
            .unwrap_or_default();
        let page: dagcron_api::audit::AuditPage = serde_json::from_value(
            c.get(&format!("/api/v1/audit?limit=1000&after={after}{ns}"))
                .await?,
        )?;
        rows.extend(page.items);
        match page.next {
            Some(next) => after = next,
            None => break,
        }
    }
    if verify {
        anyhow::ensure!(
            namespace.is_none(),
            "the chain runs through every namespace: verify the whole log (an instance admin's token)"
        );
        let entries: Vec<_> = rows.iter().filter_map(|r| r.entry()).collect();
        anyhow::ensure!(
            entries.len() == rows.len(),
            "the server answered a hash that is not hex"
        );
        return Ok(match dagcron_store::verify_audit(&entries) {
            Ok(()) => {
                writeln!(out, "{} rows, chain intact", entries.len())?;
                ExitCode::SUCCESS
            }
            Err((seq, why)) => {
                writeln!(out, "the audit log is broken at row {seq}: {why}")?;
                ExitCode::FAILURE
            }
        });
    }
    if conn.json {
        print_json(out, &serde_json::to_value(&rows)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "{:>6} {:<28} {:<18} {:>3} {:<22} ACTION",
        "SEQ", "AT", "PRINCIPAL", "OUT", "FROM"
    )?;
    for r in &rows {
        writeln!(
            out,
            "{:>6} {:<28} {:<18} {:>3} {:<22} {}",
            r.seq,
            r.at.to_string(),
            r.principal.as_deref().unwrap_or("-"),
            r.outcome,
            r.address.as_deref().unwrap_or("-"),
            r.action
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn secrets(cmd: SecretsCommand, conn: &Conn, out: &mut impl Write) -> Result<()> {
    let c = Client::new(conn);
    match cmd {
        SecretsCommand::Set { namespace, name } => {
            let mut value = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut value)
                .context("reading the value from standard input")?;
            let value = value.strip_suffix('\n').unwrap_or(&value);
            let v: Value = c
                .send(
                    c.http
                        .put(format!(
                            "{}/api/v1/namespaces/{namespace}/secrets/{name}",
                            c.base
                        ))
                        .json(&json!({ "value": value })),
                )
                .await?
                .json()
                .await?;
            writeln!(out, "{namespace}/{name} version {}", s(&v["version"]))?;
        }
        SecretsCommand::List { namespace } => {
            let v = c
                .get(&format!("/api/v1/namespaces/{namespace}/secrets"))
                .await?;
            if conn.json {
                print_json(out, &v)?;
            } else {
                writeln!(out, "{:<32} {:>7} {:<10} UPDATED", "NAME", "VERSION", "KEY")?;
                for s_ in v["items"].as_array().into_iter().flatten() {
                    writeln!(
                        out,
                        "{:<32} {:>7} {:<10} {}",
                        s(&s_["name"]),
                        s(&s_["version"]),
                        s(&s_["key_id"]),
                        s(&s_["updated_at"])
                    )?;
                }
            }
        }
        SecretsCommand::Keys => {
            let v = c.get("/api/v1/secrets/keys").await?;
            if conn.json {
                print_json(out, &v)?;
            } else {
                for k in v["keys"].as_array().into_iter().flatten() {
                    let current = if k["key_id"] == v["current"] {
                        " (current)"
                    } else {
                        ""
                    };
                    writeln!(
                        out,
                        "{} {} secrets{current}",
                        s(&k["key_id"]),
                        s(&k["secrets"])
                    )?;
                }
            }
        }
        SecretsCommand::RotateKey => {
            let v = c.post("/api/v1/secrets/rotate-key", json!({})).await?;
            writeln!(
                out,
                "current key {}; the secrets are being re-encrypted under it (dagcron secrets keys)",
                s(&v["current"])
            )?;
        }
        SecretsCommand::Delete { namespace, name } => {
            c.send(c.http.delete(format!(
                "{}/api/v1/namespaces/{namespace}/secrets/{name}",
                c.base
            )))
            .await?;
            writeln!(out, "deleted {namespace}/{name}")?;
        }
    }
    Ok(())
}
