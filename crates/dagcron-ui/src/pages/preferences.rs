//! `/preferences`: the theme and the time zone pages show times in,
//! remembered by this browser (cookies of a year; nothing is stored on
//! the server).

use std::collections::HashMap;

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use dagcron_store::prelude::*;
use jiff::tz::TimeZone;
use serde::Deserialize;

use crate::session::{THEME_COOKIE, ZONE_CHOICE_COOKIE, cookie, set_cookie};
use crate::{Chrome, Ui, error_page, render, viewer};

/// A year, in seconds: how long a choice is remembered.
const YEAR: i64 = 365 * 24 * 3600;

#[derive(Deserialize, Default)]
pub(crate) struct PrefsQuery {
    #[serde(default)]
    saved: bool,
}

#[derive(Template)]
#[template(path = "preferences.html")]
struct PrefsPage {
    chrome: Chrome,
    theme: String,
    chosen_zone: String,
    zones: Vec<String>,
    saved: bool,
}

/// The theme a browser chose: `light`, `dark`, or empty (the system's).
pub(crate) fn theme_of(headers: &HeaderMap) -> String {
    match cookie(headers, THEME_COOKIE) {
        Some(t @ ("light" | "dark")) => t.to_string(),
        _ => String::new(),
    }
}

/// `GET /preferences`.
pub(crate) async fn page<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Query(q): Query<PrefsQuery>,
) -> Response {
    let v = match viewer(&ui, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let chosen_zone = cookie(&headers, ZONE_CHOICE_COOKIE)
        .map(|z| z.replace("%2F", "/"))
        .filter(|z| TimeZone::get(z).is_ok())
        .unwrap_or_default();
    let mut zones: Vec<String> = jiff::tz::db()
        .available()
        .map(|z| z.as_str().to_string())
        .collect();
    zones.sort();
    render(&PrefsPage {
        chrome: v.chrome("Preferences", "preferences"),
        theme: theme_of(&headers),
        chosen_zone,
        zones,
        saved: q.saved,
    })
}

/// `POST /preferences`: remembers the choices in cookies.
pub(crate) async fn save<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    if let Err(resp) = crate::form_viewer(&ui, &headers, &f).await {
        return resp;
    }
    let theme = f.get("theme").map(String::as_str).unwrap_or("");
    if !matches!(theme, "" | "light" | "dark") {
        return error_page(
            StatusCode::BAD_REQUEST,
            &format!("theme {theme:?} is not one of light, dark or the system's"),
        );
    }
    let zone = f.get("zone").map(|z| z.trim()).unwrap_or("");
    if !zone.is_empty() && TimeZone::get(zone).is_err() {
        return error_page(
            StatusCode::BAD_REQUEST,
            &format!("{zone:?} is not a time zone of the IANA database (such as Europe/Berlin)"),
        );
    }
    let mut resp = Redirect::to("/preferences?saved=true").into_response();
    let remember = |name: &str, value: &str| {
        // An empty choice forgets the cookie.
        let age = if value.is_empty() { 0 } else { YEAR };
        set_cookie(name, &value.replace('/', "%2F"), Some(age))
    };
    for c in [
        remember(THEME_COOKIE, theme),
        remember(ZONE_CHOICE_COOKIE, zone),
    ] {
        if let Ok(v) = c.parse() {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}
