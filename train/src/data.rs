//! The synthetic task a model learns, generated from the seed alone (nothing is
//! downloaded).
//!
//! Modular addition: an example is two numbers `a, b < p` and its label `(a + b) mod p`.
//! Example `i` of the whole run (`i = step·batch + row`) draws `a` and `b` from Philox
//! with the run's seed and counter `i`, so any step's batch can be made again from the
//! step number alone: the data position of a checkpoint is its step.

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

/// One micro-batch of examples as the model reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Examples {
    /// `a0, b0, a1, b1, …`: two token indices per example.
    pub tokens: Vec<i32>,
    /// The label of each example.
    pub labels: Vec<i32>,
}

impl ModularAddition {
    /// Examples `first .. first + count` of the run.
    pub fn examples(&self, first: u64, count: usize) -> Examples {
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
}
