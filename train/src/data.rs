//! The synthetic tasks the models learn, generated from the seed alone (nothing is
//! downloaded).
//!
//! Example `i` of the whole run (`i = step·batch + row`) is drawn from Philox with the
//! run's seed and counters derived from `i`, so any step's batch can be made again from
//! the step number alone: the data position of a checkpoint is its step.
//!
//! - [`ModularAddition`] (the MLP's): two numbers `a, b < p`, labelled `(a + b) mod p`.
//! - [`Reverse`] (the transformer's): `n` digits, a separator, and the digits reversed,
//!   as next-token prediction; only the reversed half has labels.

use xpu_hal::ops::PhiloxStream;

/// Stream key offset of the training data (the parameters use the seed itself).
const DATA_STREAM: u64 = 0x5eed_da7a;

/// Modular addition over `modulus` classes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModularAddition {
    /// `p`: the operands and labels are below it.
    pub modulus: u32,
    /// The run's seed.
    pub seed: u64,
}

/// Examples as a model reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Examples {
    /// The input tokens, example after example.
    pub tokens: Vec<i32>,
    /// The label of each row of the loss (−1: no loss on that row).
    pub labels: Vec<i32>,
}

/// A task: examples by position in the run.
pub trait Dataset: Send + Sync {
    /// Examples `first .. first + count` of the run.
    fn examples(&self, first: u64, count: usize) -> Examples;

    /// Labelled rows per example (the rows whose loss counts).
    fn targets_per_example(&self) -> u64;
}

impl Dataset for ModularAddition {
    fn targets_per_example(&self) -> u64 {
        1
    }

    /// Tokens `a0, b0, a1, b1, …`, one label per example.
    fn examples(&self, first: u64, count: usize) -> Examples {
        let stream = PhiloxStream {
            seed: self.seed ^ DATA_STREAM,
            offset: 0,
        };
        let p = u64::from(self.modulus);
        let mut tokens = Vec::with_capacity(2 * count);
        let mut labels = Vec::with_capacity(count);
        for i in first..first + count as u64 {
            let bits = stream.block(i);
            let a = (u64::from(bits[0]) * p) >> 32;
            let b = (u64::from(bits[1]) * p) >> 32;
            tokens.push(a as i32);
            tokens.push(b as i32);
            labels.push(((a + b) % p) as i32);
        }
        Examples { tokens, labels }
    }
}

/// The separator token of [`Reverse`] (the digits are tokens 0 to 9).
pub const SEPARATOR: i32 = 10;

/// Reversing `digits` digits: the sequence `d1 … dn SEP dn … d1`, read as next-token
/// prediction over its first `2n` tokens; the rows predicting the reversed digits have
/// labels, the others −1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reverse {
    /// `n`, at most 64.
    pub digits: u32,
    /// The run's seed.
    pub seed: u64,
}

impl Reverse {
    /// Tokens per example (the model's context).
    pub fn context(&self) -> u64 {
        2 * u64::from(self.digits)
    }
}

impl Dataset for Reverse {
    fn targets_per_example(&self) -> u64 {
        u64::from(self.digits)
    }

    fn examples(&self, first: u64, count: usize) -> Examples {
        let stream = PhiloxStream {
            seed: self.seed ^ DATA_STREAM,
            offset: 1 << 62,
        };
        let n = self.digits as usize;
        let mut tokens = Vec::with_capacity(2 * n * count);
        let mut labels = Vec::with_capacity(2 * n * count);
        let mut seq = Vec::with_capacity(2 * n + 1);
        for i in first..first + count as u64 {
            seq.clear();
            for k in 0..n as u64 {
                let v = stream.value(i.wrapping_mul(64).wrapping_add(k));
                seq.push(((u64::from(v) * 10) >> 32) as i32);
            }
            seq.push(SEPARATOR);
            for k in (0..n).rev() {
                seq.push(seq[k]);
            }
            tokens.extend_from_slice(&seq[..2 * n]);
            labels.extend((1..=2 * n).map(|t| if t > n { seq[t] } else { -1 }));
        }
        Examples { tokens, labels }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_depend_on_their_position_only() {
        let task = ModularAddition {
            modulus: 7,
            seed: 3,
        };
        let all = task.examples(0, 10);
        let tail = task.examples(4, 6);
        assert_eq!(&all.tokens[8..], &tail.tokens[..]);
        assert_eq!(&all.labels[4..], &tail.labels[..]);
        for (i, l) in all.labels.iter().enumerate() {
            let (a, b) = (all.tokens[2 * i], all.tokens[2 * i + 1]);
            assert!((0..7).contains(&a) && (0..7).contains(&b));
            assert_eq!(*l, (a + b) % 7);
        }
        assert_ne!(all, ModularAddition { seed: 4, ..task }.examples(0, 10));
    }

    #[test]
    fn reverse_examples_label_the_reversed_half() {
        let task = Reverse { digits: 3, seed: 9 };
        let ex = task.examples(5, 2);
        assert_eq!((ex.tokens.len(), ex.labels.len()), (12, 12));
        let (t, l) = (&ex.tokens[..6], &ex.labels[..6]);
        assert_eq!(t[3], SEPARATOR);
        assert_eq!(&l[..2], &[-1, -1]);
        // Row 2 (reading d3) predicts the separator: no label. Rows 3..5 predict d3, d2, d1.
        assert_eq!(l[2], -1);
        assert_eq!(&l[3..], &[t[2], t[1], t[0]]);
        assert_eq!(&t[4..], &[t[2], t[1]]);
        assert_eq!(task.examples(6, 1).tokens, ex.tokens[6..]);
        assert_eq!(task.targets_per_example(), 3);
    }
}
