//! The UI's static files, embedded in the binary: the style sheet, a few
//! lines of script, and the vendored copy of htmx. A browser that accepts
//! gzip gets them compressed (once, at the first request for each).

use std::io::Write;
use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// An asset: its name, content type and bytes, and its gzip form once made.
struct Asset {
    name: &'static str,
    kind: &'static str,
    bytes: &'static [u8],
    gzip: OnceLock<Vec<u8>>,
}

const fn asset_of(name: &'static str, kind: &'static str, bytes: &'static [u8]) -> Asset {
    Asset {
        name,
        kind,
        bytes,
        gzip: OnceLock::new(),
    }
}

static ASSETS: [Asset; 3] = [
    asset_of(
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!("../assets/style.css"),
    ),
    asset_of(
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../assets/app.js"),
    ),
    asset_of(
        "htmx.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../assets/htmx.min.js"),
    ),
];

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(bytes).expect("writing to memory");
    enc.finish().expect("writing to memory")
}

/// Whether a request's `Accept-Encoding` takes gzip (with a quality above 0).
fn takes_gzip(headers: &HeaderMap) -> bool {
    // Each coding named, and whether it is refused (`q=0`).
    let codings: Vec<(String, bool)> = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or("").to_ascii_lowercase();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (name, refused)
        })
        .collect();
    match codings.iter().find(|(name, _)| name == "gzip") {
        Some((_, refused)) => !refused,
        None => codings
            .iter()
            .any(|(name, refused)| name == "*" && !refused),
    }
}

/// Serves an asset; they need no session (the sign-in page uses them).
pub(crate) async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    let Some(a) = ASSETS.iter().find(|a| a.name == file) else {
        return (StatusCode::NOT_FOUND, "no such asset").into_response();
    };
    let common = [
        (header::CONTENT_TYPE, a.kind),
        (header::CACHE_CONTROL, "public, max-age=3600"),
        (header::VARY, "Accept-Encoding"),
    ];
    if takes_gzip(&headers) {
        let body = a.gzip.get_or_init(|| gzip(a.bytes)).clone();
        (common, [(header::CONTENT_ENCODING, "gzip")], body).into_response()
    } else {
        (common, a.bytes).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn accepting(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT_ENCODING, v.parse().unwrap());
        h
    }

    #[test]
    fn gzip_is_sent_only_to_who_takes_it() {
        assert!(takes_gzip(&accepting("gzip, deflate, br")));
        assert!(takes_gzip(&accepting("br;q=1.0, GZIP;q=0.5")));
        assert!(takes_gzip(&accepting("*")));
        assert!(!takes_gzip(&accepting("gzip;q=0, br")));
        assert!(!takes_gzip(&accepting("gzip;q=0, *")));
        assert!(!takes_gzip(&accepting("br")));
        assert!(!takes_gzip(&HeaderMap::new()));
    }

    #[test]
    fn every_asset_compresses_to_its_bytes() {
        for a in &ASSETS {
            let packed = gzip(a.bytes);
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&packed[..])
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, a.bytes, "{}", a.name);
        }
        let htmx = ASSETS.iter().find(|a| a.name == "htmx.min.js").unwrap();
        assert!(gzip(htmx.bytes).len() * 2 < htmx.bytes.len());
    }
}
