//! Sessions of the web UI: a signed-in browser holds an opaque, random
//! session id in an HttpOnly, SameSite=Strict cookie; the server keeps,
//! in memory, the API token it was opened with and the session's CSRF
//! token. Every request re-checks the token through the API's own
//! [`dagcron_api::auth::principal_of`], so a revoked or expired token ends
//! its sessions at once.
//!
//! Decisions take the instant as an argument; the handlers read the clock.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::http::HeaderMap;
use jiff::{SignedDuration, Timestamp};

/// The cookie that carries the session id.
pub const SESSION_COOKIE: &str = "dagcron_session";
/// The cookie of the sign-in form's CSRF token (before there is a session).
pub const SIGNIN_COOKIE: &str = "dagcron_signin";
/// The cookie in which the browser names its time zone (set by `app.js`).
pub const ZONE_COOKIE: &str = "dagcron_tz";
/// The cookie of the time zone the viewer chose (over the browser's).
pub const ZONE_CHOICE_COOKIE: &str = "dagcron_tz_choice";
/// The cookie of the theme the viewer chose (`light` or `dark`).
pub const THEME_COOKIE: &str = "dagcron_theme";

/// A session unused for this long is forgotten.
pub const IDLE: SignedDuration = SignedDuration::from_hours(12);
/// A session older than this is forgotten, used or not.
pub const MAX_AGE: SignedDuration = SignedDuration::from_hours(7 * 24);
/// At most this many sessions are kept; opening one more forgets the
/// least recently used.
pub const MAX_SESSIONS: usize = 10_000;

/// One signed-in browser.
#[derive(Clone, Debug)]
pub struct Session {
    /// The API token it signed in with (kept in server memory only).
    pub secret: String,
    /// The token every form of this session carries.
    pub csrf: String,
    /// When it was opened.
    pub opened: Timestamp,
    /// When it was last used.
    pub seen: Timestamp,
}

/// The sessions of this server.
#[derive(Debug, Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
}

/// 32 random bytes as 64 hexadecimal digits.
pub fn random_id() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares two secrets in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Sessions {
    /// Opens a session for `secret` at `now`; returns its id and the session.
    pub fn open(&self, secret: String, now: Timestamp) -> (String, Session) {
        let id = random_id();
        let session = Session {
            secret,
            csrf: random_id(),
            opened: now,
            seen: now,
        };
        let mut map = self.by_id.lock().expect("sessions lock");
        map.retain(|_, s| alive(s, now));
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.seen)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(id.clone(), session.clone());
        (id, session)
    }

    /// The live session of `id` at `now` (marked as used), if any.
    pub fn get(&self, id: &str, now: Timestamp) -> Option<Session> {
        let mut map = self.by_id.lock().expect("sessions lock");
        let session = map.get_mut(id)?;
        if !alive(session, now) {
            map.remove(id);
            return None;
        }
        session.seen = now;
        Some(session.clone())
    }

    /// Forgets a session (sign-out, or its token no longer authenticates).
    pub fn close(&self, id: &str) {
        self.by_id.lock().expect("sessions lock").remove(id);
    }

    /// How many sessions are kept.
    pub fn len(&self) -> usize {
        self.by_id.lock().expect("sessions lock").len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn alive(s: &Session, now: Timestamp) -> bool {
    now.duration_since(s.seen) < IDLE && now.duration_since(s.opened) < MAX_AGE
}

/// The value of cookie `name` in a request's headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, for the whole site;
/// `max_age` zero deletes it.
pub fn set_cookie(name: &str, value: &str, max_age: Option<i64>) -> String {
    let age = max_age.map_or(String::new(), |a| format!("; Max-Age={a}"));
    format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict{age}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn sessions_end_when_idle_or_old_and_on_close() {
        let sessions = Sessions::default();
        let t0 = at("2026-01-01T00:00:00Z");
        let (id, s) = sessions.open("dgc_x".into(), t0);
        assert_eq!(s.secret, "dgc_x");
        assert_ne!(s.csrf, id);
        let hour = SignedDuration::from_hours(1);
        assert!(sessions.get(&id, t0 + hour * 11).is_some());
        // Used at 11 h, so still alive at 22 h; not at 34 h.
        assert!(sessions.get(&id, t0 + hour * 22).is_some());
        assert!(sessions.get(&id, t0 + hour * 35).is_none());
        assert!(sessions.get(&id, t0).is_none(), "an expired one is gone");
        let (id, _) = sessions.open("dgc_y".into(), t0);
        let mut t = t0;
        while t + hour * 10 < t0 + MAX_AGE {
            t += hour * 10;
            assert!(sessions.get(&id, t).is_some(), "{t}");
        }
        assert!(sessions.get(&id, t0 + MAX_AGE).is_none());
        let (id, _) = sessions.open("dgc_z".into(), t0);
        sessions.close(&id);
        assert!(sessions.get(&id, t0).is_none());
        assert!(sessions.get("nonsense", t0).is_none());
    }

    #[test]
    fn cookies_are_read_by_name_and_written_strict() {
        let mut h = HeaderMap::new();
        h.append("cookie", "a=1; dagcron_session=abc".parse().unwrap());
        h.append("cookie", "dagcron_tz=Europe/Berlin".parse().unwrap());
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, ZONE_COOKIE), Some("Europe/Berlin"));
        assert_eq!(cookie(&h, "b"), None);
        let c = set_cookie(SESSION_COOKIE, "v", Some(0));
        assert_eq!(
            c,
            "dagcron_session=v; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
        );
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }
}
