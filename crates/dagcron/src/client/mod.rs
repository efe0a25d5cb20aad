//! Commands that talk to a running server over its REST API, one file per
//! group of commands. Every answer is read into the API's own wire types
//! (`dagcron_api::wire`), and printed by [`output`]: the JSON with
//! `--json`, text otherwise.

mod admin;
mod audit;
mod cluster;
mod jobs;
mod notifications;
mod output;
mod runs;
mod schedules;
mod secrets;
mod tokens;
mod versions;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use dagcron_api::wire::ErrorBody;
use serde::Serialize;
use serde::de::DeserializeOwned;

use output::Output;

#[derive(Args, Clone)]
pub(crate) struct Conn {
    /// The server's URL.
    #[arg(
        long,
        global = true,
        env = "DAGCRON_SERVER",
        default_value = "http://127.0.0.1:7700",
        value_parser = server_url
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

/// The server's URL as given, `http://` put in front of an address given
/// without a scheme (`127.0.0.1:7700`), or why it is not one.
fn server_url(given: &str) -> Result<String, String> {
    let given = given.trim();
    let url = if given.contains("://") {
        given.to_string()
    } else {
        format!("http://{given}")
    };
    match reqwest::Url::parse(&url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
            Ok(url.trim_end_matches('/').to_string())
        }
        Ok(u) => Err(format!(
            "{given:?} is not a server's address: expected http:// or https:// and a host (like http://127.0.0.1:7700), not {}://",
            u.scheme()
        )),
        Err(e) => Err(format!(
            "{given:?} is not a server's address ({e}): expected one like http://127.0.0.1:7700"
        )),
    }
}

/// The token to send: the one given, or for a server on this machine
/// (loopback), the instance-admin token its first start wrote; and where
/// it came from, or where it was looked for, for a refusal to say.
fn token_for(conn: &Conn) -> (Option<String>, String) {
    if let Some(t) = &conn.token {
        return (
            Some(t.trim().to_string()),
            "the token sent is the one given by --token or DAGCRON_TOKEN".into(),
        );
    }
    let local = reqwest::Url::parse(&conn.server)
        .ok()
        .and_then(|url| match url.host()? {
            url::Host::Ipv4(ip) => Some(ip.is_loopback()),
            url::Host::Ipv6(ip) => Some(ip.is_loopback()),
            url::Host::Domain(name) => Some(name == "localhost"),
        })
        .unwrap_or(false);
    if !local {
        return (
            None,
            "no token was sent: give one with --token or DAGCRON_TOKEN (an admin.token file is read only for a server on this machine)".into(),
        );
    }
    let dir = std::env::var_os("DAGCRON_DATA_DIR")
        .map_or_else(|| PathBuf::from("./dagcron-data"), PathBuf::from);
    let file = dir.join("admin.token");
    match std::fs::read_to_string(&file) {
        Ok(text) => (
            Some(text.trim().to_string()),
            format!(
                "the token sent was read from {} (not this server's? set DAGCRON_DATA_DIR to its data directory, or give --token)",
                file.display()
            ),
        ),
        Err(e) => (
            None,
            format!(
                "no token was sent: none given by --token or DAGCRON_TOKEN, and {} could not be read ({e}); set DAGCRON_DATA_DIR to the server's data directory",
                file.display()
            ),
        ),
    }
}

#[derive(Subcommand)]
pub(crate) enum ClientCommand {
    /// Create or update the jobs of a file (YAML or JSON); applying twice changes nothing.
    Apply {
        /// The job file (`-`: standard input).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Jobs: list, show, pause, resume, trigger, delete; versions, diff, rollback.
    #[command(subcommand)]
    Jobs(jobs::JobsCommand),
    /// Runs: list, show, cancel, rerun; held tasks and what an operator does with them.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
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
    /// Schedules across jobs: the hot-spot report of seconds at which many fire together.
    #[command(subcommand)]
    Schedules(schedules::SchedulesCommand),
    /// The cluster: its nodes, their leases, epochs, clock skew and jobs.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Remote worker agents connected to the server.
    #[command(subcommand)]
    Workers(cluster::WorkersCommand),
    /// API tokens: create, list, revoke; bootstrap a cluster's first one.
    #[command(subcommand)]
    Tokens(tokens::TokensCommand),
    /// Secrets of a namespace: set (the value from standard input), list, delete.
    #[command(subcommand)]
    Secrets(secrets::SecretsCommand),
    /// Notifications of a namespace: where each went, its attempts, and
    /// those given up.
    #[command(subcommand)]
    Notifications(notifications::NotificationsCommand),
    /// The instance: read-only mode, namespaces' quotas, execution policies
    /// and retention, and pruning.
    #[command(subcommand)]
    Admin(admin::AdminCommand),
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

pub(crate) async fn run(cmd: ClientCommand, conn: Conn) -> Result<ExitCode> {
    let mut out = Output::stdout(conn.json);
    let c = Client::new(&conn);
    match cmd {
        ClientCommand::Apply { file } => jobs::apply(&c, &file, &mut out).await?,
        ClientCommand::Jobs(cmd) => jobs::run(&c, cmd, &mut out).await?,
        ClientCommand::Backfill { job, from, to } => {
            jobs::backfill(&c, &job, &from, &to, &mut out).await?
        }
        ClientCommand::Runs(cmd) => runs::run(&c, cmd, &mut out).await?,
        ClientCommand::Logs {
            run,
            task,
            attempt,
            follow,
        } => runs::logs(&c, run, &task, attempt, follow, &mut out).await?,
        ClientCommand::Schedules(cmd) => schedules::run(&c, cmd, &mut out).await?,
        ClientCommand::Workers(cmd) => cluster::workers(&c, cmd, &mut out).await?,
        ClientCommand::Cluster(cmd) => cluster::cluster(&c, cmd, &mut out).await?,
        ClientCommand::Tokens(cmd) => tokens::run(&c, cmd, &mut out).await?,
        ClientCommand::Secrets(cmd) => secrets::run(&c, cmd, &mut out).await?,
        ClientCommand::Notifications(cmd) => notifications::run(&c, cmd, &mut out).await?,
        ClientCommand::Admin(cmd) => admin::run(&c, cmd, &mut out).await?,
        ClientCommand::Audit { namespace, verify } => {
            return audit::run(&c, namespace, verify, &mut out).await;
        }
    }
    Ok(ExitCode::SUCCESS)
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

/// The body of the calls that take none but are sent `{}`.
#[derive(Serialize)]
struct Empty {}

/// What to print of an error answer: its status and message, then each
/// problem on a line of its own. A message that lists the problems too
/// (for clients that read no details) is cut before them, not to print
/// each problem twice.
fn error_text<'a>(
    status: reqwest::StatusCode,
    message: &str,
    details: impl Iterator<Item = &'a dagcron_api::wire::Problem>,
) -> String {
    let details: Vec<String> = details
        .map(|d| format!("{}: {}", d.path, d.message))
        .collect();
    let summary = details
        .first()
        .and_then(|first| message.find(first.as_str()))
        .map_or(message, |at| {
            message[..at].trim_end_matches([' ', ':', ';'])
        });
    let mut text = format!("{status}: {summary}");
    for d in details {
        text.push_str(&format!("\n  {d}"));
    }
    text
}

/// An error answer of the server: its code and what to print.
#[derive(Debug)]
pub(super) struct ApiFailure {
    pub(super) code: String,
    text: String,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for ApiFailure {}

/// The REST API of one server, with the token to send.
struct Client {
    http: reqwest::Client,
    base: String,
    /// Where the token sent came from (see [`token_for`]).
    token_from: String,
}

impl Client {
    fn new(conn: &Conn) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut headers = reqwest::header::HeaderMap::new();
        let (token, token_from) = token_for(conn);
        if let Some(token) = token {
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
            token_from,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends a request; an error answer becomes an error that says the
    /// status, the server's message and each problem it listed.
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
        let body: Option<ErrorBody> = resp.json().await.ok();
        let message = body
            .as_ref()
            .map_or("no details", |b| b.error.message.as_str());
        let details = body.iter().flat_map(|b| b.error.details.iter().flatten());
        let mut text = error_text(status, message, details);
        if status == reqwest::StatusCode::UNAUTHORIZED {
            text.push_str(&format!("\n  {}", self.token_from));
        }
        Err(ApiFailure {
            code: body.map(|b| b.error.code).unwrap_or_default(),
            text,
        }
        .into())
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        Ok(self
            .send(self.http.get(self.url(path)))
            .await?
            .json()
            .await?)
    }

    async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T> {
        let req = self.http.post(self.url(path)).json(body);
        Ok(self.send(req).await?.json().await?)
    }

    /// Every item of a listing paginated by `next_cursor`, all pages,
    /// read 1,000 at a time.
    async fn all_pages<T: DeserializeOwned>(&self, path: &str) -> Result<Vec<T>> {
        #[derive(serde::Deserialize)]
        struct Page<T> {
            items: Vec<T>,
            next_cursor: Option<String>,
        }
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let q = cursor
                .as_ref()
                .map(|c| format!("&cursor={c}"))
                .unwrap_or_default();
            let page: Page<T> = self.get(&format!("{path}?limit=1000{q}")).await?;
            all.extend(page.items);
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(all),
            }
        }
    }

    async fn put<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T> {
        let req = self.http.put(self.url(path)).json(body);
        Ok(self.send(req).await?.json().await?)
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.send(self.http.delete(self.url(path))).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::server_url;

    /// `--server 127.0.0.1:7700` failed with "relative URL without a base".
    #[test]
    fn a_server_given_without_a_scheme_is_reached_over_http() {
        for (given, url) in [
            ("127.0.0.1:7700", "http://127.0.0.1:7700"),
            ("localhost:7700/", "http://localhost:7700"),
            ("https://dagcron.example.com", "https://dagcron.example.com"),
            (" http://[::1]:7700 ", "http://[::1]:7700"),
        ] {
            assert_eq!(server_url(given).as_deref(), Ok(url), "{given}");
        }
    }

    /// `apply` printed each problem of a job file twice.
    #[test]
    fn each_problem_of_an_error_is_printed_once() {
        let problems = [
            dagcron_api::wire::Problem {
                path: "jobs[0].timezone".into(),
                message: "unknown time zone".into(),
                span: None,
            },
            dagcron_api::wire::Problem {
                path: "jobs[0].schedule".into(),
                message: "minute 61 is out of range".into(),
                span: None,
            },
        ];
        let text = super::error_text(
            reqwest::StatusCode::BAD_REQUEST,
            "the job file has 2 problem(s): jobs[0].timezone: unknown time zone; jobs[0].schedule: minute 61 is out of range",
            problems.iter(),
        );
        assert_eq!(
            text,
            "400 Bad Request: the job file has 2 problem(s)\n  jobs[0].timezone: unknown time zone\n  jobs[0].schedule: minute 61 is out of range"
        );
        let text = super::error_text(
            reqwest::StatusCode::NOT_FOUND,
            "no job a/b",
            std::iter::empty(),
        );
        assert_eq!(text, "404 Not Found: no job a/b");
    }

    #[test]
    fn what_is_no_server_address_is_refused_with_an_example() {
        for given in ["ftp://host", "http://", "", "http://exa mple"] {
            let err = server_url(given).unwrap_err();
            assert!(err.contains("http://127.0.0.1:7700"), "{given}: {err}");
        }
    }
}
