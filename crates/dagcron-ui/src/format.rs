//! How the pages write instants, durations and parameters.

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

/// An instant as HTML: in the viewer's zone, with UTC on hover and the
/// exact instant in `datetime`.
pub(crate) fn time(t: Timestamp, zone: &TimeZone) -> String {
    let local = t
        .to_zoned_datetime(zone.clone())
        .strftime("%Y-%m-%d %H:%M:%S %Z");
    let utc = t.strftime("%Y-%m-%d %H:%M:%S UTC");
    format!(r#"<time datetime="{t}" title="{utc}">{local}</time>"#)
}

/// [`time`] of an instant that may be missing.
pub(crate) fn maybe_time(t: Option<Timestamp>, zone: &TimeZone) -> String {
    t.map_or_else(|| "—".to_string(), |t| time(t, zone))
}

/// A duration for people: `850 ms`, `4.2 s`, `3 min 05 s`, `2 h 10 min`.
pub(crate) fn duration(d: SignedDuration) -> String {
    let ms = d.as_millis();
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    let text = if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{} min {:02} s", ms / 60_000, (ms / 1000) % 60)
    } else if ms < 86_400_000 {
        format!("{} h {:02} min", ms / 3_600_000, (ms / 60_000) % 60)
    } else {
        format!("{} d {} h", ms / 86_400_000, (ms / 3_600_000) % 24)
    };
    format!("{sign}{text}")
}

/// Parameters typed as `key=value` lines (blank lines ignored).
pub(crate) fn params(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut out = serde_json::Map::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!(
                "line {} of the parameters is not key=value: {line:?}",
                i + 1
            ));
        };
        out.insert(k.trim().to_string(), serde_json::Value::from(v.trim()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_show_the_zone_with_utc_on_hover() {
        let t: Timestamp = "2026-03-29T01:30:00Z".parse().unwrap();
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        assert_eq!(
            time(t, &berlin),
            r#"<time datetime="2026-03-29T01:30:00Z" title="2026-03-29 01:30:00 UTC">2026-03-29 03:30:00 CEST</time>"#
        );
        assert_eq!(maybe_time(None, &berlin), "—");
    }

    #[test]
    fn durations_read_at_every_scale() {
        let cases = [
            (850, "850 ms"),
            (4_200, "4.2 s"),
            (185_000, "3 min 05 s"),
            (7_800_000, "2 h 10 min"),
            (90_000_000, "1 d 1 h"),
            (-1_500, "-1.5 s"),
        ];
        for (ms, text) in cases {
            assert_eq!(duration(SignedDuration::from_millis(ms)), text);
        }
    }

    #[test]
    fn parameters_are_key_value_lines() {
        let p = params("a=1\n\n b = two words \n").unwrap();
        assert_eq!(
            serde_json::Value::from(p).to_string(),
            r#"{"a":"1","b":"two words"}"#
        );
        assert!(params("novalue").unwrap_err().contains("line 1"));
    }
}
