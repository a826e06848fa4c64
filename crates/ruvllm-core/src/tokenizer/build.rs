//! Builds the `tokenizers::Tokenizer` that encodes plain-text fragments (special tokens are split
//! out before, by [`super::special`]).
//!
//! - SentencePiece (`llama`): the GGUF has scores but no merges. llama.cpp's SPM tokenizer
//!   repeatedly merges the adjacent pair whose concatenation is a vocabulary piece with the
//!   highest score (leftmost first on ties). That is BPE with one merge per (left, right) split of
//!   every piece, ranked by the merged piece's score, which is how HF's `SentencePieceExtractor`
//!   turns a SentencePiece model into BPE merges. Byte fallback uses the `<0xXX>` tokens.
//! - Byte-level BPE (`gpt2`): the GGUF's merges, a regex split chosen by `tokenizer.ggml.pre`
//!   and GPT-2's byte-to-unicode mapping.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BpeBuilder, Vocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use rayon::prelude::*;

use super::spec::{TokenizerKind, TokenizerSpec};
use crate::{Error, Result};

fn tk_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(format!("{what}: {e}"))
}

/// Piece -> id; when a piece appears twice the later id wins, as in llama.cpp's `token_to_id`.
fn vocab_map(tokens: &[String]) -> Vocab {
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), i as u32);
    }
    vocab
}

/// Merges for a SentencePiece vocabulary: every split of every piece into two pieces that are
/// both in the vocabulary, ordered by the merged piece's score (highest first), ties by id.
pub(crate) fn sentencepiece_merges(tokens: &[String], scores: &[f32], vocab: &Vocab) -> Vec<(String, String)> {
    let score = |id: u32| scores.get(id as usize).copied().unwrap_or(0.0);
    // A piece listed twice contributes its merges once (for the id the vocabulary keeps).
    let has_duplicates = vocab.len() < tokens.len();
    let mut order: Vec<u32> = (0..tokens.len() as u32).filter(|&id| !has_duplicates || vocab.get(tokens[id as usize].as_str()) == Some(&id)).collect();
    order.par_sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
    // Independent per piece: split the work across threads; `collect` keeps the order.
    order
        .par_chunks(4096)
        .flat_map_iter(|chunk| {
            let mut out = Vec::with_capacity(chunk.len() * 2);
            for &id in chunk {
                let piece = tokens[id as usize].as_str();
                for (k, _) in piece.char_indices().skip(1) {
                    let (left, right) = piece.split_at(k);
                    if vocab.contains_key(right) && vocab.contains_key(left) {
                        out.push((left.to_string(), right.to_string()));
                    }
                }
            }
            out
        })
        .collect()
}

/// Merges from `tokenizer.ggml.merges` (`"left right"`), keeping the first of duplicates (as
/// llama.cpp's rank map does) and dropping those whose parts or result are not in the vocabulary
/// (they could never apply).
fn byte_level_merges(lines: &[String], vocab: &Vocab) -> Vec<(String, String)> {
    let mut seen = std::collections::HashSet::with_capacity(lines.len());
    let mut merges = Vec::with_capacity(lines.len());
    let mut joined = String::new();
    for line in lines {
        // Split at the first space after byte 0 (llama.cpp: `word.find(' ', 1)`); a space byte
        // is always a char boundary.
        let Some(pos) = line.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else { continue };
        let (left, right) = (&line[..pos], &line[pos + 1..]);
        if left.is_empty() || right.is_empty() || !vocab.contains_key(left) || !vocab.contains_key(right) {
            continue;
        }
        joined.clear();
        joined.push_str(left);
        joined.push_str(right);
        if !vocab.contains_key(joined.as_str()) {
            continue;
        }
        if seen.insert((left, right)) {
            merges.push((left.to_string(), right.to_string()));
        }
    }
    merges
}

/// The HF tokenizer for plain text (no added tokens: special tokens are handled by the caller).
pub(crate) fn build_hf(spec: &TokenizerSpec) -> Result<tokenizers::Tokenizer> {
    let vocab = vocab_map(&spec.tokens);
    match spec.kind {
        TokenizerKind::SentencePiece => {
            let merges = sentencepiece_merges(&spec.tokens, &spec.scores, &vocab);
            let mut builder = BpeBuilder::new().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
            if let Some(unk) = spec.unk.and_then(|u| spec.tokens.get(u as usize)) {
                builder = builder.unk_token(unk.clone());
            }
            let bpe = builder.build().map_err(|e| tk_err("building the SentencePiece BPE model", e))?;
            let mut tok = tokenizers::Tokenizer::new(bpe);
            let mut norms: Vec<NormalizerWrapper> = Vec::new();
            if spec.add_space_prefix {
                norms.push(Prepend::new("\u{2581}".to_string()).into());
            }
            norms.push(Replace::new(" ", "\u{2581}").map_err(|e| tk_err("normalizer", e))?.into());
            tok.with_normalizer(Some(NormalizerSequence::new(norms))).map_err(|e| tk_err("normalizer", e))?;
            let mut decoders: Vec<DecoderWrapper> =
                vec![Replace::new("\u{2581}", " ").map_err(|e| tk_err("decoder", e))?.into(), ByteFallback::new().into(), Fuse::new().into()];
            if spec.add_space_prefix {
                decoders.push(Strip::new(' ', 1, 0).into());
            }
            tok.with_decoder(Some(DecoderSequence::new(decoders)));
            Ok(tok)
        }
        TokenizerKind::ByteLevelBpe => {
            let merges = byte_level_merges(&spec.merges, &vocab);
            let bpe = BpeBuilder::new()
                .vocab_and_merges(vocab, merges)
                .ignore_merges(spec.ignore_merges)
                .build()
                .map_err(|e| tk_err("building the byte-level BPE model", e))?;
            let mut tok = tokenizers::Tokenizer::new(bpe);
            let mut pres: Vec<PreTokenizerWrapper> = Vec::new();
            for re in spec.pre.regexes() {
                let split = Split::new(SplitPattern::Regex((*re).to_string()), SplitDelimiterBehavior::Isolated, false)
                    .map_err(|e| tk_err("pre-tokenizer regex", e))?;
                pres.push(split.into());
            }
            pres.push(ByteLevel::new(false, false, false).into());
            tok.with_pre_tokenizer(Some(PreTokenizerSequence::new(pres)));
            tok.with_decoder(Some(ByteLevel::new(false, false, false)));
            Ok(tok)
        }
    }
}
