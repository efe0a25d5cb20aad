//! Delivering a notification by e-mail, through the server's SMTP relay
//! (its URL, sender and password are the server's configuration; a job
//! file names only the recipients).

use std::time::Duration;

use lettre::message::Mailbox;
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::notify::Answer;

/// The server's SMTP relay.
#[derive(Clone)]
pub struct Smtp {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// The domains mail may go to (empty: any).
    allowed: Vec<String>,
}

impl std::fmt::Debug for Smtp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Smtp(from {})", self.from)
    }
}

impl Smtp {
    /// The relay at `url`: `smtp://host:port` (plain, for a relay on the
    /// same host), `smtp://host:587?tls=required` (STARTTLS) or
    /// `smtps://host:465` (TLS), a user in the URL; `password` (read from
    /// a file) signs in as that user. Mail is sent from `from`.
    /// `allowed` lists the domains recipients may be in (and their
    /// subdomains); empty: any.
    pub fn new(
        url: &str,
        password: Option<&str>,
        from: &str,
        allowed: Vec<String>,
        timeout: Duration,
    ) -> Result<Smtp, String> {
        let from: Mailbox = from
            .parse()
            .map_err(|e| format!("the sender {from:?} is not an address: {e}"))?;
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            .map_err(|e| format!("the SMTP URL is not usable: {e}"))?
            .timeout(Some(timeout));
        if let Some(password) = password {
            let parsed = reqwest::Url::parse(url).map_err(|e| format!("the SMTP URL: {e}"))?;
            let user = parsed.username().to_string();
            let tls = parsed.scheme() == "smtps"
                || parsed
                    .query_pairs()
                    .any(|(k, v)| k == "tls" && v == "required");
            let local = matches!(parsed.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
            if !tls && !local {
                return Err("a password is sent only over TLS: use smtps://host:465 or smtp://host:587?tls=required".into());
            }
            if user.is_empty() {
                return Err(
                    "a password is given, and the SMTP URL names no user (smtp://user@host)".into(),
                );
            }
            builder = builder.credentials(Credentials::new(user, password.to_string()));
        }
        Ok(Smtp {
            transport: builder.build(),
            from,
            allowed: allowed
                .into_iter()
                .map(|d| d.to_ascii_lowercase())
                .collect(),
        })
    }

    /// Whether `address` is in a domain mail may go to.
    pub fn may_send_to(&self, address: &str) -> bool {
        if self.allowed.is_empty() {
            return true;
        }
        let domain = address
            .rsplit_once('@')
            .map_or(String::new(), |(_, d)| d.to_ascii_lowercase());
        self.allowed
            .iter()
            .any(|a| domain == *a || domain.ends_with(&format!(".{a}")))
    }

    /// Sends `body` to `to` with `subject`; `key` (the notification's
    /// idempotency key) makes its Message-ID, the same at every attempt.
    pub async fn send(&self, to: &[String], subject: &str, body: String, key: &str) -> Answer {
        let failed = |error: String| Answer {
            status: None,
            error: Some(error),
        };
        let mut message = Message::builder()
            .from(self.from.clone())
            .subject(subject)
            .message_id(Some(format!(
                "<{}@dagcron>",
                crate::notify::signature(b"message-id", key.as_bytes())
                    .trim_start_matches("sha256=")
            )))
            .header(ContentType::TEXT_PLAIN);
        for address in to {
            if !self.may_send_to(address) {
                return failed(format!(
                    "{address:?} is in none of the domains this server mails to (its --smtp-allowed-domains)"
                ));
            }
            match address.parse::<Mailbox>() {
                Ok(mailbox) => message = message.to(mailbox),
                Err(e) => return failed(format!("{address:?} is not an address: {e}")),
            }
        }
        let message = match message.body(body) {
            Ok(m) => m,
            Err(e) => return failed(format!("the message cannot be built: {e}")),
        };
        match self.transport.send(message).await {
            Ok(response) => Answer {
                status: response.code().to_string().parse().ok(),
                error: None,
            },
            Err(e) => failed(format!(
                "the SMTP relay refused or could not be reached: {e}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smtp(url: &str, password: Option<&str>, allowed: &[&str]) -> Result<Smtp, String> {
        Smtp::new(
            url,
            password,
            "dagcron@example.com",
            allowed.iter().map(|s| s.to_string()).collect(),
            Duration::from_secs(5),
        )
    }

    #[test]
    fn a_password_goes_only_over_tls_or_to_this_host() {
        assert!(smtp("smtp://u@mail.example.com:587?tls=required", Some("p"), &[]).is_ok());
        assert!(smtp("smtps://u@mail.example.com:465", Some("p"), &[]).is_ok());
        assert!(smtp("smtp://u@127.0.0.1:25", Some("p"), &[]).is_ok());
        let err = smtp("smtp://u@mail.example.com:25", Some("p"), &[]).unwrap_err();
        assert!(err.contains("only over TLS"), "{err}");
        assert!(
            smtp("smtps://mail.example.com:465", Some("p"), &[])
                .unwrap_err()
                .contains("names no user")
        );
    }

    #[test]
    fn recipients_are_kept_to_the_allowed_domains() {
        let any = smtp("smtp://127.0.0.1:25", None, &[]).unwrap();
        assert!(any.may_send_to("x@anywhere.example"));
        let some = smtp("smtp://127.0.0.1:25", None, &["example.com"]).unwrap();
        assert!(some.may_send_to("ops@example.com"));
        assert!(some.may_send_to("ops@Mail.Example.com"));
        assert!(!some.may_send_to("ops@example.com.evil.test"));
        assert!(!some.may_send_to("ops@notexample.com"));
    }
}
