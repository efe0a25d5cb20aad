//! Delivering a notification: one POST to its notifier's address, through
//! the same guarded client as http tasks, so that a notifier reaches only
//! what its namespace's execution policy allows (no loopback, private or
//! link-local address, the server's own included, unless the policy lists
//! it), and never through a proxy.

use std::sync::Arc;
use std::time::Duration;

use dagcron_core::exec_policy::ExecPolicy;
use hmac::{KeyInit, Mac};

/// The header of a webhook's signature: `sha256=` and the hex HMAC-SHA-256
/// of the body under the notifier's secret (GitHub's format).
pub const SIGNATURE_HEADER: &str = "X-Dagcron-Signature-256";

/// At most this much of a receiver's answer is read, for its error.
const MAX_ANSWER: usize = 512;

/// `sha256=` and the hex HMAC-SHA-256 of `body` under `key`.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    let mut mac =
        <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// One POST.
#[derive(Clone, Debug)]
pub struct Post {
    /// Where.
    pub url: String,
    /// Headers beyond `Content-Type: application/json`.
    pub headers: Vec<(String, String)>,
    /// The JSON body.
    pub body: Vec<u8>,
    /// How long the receiver has to answer.
    pub timeout: Duration,
}

/// How a receiver answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Its status, if it answered.
    pub status: Option<u16>,
    /// What went wrong, if it did (a status other than 2xx included).
    pub error: Option<String>,
}

impl Answer {
    /// Whether the receiver took it (a 2xx status).
    pub fn delivered(&self) -> bool {
        self.error.is_none()
    }
}

/// Sends `post` under `policy` (none: no destination is refused, as for an
/// engine without tenants).
pub async fn send(policy: Option<&Arc<ExecPolicy>>, post: Post) -> Answer {
    let url = match reqwest::Url::parse(&post.url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => u,
        Ok(_) => return failed(format!("{} is not an http:// or https:// URL", post.url)),
        Err(e) => return failed(format!("invalid URL: {e}")),
    };
    let client = match policy {
        Some(policy) => {
            if let Some(why) = crate::http::refused(policy, &url) {
                return failed(format!(
                    "refused by the namespace's execution policy: {why}"
                ));
            }
            crate::http::guarded(policy)
        }
        None => crate::http::client().clone(),
    };
    let mut request = client
        .post(url)
        .timeout(post.timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(post.body);
    for (name, value) in &post.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    match request.send().await {
        Ok(answer) => {
            let status = answer.status();
            if status.is_success() {
                return Answer {
                    status: Some(status.as_u16()),
                    error: None,
                };
            }
            // Only the start of the answer is read: a receiver that sends
            // gigabytes gets no more of this process's memory than that.
            let mut answer = answer;
            let mut body = Vec::new();
            while body.len() < MAX_ANSWER {
                match answer.chunk().await {
                    Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                    _ => break,
                }
            }
            body.truncate(MAX_ANSWER);
            let text = String::from_utf8_lossy(&body);
            Answer {
                status: Some(status.as_u16()),
                error: Some(format!("the receiver answered {status}: {}", text.trim())),
            }
        }
        Err(e) => failed(crate::http::chain(&e)),
    }
}

fn failed(error: String) -> Answer {
    Answer {
        status: None,
        error: Some(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_githubs_format() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
