//! HTTP tasks: one request, success by status, the body as the log.

use std::sync::OnceLock;
use std::time::Duration;

use dagcron_core::Failure;
use dagcron_core::model::HttpSpec;
use tokio_util::sync::CancellationToken;

use crate::{AttemptContext, CappedLog, Ending, Limits, Outcome};

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        // TLS uses rustls with the ring provider (no C toolchain needed).
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder().build().expect("HTTP client")
    })
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

fn failed(failure: Failure, error: String, code: Option<i32>, log: Vec<u8>) -> Outcome {
    Outcome {
        ending: Ending::Failed(failure),
        exit_code: code,
        error: Some(error),
        log,
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
    let mut req = client().request(method, &url);
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
                    Outcome { ending: Ending::Succeeded, exit_code: Some(i32::from(status)), error: None, log, start_error_us: None }
                } else {
                    let expected = if spec.expect.is_empty() { "2xx".to_string() } else { format!("{:?}", spec.expect) };
                    failed(Failure::HttpStatus(status), format!("{} {url} answered {status}, expected {expected}", spec.method), Some(i32::from(status)), log)
                }
            }
            Err(e) => failed(Failure::Error(e.to_string()), format!("{} {url}: {e}", spec.method), None, vec![]),
        },
        () = sleep => Outcome { ending: Ending::TimedOut, exit_code: None, error: Some(format!("no answer from {url} within {:?}", timeout.unwrap_or_default())), log: vec![], start_error_us: None },
        () = cancel.cancelled() => Outcome { ending: Ending::Cancelled, exit_code: None, error: Some("cancelled".into()), log: vec![], start_error_us: None },
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
