//! HTTP tasks: one request, success by status, the body as the log.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dagcron_core::exec_policy::ExecPolicy;

use dagcron_core::Failure;
use dagcron_core::hook::Path;
use dagcron_core::model::HttpSpec;
use dagcron_core::outputs::Outputs;
use tokio_util::sync::CancellationToken;

use crate::{AttemptContext, CappedLog, Ending, Limits, Outcome};

pub(crate) fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        // TLS uses rustls with the ring provider (no C toolchain needed).
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder().build().expect("HTTP client")
    })
}

/// The server's own addresses: never a destination of a tenant's http
/// task unless its policy allows them (see [`own_addresses`]).
static OWN: OnceLock<Vec<IpAddr>> = OnceLock::new();

/// Tells the http executor the addresses this server listens on, which
/// tasks under a policy may not reach unless it allows them. Only the
/// first call counts.
pub fn own_addresses(addresses: Vec<IpAddr>) {
    let _ = OWN.set(addresses);
}

pub(crate) fn own() -> &'static [IpAddr] {
    OWN.get().map(Vec::as_slice).unwrap_or_default()
}

/// A client for the tasks of `policy`: every address a name resolves to,
/// and every redirect, is checked against the policy's destinations when
/// the connection is made; a name that resolves only to refused addresses
/// fails. No proxy is used (a proxy would make the checks meaningless).
/// One client per set of allowed blocks, kept.
pub(crate) fn guarded(policy: &Arc<ExecPolicy>) -> reqwest::Client {
    static CLIENTS: Mutex<Vec<(Vec<String>, reqwest::Client)>> = Mutex::new(Vec::new());
    let mut clients = CLIENTS.lock().expect("http clients lock");
    if let Some((_, c)) = clients.iter().find(|(k, _)| *k == policy.http_allow) {
        return c.clone();
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let checked = policy.clone();
    let client = reqwest::Client::builder()
        .no_proxy()
        .dns_resolver(Guard(policy.clone()))
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= 10 {
                return attempt.error("more than 10 redirects");
            }
            match refused(&checked, attempt.url()) {
                Some(why) => {
                    let error = format!("a redirect to {}: {why}", attempt.url());
                    attempt.error(error)
                }
                None => attempt.follow(),
            }
        }))
        .build()
        .expect("HTTP client");
    // Policies are few; a long list means they keep changing: start over.
    if clients.len() >= 64 {
        clients.clear();
    }
    clients.push((policy.http_allow.clone(), client.clone()));
    client
}

/// Why `policy` refuses `url` if its host is an address (a name is checked
/// when it is resolved).
pub(crate) fn refused(policy: &ExecPolicy, url: &reqwest::Url) -> Option<String> {
    let host = url.host_str()?;
    let ip: IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    policy.destination(ip, own()).err()
}

/// Resolves names for a guarded client, keeping only the addresses the
/// policy allows.
struct Guard(Arc<ExecPolicy>);

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut why = format!("{host} resolves to no address");
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match policy.destination(a.ip(), own()) {
                    Ok(()) => true,
                    Err(e) => {
                        why = format!("{host} resolves to {e}");
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                return Err(why.into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// An error with its causes, which say what actually went wrong.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// `RUN_ID` -> `Run-Id`; parameter names may hold anything, so empty
/// segments are dropped rather than assumed away.
fn header_name(identity: &str) -> String {
    identity
        .split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let (first, rest) = w.split_at(1);
            first.to_string() + &rest.to_ascii_lowercase()
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// The outputs the task declares, read from its answer `body`: a path
/// that finds nothing (or `null`) sets nothing; an answer that is not JSON
/// fails the attempt, as outputs beyond the limits do.
fn answer_outputs(spec: &HttpSpec, body: &[u8]) -> Result<Outputs, String> {
    if spec.outputs.is_empty() {
        return Ok(Outputs::new());
    }
    let json: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        format!("the task's outputs: the answer is not JSON (or was cut at the output limit): {e}")
    })?;
    let mut out = Outputs::new();
    for (name, path) in &spec.outputs {
        let path = Path::parse(path).map_err(|e| format!("the task's outputs: {e}"))?;
        if let Some(value) = path.read(&json) {
            out.insert(name.clone(), value);
        }
    }
    dagcron_core::outputs::check(&out).map_err(|e| e.to_string())?;
    Ok(out)
}

fn failed(failure: Failure, error: String, code: Option<i32>, log: Vec<u8>) -> Outcome {
    Outcome {
        outputs: Default::default(),
        ending: Ending::Failed(failure),
        exit_code: code,
        error: Some(error),
        log,
        lines: Vec::new(),
        start_error_us: None,
    }
}

pub(crate) async fn run(
    spec: &HttpSpec,
    ctx: &AttemptContext,
    timeout: Option<Duration>,
    cancel: CancellationToken,
    limits: Limits,
) -> Outcome {
    let method = match reqwest::Method::from_bytes(spec.method.as_bytes()) {
        Ok(m) => m,
        Err(_) => {
            return failed(
                Failure::Error("bad method".into()),
                format!("invalid HTTP method {:?}", spec.method),
                None,
                vec![],
            );
        }
    };
    let url = ctx.substitute(&spec.url);
    let client = match &ctx.policy {
        None => client().clone(),
        Some(policy) => {
            if let Some(why) = reqwest::Url::parse(&url)
                .ok()
                .and_then(|u| refused(policy, &u))
            {
                return failed(
                    Failure::Error("destination refused".into()),
                    format!("{} {url}: {why}", spec.method),
                    None,
                    vec![],
                );
            }
            guarded(policy)
        }
    };
    let mut req = client.request(method, &url);
    for (k, v) in ctx.identity() {
        let name = header_name(&k);
        req = req.header(format!("X-Dagcron-{name}"), v);
    }
    for (name, value) in ctx.trace.iter().flat_map(|t| t.pairs()) {
        req = req.header(name, value);
    }
    for (k, v) in &spec.headers {
        req = req.header(k, ctx.substitute(v));
    }
    if let Some(body) = &spec.body {
        req = req.body(ctx.substitute(body));
    }
    let call = async {
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let mut log = CappedLog::new(limits.max_output);
        let mut resp = resp;
        while let Some(chunk) = resp.chunk().await? {
            log.push(&chunk);
        }
        Ok::<_, reqwest::Error>((status, log.finish()))
    };
    let sleep = async {
        match timeout {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    // Dropping the request future aborts it.
    tokio::select! {
        r = call => match r {
            Ok((status, log)) => {
                let ok = if spec.expect.is_empty() { (200..300).contains(&status) } else { spec.expect.contains(&status) };
                if ok {
                    match answer_outputs(spec, &log) {
                        Ok(outputs) => Outcome { ending: Ending::Succeeded, exit_code: Some(i32::from(status)), error: None, log, lines: Vec::new(), outputs: ctx.secrets.redact_outputs(outputs), start_error_us: None },
                        Err(why) => failed(Failure::Error(why.clone()), why, Some(i32::from(status)), log),
                    }
                } else {
                    let expected = if spec.expect.is_empty() { "2xx".to_string() } else { format!("{:?}", spec.expect) };
                    failed(Failure::HttpStatus(status), format!("{} {url} answered {status}, expected {expected}", spec.method), Some(i32::from(status)), log)
                }
            }
            Err(e) => failed(Failure::Error(e.to_string()), format!("{} {url}: {}", spec.method, chain(&e)), None, vec![]),
        },
        () = sleep => Outcome { ending: Ending::TimedOut, exit_code: None, error: Some(format!("no answer from {url} within {:?}", timeout.unwrap_or_default())), log: vec![], lines: Vec::new(), start_error_us: None, outputs: Default::default(), },
        () = cancel.cancelled() => Outcome { ending: Ending::Cancelled, exit_code: None, error: Some("cancelled".into()), log: vec![], lines: Vec::new(), start_error_us: None, outputs: Default::default(), },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_names() {
        assert_eq!(super::header_name("RUN_ID"), "Run-Id");
        assert_eq!(super::header_name("PARAM__DRY__RUN_"), "Param-Dry-Run");
        assert_eq!(super::header_name("_"), "");
    }
}
