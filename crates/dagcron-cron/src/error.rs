//! Parse errors: where (a byte span), what, and what would be accepted.

use std::fmt;

/// A byte range in the expression as the user typed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Span {
    pub(crate) fn new(start: usize, end: usize) -> Span {
        Span { start, end }
    }

    pub(crate) fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }
}

/// What kind of mistake a [`ParseError`] reports, for callers that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The expression is empty.
    Empty,
    /// The expression is longer than [`MAX_EXPRESSION_LEN`](crate::MAX_EXPRESSION_LEN) bytes.
    TooLong,
    /// A character that is not printable ASCII.
    NonAscii,
    /// A character that has no meaning at this position.
    UnexpectedChar,
    /// Not 5, 6 or 7 fields.
    FieldCount,
    /// An empty element in a list (`1,,2`).
    EmptyElement,
    /// A number outside its field's range.
    OutOfRange,
    /// A range whose start is after its end.
    ReversedRange,
    /// A step of zero.
    ZeroStep,
    /// A month or weekday name that does not exist, or is in the wrong field.
    UnknownName,
    /// `?`, `L`, `W`, `#` or `H` where it is not allowed.
    Misplaced,
    /// An `@` descriptor that does not exist (or `@reboot`).
    Descriptor,
    /// A malformed `@every` duration.
    Duration,
    /// A malformed `@at` instant.
    Instant,
    /// A time zone that is not in the IANA database.
    TimeZone,
    /// A valid expression that can never fire.
    NeverFires,
    /// A malformed recurrence rule (`RRULE:`): a property, part or
    /// combination RFC 5545 does not allow.
    Recurrence,
}

/// An error found while parsing a cron expression.
///
/// It carries the byte span of the offending text, a message that says what is
/// wrong, and, where one exists, a suggestion of what would be accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// What kind of mistake this is.
    pub kind: ErrorKind,
    /// Where in the expression.
    pub span: Span,
    /// What is wrong, in a sentence.
    pub message: String,
    /// What would be accepted instead, if we know.
    pub suggestion: Option<String>,
}

impl ParseError {
    pub(crate) fn new(kind: ErrorKind, span: Span, message: impl Into<String>) -> ParseError {
        ParseError {
            kind,
            span,
            message: message.into(),
            suggestion: None,
        }
    }

    pub(crate) fn help(mut self, suggestion: impl Into<String>) -> ParseError {
        self.suggestion = Some(suggestion.into());
        self
    }

    /// Draws the error under the expression with carets, as rustc does:
    ///
    /// ```text
    /// error: 60 is out of range for the minute field
    ///   |
    ///   | 60 * * * *
    ///   | ^^
    ///   = help: minutes are 0-59
    /// ```
    pub fn render(&self, source: &str) -> String {
        let mut out = format!(
            "error: {}\n  |\n  | {}\n  | ",
            self.message,
            source.escape_default()
        );
        // Column in the escaped rendering, so that carets stay aligned even
        // when the source holds characters that we print escaped.
        let col = |byte: usize| -> usize {
            source
                .get(..byte)
                .map_or(byte, |s| s.escape_default().to_string().len())
        };
        let (start, end) = (col(self.span.start), col(self.span.end));
        out.push_str(&" ".repeat(start));
        out.push_str(&"^".repeat((end - start).max(1)));
        out.push('\n');
        if let Some(help) = &self.suggestion {
            out.push_str(&format!("  = help: {help}\n"));
        }
        out
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at bytes {}..{}: {}",
            self.span.start, self.span.end, self.message
        )?;
        if let Some(help) = &self.suggestion {
            write!(f, " (help: {help})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ParseError {}
