//! Attention masks on the real Gemma 3 270M, checked by what each mask means: a position's
//! logits depend exactly on the tokens its mask lets it see. Changing the last token leaves every
//! earlier position's logits bit-identical under the causal mask, changes the first position's
//! under the bidirectional one, and under the block-causal one leaves earlier blocks untouched
//! while changing the last block. A block of 1 is the causal mask and a block covering the whole
//! sequence the bidirectional one, bit for bit.

use ruvllm_core::backend::cpu::CpuBackend;
use ruvllm_core::gguf::GgufFile;
use ruvllm_core::models::Outputs;
use ruvllm_core::models::{config_from_gguf, Transformer, WeightLoader};
use ruvllm_core::nn::AttentionMask;

const N: usize = 24;

struct Model {
    model: Transformer,
    be: std::cell::RefCell<CpuBackend>,
}

impl Model {
    fn load() -> Self {
        let path = ruvllm_models::real_test_model().unwrap_or_else(|e| panic!("{e}"));
        let file = GgufFile::open(path).unwrap();
        let cfg = config_from_gguf(&file).unwrap();
        let model = Transformer::load(&WeightLoader { file: &file }, cfg, 256).unwrap();
        let mut be = CpuBackend::new(2);
        model.prepare(&mut be, 512);
        Model { model, be: std::cell::RefCell::new(be) }
    }

    /// Logits of every position of `tokens` under `mask`, in one forward call.
    fn logits(&self, tokens: &[u32], mask: AttentionMask) -> Vec<Vec<f32>> {
        let mut be = self.be.borrow_mut();
        let mut cache = self.model.new_cache(&*be, 256, 64);
        self.model.reserve(&mut *be, 64);
        let mut out = Vec::new();
        self.model.forward_each(tokens, 0, mask, &mut cache, &mut *be, Outputs::Logits, &mut |_, l| out.push(l.to_vec())).unwrap();
        out
    }
}

fn tokens(last: u32) -> Vec<u32> {
    let mut t: Vec<u32> = [2u32].into_iter().chain((1..N as u32).map(|i| 100 + (i * 7919) % 20000)).collect();
    t[N - 1] = last;
    t
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn each_position_sees_what_its_mask_allows() {
    let m = Model::load();
    let (a, b) = (tokens(5000), tokens(9000));
    let block = AttentionMask::BlockCausal { block: 8 };
    for (mask, first_block_changes) in [(AttentionMask::Causal, false), (AttentionMask::Bidirectional, true), (block, false)] {
        let (la, lb) = (m.logits(&a, mask), m.logits(&b, mask));
        assert_eq!(la.len(), N);
        assert_eq!(!same(&la[0], &lb[0]), first_block_changes, "{mask:?}: position 0");
        assert!(!same(&la[N - 1], &lb[N - 1]), "{mask:?}: the changed position itself");
        match mask {
            AttentionMask::Causal => assert!((0..N - 1).all(|t| same(&la[t], &lb[t])), "causal: a position saw a later token"),
            AttentionMask::Bidirectional => assert!((0..N - 1).all(|t| !same(&la[t], &lb[t])), "bidirectional: a position missed the last token"),
            AttentionMask::BlockCausal { block } => {
                let last_block = (N - 1) / block * block;
                assert!((0..last_block).all(|t| same(&la[t], &lb[t])), "block-causal: an earlier block saw the last block");
                assert!((last_block..N).all(|t| !same(&la[t], &lb[t])), "block-causal: a position missed a token of its own block");
            }
        }
    }
}

#[test]
fn block_causal_spans_causal_to_bidirectional() {
    let m = Model::load();
    let t = tokens(5000);
    let causal = m.logits(&t, AttentionMask::Causal);
    let bidi = m.logits(&t, AttentionMask::Bidirectional);
    let b1 = m.logits(&t, AttentionMask::BlockCausal { block: 1 });
    let bn = m.logits(&t, AttentionMask::BlockCausal { block: N });
    assert!(causal.iter().zip(&b1).all(|(x, y)| same(x, y)), "a block of 1 is the causal mask");
    assert!(bidi.iter().zip(&bn).all(|(x, y)| same(x, y)), "one block over everything is the bidirectional mask");
    assert!(!same(&causal[0], &bidi[0]));
}
