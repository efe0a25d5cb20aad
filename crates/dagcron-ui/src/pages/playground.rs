//! `/playground`: a cron expression and a zone in, its explanation, its
//! errors drawn under it, and its next fires with daylight-saving marks
//! out, as you type (htmx asks for the result part alone). The address
//! (`/playground?expr=...&tz=...`) shares an expression.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Response};
use dagcron_cron::{Options, Schedule};
use dagcron_store::prelude::*;
use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::Deserialize;

use crate::{Chrome, Ui, from_htmx, render, viewer};

/// Fires listed.
const FIRES: usize = 10;

#[derive(Deserialize, Default)]
pub(crate) struct PlaygroundQuery {
    expr: Option<String>,
    tz: Option<String>,
}

/// An error and the marks under the part of the expression it is about.
pub(crate) struct Drawn {
    source: String,
    marks: String,
    message: String,
    suggestion: String,
}

#[derive(Template)]
#[template(path = "playground_result.html")]
pub(crate) struct Result_ {
    error: Option<Drawn>,
    english: String,
    normal: String,
    policy: String,
    zone: String,
    fires: Vec<(String, String, &'static str)>,
}

#[derive(Template)]
#[template(path = "playground.html")]
struct PlaygroundPage {
    chrome: Chrome,
    expr: String,
    tz: String,
    result: String,
}

/// Marks `[start, end)` (bytes of `source`) with carets, counted in
/// characters so that they fall under the right ones.
fn marks(source: &str, start: usize, end: usize) -> String {
    let before = source
        .get(..start.min(source.len()))
        .map_or(0, |s| s.chars().count());
    let inside = source
        .get(start.min(source.len())..end.min(source.len()))
        .map_or(0, |s| s.chars().count());
    format!("{}{}", " ".repeat(before), "^".repeat(inside.max(1)))
}

/// The result for an expression in a zone at `now`.
pub(crate) fn evaluate(expr: &str, tz: &str, now: Timestamp) -> Result_ {
    let mut out = Result_ {
        error: None,
        english: String::new(),
        normal: String::new(),
        policy: String::new(),
        zone: String::new(),
        fires: vec![],
    };
    if expr.trim().is_empty() {
        return out;
    }
    let zone = match TimeZone::get(tz.trim()) {
        Ok(z) => z,
        Err(_) => {
            out.error = Some(Drawn {
                marks: marks(tz, 0, tz.len()),
                source: tz.to_string(),
                message: format!("unknown time zone {tz:?} (an IANA name, such as Europe/Berlin)"),
                suggestion: String::new(),
            });
            return out;
        }
    };
    let options = Options {
        time_zone: zone,
        ..Options::default()
    };
    match Schedule::parse_with(expr, &options) {
        Err(e) => {
            out.error = Some(Drawn {
                source: expr.to_string(),
                marks: marks(expr, e.span.start, e.span.end),
                message: e.message.clone(),
                suggestion: e.suggestion.clone().unwrap_or_default(),
            });
        }
        Ok(s) => {
            let tz = s.time_zone().clone();
            out.english = s.explain();
            out.normal = s.normalized();
            out.policy = if s.is_wall_clock() {
                "wall-clock times".into()
            } else {
                "a rhythm".into()
            };
            out.zone = tz.iana_name().unwrap_or("UTC").to_string();
            out.fires = s
                .fires_after(now)
                .take(FIRES)
                .map(|f| {
                    (
                        f.at.to_zoned_datetime(tz.clone())
                            .strftime("%a %Y-%m-%d %H:%M:%S %Z")
                            .to_string(),
                        f.at.strftime("%Y-%m-%d %H:%M:%SZ").to_string(),
                        f.dst.map_or("", |d| d.describe()),
                    )
                })
                .collect();
        }
    }
    out
}

/// `GET /playground`.
pub(crate) async fn page<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Query(q): Query<PlaygroundQuery>,
) -> Response {
    let v = match viewer(&ui, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let expr = q.expr.unwrap_or_else(|| "0 30 9 * * MON-FRI".into());
    let tz = q.tz.unwrap_or_else(|| "Europe/Berlin".into());
    let result = evaluate(&expr, &tz, Timestamp::now());
    let html = match result.render() {
        Ok(h) => h,
        Err(e) => {
            return crate::error_page(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                &e.to_string(),
            );
        }
    };
    if from_htmx(&headers) {
        return Html(html).into_response();
    }
    render(&PlaygroundPage {
        chrome: v.chrome("Cron playground", "playground"),
        expr,
        tz,
        result: html,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_drawn_under_its_part_of_the_expression() {
        let r = evaluate("0 61 * * *", "UTC", Timestamp::UNIX_EPOCH);
        let e = r.error.expect("minute 61 is an error");
        assert_eq!(e.marks, "  ^^");
        assert!(!e.message.is_empty());
        let r = evaluate("0 0 * * *", "Mars/Olympus", Timestamp::UNIX_EPOCH);
        assert!(r.error.unwrap().message.contains("unknown time zone"));
    }

    #[test]
    fn fires_carry_their_daylight_saving_marks() {
        // 02:30 does not exist in Berlin on 2026-03-29.
        let now: Timestamp = "2026-03-27T12:00:00Z".parse().unwrap();
        let r = evaluate("0 30 2 * * *", "Europe/Berlin", now);
        assert!(r.error.is_none());
        assert!(r.english.contains("02:30"), "{}", r.english);
        assert_eq!(r.fires.len(), FIRES);
        assert!(r.fires[0].2.is_empty(), "{:?}", r.fires[0]);
        assert!(
            !r.fires[1].2.is_empty(),
            "the gap is marked: {:?}",
            r.fires[1]
        );
    }
}
