//! Privacy accounting for the public tier: Rényi differential privacy (RDP) of the Gaussian
//! mechanism (Mironov, "Rényi Differential Privacy", 2017), composed over the releases and
//! converted to (ε, δ).
//!
//! A release adds `N(0, (z·C)²)` to a quantity of L2 sensitivity `C`; at order `α` it is
//! `(α, α / (2z²))`-RDP, and RDP adds up under composition, so `R` releases give
//! `R·α / (2z²)`. The conversion to (ε, δ)-DP is the one of Canonne, Kamath and Steinke ("The
//! Discrete Gaussian for Differential Privacy", 2020, Prop. 12), also used by Opacus and
//! TensorFlow Privacy: `ε = rdp(α) + ln((α−1)/α) − (ln δ + ln α)/(α − 1)`, minimised over a grid
//! of orders. Releases without subsampling compose to a Gaussian mechanism of noise multiplier
//! `z/√R` exactly (Dong, Roth and Su, "Gaussian Differential Privacy", 2019), which the tests use
//! as the tight reference the accountant must never undercut.

use crate::{Error, Result};

/// The orders `α` the accountant tracks: dense near 1 (where long compositions are tight),
/// sparse further out (where few releases with little noise are).
fn orders() -> Vec<f64> {
    let mut v: Vec<f64> = (1..=100).map(|i| 1.0 + i as f64 / 20.0).collect();
    v.extend((7..=64).map(|i| i as f64));
    v.extend([80.0, 96.0, 128.0, 192.0, 256.0, 512.0, 1024.0]);
    v
}

/// RDP of one Gaussian release with noise multiplier `z` (noise std / sensitivity) at `alpha`.
pub fn gaussian_rdp(z: f64, alpha: f64) -> f64 {
    alpha / (2.0 * z * z)
}

/// (ε at δ) from RDP values `rdp` at `orders`, and the order that attains it.
pub fn rdp_to_epsilon(orders: &[f64], rdp: &[f64], delta: f64) -> (f64, f64) {
    let mut best = (f64::INFINITY, f64::NAN);
    for (&a, &r) in orders.iter().zip(rdp) {
        let eps = r + ((a - 1.0) / a).ln() - (delta.ln() + a.ln()) / (a - 1.0);
        if eps < best.0 {
            best = (eps.max(0.0), a);
        }
    }
    best
}

/// ε after `releases` Gaussian releases with noise multiplier `z`, at `delta`.
pub fn gaussian_epsilon(z: f64, releases: u64, delta: f64) -> f64 {
    let o = orders();
    let rdp: Vec<f64> = o.iter().map(|&a| releases as f64 * gaussian_rdp(z, a)).collect();
    rdp_to_epsilon(&o, &rdp, delta).0
}

/// The smallest noise multiplier (to 1e-4 relative) for which `releases` Gaussian releases stay
/// within (`epsilon`, `delta`).
pub fn calibrate(epsilon: f64, delta: f64, releases: u64) -> Result<f64> {
    let usable = epsilon > 0.0 && epsilon.is_finite() && delta > 0.0 && delta < 1.0 && releases > 0;
    if !usable {
        return Err(Error::Config(format!(
            "privacy target epsilon {epsilon}, delta {delta}, releases {releases}: need epsilon > 0, 0 < delta < 1, releases ≥ 1"
        )));
    }
    let (mut lo, mut hi) = (1e-3, 1e-3);
    while gaussian_epsilon(hi, releases, delta) > epsilon {
        lo = hi;
        hi *= 2.0;
        if hi > 1e9 {
            return Err(Error::Config(format!("no noise level reaches epsilon {epsilon} over {releases} releases")));
        }
    }
    while hi - lo > 1e-4 * hi {
        let mid = 0.5 * (lo + hi);
        if gaussian_epsilon(mid, releases, delta) > epsilon {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(hi)
}

/// Running RDP totals of the releases made so far.
#[derive(Debug, Clone)]
pub struct Accountant {
    orders: Vec<f64>,
    rdp: Vec<f64>,
    pub releases: u64,
}

impl Default for Accountant {
    fn default() -> Self {
        Accountant::new()
    }
}

impl Accountant {
    pub fn new() -> Accountant {
        let orders = orders();
        let rdp = vec![0.0; orders.len()];
        Accountant { orders, rdp, releases: 0 }
    }

    /// Records one Gaussian release with noise multiplier `z`.
    pub fn record(&mut self, z: f64) {
        for (r, &a) in self.rdp.iter_mut().zip(&self.orders) {
            *r += gaussian_rdp(z, a);
        }
        self.releases += 1;
    }

    /// ε spent so far at `delta` (0 before any release).
    pub fn epsilon(&self, delta: f64) -> f64 {
        if self.releases == 0 {
            return 0.0;
        }
        rdp_to_epsilon(&self.orders, &self.rdp, delta).0
    }

    /// ε after one more release with noise multiplier `z`.
    pub fn epsilon_after(&self, z: f64, delta: f64) -> f64 {
        let mut next = self.clone();
        next.record(z);
        next.epsilon(delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Φ(x)` through Numerical Recipes' `erfcc` (a Chebyshev fit of the complementary error
    /// function, fractional error below 1.2e-7).
    fn phi(x: f64) -> f64 {
        let z = -x / std::f64::consts::SQRT_2;
        let t = 1.0 / (1.0 + 0.5 * z.abs());
        let poly = -z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
        let erfc = t * poly.exp();
        0.5 * if z >= 0.0 { erfc } else { 2.0 - erfc }
    }

    /// The exact δ(ε) of a Gaussian mechanism of sensitivity 1 and std `s` (Balle and Wang,
    /// "Improving the Gaussian Mechanism for Differential Privacy", 2018, Thm. 8).
    fn exact_delta(s: f64, eps: f64) -> f64 {
        phi(0.5 / s - eps * s) - eps.exp() * phi(-0.5 / s - eps * s)
    }

    /// The exact ε at `delta` of `R` releases with multiplier `z` (one mechanism of std `z/√R`).
    fn exact_epsilon(z: f64, releases: u64, delta: f64) -> f64 {
        let s = z / (releases as f64).sqrt();
        let (mut lo, mut hi) = (0.0, 100.0);
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if exact_delta(s, mid) > delta {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        hi
    }

    #[test]
    fn gaussian_rdp_known_values() {
        // α/(2z²): TensorFlow Privacy's `compute_rdp(q=1, noise_multiplier=10, steps=1, orders=20)`
        // is 0.1.
        assert!((gaussian_rdp(10.0, 20.0) - 0.1).abs() < 1e-15);
        assert!((gaussian_rdp(1.0, 2.0) - 1.0).abs() < 1e-15);
        let mut acc = Accountant::new();
        assert_eq!(acc.epsilon(1e-5), 0.0);
        acc.record(10.0);
        acc.record(10.0);
        let o = orders();
        let at = o.iter().position(|&a| a == 20.0).expect("order 20 on the grid");
        assert!((acc.rdp[at] - 0.2).abs() < 1e-15, "RDP composes additively");
    }

    #[test]
    fn the_exact_reference_reproduces_the_analytic_gaussian_mechanism() {
        // Balle and Wang's analytic calibration for ε = 1, δ = 1e-5 gives σ ≈ 3.73 (the classical
        // bound √(2 ln(1.25/δ))/ε gives 4.84).
        let (mut lo, mut hi) = (1.0, 10.0);
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if exact_delta(mid, 1.0) > 1e-5 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        assert!((hi - 3.73).abs() < 0.01, "analytic Gaussian sigma {hi}");
    }

    #[test]
    fn accountant_is_sound_and_close_to_the_exact_composition() {
        for (z, r) in [(1.0, 1), (2.0, 10), (5.0, 100), (15.0, 10), (0.8, 3)] {
            let delta = 1e-5;
            let acc = gaussian_epsilon(z, r, delta);
            let exact = exact_epsilon(z, r, delta);
            // zCDP conversion (Bun and Steinke 2016): ρ = R/(2z²), ε = ρ + 2√(ρ ln(1/δ)).
            let rho = r as f64 / (2.0 * z * z);
            let zcdp = rho + 2.0 * (rho * (1.0 / delta).ln()).sqrt();
            assert!(acc >= exact, "z {z}, R {r}: accountant {acc} below the exact {exact}");
            assert!(acc <= 1.3 * exact, "z {z}, R {r}: accountant {acc} far above the exact {exact}");
            assert!(acc <= zcdp + 1e-3, "z {z}, R {r}: accountant {acc} worse than zCDP {zcdp}");
        }
    }

    #[test]
    fn calibration_meets_the_target_tightly() {
        for rounds in [1, 5, 20, 100] {
            let z = calibrate(1.0, 1e-5, rounds).expect("calibrates");
            assert!(gaussian_epsilon(z, rounds, 1e-5) <= 1.0);
            assert!(gaussian_epsilon(0.99 * z, rounds, 1e-5) > 1.0, "rounds {rounds}: z {z} is not the smallest");
            let mut acc = Accountant::new();
            (0..rounds).for_each(|_| acc.record(z));
            assert!(acc.epsilon(1e-5) <= 1.0);
            assert!(acc.epsilon_after(z, 1e-5) > 1.0, "one release more than configured exceeds the budget");
        }
        assert!(calibrate(0.0, 1e-5, 1).is_err());
        assert!(calibrate(1.0, 1.5, 1).is_err());
    }
}
