//! `when:` conditions: whether a task whose trigger rule lets it start runs
//! at all (false: it is `skipped`, and the skip flows downstream through
//! the trigger rules like any other).
//!
//! A deliberately small language over the run's parameters and the
//! outputs of upstream tasks, not a general expression language:
//!
//! ```text
//! condition := or
//! or        := and ("or" and)*
//! and       := not ("and" not)*
//! not       := "not" not | "(" condition ")" | test
//! test      := value ("==" | "!=") value
//!            | value ["not"] "in" "[" value ("," value)* "]"
//!            | value                      (true when it is "true")
//! value     := params.<name> | tasks.<task>.outputs.<name>
//!            | 'text' | "text" | a number | true | false
//! ```
//!
//! Every value is text: numbers and `true`/`false` are compared as they
//! are written (`rows == 0` is `rows == '0'`). A parameter or an output
//! that is not there is *absent*: it equals nothing, so `==` and `in` are
//! false and `!=` and `not in` true. A condition is at most
//! [`MAX_LEN`] bytes and nests at most [`MAX_DEPTH`] deep.

use std::collections::BTreeMap;

use crate::outputs::{Outputs, Ref};

/// The longest condition, in bytes.
pub const MAX_LEN: usize = 1024;

/// The deepest nesting of `not` and parentheses.
pub const MAX_DEPTH: usize = 32;

/// A parsed condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// Both hold.
    And(Box<Condition>, Box<Condition>),
    /// Either holds.
    Or(Box<Condition>, Box<Condition>),
    /// It does not hold.
    Not(Box<Condition>),
    /// Two values are equal (both present).
    Eq(Value, Value),
    /// The value is one of the list.
    In(Value, Vec<Value>),
    /// The value is `true`.
    Truthy(Value),
}

/// A value of a condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// Written out.
    Literal(String),
    /// A run parameter.
    Param(String),
    /// An upstream task's output.
    Output(Ref),
}

/// What a condition is evaluated against.
pub struct Facts<'a> {
    /// The run's parameters.
    pub params: &'a BTreeMap<String, String>,
    /// The outputs of the run's tasks that have some, by task id.
    pub outputs: &'a dyn Fn(&str) -> Option<&'a Outputs>,
}

impl Value {
    fn get(&self, facts: &Facts<'_>) -> Option<String> {
        match self {
            Value::Literal(s) => Some(s.clone()),
            Value::Param(p) => facts.params.get(p).cloned(),
            Value::Output(r) => (facts.outputs)(&r.task).and_then(|o| o.get(&r.key).cloned()),
        }
    }
}

impl Condition {
    /// Parses `text`; an error says where and what was expected.
    pub fn parse(text: &str) -> Result<Condition, String> {
        if text.len() > MAX_LEN {
            return Err(format!(
                "the condition is {} bytes; at most {MAX_LEN} are accepted",
                text.len()
            ));
        }
        let tokens = lex(text)?;
        let mut p = Parser {
            tokens,
            at: 0,
            depth: 0,
        };
        let c = p.or()?;
        match p.tokens.get(p.at) {
            None => Ok(c),
            Some((pos, t)) => Err(format!(
                "at column {}: unexpected {}; expected `and`, `or` or the end",
                pos + 1,
                t.describe()
            )),
        }
    }

    /// Whether it holds.
    pub fn holds(&self, facts: &Facts<'_>) -> bool {
        match self {
            Condition::And(a, b) => a.holds(facts) && b.holds(facts),
            Condition::Or(a, b) => a.holds(facts) || b.holds(facts),
            Condition::Not(c) => !c.holds(facts),
            Condition::Eq(a, b) => match (a.get(facts), b.get(facts)) {
                (Some(x), Some(y)) => x == y,
                _ => false,
            },
            Condition::In(v, list) => match v.get(facts) {
                Some(x) => list.iter().any(|l| l.get(facts).as_ref() == Some(&x)),
                None => false,
            },
            Condition::Truthy(v) => v.get(facts).is_some_and(|x| x == "true"),
        }
    }

    /// The upstream outputs it reads.
    pub fn references(&self) -> Vec<Ref> {
        let mut out = Vec::new();
        self.each_value(&mut |v| {
            if let Value::Output(r) = v {
                out.push(r.clone());
            }
        });
        out
    }

    fn each_value(&self, f: &mut dyn FnMut(&Value)) {
        match self {
            Condition::And(a, b) | Condition::Or(a, b) => {
                a.each_value(f);
                b.each_value(f);
            }
            Condition::Not(c) => c.each_value(f),
            Condition::Eq(a, b) => {
                f(a);
                f(b);
            }
            Condition::In(v, list) => {
                f(v);
                list.iter().for_each(&mut *f);
            }
            Condition::Truthy(v) => f(v),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Text(String),
    Eq,
    Ne,
    Open,
    Close,
    OpenList,
    CloseList,
    Comma,
}

impl Token {
    fn describe(&self) -> String {
        match self {
            Token::Word(w) => format!("`{w}`"),
            Token::Text(t) => format!("the text {t:?}"),
            Token::Eq => "`==`".into(),
            Token::Ne => "`!=`".into(),
            Token::Open => "`(`".into(),
            Token::Close => "`)`".into(),
            Token::OpenList => "`[`".into(),
            Token::CloseList => "`]`".into(),
            Token::Comma => "`,`".into(),
        }
    }
}

fn lex(text: &str) -> Result<Vec<(usize, Token)>, String> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let token = match c {
            c if c.is_whitespace() => continue,
            '(' => Token::Open,
            ')' => Token::Close,
            '[' => Token::OpenList,
            ']' => Token::CloseList,
            ',' => Token::Comma,
            '=' | '!' => match chars.next() {
                Some((_, '=')) => {
                    if c == '=' {
                        Token::Eq
                    } else {
                        Token::Ne
                    }
                }
                _ => {
                    return Err(format!(
                        "at column {}: `{c}` alone; compare with `==` or `!=`",
                        i + 1
                    ));
                }
            },
            '\'' | '"' => {
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some((_, q)) if q == c => break,
                        Some((_, ch)) => s.push(ch),
                        None => {
                            return Err(format!(
                                "at column {}: the text starting here is not closed by {c}",
                                i + 1
                            ));
                        }
                    }
                }
                Token::Text(s)
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' => {
                let mut w = String::from(c);
                while let Some(&(_, ch)) = chars.peek() {
                    if ch.is_ascii_alphanumeric() || ch == '_' || ch == '-' || ch == '.' {
                        w.push(ch);
                        chars.next();
                    } else {
                        break;
                    }
                }
                Token::Word(w)
            }
            other => {
                return Err(format!(
                    "at column {}: unexpected {other:?}",
                    text[..i].chars().count() + 1
                ));
            }
        };
        out.push((i, token));
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<(usize, Token)>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at).map(|(_, t)| t)
    }

    fn word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(x)) if x == w)
    }

    fn expected(&self, what: &str) -> String {
        match self.tokens.get(self.at) {
            Some((pos, t)) => format!(
                "at column {}: expected {what}, found {}",
                pos + 1,
                t.describe()
            ),
            None => format!("at the end: expected {what}"),
        }
    }

    fn or(&mut self) -> Result<Condition, String> {
        let mut c = self.and()?;
        while self.word("or") {
            self.at += 1;
            c = Condition::Or(Box::new(c), Box::new(self.and()?));
        }
        Ok(c)
    }

    fn and(&mut self) -> Result<Condition, String> {
        let mut c = self.not()?;
        while self.word("and") {
            self.at += 1;
            c = Condition::And(Box::new(c), Box::new(self.not()?));
        }
        Ok(c)
    }

    fn not(&mut self) -> Result<Condition, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("the condition nests deeper than {MAX_DEPTH}"));
        }
        let c = if self.word("not") {
            self.at += 1;
            Condition::Not(Box::new(self.not()?))
        } else if self.peek() == Some(&Token::Open) {
            self.at += 1;
            let c = self.or()?;
            if self.peek() != Some(&Token::Close) {
                return Err(self.expected("`)`"));
            }
            self.at += 1;
            c
        } else {
            self.test()?
        };
        self.depth -= 1;
        Ok(c)
    }

    fn test(&mut self) -> Result<Condition, String> {
        let left = self.value()?;
        match self.peek() {
            Some(Token::Eq) => {
                self.at += 1;
                Ok(Condition::Eq(left, self.value()?))
            }
            Some(Token::Ne) => {
                self.at += 1;
                Ok(Condition::Not(Box::new(Condition::Eq(left, self.value()?))))
            }
            Some(Token::Word(w)) if w == "in" => {
                self.at += 1;
                Ok(Condition::In(left, self.list()?))
            }
            Some(Token::Word(w)) if w == "not" => {
                self.at += 1;
                if !self.word("in") {
                    return Err(self.expected("`in` after `not`"));
                }
                self.at += 1;
                Ok(Condition::Not(Box::new(Condition::In(left, self.list()?))))
            }
            _ => Ok(Condition::Truthy(left)),
        }
    }

    fn list(&mut self) -> Result<Vec<Value>, String> {
        if self.peek() != Some(&Token::OpenList) {
            return Err(self.expected("a list in `[` `]`"));
        }
        self.at += 1;
        let mut out = vec![self.value()?];
        loop {
            match self.peek() {
                Some(Token::Comma) => {
                    self.at += 1;
                    out.push(self.value()?);
                }
                Some(Token::CloseList) => {
                    self.at += 1;
                    return Ok(out);
                }
                _ => return Err(self.expected("`,` or `]`")),
            }
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        let what =
            "a value (params.<name>, tasks.<task>.outputs.<name>, 'text', a number, true or false)";
        let Some((pos, token)) = self.tokens.get(self.at).cloned() else {
            return Err(self.expected(what));
        };
        let value = match token {
            Token::Text(s) => Value::Literal(s),
            Token::Word(w) if matches!(w.as_str(), "and" | "or" | "not" | "in") => {
                return Err(self.expected(what));
            }
            Token::Word(w) => {
                if let Some(p) = w.strip_prefix("params.") {
                    if !crate::outputs::valid_key(p) {
                        return Err(format!(
                            "at column {}: {w:?} does not name a parameter",
                            pos + 1
                        ));
                    }
                    Value::Param(p.to_string())
                } else if let Some(path) = w.strip_prefix("tasks.") {
                    match crate::outputs::reference(path) {
                        Some(r) => Value::Output(r),
                        None => {
                            return Err(format!(
                                "at column {}: {w:?} is not of the form tasks.<task>.outputs.<name>",
                                pos + 1
                            ));
                        }
                    }
                } else if w == "true" || w == "false" || w.parse::<f64>().is_ok() {
                    Value::Literal(w)
                } else {
                    return Err(format!(
                        "at column {}: {w:?} is not a value: quote text ('{w}'), or refer to params.<name> or tasks.<task>.outputs.<name>",
                        pos + 1
                    ));
                }
            }
            _ => return Err(self.expected(what)),
        };
        self.at += 1;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(text: &str, params: &[(&str, &str)], outputs: &[(&str, &str, &str)]) -> bool {
        let params: BTreeMap<String, String> = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut by_task: BTreeMap<String, Outputs> = BTreeMap::new();
        for (t, k, v) in outputs {
            by_task
                .entry(t.to_string())
                .or_default()
                .insert(k.to_string(), v.to_string());
        }
        let look = |t: &str| by_task.get(t);
        let facts = Facts {
            params: &params,
            outputs: &look,
        };
        Condition::parse(text).unwrap().holds(&facts)
    }

    #[test]
    fn comparisons_lists_and_logic() {
        let p = [("env", "prod"), ("region", "eu")];
        let o = [("check", "changed", "true"), ("count", "rows", "0")];
        assert!(eval("params.env == 'prod'", &p, &o));
        assert!(eval("params.env != \"dev\"", &p, &o));
        assert!(eval("params.region in ['eu', 'us']", &p, &o));
        assert!(!eval("params.region not in ['eu', 'us']", &p, &o));
        assert!(eval("tasks.check.outputs.changed", &p, &o));
        assert!(eval("tasks.count.outputs.rows == 0", &p, &o));
        assert!(eval(
            "not (tasks.count.outputs.rows != 0) and (params.env == 'dev' or params.region == 'eu')",
            &p,
            &o
        ));
        assert!(!eval(
            "params.env == 'prod' and not tasks.check.outputs.changed",
            &p,
            &o
        ));
        assert!(eval("params.env == params.env", &p, &o));
    }

    #[test]
    fn absent_values_equal_nothing() {
        assert!(!eval("params.missing == ''", &[], &[]));
        assert!(eval("params.missing != 'x'", &[], &[]));
        assert!(!eval("tasks.a.outputs.x in ['1']", &[], &[]));
        assert!(eval("tasks.a.outputs.x not in ['1']", &[], &[]));
        assert!(!eval("tasks.a.outputs.x", &[], &[]));
        assert!(!eval("params.missing == params.other", &[], &[]));
    }

    #[test]
    fn errors_say_where() {
        let err = |t: &str| Condition::parse(t).unwrap_err();
        assert_eq!(
            err("params.env = 'x'"),
            "at column 12: `=` alone; compare with `==` or `!=`"
        );
        assert!(err("params.env == prod").contains("\"prod\" is not a value: quote text"));
        assert!(err("params.env ==").contains("at the end: expected a value"));
        assert!(err("(params.a == 'x'").contains("expected `)`"));
        assert!(err("params.a in 'x'").contains("expected a list"));
        assert!(err("params.a == 'x' params.b").contains("unexpected `params.b`"));
        assert!(err("tasks.a.rows == 1").contains("tasks.<task>.outputs.<name>"));
        assert!(err("params.a == 'x").contains("not closed"));
        assert!(err("params.a ~ 1").contains("unexpected '~'"));
        assert!(err(&"not ".repeat(40)).contains("nests deeper"));
        assert!(err(&"x".repeat(MAX_LEN + 1)).contains("at most 1024"));
    }

    #[test]
    fn references_are_listed() {
        let c = Condition::parse(
            "tasks.a.outputs.x == tasks.b.outputs.y or params.p in [tasks.c.outputs.z]",
        )
        .unwrap();
        let tasks: Vec<String> = c.references().into_iter().map(|r| r.task).collect();
        assert_eq!(tasks, ["a", "b", "c"]);
    }

    proptest::proptest! {
        /// Any text is parsed or refused with a message, never a panic,
        /// and a parsed condition evaluates.
        #[test]
        fn any_text_is_parsed_or_refused(text in "[ a-z.()\\[\\]',=!\"0-9]{0,60}") {
            if let Ok(c) = Condition::parse(&text) {
                let params = BTreeMap::new();
                let none = |_: &str| None;
                let _ = c.holds(&Facts { params: &params, outputs: &none });
            }
        }
    }
}
