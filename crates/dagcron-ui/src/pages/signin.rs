//! Signing in with an API token, and out.

use std::collections::HashMap;
use std::net::SocketAddr;

use askama::Template;
use axum::Extension;
use axum::Form;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use dagcron_api::auth::{TokenRefused, principal_of, refused_signin};
use dagcron_store::prelude::*;
use jiff::Timestamp;

use crate::session::{SESSION_COOKIE, SIGNIN_COOKIE, cookie, random_id, same_secret, set_cookie};
use crate::{Ui, error_page, render};

#[derive(Template)]
#[template(path = "signin.html")]
struct SigninPage<'a> {
    csrf: &'a str,
    error: Option<&'a str>,
}

/// The sign-in form, with a fresh CSRF token in a cookie of its own (the
/// form must send it back: a page of another site cannot sign a browser in
/// with the other site's token).
pub(crate) fn form(status: StatusCode, error: Option<&str>) -> Response {
    let csrf = random_id();
    let mut resp = (status, render(&SigninPage { csrf: &csrf, error })).into_response();
    if let Ok(v) = set_cookie(SIGNIN_COOKIE, &csrf, Some(3600)).parse() {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    resp
}

/// `POST /signin`: checks the token as the API does, then opens a session.
pub(crate) async fn signin<S: Store>(
    State(ui): State<Ui<S>>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let sent = f.get("csrf").map(String::as_str).unwrap_or("");
    let expected = cookie(&headers, SIGNIN_COOKIE).unwrap_or("");
    if expected.is_empty() || !same_secret(sent, expected) {
        return form(
            StatusCode::FORBIDDEN,
            Some("the sign-in form had expired or did not come from this site: try again"),
        );
    }
    let token = f.get("token").map(|t| t.trim()).unwrap_or("");
    match principal_of(&ui.st, token).await {
        Ok(_) => {
            let (id, _) = ui.sessions.open(token.to_string(), Timestamp::now());
            let mut resp = Redirect::to("/").into_response();
            let h = resp.headers_mut();
            for c in [
                set_cookie(SESSION_COOKIE, &id, None),
                set_cookie(SIGNIN_COOKIE, "", Some(0)),
            ] {
                if let Ok(v) = c.parse() {
                    h.append(header::SET_COOKIE, v);
                }
            }
            resp
        }
        Err(TokenRefused::Unauthenticated(m)) => {
            let address = peer.map(|Extension(ConnectInfo(a))| a.to_string());
            match refused_signin(&ui.st, address).await {
                None => form(
                    StatusCode::UNAUTHORIZED,
                    Some(&format!("Not signed in: {m}.")),
                ),
                Some(retry) => form(
                    StatusCode::TOO_MANY_REQUESTS,
                    Some(&format!(
                        "Too many failed sign-ins from this address: try again in {retry} s."
                    )),
                ),
            }
        }
        Err(TokenRefused::Store(e)) => error_page(StatusCode::SERVICE_UNAVAILABLE, &e.message),
    }
}

/// `POST /signout`: forgets the session.
pub(crate) async fn signout<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    if let Err(resp) = crate::form_viewer(&ui, &headers, &f).await {
        return resp;
    }
    if let Some(id) = cookie(&headers, SESSION_COOKIE) {
        ui.sessions.close(id);
    }
    let mut resp = Redirect::to("/").into_response();
    if let Ok(c) = set_cookie(SESSION_COOKIE, "", Some(0)).parse() {
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    resp
}
