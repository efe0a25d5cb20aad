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
    pub fn new(
        url: &str,
        password: Option<&str>,
        from: &str,
        timeout: Duration,
    ) -> Result<Smtp, String> {
        let from: Mailbox = from
            .parse()
            .map_err(|e| format!("the sender {from:?} is not an address: {e}"))?;
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            .map_err(|e| format!("the SMTP URL is not usable: {e}"))?
            .timeout(Some(timeout));
        if let Some(password) = password {
            let user = reqwest::Url::parse(url)
                .map(|u| u.username().to_string())
                .unwrap_or_default();
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
        })
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
