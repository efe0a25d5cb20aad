//! Where each line of an attempt's output came from: the instant its first
//! byte was read and the stream it was read from. The output itself stays
//! the bytes the task wrote (stdout and stderr interleaved as they came);
//! the marks are kept beside it, one per line start, and joined with the
//! lines when a log is shown.

/// The stream a line was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    /// Its name in the API: `stdout` or `stderr`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// The start of a line of output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineMark {
    /// The line's number, from 0.
    pub line: u32,
    /// When its first byte was read, in microseconds since the Unix epoch.
    pub at_us: i64,
    /// Where it came from.
    pub stream: Stream,
}

/// At most this many lines of an attempt are marked; the lines after them
/// are shown without time or stream.
pub const MAX_MARKS: usize = 20_000;

/// Bytes of a mark once encoded.
const MARK_BYTES: usize = 13;

/// The marks as stored: 13 bytes each (line, instant, stream), little
/// endian.
pub fn encode(marks: &[LineMark]) -> Vec<u8> {
    let mut out = Vec::with_capacity(marks.len() * MARK_BYTES);
    for m in marks {
        out.extend_from_slice(&m.line.to_le_bytes());
        out.extend_from_slice(&m.at_us.to_le_bytes());
        out.push(match m.stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        });
    }
    out
}

/// The marks of [`encode`]; a truncated or unknown record ends them.
pub fn decode(bytes: &[u8]) -> Vec<LineMark> {
    bytes
        .chunks_exact(MARK_BYTES)
        .take(MAX_MARKS)
        .map_while(|c| {
            let stream = match c[12] {
                0 => Stream::Stdout,
                1 => Stream::Stderr,
                _ => return None,
            };
            Some(LineMark {
                line: u32::from_le_bytes(c[0..4].try_into().ok()?),
                at_us: i64::from_le_bytes(c[4..12].try_into().ok()?),
                stream,
            })
        })
        .collect()
}

/// Marks the line starts of output as it is read: fed each chunk with its
/// stream and instant, it keeps a mark for every line that starts in it.
#[derive(Debug, Default)]
pub struct Marker {
    marks: Vec<LineMark>,
    /// Lines ended so far.
    lines: u32,
    /// Whether the next byte starts a line (so at first).
    mid_line: bool,
}

impl Marker {
    /// Takes a chunk of output read from `stream` at `at_us`.
    pub fn push(&mut self, bytes: &[u8], stream: Stream, at_us: i64) {
        for &b in bytes {
            if !self.mid_line {
                if self.marks.len() < MAX_MARKS {
                    self.marks.push(LineMark {
                        line: self.lines,
                        at_us,
                        stream,
                    });
                }
                self.mid_line = true;
            }
            if b == b'\n' {
                self.lines = self.lines.saturating_add(1);
                self.mid_line = false;
            }
        }
    }

    /// The marks, once the output has ended.
    pub fn finish(self) -> Vec<LineMark> {
        self.marks
    }
}

/// A line of output with where it came from (none for a line that has no
/// mark: an old log, or past [`MAX_MARKS`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line<'a> {
    /// Its text, without its newline.
    pub text: &'a str,
    /// Its mark.
    pub mark: Option<LineMark>,
}

/// The lines of `text` joined with their marks.
pub fn lines<'a>(text: &'a str, marks: &[LineMark]) -> Vec<Line<'a>> {
    let mut by_line = marks.iter().peekable();
    text.lines()
        .enumerate()
        .map(|(i, text)| {
            while by_line.peek().is_some_and(|m| (m.line as usize) < i) {
                by_line.next();
            }
            let mark = by_line
                .peek()
                .filter(|m| m.line as usize == i)
                .copied()
                .copied();
            Line { text, mark }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_line_is_marked_by_its_first_bytes_stream_and_instant() {
        let mut m = Marker::default();
        m.push(b"one\ntw", Stream::Stdout, 10);
        m.push(b"o\n", Stream::Stdout, 20);
        m.push(b"oops\n", Stream::Stderr, 30);
        m.push(b"", Stream::Stdout, 40);
        m.push(b"last", Stream::Stdout, 50);
        let marks = m.finish();
        let at: Vec<(u32, i64, Stream)> =
            marks.iter().map(|m| (m.line, m.at_us, m.stream)).collect();
        assert_eq!(
            at,
            [
                (0, 10, Stream::Stdout),
                (1, 10, Stream::Stdout),
                (2, 30, Stream::Stderr),
                (3, 50, Stream::Stdout)
            ]
        );
        let shown = lines("one\ntwo\noops\nlast", &marks);
        assert_eq!(shown[2].text, "oops");
        assert_eq!(shown[2].mark.unwrap().stream, Stream::Stderr);
        assert_eq!(shown.len(), 4);
        // An old log: no marks, the same lines.
        assert!(lines("a\nb\n", &[]).iter().all(|l| l.mark.is_none()));
    }

    #[test]
    fn marks_stop_at_their_bound() {
        let mut m = Marker::default();
        let many = "x\n".repeat(MAX_MARKS + 5);
        m.push(many.as_bytes(), Stream::Stdout, 1);
        assert_eq!(m.finish().len(), MAX_MARKS);
    }

    proptest! {
        #[test]
        fn marks_decode_as_encoded(raw in proptest::collection::vec((any::<u32>(), any::<i64>(), any::<bool>()), 0..50)) {
            let marks: Vec<LineMark> = raw
                .into_iter()
                .map(|(line, at_us, err)| LineMark {
                    line,
                    at_us,
                    stream: if err { Stream::Stderr } else { Stream::Stdout },
                })
                .collect();
            prop_assert_eq!(decode(&encode(&marks)), marks);
        }

        #[test]
        fn any_bytes_decode_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let marks = decode(&bytes);
            prop_assert!(marks.len() <= bytes.len() / 13);
        }

        #[test]
        fn every_line_gets_the_mark_of_its_start(chunks in proptest::collection::vec(("[a-c\n]{0,6}", any::<bool>()), 0..20)) {
            let mut m = Marker::default();
            let mut text = String::new();
            let mut starts = Vec::new();
            for (i, (chunk, err)) in chunks.iter().enumerate() {
                let stream = if *err { Stream::Stderr } else { Stream::Stdout };
                for c in chunk.chars() {
                    if text.is_empty() || text.ends_with('\n') {
                        starts.push((i as i64, stream));
                    }
                    text.push(c);
                }
                m.push(chunk.as_bytes(), stream, i as i64);
            }
            let marks = m.finish();
            let got: Vec<(i64, Stream)> = marks.iter().map(|m| (m.at_us, m.stream)).collect();
            prop_assert_eq!(got, starts);
            for (n, mark) in marks.iter().enumerate() {
                prop_assert_eq!(mark.line as usize, n);
            }
        }
    }
}
