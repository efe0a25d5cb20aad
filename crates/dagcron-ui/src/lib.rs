//! The web UI: server-rendered HTML pages (askama templates) over the
//! API's state, with a vendored copy of htmx for the live parts (a log
//! followed while it grows, the cron playground as you type). Every page
//! reads without JavaScript; htmx only enhances.
//!
//! [`with_ui`] puts the pages in front of the API's router: the UI's paths
//! are answered here, everything else (`/api/v1/...`, `/metrics`, health)
//! goes to the API unchanged. A page asks the same authorization as the
//! API ([`dagcron_api::auth::principal_of`], then [`Principal::allow`]);
//! an action is sent to the API's own route with the session's token, so
//! that it is authorized, refused in read-only mode, limited by quotas and
//! recorded in the audit log exactly as a call of the API.
//!
//! # How it works
//!
//! The web UI: server-rendered pages (askama templates in `templates/`), its
//! assets embedded in the binary (`assets/`: the style sheet, a few lines of
//! script, a vendored htmx), served by `with_ui(state, api)` in front of the
//! API's router, which answers every path the UI does not know. `session.rs`
//! keeps the sessions (in memory; the token a browser signed in with, its
//! CSRF token); `pages/` has a module per view; `svg.rs` draws the DAG and
//! the Gantt timeline and `health.rs` joins the expected fires with the fire
//! ledger, both pure. A page reads the store and asks the API's own
//! decision (`principal_of`, `Principal::allow`); an action is sent to the
//! API's route with the session's token, so that authorization, read-only
//! mode, quotas and the audit log are the API's, once.
//!
//! **Architecture Invariant:** the UI has no authorization of its own and
//! no SQL; every page reads a bounded amount (a page of jobs, the last N
//! runs, a window of fires).

// A page's early answer (sign in, refused, not found) is the `Err` of its
// checks: a whole response, as axum's handlers return.
#![allow(clippy::result_large_err)]

mod assets;
mod format;
mod health;
mod pages;
pub mod session;
mod svg;

use std::sync::Arc;

use askama::Template;
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use dagcron_api::AppState;
use dagcron_api::auth::{Principal, TokenRefused, principal_of};
use dagcron_core::authz::{Decision, Need};
use dagcron_store::prelude::*;
use jiff::Timestamp;
use jiff::tz::TimeZone;
use tower::ServiceExt;

use crate::session::{
    SESSION_COOKIE, Sessions, ZONE_CHOICE_COOKIE, ZONE_COOKIE, cookie, same_secret,
};

/// What the pages share: the API's state, the API itself (where actions
/// go) and the sessions.
pub(crate) struct Ui<S: Store> {
    pub(crate) st: AppState<S>,
    api: Router,
    pub(crate) sessions: Arc<Sessions>,
}

impl<S: Store> Clone for Ui<S> {
    fn clone(&self) -> Self {
        Ui {
            st: self.st.clone(),
            api: self.api.clone(),
            sessions: self.sessions.clone(),
        }
    }
}

/// The UI's pages in front of `api` (the API's router, built from the same
/// state): a path the UI does not know goes to `api`.
pub fn with_ui<S: Store>(state: AppState<S>, api: Router) -> Router {
    let ui = Ui {
        st: state,
        api: api.clone(),
        sessions: Arc::new(Sessions::default()),
    };
    Router::new()
        .route("/", get(pages::overview::index::<S>))
        .route("/jobs", get(pages::jobs::index::<S>))
        .route("/signin", post(pages::signin::signin::<S>))
        .route("/signout", post(pages::signin::signout::<S>))
        .route("/jobs/{ns}/{name}", get(pages::job::page::<S>))
        .route("/jobs/{ns}/{name}/{action}", post(pages::job::act::<S>))
        .route("/runs", get(pages::runs::page::<S>))
        .route("/runs/{id}", get(pages::run::page::<S>))
        .route("/runs/{id}/{action}", post(pages::run::act::<S>))
        .route(
            "/runs/{id}/tasks/{task}/{action}",
            post(pages::run::act_on_task::<S>),
        )
        .route(
            "/runs/{id}/tasks/{task}/attempts/{n}/log",
            get(pages::run::log::<S>),
        )
        .route("/playground", get(pages::playground::page::<S>))
        .route("/cluster", get(pages::cluster::page::<S>))
        .route("/notifications/{ns}", get(pages::notifications::page::<S>))
        .route("/audit", get(pages::audit::page::<S>))
        .route(
            "/preferences",
            get(pages::preferences::page::<S>).post(pages::preferences::save::<S>),
        )
        .route("/assets/{file}", get(assets::asset))
        .with_state(ui)
        .layer(axum::middleware::map_response(secure_headers))
        .fallback_service(api)
}

/// Headers of every page: no framing, no sniffing, scripts only from here.
async fn secure_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    if h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html"))
    {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
            ),
        );
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// A signed-in request: who, its session's CSRF token, and the zone its
/// browser shows times in.
pub(crate) struct Viewer {
    pub(crate) who: Principal,
    secret: String,
    pub(crate) csrf: String,
    pub(crate) zone: TimeZone,
    /// The theme the viewer chose (empty: the system's).
    theme: String,
    /// While the instance is read-only, what every page says about it.
    pub(crate) read_only: Option<String>,
}

impl Viewer {
    /// Whether the token may do `need` in `namespace`: the API's decision,
    /// used to decide what a page offers (the API decides again when the
    /// action comes).
    pub(crate) fn may(&self, need: Need, namespace: Option<&str>) -> bool {
        self.who.grant.decide(need, namespace) == Decision::Allow
    }

    /// The frame of every page.
    pub(crate) fn chrome(&self, title: impl Into<String>, here: &'static str) -> Chrome {
        Chrome {
            title: title.into(),
            here,
            name: self.who.name.clone(),
            role: match &self.who.grant.namespace {
                Some(ns) => format!("{} in {ns}", self.who.grant.role),
                None => self.who.grant.role.to_string(),
            },
            csrf: self.csrf.clone(),
            admin: self.may(Need::Administer, self.who.grant.namespace.as_deref()),
            zone: self.zone.iana_name().unwrap_or("UTC").to_string(),
            theme: self.theme.clone(),
            read_only: self.read_only.clone(),
        }
    }
}

/// What the frame of a page shows: its title, where in the navigation it
/// is, who is signed in.
pub(crate) struct Chrome {
    pub(crate) title: String,
    pub(crate) here: &'static str,
    pub(crate) name: String,
    pub(crate) role: String,
    pub(crate) csrf: String,
    pub(crate) admin: bool,
    pub(crate) zone: String,
    pub(crate) theme: String,
    pub(crate) read_only: Option<String>,
}

/// The viewer of a request, or the answer that sends it to sign in.
pub(crate) async fn viewer<S: Store>(ui: &Ui<S>, headers: &HeaderMap) -> Result<Viewer, Response> {
    let to_signin = || Redirect::to("/").into_response();
    let Some(id) = cookie(headers, SESSION_COOKIE) else {
        return Err(to_signin());
    };
    let Some(session) = ui.sessions.get(id, Timestamp::now()) else {
        return Err(to_signin());
    };
    let who = match principal_of(&ui.st, &session.secret).await {
        Ok(who) => who,
        Err(TokenRefused::Unauthenticated(_)) => {
            ui.sessions.close(id);
            return Err(to_signin());
        }
        Err(TokenRefused::Store(e)) => {
            return Err(error_page(StatusCode::SERVICE_UNAVAILABLE, &e.message));
        }
    };
    // The zone the viewer chose, else the browser's, else UTC.
    let zone = [ZONE_CHOICE_COOKIE, ZONE_COOKIE]
        .into_iter()
        .find_map(|c| cookie(headers, c).and_then(|z| TimeZone::get(&z.replace("%2F", "/")).ok()))
        .unwrap_or(TimeZone::UTC);
    let read_only = ui
        .st
        .read_only_notice()
        .await
        .map_err(|e| error_page(StatusCode::SERVICE_UNAVAILABLE, &e.message))?;
    Ok(Viewer {
        who,
        secret: session.secret,
        csrf: session.csrf,
        zone,
        theme: pages::preferences::theme_of(headers),
        read_only,
    })
}

/// The viewer of a form's request, once its CSRF token is the session's;
/// else the answer that refuses it.
pub(crate) async fn form_viewer<S: Store>(
    ui: &Ui<S>,
    headers: &HeaderMap,
    form: &std::collections::HashMap<String, String>,
) -> Result<Viewer, Response> {
    let v = viewer(ui, headers).await?;
    check_csrf(&v, form)?;
    Ok(v)
}

/// Refuses a form whose CSRF token is not the session's.
pub(crate) fn check_csrf(
    v: &Viewer,
    form: &std::collections::HashMap<String, String>,
) -> Result<(), Response> {
    match form.get("csrf") {
        Some(t) if same_secret(t, &v.csrf) => Ok(()),
        _ => Err(error_page(
            StatusCode::FORBIDDEN,
            "this form is not from this session (its CSRF token is missing or wrong): reload the page and try again",
        )),
    }
}

/// Sends an action to the API's own route with the viewer's token; the
/// API's answer, or its status and error message.
pub(crate) async fn call_api<S: Store>(
    ui: &Ui<S>,
    v: &Viewer,
    from: &HeaderMap,
    connect: Option<axum::extract::ConnectInfo<std::net::SocketAddr>>,
    path: &str,
    body: serde_json::Value,
) -> Result<serde_json::Value, (StatusCode, String)> {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {}", v.secret))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("a request from valid parts");
    if let Some(tp) = from.get("traceparent") {
        req.headers_mut().insert("traceparent", tp.clone());
    }
    if let Some(c) = connect {
        req.extensions_mut().insert(c);
    }
    let resp = ui
        .api
        .clone()
        .oneshot(req)
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 4 << 20)
        .await
        .map_err(|e| (StatusCode::BAD_GATEWAY, e.to_string()))?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    if status.is_success() {
        Ok(value)
    } else {
        let message = value["error"]["message"]
            .as_str()
            .unwrap_or("the API refused the action")
            .to_string();
        Err((status, message))
    }
}

/// The page of an error, with its status.
#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    status: u16,
    reason: &'a str,
    message: &'a str,
}

pub(crate) fn error_page(status: StatusCode, message: &str) -> Response {
    let page = ErrorPage {
        status: status.as_u16(),
        reason: status.canonical_reason().unwrap_or("Error"),
        message,
    };
    (status, render(&page)).into_response()
}

/// Renders a template into an HTML answer.
pub(crate) fn render(t: &impl Template) -> Response {
    match t.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!("a page did not render: {e}");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page did not render").into_response()
        }
    }
}

/// Whether a request was made by htmx (it wants a fragment, not a page).
pub(crate) fn from_htmx(headers: &HeaderMap) -> bool {
    headers.contains_key("hx-request")
}

/// A path segment with every byte outside the unreserved set escaped.
pub(crate) fn path_part(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
