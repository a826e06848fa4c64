//! Splitting text on special-token strings before the BPE runs, exactly as llama.cpp's
//! `tokenizer_st_partition`: control, unknown and user-defined tokens are tried longest first;
//! each takes every non-overlapping occurrence (left to right) in the text not yet claimed.
//! Control and unknown tokens take part only with `parse_special`; user-defined ones always.

use std::collections::BTreeMap;

use aho_corasick::{AhoCorasick, MatchKind};

use super::spec::TokenType;
use crate::{Error, Result};

/// A piece of the input: text still to tokenize, or a token matched as a whole string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

pub(crate) struct SpecialMatcher {
    /// All special strings, in priority order (longest first, then lowest id).
    ac: Option<AhoCorasick>,
    /// Per pattern: token id and whether it is parsed only with `parse_special`.
    patterns: Vec<(u32, bool)>,
}

impl SpecialMatcher {
    pub(crate) fn new(tokens: &[String], types: &[TokenType]) -> Result<Self> {
        let mut ids: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&id| matches!(types[id as usize], TokenType::Control | TokenType::UserDefined | TokenType::Unknown) && !tokens[id as usize].is_empty())
            .collect();
        ids.sort_by(|&a, &b| tokens[b as usize].len().cmp(&tokens[a as usize].len()).then(a.cmp(&b)));
        let mut seen = std::collections::HashSet::new();
        ids.retain(|&id| seen.insert(tokens[id as usize].as_str()));
        if ids.is_empty() {
            return Ok(SpecialMatcher { ac: None, patterns: Vec::new() });
        }
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .build(ids.iter().map(|&id| tokens[id as usize].as_bytes()))
            .map_err(|e| Error::Tokenizer(format!("building the special-token matcher: {e}")))?;
        let patterns = ids.iter().map(|&id| (id, matches!(types[id as usize], TokenType::Control | TokenType::Unknown))).collect();
        Ok(SpecialMatcher { ac: Some(ac), patterns })
    }

    /// Splits `text` into fragments (empty text gives no fragments).
    pub(crate) fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        if text.is_empty() {
            return Vec::new();
        }
        let Some(ac) = &self.ac else { return vec![Fragment::Text(text)] };
        // (priority, start, end) of every occurrence of every allowed special string.
        let mut candidates: Vec<(usize, usize, usize)> = ac
            .find_overlapping_iter(text)
            .filter(|m| parse_special || !self.patterns[m.pattern().as_usize()].1)
            .map(|m| (m.pattern().as_usize(), m.start(), m.end()))
            .collect();
        if candidates.is_empty() {
            return vec![Fragment::Text(text)];
        }
        candidates.sort_unstable();
        // Accepted spans, disjoint, keyed by start.
        let mut taken: BTreeMap<usize, (usize, u32)> = BTreeMap::new();
        for (pat, start, end) in candidates {
            if let Some((_, &(prev_end, _))) = taken.range(..end).next_back() {
                if prev_end > start {
                    continue;
                }
            }
            taken.insert(start, (end, self.patterns[pat].0));
        }
        let mut out = Vec::with_capacity(taken.len() * 2 + 1);
        let mut pos = 0;
        for (start, (end, id)) in taken {
            if start > pos {
                out.push(Fragment::Text(&text[pos..start]));
            }
            out.push(Fragment::Token(id));
            pos = end;
        }
        if pos < text.len() {
            out.push(Fragment::Text(&text[pos..]));
        }
        out
    }
}
