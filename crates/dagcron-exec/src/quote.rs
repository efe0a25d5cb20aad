//! Putting a value into a string run by `/bin/sh -c` so that it is data
//! wherever its placeholder stands: outside quotes (one single-quoted
//! word), inside single quotes, inside double quotes (`${...}` in them
//! included), inside a command substitution `$( )`, in a comment or in a
//! here-document.
//!
//! [`Tracker`] follows the shell's quoting over the literal text around the
//! placeholders and quotes each value for the place it lands in. Where the
//! quoting is not one it follows well enough to be sure, a value is
//! refused rather than guessed at: right after a backslash, inside
//! backquotes (write `$( )`), inside arithmetic `$(( ))`, inside `$'...'`,
//! in a `case` inside `$( )`, in a here-document's line that holds a
//! substitution, or as a line that would end a here-document. (A string
//! the task hands to another shell, as `sh -c '...'` or `ssh`, is read
//! again there: values must reach such commands through the variables.)

/// Where the text has got to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ctx {
    /// Unquoted: at the top, or inside `$( )`, with its parentheses' depth
    /// and the `case` commands open in it.
    Plain { depth: u32, cases: u32 },
    /// Inside `$(( ))`, with its parentheses' depth.
    Arith { depth: u32 },
    /// Inside backquotes.
    Backquote,
    /// Inside `'...'`.
    Single,
    /// Inside `$'...'`.
    AnsiC,
    /// Inside `"..."`.
    Double,
    /// Inside `${...}` within double quotes.
    Brace,
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

/// The delimiter word after `<<`, as it is read.
#[derive(Debug, Default)]
struct Reading {
    strip_tabs: bool,
    word: String,
    quoted: bool,
    quote: Option<char>,
    escaped: bool,
}

/// The shell's blanks (not `\r` nor other Unicode spaces, which it takes
/// as part of a word).
fn blank(c: char) -> bool {
    c == ' ' || c == '\t' || c == '\n'
}

/// Follows the quoting of a shell script fed to it piece by piece.
#[derive(Debug)]
pub(crate) struct Tracker {
    stack: Vec<Ctx>,
    /// The previous character was an unquoted backslash.
    escaped: bool,
    /// The previous character (a word starts after blanks and operators).
    prev: char,
    /// The unquoted word being read (to see `case` and `esac`).
    word: String,
    /// Here-documents whose bodies start at the next newline.
    pending: Vec<Heredoc>,
    /// The current line of a here-document's body.
    line: String,
    /// The delimiter word after `<<`, while it is read.
    reading: Option<Reading>,
}

impl Default for Tracker {
    fn default() -> Tracker {
        Tracker {
            stack: vec![Ctx::Plain { depth: 0, cases: 0 }],
            escaped: false,
            prev: ' ',
            word: String::new(),
            pending: Vec::new(),
            line: String::new(),
            reading: None,
        }
    }
}

type Chars<'a> = std::iter::Peekable<std::str::Chars<'a>>;

/// Whether the characters coming are `what`; consumed if so.
fn take(chars: &mut Chars<'_>, what: &str) -> bool {
    let mut look = chars.clone();
    if what.chars().all(|c| look.next() == Some(c)) {
        for _ in what.chars() {
            chars.next();
        }
        true
    } else {
        false
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
            } else {
                match self.ctx().clone() {
                    Ctx::Heredoc(h) => self.heredoc(c, &h),
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
                    Ctx::AnsiC | Ctx::Backquote => {
                        let end = if *self.ctx() == Ctx::AnsiC { '\'' } else { '`' };
                        if self.escaped {
                            self.escaped = false;
                        } else if c == '\\' {
                            self.escaped = true;
                        } else if c == end {
                            self.stack.pop();
                        }
                    }
                    Ctx::Double | Ctx::Brace => self.double(c, &mut chars),
                    Ctx::Arith { .. } => self.arith(c, &mut chars),
                    Ctx::Plain { .. } => self.plain(c, &mut chars),
                }
            }
            self.prev = c;
        }
    }

    fn heredoc(&mut self, c: char, h: &Heredoc) {
        if c != '\n' {
            self.line.push(c);
            return;
        }
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
    }

    /// Inside `"..."` or a `${...}` within them.
    fn double(&mut self, c: char, chars: &mut Chars<'_>) {
        if self.escaped {
            self.escaped = false;
            return;
        }
        let brace = *self.ctx() == Ctx::Brace;
        match c {
            '\\' => self.escaped = true,
            '"' if brace => self.stack.push(Ctx::Double),
            '"' => {
                self.stack.pop();
            }
            '}' if brace => {
                self.stack.pop();
            }
            '`' => self.stack.push(Ctx::Backquote),
            '$' => self.dollar(chars),
            _ => {}
        }
    }

    /// `$` unquoted or in double quotes: what opens after it.
    fn dollar(&mut self, chars: &mut Chars<'_>) {
        if take(chars, "((") {
            self.stack.push(Ctx::Arith { depth: 0 });
        } else if take(chars, "(") {
            self.stack.push(Ctx::Plain { depth: 0, cases: 0 });
        } else if take(chars, "{") {
            if matches!(self.ctx(), Ctx::Double | Ctx::Brace) {
                self.stack.push(Ctx::Brace);
            }
        } else if matches!(self.ctx(), Ctx::Plain { .. }) && take(chars, "'") {
            self.stack.push(Ctx::AnsiC);
        }
    }

    fn arith(&mut self, c: char, chars: &mut Chars<'_>) {
        let Some(Ctx::Arith { depth }) = self.stack.last_mut() else {
            return;
        };
        match c {
            '(' => *depth += 1,
            ')' if *depth > 0 => *depth -= 1,
            ')' => {
                take(chars, ")");
                self.stack.pop();
            }
            _ => {}
        }
    }

    fn plain(&mut self, c: char, chars: &mut Chars<'_>) {
        if self.escaped {
            self.escaped = false;
            return;
        }
        if c.is_ascii_alphanumeric() || c == '_' {
            self.word.push(c);
        } else {
            self.end_word();
        }
        let word_start = blank(self.prev) || ";&|()".contains(self.prev);
        match c {
            '\\' => self.escaped = true,
            '\'' => self.stack.push(Ctx::Single),
            '"' => self.stack.push(Ctx::Double),
            '#' if word_start => self.stack.push(Ctx::Comment),
            '`' => self.stack.push(Ctx::Backquote),
            '$' => self.dollar(chars),
            '(' => {
                if let Some(Ctx::Plain { depth, .. }) = self.stack.last_mut() {
                    *depth += 1;
                }
            }
            ')' => {
                let nested = self.stack.len() > 1;
                match self.stack.last_mut() {
                    Some(Ctx::Plain { depth, .. }) if *depth > 0 => *depth -= 1,
                    // A pattern of a `case`, not the end of the `$( )`.
                    Some(Ctx::Plain { cases, .. }) if *cases > 0 => {}
                    Some(Ctx::Plain { .. }) if nested => {
                        self.stack.pop();
                    }
                    _ => {}
                }
            }
            // `<<<` is a here-string, not a here-document.
            '<' if take(chars, "<") && !take(chars, "<") => {
                self.reading = Some(Reading {
                    strip_tabs: take(chars, "-"),
                    ..Reading::default()
                });
            }
            '\n' => self.newline(),
            _ => {}
        }
    }

    /// An unquoted word ended: `case` and `esac` open and close a `case`.
    fn end_word(&mut self) {
        let word = std::mem::take(&mut self.word);
        if let Some(Ctx::Plain { cases, .. }) = self.stack.last_mut() {
            match word.as_str() {
                "case" => *cases += 1,
                "esac" => *cases = cases.saturating_sub(1),
                _ => {}
            }
        }
    }

    /// A character of the delimiter word after `<<`.
    fn read_delimiter(&mut self, c: char) {
        let r = self.reading.as_mut().expect("reading");
        if r.escaped {
            r.escaped = false;
            r.word.push(c);
            return;
        }
        if let Some(q) = r.quote {
            if c == q {
                r.quote = None;
            } else {
                r.word.push(c);
            }
            return;
        }
        match c {
            '\\' => {
                r.escaped = true;
                r.quoted = true;
            }
            '\'' | '"' => {
                r.quote = Some(c);
                r.quoted = true;
            }
            ' ' | '\t' if r.word.is_empty() && !r.quoted => {}
            c if blank(c) || ";&|<>()".contains(c) => {
                let r = self.reading.take().expect("reading");
                self.pending.push(Heredoc {
                    delimiter: r.word,
                    expands: !r.quoted,
                    strip_tabs: r.strip_tabs,
                });
                if c == '\n' {
                    self.newline();
                }
            }
            c => r.word.push(c),
        }
    }

    /// An unquoted newline: a pending here-document's body starts.
    fn newline(&mut self) {
        if matches!(self.ctx(), Ctx::Plain { .. }) {
            self.next_heredoc();
        }
    }

    fn next_heredoc(&mut self) {
        if !self.pending.is_empty() {
            let h = self.pending.remove(0);
            self.stack.push(Ctx::Heredoc(h));
        }
    }

    /// Why a value cannot be put where the script has got to, if it
    /// cannot.
    fn refusal(&self) -> Option<&'static str> {
        if self.reading.is_some() {
            return Some("in a here-document's delimiter");
        }
        if self.escaped {
            return Some("right after a backslash");
        }
        let nested = self.stack.iter().skip(1);
        for ctx in self.stack.iter() {
            match ctx {
                Ctx::Backquote => return Some("inside backquotes (write $( ) instead)"),
                Ctx::Arith { .. } => return Some("inside arithmetic $(( ))"),
                Ctx::AnsiC => return Some("inside $'...'"),
                _ => {}
            }
        }
        if nested
            .into_iter()
            .any(|c| matches!(c, Ctx::Plain { cases, .. } if *cases > 0))
        {
            return Some("in a case command inside $( )");
        }
        if let Ctx::Heredoc(h) = self.ctx()
            && h.expands
            && (self.line.contains("$(")
                || self.line.contains("${")
                || self.line.contains('`')
                || self.line.ends_with('\\'))
        {
            return Some("in a line of a here-document that holds a substitution or a backslash");
        }
        None
    }

    /// Writes `value` to `out` quoted for where the script has got to, and
    /// follows what was written; refused where that is not sure.
    pub(crate) fn put(&mut self, value: &str, out: &mut String) -> Result<(), String> {
        if let Some(why) = self.refusal() {
            return Err(format!(
                "a value cannot be put {why}: use its variable instead"
            ));
        }
        let quoted = match self.ctx() {
            Ctx::Plain { .. } => format!("'{}'", value.replace('\'', r"'\''")),
            Ctx::Single => value.replace('\'', r"'\''"),
            Ctx::Double | Ctx::Brace => escape(value, "\\$`\""),
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
                        "a value would end the here-document `{}` early: use its variable instead",
                        h.delimiter
                    ));
                }
                if h.expands {
                    escape(value, "\\$`")
                } else {
                    value.to_string()
                }
            }
            Ctx::Arith { .. } | Ctx::Backquote | Ctx::AnsiC => unreachable!("refused above"),
        };
        // What was written leaves the quoting where it was, except in a
        // here-document, whose current line it extends.
        if let Ctx::Heredoc(_) = self.ctx() {
            match quoted.rsplit_once('\n') {
                Some((_, last)) => self.line = last.to_string(),
                None => self.line.push_str(&quoted),
            }
        }
        self.end_word();
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

    /// The script with every `{}` replaced by `value`, quoted where it
    /// stands.
    fn script(template: &str, value: &str) -> Result<String, String> {
        let mut t = Tracker::default();
        let mut out = String::new();
        let mut pieces = template.split("{}");
        let first = pieces.next().unwrap_or("");
        t.feed(first);
        out.push_str(first);
        for piece in pieces {
            t.put(value, &mut out)?;
            t.feed(piece);
            out.push_str(piece);
        }
        Ok(out)
    }

    /// Runs `script` with `sh -c`: it must create no `pwned`; what it printed.
    fn run(template: &str, value: &str, script: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let made: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(
            made.is_empty(),
            "{template:?} with {value:?} ran code: {script}"
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    const HOSTILE: &[&str] = &[
        "x; touch pwned",
        "x; touch pwned; #",
        "$(touch pwned)",
        "`touch pwned`",
        "`;touch pwned;`",
        "it's \"$(touch pwned)\"",
        "a\\\"; touch pwned; echo \"",
        "'; touch pwned; '",
        "\\';touch pwned;#",
        "line\ntouch pwned",
        "x\nEOF\ntouch pwned",
        "x\nEOF\r\ntouch pwned\r\n",
        "\\",
    ];

    /// Where a careless author may put a value: each runs nothing, or is
    /// refused.
    const ANYWHERE: &[&str] = &[
        "cat <<EOF\nname: $(echo {} | tr a-z A-Z)\nEOF",
        "cat <<EOF\nname: `echo {}`\nEOF",
        "echo \"C:\\Users\\{}\"",
        "echo \"C:\\data\\{}\"; echo {}",
        "echo \\{}",
        "cat <<EOF\nC:\\{}\nEOF",
        "x=`basename \"{}\"`; echo $x",
        "x=`true # {}`",
        "mask=$((1 << 3))\necho {}",
        "echo $(( {} + 1 ))",
        "echo \"result: $(case \"$MODE\" in fast) echo quick;; *) echo {};; esac)\"",
        "echo \"${NAME:-\"{}\"}\"",
        "cat <<EOF\r\nhello\r\nEOF\r\necho {}\r\n",
        "cat <<EOF\r\n{}\r\nEOF",
        "echo hello\u{a0}# {}",
        "echo hello\r# {}",
        "cat <<'E O F'\nhi\nE O F\necho {}",
        "echo $'{}'",
        "cat <<<\"hi\"\necho {}",
        "cat <<A <<B\na {}\nA\nb {}\nB\necho {}",
        "x=1 # {}\necho {}",
    ];

    /// Where a value is put and printed as it is.
    const WORKING: &[&str] = &[
        "echo {}",
        "echo '{}'",
        "echo \"{}\"",
        "echo \"[{}]\"",
        "echo \"$(echo {})\"",
        "echo $(echo \"{}\")",
        "echo 'a' \"b\" {} 'c'",
        "echo \"it's\" {}",
        "echo \"${NAME:-{}}\"",
        "echo ${NAME:-{}}",
        "cat <<EOF\n{}\nEOF",
        "cat <<-EOF\n\t{}\n\tEOF",
        "cat <<'EOF'\n{}\nEOF",
        "cat <<EOF; echo after\npre {} post\nEOF",
        "cat <<EOF\n$(date +%Y) is the year\n{}\nEOF",
        "case x in x) echo {};; esac",
    ];

    #[test]
    fn a_value_is_data_wherever_it_stands() {
        let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        for value in HOSTILE {
            for template in ANYWHERE {
                if let Ok(s) = script(template, value) {
                    run(template, value, &s);
                }
            }
            for template in WORKING {
                match script(template, value) {
                    Ok(s) => {
                        let printed = run(template, value, &s);
                        // Printed as written (unquoted output is split
                        // into words).
                        assert!(
                            words(&printed).contains(&words(value.trim_end_matches('\\'))),
                            "{template:?} with {value:?} printed {printed:?}"
                        );
                    }
                    // Only a line that would end its here-document.
                    Err(e) => assert!(
                        template.contains("<<") && value.contains("EOF"),
                        "{template:?} with {value:?}: {e}"
                    ),
                }
            }
        }
    }

    #[test]
    fn a_value_is_refused_where_its_quoting_is_not_sure() {
        for (template, why) in [
            ("echo `echo {}`", "inside backquotes"),
            ("echo \\{}", "right after a backslash"),
            ("echo $(( {} ))", "arithmetic"),
            ("echo $(case a in a) echo {};; esac)", "case"),
            ("cat <<EOF\n$(echo {})\nEOF", "here-document"),
            ("cat <<EOF\n{}\nEOF", "would end the here-document"),
        ] {
            let e = script(template, "x\nEOF").unwrap_err();
            assert!(e.contains(why), "{template:?}: {e}");
        }
        assert!(script("cat <<EOF\n{}\nEOF", "EOF is a word").is_ok());
        assert!(script("echo {}", "x\nEOF").is_ok());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Any value made of the shell's special characters, wherever it
        /// stands, runs nothing (or is refused).
        #[test]
        fn any_value_runs_nothing(
            value in "[a-z ;&|$`'\"\\\\(){}<>#\\n\\r*?!=-]{0,24}",
            template in proptest::sample::select(ANYWHERE.iter().chain(WORKING).copied().collect::<Vec<_>>()),
        ) {
            let value = format!("{value} touch pwned");
            if let Ok(s) = script(template, &value) {
                run(template, &value, &s);
            }
        }
    }
}
