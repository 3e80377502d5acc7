//! Philox 4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as
//! 1, 2, 3", SC'11): a counter-based generator, so element `n` of a random tensor is a
//! pure function of (seed, offset, n) and every device computes the same bits.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

/// Philox 4x32 with 10 rounds: the four 32-bit outputs for `counter` under `key`.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c0);
        let (hi1, lo1) = mulhilo(M1, c2);
        (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);
    }
    [c0, c1, c2, c3]
}

/// A uniform value in `[0, 1)` from 32 random bits: the top 24 bits times 2⁻²⁴, exact in
/// `f32`.
#[inline]
pub fn uniform_from_bits(bits: u32) -> f32 {
    (bits >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// The stream of 32-bit values that a random operation with `seed` and `offset` uses:
/// value `n` is output `n mod 4` of [`philox4x32_10`] with key `(seed low, seed high)`
/// and counter `(c low, c high, 0, 0)` where `c = offset + n/4` (wrapping).
#[derive(Debug, Clone, Copy)]
pub struct PhiloxStream {
    /// The key.
    pub seed: u64,
    /// The first counter.
    pub offset: u64,
}

impl PhiloxStream {
    /// The four values of block `block` (values `4·block` to `4·block + 3`).
    #[inline]
    pub fn block(&self, block: u64) -> [u32; 4] {
        let c = self.offset.wrapping_add(block);
        philox4x32_10(
            [c as u32, (c >> 32) as u32, 0, 0],
            [self.seed as u32, (self.seed >> 32) as u32],
        )
    }

    /// Value `n`.
    #[inline]
    pub fn value(&self, n: u64) -> u32 {
        self.block(n / 4)[(n % 4) as usize]
    }

    /// The standard normal value of element `n` by Box–Muller: elements `4b` and `4b+1`
    /// use outputs 0 and 1 of block `b` (cosine and sine), `4b+2` and `4b+3` outputs 2
    /// and 3, with `u1 = (bits₁ >> 8 + 1)·2⁻²⁴` in `(0, 1]` and `u2 = (bits₂ >> 8)·2⁻²⁴`.
    pub fn normal(&self, n: u64) -> f64 {
        let block = self.block(n / 4);
        let lane = (n % 4) as usize;
        let pair = lane & !1;
        let u1 = (f64::from(block[pair] >> 8) + 1.0) / 16_777_216.0;
        let u2 = f64::from(block[pair + 1] >> 8) / 16_777_216.0;
        let r = (-2.0 * u1.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * u2;
        if lane & 1 == 0 {
            r * angle.cos()
        } else {
            r * angle.sin()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors of the Random123 distribution (kat_vectors, philox4x32_10).
    #[test]
    fn known_answers() {
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn stream_values_continue_across_offsets() {
        let a = PhiloxStream { seed: 7, offset: 0 };
        let b = PhiloxStream { seed: 7, offset: 2 };
        assert_eq!(a.value(8), b.value(0));
        assert_eq!(a.value(11), b.value(3));
        assert_ne!(a.value(0), PhiloxStream { seed: 8, offset: 0 }.value(0));
        assert!(uniform_from_bits(u32::MAX) < 1.0 && uniform_from_bits(0) == 0.0);
    }

    #[test]
    fn normals_look_normal() {
        let s = PhiloxStream { seed: 1, offset: 0 };
        let n = 40_000;
        let xs: Vec<f64> = (0..n).map(|i| s.normal(i)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
    }
}
