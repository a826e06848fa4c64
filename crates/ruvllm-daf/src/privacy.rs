//! Privacy tiers on the wire.
//!
//! Every update that leaves a node travels in an envelope: a header (domain tag, tier, round,
//! sender key) and a body. What the body is depends on the tier:
//!
//! - **private**: there is no envelope. [`seal`] refuses, so a private adapter's factors cannot
//!   be put on the wire by any path of this crate.
//! - **group**: the encoded update encrypted with XChaCha20-Poly1305 under the group's key, a
//!   fresh random 24-byte nonce per envelope (random nonces of this size do not collide in
//!   practice), the header as associated data, so changing the round or sender in transit fails
//!   decryption.
//! - **tenant**: as group, with the tenant's key; only members (public keys on the tenant's list)
//!   may seal, and envelopes whose sender is not on the list are refused before decryption.
//! - **public**: the body is plaintext, but only a [`PublicRelease`] can be sealed, and only
//!   [`PublicTier::release`] makes one: the update's `ΔW = s·B·A` is clipped to Frobenius norm
//!   `C` jointly over its targets, Gaussian noise `N(0, (z·C)²)` is added to every entry of each
//!   dense `ΔW`, and each is re-factorised to the update's rank. The noise multiplier `z` is
//!   calibrated by the RDP accountant ([`crate::accountant`]) so the configured number of
//!   releases stays within (ε, δ); a release beyond that budget is refused. The aggregate of a
//!   public group is released only when at least k distinct nodes contributed
//!   ([`crate::weighting::RoundPolicy::k_anonymity`]).
//!
//! Why clip and noise `ΔW`, not the factors: `ΔW` is what the update does to the model and what
//! a receiver can reconstruct, so its norm is the sensitivity that matters; a factorisation is
//! not unique (`B·A = (B·G)(G⁻¹·A)`), so a bound on the factors' norms is a bound on one
//! representation, and noise added to both factors enters `ΔW` with the product term
//! `N_B·N_A`, quadratic in the noise. Noising the dense `ΔW` keeps the noise linear; the
//! re-factorisation is post-processing, which costs no privacy, and keeps the wire low-rank.
//! The update's metadata (samples, quality, improvement) depend on the data and are not noised,
//! so a public release withholds them (samples 1, quality and improvement 0): public groups are
//! averaged uniformly. The neighbouring relation is user-level: the whole of one node's update in
//! a release replaced by zero (sensitivity `C`). Noise is drawn from a CSPRNG by Box–Muller in
//! floating point, which, like every floating-point sampler, deviates from the ideal Gaussian in
//! its lowest bits (Mironov, CCS 2012).

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use ed25519_dalek::SigningKey;
use rand::{CryptoRng, Rng, RngCore};

use crate::accountant::{calibrate, Accountant};
use crate::linalg::truncated_svd_dense;
use crate::update::{Factors, Tier, Update};
use crate::validate::Reject;
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"RVDAFE1\0";
/// Magic, tier, round, sender.
pub const HEADER_LEN: usize = 8 + 1 + 8 + 32;
const NONCE_LEN: usize = 24;

/// A tenant: its key and the public keys of its members.
#[derive(Clone)]
pub struct Tenant {
    pub key: [u8; 32],
    pub members: Vec<[u8; 32]>,
}

/// The symmetric keys a node holds.
#[derive(Clone, Default)]
pub struct Keys {
    pub group: Option<[u8; 32]>,
    pub tenant: Option<Tenant>,
}

impl std::fmt::Debug for Keys {
    // Keys never reach logs or error messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("group", &self.group.is_some()).field("tenant_members", &self.tenant.as_ref().map(|t| t.members.len())).finish()
    }
}

/// An envelope's header: what a receiver may read before opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub tier: Tier,
    pub round: u64,
    pub sender: [u8; 32],
}

impl Header {
    pub fn of(u: &Update) -> Header {
        Header { tier: u.tier, round: u.round, sender: u.node }
    }

    pub fn bytes(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[8] = self.tier.as_u8();
        h[9..17].copy_from_slice(&self.round.to_le_bytes());
        h[17..].copy_from_slice(&self.sender);
        h
    }

    pub fn parse(b: &[u8]) -> std::result::Result<Header, Reject> {
        if b.len() < HEADER_LEN || &b[..8] != MAGIC {
            return Err(Reject::Malformed);
        }
        let tier = Tier::from_u8(b[8]).ok_or(Reject::Malformed)?;
        let round = u64::from_le_bytes(b[9..17].try_into().map_err(|_| Reject::Malformed)?);
        let sender = b[17..HEADER_LEN].try_into().map_err(|_| Reject::Malformed)?;
        Ok(Header { tier, round, sender })
    }
}

/// Encrypts `body` under `key` with `header` authenticated: `header ‖ nonce ‖ ciphertext`.
pub fn seal_bytes<R: RngCore + CryptoRng>(header: &Header, body: &[u8], key: &[u8; 32], rng: &mut R) -> Result<Vec<u8>> {
    let h = header.bytes();
    let mut nonce = [0u8; NONCE_LEN];
    rng.fill_bytes(&mut nonce);
    let cipher = XChaCha20Poly1305::new(key.into());
    let ct = cipher.encrypt(XNonce::from_slice(&nonce), Payload { msg: body, aad: &h }).map_err(|_| Error::Key("encryption failed".into()))?;
    let mut out = Vec::with_capacity(HEADER_LEN + NONCE_LEN + ct.len());
    out.extend_from_slice(&h);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ct);
    Ok(out)
}

/// The wire form of a signed group- or tenant-tier update. Private updates are refused (they
/// never leave the node); public ones must go through [`PublicTier::release`] and
/// [`seal_public`].
pub fn seal<R: RngCore + CryptoRng>(u: &Update, keys: &Keys, rng: &mut R) -> Result<Vec<u8>> {
    if u.signature.is_none() {
        return Err(Error::Rejected(Reject::Unsigned));
    }
    let key = match u.tier {
        Tier::Private => return Err(Error::PrivateTier { adapter: u.adapter.clone() }),
        Tier::Public => return Err(Error::Config(format!("adapter '{}' is public: it leaves only as a differentially private release", u.adapter))),
        Tier::Group => keys.group.ok_or_else(|| Error::Key(format!("adapter '{}' is group-tier but no group key is set", u.adapter)))?,
        Tier::Tenant => {
            let t = keys.tenant.as_ref().ok_or_else(|| Error::Key(format!("adapter '{}' is tenant-tier but no tenant is set", u.adapter)))?;
            if !t.members.contains(&u.node) {
                return Err(Error::Key("this node is not on the tenant's member list".into()));
            }
            t.key
        }
    };
    seal_bytes(&Header::of(u), &u.encode(), &key, rng)
}

/// The wire form of a public release: header and the plaintext signed update.
pub fn seal_public(r: &PublicRelease) -> Vec<u8> {
    let mut out = Header::of(&r.0).bytes().to_vec();
    out.extend_from_slice(&r.0.encode());
    out
}

/// Opens an envelope: its header and the encoded update inside (decrypted where the tier
/// encrypts). The caller decodes and validates the update, and checks it against the header.
pub fn open(bytes: &[u8], keys: &Keys) -> std::result::Result<(Header, Vec<u8>), Reject> {
    let h = Header::parse(bytes)?;
    let rest = &bytes[HEADER_LEN..];
    let key = match h.tier {
        Tier::Private => return Err(Reject::WrongTier),
        Tier::Public => return Ok((h, rest.to_vec())),
        Tier::Group => keys.group.ok_or(Reject::Undecryptable)?,
        Tier::Tenant => {
            let t = keys.tenant.as_ref().ok_or(Reject::Undecryptable)?;
            if !t.members.contains(&h.sender) {
                return Err(Reject::NotTenantMember);
            }
            t.key
        }
    };
    if rest.len() < NONCE_LEN {
        return Err(Reject::Malformed);
    }
    let cipher = XChaCha20Poly1305::new((&key).into());
    let body = cipher
        .decrypt(XNonce::from_slice(&rest[..NONCE_LEN]), Payload { msg: &rest[NONCE_LEN..], aad: &bytes[..HEADER_LEN] })
        .map_err(|_| Reject::Undecryptable)?;
    Ok((h, body))
}

/// The public tier's settings: the privacy target over the configured number of rounds, and
/// the clipping norm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpConfig {
    pub epsilon: f64,
    pub delta: f64,
    /// Rounds the budget must last. Each round releases one update per public adapter and
    /// bucket; all of them are accounted (they may come from the same data).
    pub rounds: u64,
    /// `C`: the Frobenius norm `ΔW` is clipped to, over all targets of an update.
    pub clip: f64,
}

impl Default for DpConfig {
    fn default() -> Self {
        DpConfig { epsilon: 1.0, delta: 1e-5, rounds: 10, clip: 1.0 }
    }
}

/// A public-tier update that went through clipping and noise; the only public thing
/// [`seal_public`] takes.
#[derive(Debug, Clone, PartialEq)]
pub struct PublicRelease(Update);

impl PublicRelease {
    pub fn update(&self) -> &Update {
        &self.0
    }
}

/// The public tier of one node: the calibrated noise and the accountant of what was released.
#[derive(Debug, Clone)]
pub struct PublicTier {
    pub cfg: DpConfig,
    /// The noise multiplier: std of the noise / `clip`.
    pub z: f64,
    pub accountant: Accountant,
}

impl PublicTier {
    /// Calibrates the noise for `cfg.rounds` rounds of `per_round` releases each.
    pub fn new(cfg: DpConfig, per_round: u64) -> Result<PublicTier> {
        if !(cfg.clip > 0.0 && cfg.clip.is_finite()) {
            return Err(Error::Config(format!("clip norm {} must be positive", cfg.clip)));
        }
        let releases = cfg.rounds.checked_mul(per_round).ok_or_else(|| Error::Config(format!("{} rounds of {per_round} releases", cfg.rounds)))?;
        Ok(PublicTier { z: calibrate(cfg.epsilon, cfg.delta, releases)?, cfg, accountant: Accountant::new() })
    }

    /// ε spent so far.
    pub fn epsilon_spent(&self) -> f64 {
        self.accountant.epsilon(self.cfg.delta)
    }

    /// Clips, noises, re-factorises and signs `u` for release; records the release. Refused
    /// once the budget is spent.
    pub fn release<R: RngCore + CryptoRng>(&mut self, u: &Update, key: &SigningKey, rng: &mut R) -> Result<PublicRelease> {
        let would_be = self.accountant.epsilon_after(self.z, self.cfg.delta);
        if would_be > self.cfg.epsilon * (1.0 + 1e-9) {
            return Err(Error::BudgetExhausted { would_be, budget: self.cfg.epsilon });
        }
        let sigma = self.z * self.cfg.clip;
        let scale = u.scale as f64 * clip_factor(u, self.cfg.clip);
        let mut gauss = || gaussian(rng);
        let targets = u
            .targets
            .iter()
            .map(|t| {
                let mut dense = t.delta(scale);
                dense.iter_mut().for_each(|x| *x += sigma * gauss());
                refactor(t, &dense, &mut gauss)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut out = Update { targets, scale: 1.0, samples: 1, quality: 0.0, improvement: 0.0, tier: Tier::Public, signature: None, ..u.clone() };
        out.sign(key);
        self.accountant.record(self.z);
        Ok(PublicRelease(out))
    }
}

/// `min(1, C / ‖ΔW‖_F)`, the factor that clips `u` to norm `clip`.
pub fn clip_factor(u: &Update, clip: f64) -> f64 {
    let n = u.delta_norm();
    if n > clip {
        clip / n
    } else {
        1.0
    }
}

/// The rank-`t.rank` factors (balanced) of the dense `d_out × d_in` matrix `dense`.
fn refactor(t: &Factors, dense: &[f64], gauss: &mut dyn FnMut() -> f64) -> Result<Factors> {
    let (u, s, v) = truncated_svd_dense(dense, t.d_out, t.d_in, t.rank, gauss);
    let r = s.len();
    let mut a = Vec::with_capacity(r * t.d_in);
    let mut b = vec![0.0f32; t.d_out * r];
    for j in 0..r {
        let c = s[j].sqrt();
        a.extend(v[j].iter().map(|&x| (c * x) as f32));
        for o in 0..t.d_out {
            b[o * r + j] = (c * u[j][o]) as f32;
        }
    }
    Factors::new(t.layer, &t.proj, r, t.d_in, t.d_out, a, b)
}

/// A standard normal number (Box–Muller).
fn gaussian<R: Rng>(rng: &mut R) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::update::tests::{key, random_update};
    use rand::SeedableRng;

    const T: &[(u32, &str, usize, usize, usize)] = &[(1, "ffn_down", 2, 16, 8)];

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(42)
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    fn keys() -> Keys {
        Keys { group: Some([7; 32]), tenant: Some(Tenant { key: [9; 32], members: vec![key(1).verifying_key().to_bytes()] }) }
    }

    #[test]
    fn private_updates_cannot_be_sealed() {
        let mut u = random_update(&key(1), "m", None, 1, T, 1);
        u.tier = Tier::Private;
        u.sign(&key(1));
        assert!(matches!(seal(&u, &keys(), &mut rng()), Err(Error::PrivateTier { .. })));
        u.tier = Tier::Public;
        u.sign(&key(1));
        assert!(seal(&u, &keys(), &mut rng()).is_err(), "public only as a DP release");
    }

    #[test]
    fn group_envelopes_hide_the_factors_and_authenticate_the_header() {
        let u = random_update(&key(1), "m", None, 3, T, 2);
        let mut r = rng();
        let e1 = seal(&u, &keys(), &mut r).expect("seals");
        let e2 = seal(&u, &keys(), &mut r).expect("seals");
        assert_ne!(e1[HEADER_LEN..HEADER_LEN + NONCE_LEN], e2[HEADER_LEN..HEADER_LEN + NONCE_LEN], "a fresh nonce each time");
        assert!(!contains(&e1, &f32_bytes(&u.targets[0].a[..4])), "plaintext factors on the wire");
        let (h, body) = open(&e1, &keys()).expect("opens");
        assert_eq!(h, Header::of(&u));
        assert_eq!(Update::decode(&body, 8).expect("decodes"), u);

        let wrong = Keys { group: Some([8; 32]), ..keys() };
        assert_eq!(open(&e1, &wrong).err(), Some(Reject::Undecryptable));
        assert_eq!(open(&e1, &Keys::default()).err(), Some(Reject::Undecryptable));
        let mut replayed_as_later_round = e1.clone();
        replayed_as_later_round[9] ^= 1;
        assert_eq!(open(&replayed_as_later_round, &keys()).err(), Some(Reject::Undecryptable));
        let mut flipped = e1.clone();
        let last = flipped.len() - 20;
        flipped[last] ^= 1;
        assert_eq!(open(&flipped, &keys()).err(), Some(Reject::Undecryptable));
        assert_eq!(open(&e1[..HEADER_LEN + 3], &keys()).err(), Some(Reject::Malformed));
    }

    #[test]
    fn tenant_envelopes_only_from_members() {
        let mut member = random_update(&key(1), "t", None, 1, T, 3);
        member.tier = Tier::Tenant;
        member.sign(&key(1));
        let e = seal(&member, &keys(), &mut rng()).expect("a member seals");
        assert!(open(&e, &keys()).is_ok());
        let mut outsider = random_update(&key(2), "t", None, 1, T, 4);
        outsider.tier = Tier::Tenant;
        outsider.sign(&key(2));
        assert!(matches!(seal(&outsider, &keys(), &mut rng()), Err(Error::Key(_))));
        // An outsider who got hold of the tenant key still is not accepted.
        let forged = seal_bytes(&Header::of(&outsider), &outsider.encode(), &[9; 32], &mut rng()).expect("seals");
        assert_eq!(open(&forged, &keys()).err(), Some(Reject::NotTenantMember));
    }

    #[test]
    fn public_release_clips_noises_withholds_metadata_and_signs() {
        let cfg = DpConfig { epsilon: 1.0, delta: 1e-5, rounds: 3, clip: 0.1 };
        let mut tier = PublicTier::new(cfg, 1).expect("calibrates");
        let u = random_update(&key(1), "p", None, 1, T, 5);
        assert!(u.delta_norm() > 10.0 * cfg.clip, "the test update must need clipping");
        let mut r = rng();
        let rel = tier.release(&u, &key(1), &mut r).expect("releases");
        let p = rel.update();
        assert_eq!((p.tier, p.samples, p.quality, p.improvement, p.scale), (Tier::Public, 1, 0.0, 0.0, 1.0));
        assert_eq!(p.targets[0].rank, 2);
        assert_eq!(p.verify(), Ok(()));
        let wire = seal_public(&rel);
        assert!(!contains(&wire, &f32_bytes(&u.targets[0].a[..4])), "the original factors on the wire");
        let (h, body) = open(&wire, &Keys::default()).expect("public opens without keys");
        assert_eq!((h.tier, Update::decode(&body, 8).expect("decodes")), (Tier::Public, p.clone()));
        assert!(tier.epsilon_spent() > 0.0 && tier.epsilon_spent() <= 1.0);
        tier.release(&u, &key(1), &mut r).expect("second");
        tier.release(&u, &key(1), &mut r).expect("third");
        assert!(tier.epsilon_spent() <= 1.0, "spent {}", tier.epsilon_spent());
        assert!(matches!(tier.release(&u, &key(1), &mut r), Err(Error::BudgetExhausted { .. })));
        // Two releases a round (two public buckets): the same rounds need more noise.
        assert!(PublicTier::new(cfg, 2).expect("calibrates").z > tier.z);
    }

    #[test]
    fn clipping_bounds_the_norm_and_keeps_the_direction() {
        let u = random_update(&key(1), "p", None, 1, &[(1, "ffn_down", 2, 16, 8), (2, "attn_q", 1, 8, 8)], 6);
        let c = clip_factor(&u, 0.25);
        let clipped = Update { scale: (u.scale as f64 * c) as f32, ..u.clone() };
        assert!((clipped.delta_norm() - 0.25).abs() < 1e-5);
        assert_eq!(clip_factor(&clipped, 1.0), 1.0, "a small update is left as it is");
    }

    #[test]
    fn the_noise_has_the_calibrated_std() {
        let mut r = rng();
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| gaussian(&mut r)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.01, "mean {mean}, var {var}");
        // With z·C the std, a zero update's release is pure noise of that size: the rank-2
        // projection of a 8×16 Gaussian matrix keeps a predictable part of it.
        let cfg = DpConfig { epsilon: 1.0, delta: 1e-5, rounds: 1, clip: 1.0 };
        let mut tier = PublicTier::new(cfg, 1).expect("calibrates");
        let mut zero = random_update(&key(1), "p", None, 1, T, 7);
        zero.scale = 0.0;
        let rel = tier.release(&zero, &key(1), &mut r).expect("releases");
        let got = rel.update().delta_norm();
        let full = tier.z * (8.0f64 * 16.0).sqrt();
        assert!(got > 0.3 * full && got < full, "noise norm {got}, all of it would be {full}");
    }
}
