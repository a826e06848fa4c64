//! Attention masks: which stored positions a query attends to. Every mask here gives each
//! query one contiguous range of positions, so the attention kernels take `(first, count)`.
//!
//! - [`AttentionMask::Causal`]: positions up to and including the query's own (decoder LMs).
//! - [`AttentionMask::Bidirectional`]: every position evaluated so far, later ones in the same
//!   call included (masked-diffusion LMs denoise a whole sequence at once).
//! - [`AttentionMask::BlockCausal`]: the query's own block of `block` positions and all earlier
//!   blocks (block diffusion, BD3-LM: blocks are denoised left to right).
//!
//! A sliding window (Gemma's local layers) limits how far back a query looks in any mask. A
//! query never sees positions that are not stored yet: with a prompt evaluated in several
//! chunks, the bidirectional and block-causal masks are exact only when each chunk ends on a
//! block boundary (a bidirectional sequence: one chunk).

/// Which positions a query attends to; chosen per forward call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionMask {
    #[default]
    Causal,
    Bidirectional,
    BlockCausal {
        block: usize,
    },
}

impl AttentionMask {
    /// The positions the query at `pos` attends to when positions `0..stored` are stored, as
    /// (first position, count), with an optional sliding `window` looking back from `pos`.
    pub fn visible(self, pos: usize, stored: usize, window: Option<usize>) -> (usize, usize) {
        let end = match self {
            AttentionMask::Causal => pos + 1,
            AttentionMask::Bidirectional => stored,
            AttentionMask::BlockCausal { block } => stored.min((pos / block.max(1) + 1) * block.max(1)),
        }
        .max(pos + 1);
        let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        (lo, end - lo)
    }
}

#[cfg(test)]
mod tests {
    use super::AttentionMask::*;

    #[test]
    fn ranges() {
        assert_eq!(Causal.visible(5, 10, None), (0, 6));
        assert_eq!(Causal.visible(5, 10, Some(3)), (3, 3));
        assert_eq!(Bidirectional.visible(5, 10, None), (0, 10));
        assert_eq!(Bidirectional.visible(5, 10, Some(3)), (3, 7));
        assert_eq!(BlockCausal { block: 4 }.visible(5, 10, None), (0, 8));
        assert_eq!(BlockCausal { block: 4 }.visible(8, 10, None), (0, 10));
        assert_eq!(BlockCausal { block: 1 }.visible(5, 10, None), Causal.visible(5, 10, None));
        assert_eq!(BlockCausal { block: 16 }.visible(5, 10, None), Bidirectional.visible(5, 10, None));
    }
}
