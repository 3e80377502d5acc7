//! Parameters: where each lives in its bucket, and their initial values.
//!
//! A model's parameters are grouped into buckets, one handle per bucket on each replica
//! (and the same for gradients and the optimizer's two moments), so that a bucket's
//! gradients are all-reduced as one collective and updated by one AdamW operation over
//! the whole bucket as a flat tensor. Initial values are computed on the host from the
//! seed (Philox normals, the same bits for every replica whatever its device) and
//! copied to each replica.

use xpu_hal::ops::{Layout, PhiloxStream};
use xpu_hal::{DType, Result};
use xpu_scheduler::{Handle, TensorRef};

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Normal with mean 0 and this standard deviation.
    Normal(f32),
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
}

/// A parameter as a model declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Its name, for messages and checkpoints (`mlp.w1`).
    pub name: String,
    /// Its shape.
    pub dims: Vec<u64>,
    /// How it starts.
    pub init: Init,
}

impl ParamSpec {
    /// A parameter named `name` of shape `dims`.
    pub fn new(name: impl Into<String>, dims: &[u64], init: Init) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            dims: dims.to_vec(),
            init,
        }
    }

    /// Its number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Where a parameter lives: its bucket and its offset there, in elements.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    /// The bucket.
    pub bucket: usize,
    /// Offset in the bucket, in elements.
    pub offset: u64,
    /// Its shape.
    pub dims: Vec<u64>,
}

impl Slot {
    /// The parameter (or its gradient, or a moment) in `handles`, one per bucket, whose
    /// elements are `dtype`.
    pub fn of(&self, handles: &[Handle], dtype: DType) -> Result<TensorRef> {
        Ok(TensorRef::strided(
            handles[self.bucket],
            self.offset * dtype.size() as u64,
            Layout::contiguous(dtype, &self.dims)?,
        ))
    }
}

/// Every parameter of a model, laid out in its buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamLayout {
    /// The declarations, bucket by bucket.
    pub specs: Vec<Vec<ParamSpec>>,
    /// The elements of each bucket.
    pub bucket_elements: Vec<u64>,
}

impl ParamLayout {
    /// Lays out `specs` (one list per bucket) densely in declaration order.
    pub fn new(specs: Vec<Vec<ParamSpec>>) -> ParamLayout {
        let bucket_elements = specs
            .iter()
            .map(|b| b.iter().map(ParamSpec::elements).sum())
            .collect();
        ParamLayout {
            specs,
            bucket_elements,
        }
    }

    /// The slot of the parameter named `name`.
    pub fn slot(&self, name: &str) -> Option<Slot> {
        for (bucket, specs) in self.specs.iter().enumerate() {
            let mut offset = 0;
            for s in specs {
                if s.name == name {
                    return Some(Slot {
                        bucket,
                        offset,
                        dims: s.dims.clone(),
                    });
                }
                offset += s.elements();
            }
        }
        None
    }

    /// The parameter count.
    pub fn total(&self) -> u64 {
        self.bucket_elements.iter().sum()
    }

    /// The initial values of each bucket for `seed`: parameter `k` (counting across
    /// buckets) draws from Philox with key `seed` and counters from `k·2³²`.
    pub fn initial_values(&self, seed: u64) -> Vec<Vec<f32>> {
        let mut k = 0u64;
        self.specs
            .iter()
            .map(|specs| {
                let mut values = Vec::new();
                for s in specs {
                    let stream = PhiloxStream {
                        seed,
                        offset: k << 32,
                    };
                    k += 1;
                    values.extend((0..s.elements()).map(|n| match s.init {
                        Init::Normal(std) => (stream.normal(n) * f64::from(std)) as f32,
                        Init::Zeros => 0.0,
                        Init::Ones => 1.0,
                    }));
                }
                values
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_dense_in_declaration_order() {
        let l = ParamLayout::new(vec![
            vec![
                ParamSpec::new("a", &[2, 3], Init::Zeros),
                ParamSpec::new("b", &[4], Init::Ones),
            ],
            vec![ParamSpec::new("c", &[5], Init::Normal(1.0))],
        ]);
        assert_eq!(l.bucket_elements, [10, 5]);
        assert_eq!(l.slot("b").unwrap().offset, 6);
        assert_eq!(l.slot("c").unwrap().bucket, 1);
        assert!(l.slot("d").is_none());
        let v = l.initial_values(7);
        assert_eq!(&v[0][..6], &[0.0; 6]);
        assert_eq!(&v[0][6..], &[1.0; 4]);
        assert_eq!(v, l.initial_values(7));
        assert_ne!(v, l.initial_values(8));
    }
}
