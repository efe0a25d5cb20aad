//! How the commands print what the server answers, decided in one place:
//! with `--json`, the answer itself; otherwise its text form, a table or a
//! few lines, which each answer type gives by implementing [`Show`].

use std::fmt::Display;
use std::io::{self, Write};

use anyhow::Result;
use jiff::Timestamp;
use serde::Serialize;

/// An answer the command line prints: as JSON, or as text.
pub(super) trait Show: Serialize {
    /// The text form.
    fn text(&self, out: &mut dyn Write) -> io::Result<()>;
}

/// Standard output, and whether `--json` was asked.
pub(super) struct Output {
    json: bool,
    out: io::StdoutLock<'static>,
}

impl Output {
    pub(super) fn stdout(json: bool) -> Output {
        Output {
            json,
            out: io::stdout().lock(),
        }
    }

    /// Prints an answer in the form asked.
    pub(super) fn show(&mut self, value: &impl Show) -> Result<()> {
        if self.json {
            self.json(value)
        } else {
            Ok(value.text(&mut self.out)?)
        }
    }

    /// Prints an answer as JSON whatever was asked (`jobs show`), pretty and
    /// with its keys sorted, as the command line always printed them.
    pub(super) fn json(&mut self, value: &impl Serialize) -> Result<()> {
        let value = serde_json::to_value(value)?;
        writeln!(self.out, "{}", serde_json::to_string_pretty(&value)?)?;
        Ok(())
    }

    /// A line that has no JSON form (what a change did), printed as is.
    pub(super) fn say(&mut self, line: impl Display) -> Result<()> {
        writeln!(self.out, "{line}")?;
        Ok(())
    }

    /// Output passed through as it comes (an attempt's log).
    pub(super) fn raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes)?;
        self.out.flush()?;
        Ok(())
    }
}

/// An instant as the API writes it (padding applies to the text: jiff's
/// `Display` ignores widths).
pub(super) fn instant(t: &Timestamp) -> String {
    t.to_string()
}

/// An optional value, `-` when there is none.
pub(super) fn or_dash<T: ToString>(v: Option<&T>) -> String {
    v.map_or_else(|| "-".to_string(), ToString::to_string)
}
