//! Tokenizer built from a GGUF's `tokenizer.ggml.*` metadata with the `tokenizers` crate:
//! SentencePiece-style BPE with scores (`tokenizer.ggml.model = "llama"`: Gemma 3, Llama 2,
//! Mistral) and byte-level BPE with merges (`"gpt2"`: Qwen2, Llama 3). Special tokens are matched
//! as whole strings. Matches llama.cpp's tokenization token for token on the real model.
//!
//! Encoding follows llama.cpp (`llama_vocab::impl::tokenize`):
//! 1. the text is split on special-token strings ([`special`]): user-defined tokens always,
//!    control and unknown tokens only with `parse_special`;
//! 2. each remaining text fragment goes through a `tokenizers::Tokenizer` built here
//!    ([`build`]): for SentencePiece, spaces become `▁` (with a leading `▁` when
//!    `add_space_prefix`), then BPE with merges derived from the scores and byte fallback;
//!    for byte-level BPE, the `tokenizer.ggml.pre` regex split, bytes to unicode, then BPE;
//! 3. BOS / EOS are added when asked and the model wants them.
//!
//! Decoding also follows llama.cpp (`token_to_piece` / `detokenize`), piece by piece, so that
//! [`StreamDecoder`] produces exactly the same text incrementally: control and unknown tokens
//! are rendered only without `skip_special`, user-defined ones always, `▁` becomes a space, byte
//! tokens are raw bytes, and with `add_space_prefix` the first token's leading space is dropped.
//! llama.cpp's optional `clean_up_tokenization_spaces` pass (" ." -> ".", for some byte-level
//! models) is not applied: it rewrites text and cannot be streamed token by token.

mod build;
mod spec;
mod special;

pub use spec::{PreTokenizer, TokenType, TokenizerKind, TokenizerSpec};

use crate::gguf::GgufFile;
use crate::{Error, Result};
use special::{Fragment, SpecialMatcher};

/// Token texts that end generation (llama.cpp's EOG list). A token with one of these texts is
/// treated as a control token whatever its type in the file, as llama.cpp does.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
];

/// A tokenizer for one model: encode text to ids and decode ids to text.
pub struct Tokenizer {
    kind: TokenizerKind,
    /// Encodes plain-text fragments (no special tokens inside).
    hf: tokenizers::Tokenizer,
    special: SpecialMatcher,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Sorted ids that end generation.
    end_of_generation: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("end_of_generation", &self.end_of_generation)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds from GGUF metadata; `Error::Tokenizer`/`GgufInvalid` on bad or missing metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let spec = TokenizerSpec::from_gguf(file)?;
        Self::from_spec(spec).map_err(|e| match e {
            Error::Tokenizer(msg) => Error::gguf(file.path.clone(), format!("tokenizer: {msg}")),
            other => other,
        })
    }

    /// Builds from an already-read spec (tests use this with synthetic vocabularies).
    pub fn from_spec(spec: TokenizerSpec) -> Result<Self> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(Error::Tokenizer("the vocabulary is empty".into()));
        }
        if n > (u32::MAX / 2) as usize {
            return Err(Error::Tokenizer(format!("the vocabulary has {n} tokens, too many")));
        }
        if !spec.scores.is_empty() && spec.scores.len() != n {
            return Err(Error::Tokenizer(format!("{} scores for {n} tokens", spec.scores.len())));
        }
        if !spec.token_types.is_empty() && spec.token_types.len() != n {
            return Err(Error::Tokenizer(format!("{} token types for {n} tokens", spec.token_types.len())));
        }
        for (what, id) in [("bos", spec.bos), ("eos", spec.eos), ("eot", spec.eot), ("eom", spec.eom), ("unk", spec.unk)] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(Error::Tokenizer(format!("{what} token id {id} is outside the vocabulary of {n}")));
                }
            }
        }
        let mut types = if spec.token_types.is_empty() { vec![TokenType::Normal; n] } else { spec.token_types.clone() };

        let mut end_of_generation: Vec<u32> = [spec.eos, spec.eot, spec.eom].into_iter().flatten().collect();
        for (id, text) in spec.tokens.iter().enumerate() {
            if END_OF_GENERATION_TEXTS.contains(&text.as_str()) {
                end_of_generation.push(id as u32);
                types[id] = TokenType::Control;
            }
        }
        end_of_generation.sort_unstable();
        end_of_generation.dedup();

        let special = SpecialMatcher::new(&spec.tokens, &types)?;
        let hf = build::build_hf(&spec)?;
        Ok(Tokenizer {
            kind: spec.kind,
            hf,
            special,
            tokens: spec.tokens,
            types,
            end_of_generation,
            bos: spec.bos,
            eos: spec.eos,
            add_bos: spec.add_bos,
            add_eos: spec.add_eos,
            add_space_prefix: spec.add_space_prefix,
        })
    }

    /// Encodes `text`. With `add_special`, prepends BOS when the model asks for it
    /// (`tokenizer.ggml.add_bos_token`) and appends EOS when `add_eos_token`. Special-token
    /// strings in `text` (e.g. `<start_of_turn>`) are parsed as those tokens when `parse_special`.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            if let Some(bos) = self.bos {
                out.push(bos);
            }
        }
        for fragment in self.special.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(t) => {
                    let enc = self.hf.encode_fast(t, false).map_err(|e| Error::Tokenizer(format!("encoding failed: {e}")))?;
                    out.extend_from_slice(enc.get_ids());
                }
            }
        }
        if add_special && self.add_eos {
            if let Some(eos) = self.eos {
                out.push(eos);
            }
        }
        Ok(out)
    }

    /// Decodes ids to text (special/control tokens skipped when `skip_special`). Bytes that do
    /// not form valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            self.piece_into(id, !skip_special, i == 0, &mut bytes)?;
        }
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Beginning-of-sequence token, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token, if the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Every id that ends generation: EOS, EOT, `<end_of_turn>`, `<|im_end|>`, `<|eot_id|>`...
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.end_of_generation.binary_search(&id).is_ok()
    }

    /// All ids that end generation, sorted.
    pub fn end_of_generation_ids(&self) -> &[u32] {
        &self.end_of_generation
    }

    /// Id of an exact token string, if any.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.hf.token_to_id(token)
    }

    /// The token's string as stored in the vocabulary (`▁` for spaces, `<0x0A>` for bytes...).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The token's type (after llama.cpp's fix-ups: end-of-generation texts are control tokens).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Whether BOS is prepended by `encode(.., add_special = true, ..)`.
    pub fn adds_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// Algorithm of this vocabulary.
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// The underlying `tokenizers` tokenizer that encodes plain text (no special tokens).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.hf
    }

    /// The bytes token `id` stands for in generated text, for a constrained-decoding trie:
    /// `▁` is a space and `<0xAB>` the byte 0xAB. Control and unknown tokens come back as
    /// `0xFF` followed by their text (the marker llguidance's `TokTrie` reads as "special", so a
    /// grammar never matches them as text); unused ones as no bytes (never allowed).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        match self.types.get(id as usize) {
            Some(TokenType::Control | TokenType::Unknown) => {
                let mut out = vec![0xFF];
                out.extend_from_slice(self.tokens[id as usize].as_bytes());
                out
            }
            _ => {
                let mut out = Vec::new();
                // Only fails for an id outside the vocabulary: no bytes, so never allowed.
                let _ = self.piece_into(id, false, false, &mut out);
                out
            }
        }
    }

    /// The bytes of token `id` alone as generated text, control tokens as their text
    /// (`<end_of_turn>`); none for an id outside the vocabulary.
    pub fn token_piece(&self, id: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = self.piece_into(id, true, false, &mut out);
        out
    }

    /// Appends the bytes of token `id` (llama.cpp `token_to_piece`). `first`: the token starts
    /// the sequence, so with `add_space_prefix` one leading space is dropped (as `detokenize`).
    fn piece_into(&self, id: u32, special: bool, first: bool, out: &mut Vec<u8>) -> Result<()> {
        let idx = id as usize;
        let (Some(text), Some(ty)) = (self.tokens.get(idx), self.types.get(idx)) else {
            return Err(Error::Tokenizer(format!("token id {id} is outside the vocabulary of {} tokens", self.tokens.len())));
        };
        let start = out.len();
        match ty {
            TokenType::Control | TokenType::Unknown => {
                if special {
                    out.extend_from_slice(text.as_bytes());
                }
            }
            TokenType::UserDefined => out.extend_from_slice(text.as_bytes()),
            TokenType::Normal => match self.kind {
                TokenizerKind::SentencePiece => {
                    for (i, part) in text.split('\u{2581}').enumerate() {
                        if i > 0 {
                            out.push(b' ');
                        }
                        out.extend_from_slice(part.as_bytes());
                    }
                }
                TokenizerKind::ByteLevelBpe => byte_level_decode(text, out),
            },
            TokenType::Byte => match parse_byte_token(text) {
                Some(b) => out.push(b),
                None => byte_level_decode(text, out),
            },
            TokenType::Unused | TokenType::Undefined => {}
        }
        if first && self.add_space_prefix && out.get(start) == Some(&b' ') {
            out.remove(start);
        }
        Ok(())
    }
}

/// `<0xAB>` -> 0xAB.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2's unicode-to-byte map: chars of byte-level BPE pieces back to the bytes they stand for.
/// Chars outside the map are kept as their UTF-8.
fn byte_level_decode(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match unicode_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

fn unicode_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    // Printable bytes map to themselves: '!'..='~', '¡'..='¬', '®'..='ÿ'.
    if (0x21..=0x7e).contains(&cp) || (0xa1..=0xac).contains(&cp) || (0xae..=0xff).contains(&cp) {
        return Some(cp as u8);
    }
    // The others, in byte order, map to U+0100.. .
    if (0x100..0x100 + 68).contains(&cp) {
        let k = cp - 0x100;
        let mut n = 0u32;
        for b in 0u32..256 {
            let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
            if !printable {
                if n == k {
                    return Some(b as u8);
                }
                n += 1;
            }
        }
    }
    None
}

/// Turns a stream of ids into text pieces that are always valid UTF-8: bytes of a character
/// split across tokens are held back until the character is complete. The concatenation of every
/// `push` and the final `finish` equals `decode(all ids, skip_special)`; the default
/// (`new`) skips special tokens, like `decode(ids, true)`.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    /// Bytes not yet returned: at most an incomplete UTF-8 character.
    pending: Vec<u8>,
    /// Tokens pushed so far.
    count: usize,
    skip_special: bool,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder that skips special tokens (as `decode(ids, true)`).
    pub fn new(tok: &'a Tokenizer) -> Self {
        Self::with_skip_special(tok, true)
    }

    /// A decoder that skips special tokens or not, as `decode(ids, skip_special)`.
    pub fn with_skip_special(tok: &'a Tokenizer, skip_special: bool) -> Self {
        StreamDecoder { tok, pending: Vec::with_capacity(8), count: 0, skip_special }
    }

    /// Returns the new text (possibly empty) that token `id` completes.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.tok.piece_into(id, !self.skip_special, self.count == 0, &mut self.pending)?;
        self.count += 1;
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // from_utf8 validated this prefix, so this cannot fail.
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: hold it back.
                        None => {
                            rest = &rest[valid..];
                            break;
                        }
                        // Invalid bytes: one U+FFFD, as String::from_utf8_lossy does.
                        Some(len) => {
                            out.push('\u{fffd}');
                            rest = &rest[valid + len..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        Ok(out)
    }

    /// Remaining text at the end of the stream (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
