//! Putting a value into a string run by `/bin/sh -c` so that it is data
//! wherever its placeholder stands: outside quotes (one single-quoted
//! word), inside single quotes, inside double quotes, inside a command
//! substitution, in a here-document or in a comment.
//!
//! [`Tracker`] follows the shell's quoting over the literal text around the
//! placeholders (as far as quoting goes: quotes, backslashes, `$(...)` and
//! backquotes, comments and here-documents) and quotes each value for the
//! place it lands in. A value that would end a here-document early (a line
//! that is its delimiter) is refused.

/// Where the text has got to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ctx {
    /// Unquoted: at the top, or inside `$( )` with its parentheses' depth.
    Plain { depth: u32 },
    /// Inside backquotes.
    Backquote,
    /// Inside `'...'`.
    Single,
    /// Inside `"..."`.
    Double,
    /// A comment, to the end of the line.
    Comment,
    /// The body of a here-document.
    Heredoc(Heredoc),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Heredoc {
    delimiter: String,
    /// Its delimiter was not quoted: `$`, backquotes and `\` work in it.
    expands: bool,
    /// `<<-`: leading tabs are stripped, from the delimiter line too.
    strip_tabs: bool,
}

/// Follows the quoting of a shell script fed to it piece by piece.
#[derive(Debug)]
pub(crate) struct Tracker {
    stack: Vec<Ctx>,
    /// The previous character was an unquoted backslash.
    escaped: bool,
    /// The previous character (a word starts after blanks and operators).
    prev: char,
    /// Here-documents whose bodies start at the next newline.
    pending: Vec<Heredoc>,
    /// The current line of a here-document's body.
    line: String,
    /// Text after `<<` while its delimiter word is read.
    reading: Option<(bool, String)>,
}

impl Default for Tracker {
    fn default() -> Tracker {
        Tracker {
            stack: vec![Ctx::Plain { depth: 0 }],
            escaped: false,
            prev: ' ',
            pending: Vec::new(),
            line: String::new(),
            reading: None,
        }
    }
}

impl Tracker {
    fn ctx(&self) -> &Ctx {
        self.stack.last().expect("never empty")
    }

    /// Follows `text`, written as it is into the script.
    pub(crate) fn feed(&mut self, text: &str) {
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if self.reading.is_some() {
                self.read_delimiter(c);
                self.prev = c;
                continue;
            }
            match self.ctx().clone() {
                Ctx::Heredoc(h) => {
                    if c == '\n' {
                        let line = std::mem::take(&mut self.line);
                        let line = if h.strip_tabs {
                            line.trim_start_matches('\t')
                        } else {
                            &line
                        };
                        if line == h.delimiter {
                            self.stack.pop();
                            self.next_heredoc();
                        }
                    } else {
                        self.line.push(c);
                    }
                }
                Ctx::Comment => {
                    if c == '\n' {
                        self.stack.pop();
                        self.newline();
                    }
                }
                Ctx::Single => {
                    if c == '\'' {
                        self.stack.pop();
                    }
                }
                Ctx::Double => {
                    if self.escaped {
                        self.escaped = false;
                    } else if c == '\\' {
                        self.escaped = true;
                    } else if c == '"' {
                        self.stack.pop();
                    } else if c == '`' {
                        self.stack.push(Ctx::Backquote);
                    } else if c == '$' && chars.peek() == Some(&'(') {
                        chars.next();
                        self.stack.push(Ctx::Plain { depth: 0 });
                    }
                }
                Ctx::Plain { .. } | Ctx::Backquote => self.plain(c, &mut chars),
            }
            self.prev = c;
        }
    }

    fn plain(&mut self, c: char, chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
        if self.escaped {
            self.escaped = false;
            return;
        }
        let word_start = self.prev.is_whitespace() || ";&|()".contains(self.prev);
        match c {
            '\\' => self.escaped = true,
            '\'' => self.stack.push(Ctx::Single),
            '"' => self.stack.push(Ctx::Double),
            '#' if word_start => self.stack.push(Ctx::Comment),
            '`' if *self.ctx() == Ctx::Backquote => {
                self.stack.pop();
            }
            '`' => self.stack.push(Ctx::Backquote),
            '$' if chars.peek() == Some(&'(') => {
                chars.next();
                self.stack.push(Ctx::Plain { depth: 0 });
            }
            '(' => {
                if let Some(Ctx::Plain { depth }) = self.stack.last_mut() {
                    *depth += 1;
                }
            }
            ')' => {
                let nested = self.stack.len() > 1;
                match self.stack.last_mut() {
                    Some(Ctx::Plain { depth }) if *depth > 0 => *depth -= 1,
                    Some(Ctx::Plain { .. }) if nested => {
                        self.stack.pop();
                    }
                    _ => {}
                }
            }
            '<' if chars.peek() == Some(&'<') => {
                chars.next();
                let strip_tabs = chars.peek() == Some(&'-');
                if strip_tabs {
                    chars.next();
                }
                self.reading = Some((strip_tabs, String::new()));
            }
            '\n' => self.newline(),
            _ => {}
        }
    }

    /// A character of the delimiter word after `<<`.
    fn read_delimiter(&mut self, c: char) {
        let (strip_tabs, word) = self.reading.as_mut().expect("reading");
        let ends = c.is_whitespace() || ";&|<>()".contains(c);
        if !ends || word.is_empty() && c != '\n' && c.is_whitespace() {
            if !c.is_whitespace() {
                word.push(c);
            }
            return;
        }
        let quoted = word.contains(['\'', '"', '\\']);
        let delimiter: String = word.chars().filter(|c| !"'\"\\".contains(*c)).collect();
        self.pending.push(Heredoc {
            delimiter,
            expands: !quoted,
            strip_tabs: *strip_tabs,
        });
        self.reading = None;
        if c == '\n' {
            self.newline();
        }
    }

    /// An unquoted newline: a pending here-document's body starts.
    fn newline(&mut self) {
        if matches!(self.ctx(), Ctx::Plain { .. } | Ctx::Backquote) {
            self.next_heredoc();
        }
    }

    fn next_heredoc(&mut self) {
        if !self.pending.is_empty() {
            let h = self.pending.remove(0);
            self.stack.push(Ctx::Heredoc(h));
        }
    }

    /// Writes `value` to `out` quoted for where the script has got to, and
    /// follows what was written; refused if it would end a here-document.
    pub(crate) fn put(&mut self, value: &str, out: &mut String) -> Result<(), String> {
        let quoted = match self.ctx() {
            Ctx::Plain { .. } => format!("'{}'", value.replace('\'', r"'\''")),
            // Backquotes end at the next unescaped backquote, quotes or
            // not: backquotes and backslashes are escaped once more.
            Ctx::Backquote => escape(&format!("'{}'", value.replace('\'', r"'\''")), "\\`"),
            Ctx::Single => value.replace('\'', r"'\''"),
            Ctx::Double => escape(value, "\\$`\""),
            Ctx::Comment => value.replace(['\n', '\r'], " "),
            Ctx::Heredoc(h) => {
                // Only a whole line can end it: the one the value starts on
                // (with what precedes it) and the ones it holds.
                let mut lines = value.split('\n');
                let first = format!("{}{}", self.line, lines.next().unwrap_or(""));
                let ends = |l: &str| {
                    let l = if h.strip_tabs {
                        l.trim_start_matches('\t')
                    } else {
                        l
                    };
                    l == h.delimiter
                };
                if value.contains('\n') && (ends(&first) || lines.any(ends)) {
                    return Err(format!(
                        "a value would end the here-document `{}` early: use the variable instead",
                        h.delimiter
                    ));
                }
                if h.expands {
                    escape(value, "\\$`")
                } else {
                    value.to_string()
                }
            }
        };
        // What was written leaves the quoting where it was, except in a
        // here-document, whose current line it extends.
        if let Ctx::Heredoc(_) = self.ctx() {
            match quoted.rsplit_once('\n') {
                Some((_, last)) => self.line = last.to_string(),
                None => self.line.push_str(&quoted),
            }
        }
        self.prev = quoted.chars().last().unwrap_or(self.prev);
        out.push_str(&quoted);
        Ok(())
    }
}

fn escape(value: &str, special: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if special.contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::Tracker;

    /// The script with `{}` replaced by `value`, quoted where it stands.
    fn script(template: &str, value: &str) -> Result<String, String> {
        let mut t = Tracker::default();
        let mut out = String::new();
        let (before, after) = template.split_once("{}").expect("a placeholder");
        t.feed(before);
        out.push_str(before);
        t.put(value, &mut out)?;
        out.push_str(after);
        Ok(out)
    }

    /// Runs the script with `sh -c` and returns what it printed; the
    /// hostile value must come out as written and run nothing.
    fn run(template: &str, value: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let s = script(template, value).unwrap();
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&s)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            !dir.path().join("pwned").exists(),
            "{template:?} with {value:?} ran code: {s}"
        );
        String::from_utf8(out.stdout).unwrap()
    }

    const HOSTILE: &[&str] = &[
        "x; touch pwned",
        "$(touch pwned)",
        "`touch pwned`",
        "it's \"$(touch pwned)\"",
        "a\\\"; touch pwned; echo \"",
        "'; touch pwned; '",
        "line\ntouch pwned",
        "\\",
    ];

    #[test]
    fn a_value_is_data_wherever_it_stands() {
        for value in HOSTILE {
            for template in [
                "echo {}",
                "echo '{}'",
                "echo \"{}\"",
                "echo \"[{}]\"",
                "echo \"$(echo {})\"",
                "echo $(echo \"{}\")",
                "echo `echo {}`",
                "echo 'a' \"b\" {} 'c'",
                "x=1 # {}\necho {}",
                "cat <<EOF\n{}\nEOF",
                "cat <<-EOF\n\t{}\n\tEOF",
                "cat <<'EOF'\n{}\nEOF",
                "cat <<EOF; echo after\npre {} post\nEOF",
                "echo \"it's\" {}",
            ] {
                let printed = run(template, value);
                let lone = template.matches("{}").count() == 1;
                // Printed as written (unquoted output is split into words).
                let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
                if lone && !template.contains('#') {
                    assert!(
                        words(&printed).contains(&words(value.trim_end_matches('\\'))),
                        "{template:?} with {value:?} printed {printed:?}"
                    );
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Any value made of the shell's special characters, wherever it
        /// stands, runs nothing (a here-document's delimiter aside, which
        /// is refused).
        #[test]
        fn any_value_runs_nothing(
            value in "[a-z ;&|$`'\"\\(){}<>#\n*?!=-]{0,24}",
            template in proptest::sample::select(vec![
                "echo {}", "echo '{}'", "echo \"{}\"", "echo \"$(echo {})\"",
                "echo `echo {}`", "cat <<EOF\n{}\nEOF", "cat <<'EOF'\n{}\nEOF", "true # {}\necho x",
            ]),
        ) {
            let value = format!("{value} touch pwned");
            if script(template, &value).is_ok() {
                run(template, &value);
            }
        }
    }

    #[test]
    fn a_value_that_would_end_a_here_document_is_refused() {
        assert!(script("cat <<EOF\n{}\nEOF", "x\nEOF\ntouch pwned").is_err());
        assert!(script("cat <<-EOF\n{}\nEOF", "x\n\tEOF").is_err());
        assert!(script("cat <<EOF\n{}\nEOF", "EOF is a word").is_ok());
        assert!(script("echo {}", "x\nEOF").is_ok());
    }
}
