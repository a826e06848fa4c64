//! GBNF (llama.cpp's grammar syntax) rewritten as the Lark dialect llguidance compiles, the way
//! llguidance's own `gbnf_to_lark.py` does it: `name ::= …` becomes `name: …`, `root` the start
//! rule, string literals are re-quoted as JSON strings, character classes and `.` become
//! regexes, and groups, alternatives, `* + ?` and `{m,n}` repeats carry over as they are.
//! Rule names are lower-cased with `-` as `_` (Lark reserves upper case for terminals).

use crate::{Error, Result};

fn err(msg: impl Into<String>) -> Error {
    Error::Grammar(format!("GBNF: {}", msg.into()))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// The Lark name of a GBNF rule.
fn rule_name(name: &str) -> String {
    let n = name.to_ascii_lowercase().replace('-', "_");
    // `start` is Lark's entry rule (it refers to `root`).
    if n == "start" {
        "start_".into()
    } else {
        n
    }
}

/// Converts a GBNF grammar (with a `root` rule) to Lark; `Error::Grammar` on syntax errors.
pub fn gbnf_to_lark(src: &str) -> Result<String> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::from("start: root\n");
    let mut i = 0;
    let mut has_root = false;
    loop {
        i = skip_space(&chars, i, true);
        if i >= chars.len() {
            break;
        }
        let start = i;
        while i < chars.len() && is_name_char(chars[i]) {
            i += 1;
        }
        if start == i {
            return Err(err(format!("expected a rule name at offset {start}")));
        }
        let name: String = chars[start..i].iter().collect();
        has_root |= name == "root";
        i = skip_space(&chars, i, false);
        if !(chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') && chars.get(i + 2) == Some(&'=')) {
            return Err(err(format!("expected '::=' after rule name '{name}'")));
        }
        i += 3;
        out.push_str(&rule_name(&name));
        out.push_str(": ");
        i = convert_body(&chars, i, &mut out)?;
        out.push('\n');
    }
    if !has_root {
        return Err(err("the grammar has no 'root' rule"));
    }
    Ok(out)
}

/// Skips spaces and `#` comments; newlines too when `newlines`.
fn skip_space(chars: &[char], mut i: usize, newlines: bool) -> usize {
    while let Some(&c) = chars.get(i) {
        if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r')) {
            i += 1;
        } else {
            break;
        }
    }
    i
}

/// Whether a new rule (`name ::=`) starts at `i`.
fn rule_starts_at(chars: &[char], mut i: usize) -> bool {
    let start = i;
    while i < chars.len() && is_name_char(chars[i]) {
        i += 1;
    }
    if i == start {
        return false;
    }
    i = skip_space(chars, i, false);
    chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') && chars.get(i + 2) == Some(&'=')
}

/// Converts one rule's right-hand side; it ends at a newline outside parentheses that is
/// followed by another rule or the end of the text. Returns the offset after it.
fn convert_body(chars: &[char], mut i: usize, out: &mut String) -> Result<usize> {
    let mut depth = 0usize;
    loop {
        let Some(&c) = chars.get(i) else {
            if depth > 0 {
                return Err(err("unbalanced '('"));
            }
            return Ok(i);
        };
        match c {
            '#' | ' ' | '\t' | '\r' => i = skip_space(chars, i, false),
            '\n' => {
                let next = skip_space(chars, i, true);
                if depth == 0 && (next >= chars.len() || rule_starts_at(chars, next)) {
                    return Ok(next);
                }
                out.push(' ');
                i = next;
            }
            '"' => {
                let (text, next) = read_literal(chars, i + 1)?;
                // JSON quoting is what llguidance's Lark reads for strings.
                out.push_str(&serde_json::to_string(&text).map_err(|e| err(e.to_string()))?);
                out.push(' ');
                i = next;
            }
            '[' => {
                let end = class_end(chars, i)?;
                out.push('/');
                for &ch in &chars[i..=end] {
                    if ch == '/' {
                        out.push('\\');
                    }
                    out.push(ch);
                }
                out.push_str("/ ");
                i = end + 1;
            }
            '.' => {
                out.push_str("/(?s:.)/ ");
                i += 1;
            }
            '(' => {
                depth += 1;
                out.push_str("( ");
                i += 1;
            }
            ')' => {
                depth = depth.checked_sub(1).ok_or_else(|| err("unbalanced ')'"))?;
                out.push_str(") ");
                i += 1;
            }
            '|' | '*' | '+' | '?' => {
                out.push(c);
                out.push(' ');
                i += 1;
            }
            '{' => {
                let end = chars[i..].iter().position(|&ch| ch == '}').map(|p| i + p).ok_or_else(|| err("unterminated '{'"))?;
                let inner: String = chars[i + 1..end].iter().filter(|ch| !ch.is_whitespace()).collect();
                if inner.is_empty() || !inner.chars().all(|ch| ch.is_ascii_digit() || ch == ',') {
                    return Err(err(format!("bad repetition '{{{inner}}}'")));
                }
                out.push_str(&format!("{{{inner}}} "));
                i = end + 1;
            }
            c if is_name_char(c) => {
                let start = i;
                while i < chars.len() && is_name_char(chars[i]) {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                out.push_str(&rule_name(&name));
                out.push(' ');
            }
            other => return Err(err(format!("unexpected '{other}' at offset {i}"))),
        }
    }
}

/// Reads a `"…"` literal from after its opening quote, decoding GBNF escapes.
fn read_literal(chars: &[char], mut i: usize) -> Result<(String, usize)> {
    let mut text = String::new();
    loop {
        match chars.get(i) {
            None | Some('\n') => return Err(err("unterminated string literal")),
            Some('"') => return Ok((text, i + 1)),
            Some('\\') => {
                let (c, next) = read_escape(chars, i + 1)?;
                text.push(c);
                i = next;
            }
            Some(&c) => {
                text.push(c);
                i += 1;
            }
        }
    }
}

/// Decodes the escape after a backslash (`n r t \ " [ ] xHH uHHHH UHHHHHHHH`).
fn read_escape(chars: &[char], i: usize) -> Result<(char, usize)> {
    let hex = |len: usize| -> Result<(char, usize)> {
        let digits: String = chars.get(i + 1..i + 1 + len).ok_or_else(|| err("truncated escape"))?.iter().collect();
        let cp = u32::from_str_radix(&digits, 16).map_err(|_| err(format!("bad escape '{digits}'")))?;
        Ok((char::from_u32(cp).ok_or_else(|| err(format!("bad code point {cp:#x}")))?, i + 1 + len))
    };
    match chars.get(i) {
        Some('n') => Ok(('\n', i + 1)),
        Some('r') => Ok(('\r', i + 1)),
        Some('t') => Ok(('\t', i + 1)),
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some(&c @ ('\\' | '"' | '[' | ']' | '-' | '^')) => Ok((c, i + 1)),
        Some(c) => Err(err(format!("unknown escape '\\{c}'"))),
        None => Err(err("truncated escape")),
    }
}

/// The offset of the `]` closing the class that opens at `i` (escapes skipped).
fn class_end(chars: &[char], mut i: usize) -> Result<usize> {
    i += 1;
    while let Some(&c) = chars.get(i) {
        match c {
            '\\' => i += 2,
            ']' => return Ok(i),
            '\n' => break,
            _ => i += 1,
        }
    }
    Err(err("unterminated character class"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_rules_literals_classes_and_repeats() {
        let g = "root ::= answer \" \" num # trailing comment\nanswer ::= (\"yes\" | \"no\")\n  | \"maybe\\n\"\nnum ::= [0-9]{1,3} [a/b]? .\n";
        let lark = gbnf_to_lark(g).unwrap();
        assert_eq!(lark, "start: root\nroot: answer \" \" num \nanswer: ( \"yes\" | \"no\" )  | \"maybe\\n\" \nnum: /[0-9]/ {1,3} /[a\\/b]/ ? /(?s:.)/ \n");
    }

    #[test]
    fn rejects_bad_grammars() {
        for bad in ["root ::= \"open", "answer ::= \"x\"", "root := \"x\"", "root ::= (\"x\"", "root ::= [a-z", "root ::= x{a}"] {
            match gbnf_to_lark(bad) {
                Err(Error::Grammar(msg)) => assert!(msg.starts_with("GBNF:"), "{msg}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
