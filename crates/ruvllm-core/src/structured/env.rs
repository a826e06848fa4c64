//! The tokenizer as llguidance sees it: every token's bytes in a `TokTrie`, and a
//! `ParserFactory` that compiles grammars against it. Building the trie walks the whole
//! vocabulary (262,144 tokens for Gemma 3), so an engine builds one [`TokenEnv`] the first time
//! a request needs it and shares it behind an `Arc`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
use llguidance::ParserFactory;

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A vocabulary compiled for constrained decoding, shared by every request of one engine.
pub struct TokenEnv {
    pub(crate) factory: ParserFactory,
    /// Tokens the trie knows; logits past it (a model's padded vocabulary) are never allowed.
    pub(crate) vocab_size: usize,
}

impl std::fmt::Debug for TokenEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEnv").field("vocab_size", &self.vocab_size).finish_non_exhaustive()
    }
}

impl TokenEnv {
    /// Builds the trie of `tok`'s vocabulary. Every end-of-generation token ends a complete
    /// output (the grammar's "EOS").
    pub fn new(tok: &Tokenizer) -> Result<Arc<Self>> {
        let n = tok.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32).map(|id| tok.token_bytes(id)).collect();
        let eog = tok.end_of_generation_ids();
        let Some(&eos) = tok.eos_id().as_ref().or(eog.first()) else {
            return Err(Error::InvalidArg("constrained output needs a model with an end-of-sequence token".into()));
        };
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tok.bos_id();
        // The trie asserts its invariants (lengths, sizes) by panicking; a vocabulary it rejects
        // is an error of this model, not a crash.
        let built = catch_unwind(AssertUnwindSafe(|| {
            let trie = TokTrie::from(&info, &words);
            let trie = if eog.is_empty() { trie } else { trie.with_eos_tokens(eog) };
            // Greedy re-tokenization is only used for text the grammar forces; any tokenization
            // of the right bytes is accepted by the matcher, so it need not be canonical.
            let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            factory.quiet();
            Ok::<_, String>(factory)
        }));
        let factory = match built {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Err(Error::Tokenizer(format!("building the constrained-decoding vocabulary: {e}"))),
            Err(p) => return Err(Error::Tokenizer(format!("building the constrained-decoding vocabulary: {}", Error::from_panic(p)))),
        };
        Ok(Arc::new(TokenEnv { factory, vocab_size: n }))
    }
}
