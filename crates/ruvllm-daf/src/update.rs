//! Adapter updates: what a node publishes after a round of local learning, and its canonical,
//! signed byte encoding.
//!
//! An update carries, per adapted projection ("target"), the low-rank factors `A` (`rank × d_in`)
//! and `B` (`d_out × rank`), both row-major f32, with one `scale` for the whole update, so that
//! the projection's change is `ΔW = scale · B·A` (the layout SONA trains and the runtime's
//! `LoraPair` takes). For a TALoRA adapter of the diffusion model an update is one timestep
//! bucket's adapter, with the quality and loss improvement measured on that bucket.
//!
//! The signature is Ed25519 (RFC 8032, `verify_strict`) over [`Update::signing_bytes`]: every
//! field in a fixed order, lengths prefixed, little-endian, after a domain tag; the encoding is a
//! function of the values only, so two nodes that hold the same update hold the same bytes.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::validate::Reject;
use crate::{Error, Result};

/// The domain tag that starts every encoded update (and the signed bytes).
const MAGIC: &[u8; 8] = b"RVDAFU1\0";

/// Who may see an adapter's updates. Chosen per adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Never leaves the node: the wire encoder refuses it.
    Private,
    /// Encrypted with a key shared by a group of nodes.
    Group,
    /// Encrypted with a tenant's key, accepted only from nodes on the tenant's member list.
    Tenant,
    /// Readable by anyone: clipped and noised (differential privacy), released in aggregates of
    /// at least k distinct nodes.
    Public,
}

impl Tier {
    pub fn as_u8(self) -> u8 {
        match self {
            Tier::Private => 0,
            Tier::Group => 1,
            Tier::Tenant => 2,
            Tier::Public => 3,
        }
    }

    pub fn from_u8(v: u8) -> Option<Tier> {
        Some(match v {
            0 => Tier::Private,
            1 => Tier::Group,
            2 => Tier::Tenant,
            3 => Tier::Public,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Tier::Private => "private",
            Tier::Group => "group",
            Tier::Tenant => "tenant",
            Tier::Public => "public",
        }
    }

    pub fn parse(s: &str) -> Result<Tier> {
        Ok(match s {
            "private" => Tier::Private,
            "group" => Tier::Group,
            "tenant" => Tier::Tenant,
            "public" => Tier::Public,
            _ => return Err(Error::Config(format!("unknown tier '{s}' (private, group, tenant, public)"))),
        })
    }
}

/// One adapted projection's low-rank factors: `ΔW = scale · B·A` with the update's scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Factors {
    pub layer: u32,
    /// The projection's GGUF name (`attn_q`, `ffn_down`, ...), as `Proj::gguf_name` spells it.
    pub proj: String,
    pub rank: usize,
    pub d_in: usize,
    pub d_out: usize,
    /// `rank × d_in`, row-major.
    pub a: Vec<f32>,
    /// `d_out × rank`, row-major.
    pub b: Vec<f32>,
}

impl Factors {
    /// Factors with their lengths checked against the shape.
    pub fn new(layer: u32, proj: &str, rank: usize, d_in: usize, d_out: usize, a: Vec<f32>, b: Vec<f32>) -> Result<Factors> {
        let f = Factors { layer, proj: proj.to_string(), rank, d_in, d_out, a, b };
        if f.a.len() != rank * d_in || f.b.len() != d_out * rank {
            return Err(Error::Shape {
                target: f.name(),
                msg: format!("A has {} values, B {}; rank {rank}, d_in {d_in}, d_out {d_out} need {} and {}", f.a.len(), f.b.len(), rank * d_in, d_out * rank),
            });
        }
        Ok(f)
    }

    /// From `A` and `Bᵀ` (`rank × d_out`, as the runtime's `LoraPair` holds it).
    pub fn from_transposed_b(layer: u32, proj: &str, rank: usize, d_in: usize, d_out: usize, a: Vec<f32>, bt: &[f32]) -> Result<Factors> {
        if bt.len() != rank * d_out {
            return Err(Error::Shape { target: format!("blk.{layer}.{proj}"), msg: format!("Bᵀ has {} values, expected {}", bt.len(), rank * d_out) });
        }
        let mut b = vec![0.0f32; d_out * rank];
        for j in 0..rank {
            for o in 0..d_out {
                b[o * rank + j] = bt[j * d_out + o];
            }
        }
        Factors::new(layer, proj, rank, d_in, d_out, a, b)
    }

    /// `blk.{layer}.{proj}`, the GGUF tensor stem.
    pub fn name(&self) -> String {
        format!("blk.{}.{}", self.layer, self.proj)
    }

    /// The dense `scale · B·A` (`d_out × d_in`, row-major, f64).
    pub fn delta(&self, scale: f64) -> Vec<f64> {
        let (r, n) = (self.rank, self.d_in);
        let mut w = vec![0.0f64; self.d_out * n];
        for o in 0..self.d_out {
            let row = &mut w[o * n..(o + 1) * n];
            for j in 0..r {
                let c = scale * self.b[o * r + j] as f64;
                if c != 0.0 {
                    for (x, &av) in row.iter_mut().zip(&self.a[j * n..(j + 1) * n]) {
                        *x += c * av as f64;
                    }
                }
            }
        }
        w
    }

    /// `‖scale · B·A‖²_F` through the `rank × rank` Gram matrices (`tr(BᵀB · AAᵀ)`), without
    /// forming the dense product.
    pub fn delta_norm_sq(&self, scale: f64) -> f64 {
        let (r, n, m) = (self.rank, self.d_in, self.d_out);
        let mut ga = vec![0.0f64; r * r];
        let mut gb = vec![0.0f64; r * r];
        for i in 0..r {
            for j in 0..r {
                ga[i * r + j] = (0..n).map(|k| self.a[i * n + k] as f64 * self.a[j * n + k] as f64).sum();
                gb[i * r + j] = (0..m).map(|o| self.b[o * r + i] as f64 * self.b[o * r + j] as f64).sum();
            }
        }
        scale * scale * (0..r * r).map(|k| ga[k] * gb[k]).sum::<f64>()
    }

    fn all_finite(&self) -> bool {
        self.a.iter().chain(&self.b).all(|v| v.is_finite())
    }
}

/// A fresh node identity: an Ed25519 secret key (32 bytes from the OS's CSPRNG).
pub fn generate_identity() -> [u8; 32] {
    use rand::RngCore;
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    secret
}

/// The public key (node id) of an Ed25519 secret key.
pub fn public_key(secret: &[u8; 32]) -> [u8; 32] {
    SigningKey::from_bytes(secret).verifying_key().to_bytes()
}

/// One node's update of one adapter (and, for TALoRA, one timestep bucket) for one round.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    /// The adapter's id (the name the nodes agree on, e.g. `sona.micro` or `talora.q4`).
    pub adapter: String,
    /// The timestep bucket of a TALoRA adapter (its index among the adapter's mask-ratio ranges).
    pub bucket: Option<u16>,
    pub targets: Vec<Factors>,
    pub scale: f32,
    /// How many examples (feedback trajectories, diffusion samples) the update learned from.
    pub samples: u64,
    /// Mean quality of the feedback it learned from, in `[0, 1]`.
    pub quality: f32,
    /// Held-out loss before minus after local learning, on this bucket (positive: it helped).
    pub improvement: f32,
    pub tier: Tier,
    /// The sender's Ed25519 public key.
    pub node: [u8; 32],
    pub round: u64,
    pub signature: Option<[u8; 64]>,
}

impl Update {
    /// The bytes the signature covers: everything but the signature.
    pub fn signing_bytes(&self) -> Vec<u8> {
        let floats: usize = self.targets.iter().map(|t| t.a.len() + t.b.len()).sum();
        let mut w = Vec::with_capacity(96 + self.adapter.len() + 4 * floats + 32 * self.targets.len());
        w.extend_from_slice(MAGIC);
        put_str(&mut w, &self.adapter);
        match self.bucket {
            Some(b) => {
                w.push(1);
                w.extend_from_slice(&b.to_le_bytes());
            }
            None => w.extend_from_slice(&[0, 0, 0]),
        }
        w.push(self.tier.as_u8());
        w.extend_from_slice(&self.node);
        w.extend_from_slice(&self.round.to_le_bytes());
        w.extend_from_slice(&self.samples.to_le_bytes());
        for v in [self.quality, self.improvement, self.scale] {
            w.extend_from_slice(&v.to_le_bytes());
        }
        w.extend_from_slice(&(self.targets.len() as u32).to_le_bytes());
        for t in &self.targets {
            w.extend_from_slice(&t.layer.to_le_bytes());
            put_str(&mut w, &t.proj);
            for d in [t.rank, t.d_in, t.d_out] {
                w.extend_from_slice(&(d as u32).to_le_bytes());
            }
            for v in t.a.iter().chain(&t.b) {
                w.extend_from_slice(&v.to_le_bytes());
            }
        }
        w
    }

    /// The full encoding: the signed bytes, then a presence byte and the 64-byte signature.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = self.signing_bytes();
        match &self.signature {
            Some(s) => {
                w.push(1);
                w.extend_from_slice(s);
            }
            None => w.push(0),
        }
        w
    }

    /// Sets `node` to `key`'s public key and signs.
    pub fn sign(&mut self, key: &SigningKey) {
        self.node = key.verifying_key().to_bytes();
        self.signature = Some(key.sign(&self.signing_bytes()).to_bytes());
    }

    /// Checks the signature against `node`.
    pub fn verify(&self) -> std::result::Result<(), Reject> {
        let sig = self.signature.ok_or(Reject::Unsigned)?;
        let key = VerifyingKey::from_bytes(&self.node).map_err(|_| Reject::BadSignature)?;
        key.verify_strict(&self.signing_bytes(), &Signature::from_bytes(&sig)).map_err(|_| Reject::BadSignature)
    }

    /// Whether every factor value and the scalars are finite.
    pub fn all_finite(&self) -> bool {
        self.scale.is_finite() && self.quality.is_finite() && self.improvement.is_finite() && self.targets.iter().all(Factors::all_finite)
    }

    /// The largest rank of its targets.
    pub fn max_rank(&self) -> usize {
        self.targets.iter().map(|t| t.rank).max().unwrap_or(0)
    }

    /// `‖ΔW‖_F` over all targets together.
    pub fn delta_norm(&self) -> f64 {
        self.targets.iter().map(|t| t.delta_norm_sq(self.scale as f64)).sum::<f64>().sqrt()
    }

    /// Decodes `bytes`, refusing before any allocation a declared rank above `max_rank` or a
    /// declared size beyond the bytes present.
    pub fn decode(bytes: &[u8], max_rank: usize) -> std::result::Result<Update, Reject> {
        let mut r = Reader { b: bytes, at: 0 };
        if r.take(8)? != MAGIC {
            return Err(Reject::Malformed);
        }
        let adapter = r.string()?;
        let bucket = match r.u8()? {
            // The padding must be zero: the encoding is canonical, no two byte strings decode
            // to the same update.
            0 if r.take(2)? == [0, 0] => None,
            1 => Some(u16::from_le_bytes(r.array()?)),
            _ => return Err(Reject::Malformed),
        };
        let tier = Tier::from_u8(r.u8()?).ok_or(Reject::Malformed)?;
        let node: [u8; 32] = r.array()?;
        let round = u64::from_le_bytes(r.array()?);
        let samples = u64::from_le_bytes(r.array()?);
        let quality = f32::from_le_bytes(r.array()?);
        let improvement = f32::from_le_bytes(r.array()?);
        let scale = f32::from_le_bytes(r.array()?);
        let n = u32::from_le_bytes(r.array()?) as usize;
        // Each target takes at least 18 bytes: a count beyond that is a lie about the length.
        if n > r.left() / 18 {
            return Err(Reject::Malformed);
        }
        let mut targets = Vec::with_capacity(n);
        for _ in 0..n {
            let layer = u32::from_le_bytes(r.array()?);
            let proj = r.string()?;
            let rank = u32::from_le_bytes(r.array()?) as usize;
            let d_in = u32::from_le_bytes(r.array()?) as usize;
            let d_out = u32::from_le_bytes(r.array()?) as usize;
            if rank > max_rank {
                return Err(Reject::Oversized);
            }
            let na = rank.checked_mul(d_in).ok_or(Reject::Malformed)?;
            let nb = rank.checked_mul(d_out).ok_or(Reject::Malformed)?;
            if na.checked_add(nb).and_then(|k| k.checked_mul(4)).is_none_or(|k| k > r.left()) {
                return Err(Reject::Malformed);
            }
            let a = r.floats(na)?;
            let b = r.floats(nb)?;
            targets.push(Factors { layer, proj, rank, d_in, d_out, a, b });
        }
        let signature = match r.u8()? {
            0 => None,
            1 => Some(r.array()?),
            _ => return Err(Reject::Malformed),
        };
        if r.left() != 0 {
            return Err(Reject::Malformed);
        }
        Ok(Update { adapter, bucket, targets, scale, samples, quality, improvement, tier, node, round, signature })
    }
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    // Names are short; a longer one is cut at a char boundary rather than mis-encoded.
    let mut end = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    w.extend_from_slice(&(end as u16).to_le_bytes());
    w.extend_from_slice(&s.as_bytes()[..end]);
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.b.len() - self.at
    }

    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], Reject> {
        if n > self.left() {
            return Err(Reject::Malformed);
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], Reject> {
        self.take(N)?.try_into().map_err(|_| Reject::Malformed)
    }

    fn u8(&mut self) -> std::result::Result<u8, Reject> {
        Ok(self.take(1)?[0])
    }

    fn string(&mut self) -> std::result::Result<String, Reject> {
        let n = u16::from_le_bytes(self.array()?) as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| Reject::Malformed)
    }

    fn floats(&mut self, n: usize) -> std::result::Result<Vec<f32>, Reject> {
        let s = self.take(n * 4)?;
        Ok(s.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A random update of `targets` (`(layer, proj, rank, d_in, d_out)`), signed by `key`.
    pub(crate) fn random_update(
        key: &SigningKey,
        adapter: &str,
        bucket: Option<u16>,
        round: u64,
        targets: &[(u32, &str, usize, usize, usize)],
        seed: u64,
    ) -> Update {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let targets = targets
            .iter()
            .map(|&(l, p, r, i, o)| {
                let a = (0..r * i).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                let b = (0..o * r).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                Factors::new(l, p, r, i, o, a, b).expect("consistent shapes")
            })
            .collect();
        let mut u = Update {
            adapter: adapter.into(),
            bucket,
            targets,
            scale: 0.5,
            samples: 10 + seed % 7,
            quality: 0.8,
            improvement: 0.1,
            tier: Tier::Group,
            node: [0; 32],
            round,
            signature: None,
        };
        u.sign(key);
        u
    }

    pub(crate) fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    #[test]
    fn encoding_round_trips_and_signature_verifies() {
        let u = random_update(&key(1), "sona.micro", Some(3), 7, &[(17, "ffn_down", 2, 6, 4), (3, "attn_q", 1, 4, 4)], 1);
        let bytes = u.encode();
        let back = Update::decode(&bytes, 8).expect("decodes");
        assert_eq!(back, u);
        assert_eq!(back.verify(), Ok(()));
        assert_eq!(back.encode(), bytes, "the encoding is canonical");
    }

    #[test]
    fn any_changed_byte_breaks_the_signature_or_the_decoding() {
        let u = random_update(&key(1), "a", None, 1, &[(0, "ffn_up", 1, 3, 2)], 2);
        let bytes = u.encode();
        for i in 0..bytes.len() {
            let mut t = bytes.clone();
            t[i] ^= 0x01;
            match Update::decode(&t, 8) {
                Ok(v) => assert!(v.verify().is_err(), "flipping byte {i} still verifies"),
                Err(e) => assert!(matches!(e, Reject::Malformed | Reject::Oversized), "byte {i}: {e:?}"),
            }
        }
    }

    #[test]
    fn truncated_or_lying_lengths_are_malformed_not_panics() {
        let u = random_update(&key(1), "a", None, 1, &[(0, "ffn_up", 2, 3, 2)], 3);
        let bytes = u.encode();
        for n in 0..bytes.len() {
            assert!(Update::decode(&bytes[..n], 8).is_err());
        }
        assert_eq!(Update::decode(&bytes, 1), Err(Reject::Oversized), "rank 2 over a limit of 1");
    }

    #[test]
    fn delta_norm_through_grams_matches_the_dense_product() {
        let u = random_update(&key(1), "a", None, 1, &[(0, "ffn_up", 3, 7, 5)], 4);
        let t = &u.targets[0];
        let dense: f64 = t.delta(0.5).iter().map(|v| v * v).sum();
        assert!((t.delta_norm_sq(0.5) - dense).abs() < 1e-9 * dense.max(1.0));
    }

    #[test]
    fn transposed_b_matches_b() {
        let f = Factors::new(0, "attn_v", 2, 3, 2, vec![1., 2., 3., 4., 5., 6.], vec![1., 2., 3., 4.]).expect("shapes");
        let bt = [1., 3., 2., 4.];
        assert_eq!(Factors::from_transposed_b(0, "attn_v", 2, 3, 2, f.a.clone(), &bt).expect("shapes"), f);
        assert!(Factors::new(0, "attn_v", 2, 3, 2, vec![0.0; 5], vec![0.0; 4]).is_err());
    }
}
