//! Codelets: a kind of task, with one implementation per kind of device.
//!
//! A [`Codelet`] names what a task computes and how each kind of device computes it: a
//! kernel in any format the HAL loads (a host function, WGSL or SPIR-V for Vulkan, PTX or
//! CUDA C for CUDA, a plugin's native format), or one of the HAL's builtin operations,
//! which every backend provides. A task of the codelet may run on any device that loads
//! one of its implementations and supports the dtypes it declares.
//!
//! Arguments reach an implementation in a fixed order: the task's handles in the order
//! the task lists them (as buffers, with the access the task declares), then the task's
//! scalars. Kernels are loaded once per device and kept for the codelet's life.

use rustc_hash::FxHashMap as HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::op::OpSlot;
use xpu_hal::ops::Op;
use xpu_hal::{
    BinaryOp, DType, Device, Error, Kernel, KernelDesc, KernelParam, KernelSource, LaunchDims,
    Result, Scalar,
};

/// Launch dimensions for a kernel implementation, from the sizes in bytes of the task's
/// buffers (in the task's order).
pub type DimsFn = dyn Fn(&[u64]) -> LaunchDims + Send + Sync;

/// One of the HAL's builtin operations as a codelet implementation. The task's buffers
/// are its operands, in the order given for each variant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Builtin {
    /// Buffers `[dst]`: `dst[i] = value`.
    Fill {
        /// The value (its dtype is the element type).
        value: Scalar,
    },
    /// Buffers `[a, b, dst]`: `dst[i] = a[i] op b[i]`.
    Binary {
        /// The operator.
        op: BinaryOp,
        /// Element type of the three.
        dtype: DType,
    },
    /// Buffers `[dst, src]`: `dst[i] = dst[i] op src[i]` (`dst` accessed read-write or
    /// as a reduction).
    Accumulate {
        /// The operator.
        op: BinaryOp,
        /// Element type of both.
        dtype: DType,
    },
    /// Buffers `[src, dst]`: `dst[i] = src[i] * alpha`.
    Scale {
        /// The factor (its dtype is the element type).
        alpha: Scalar,
    },
    /// Buffers `[src, dst]`: `dst[i] = src[i] as to`.
    Cast {
        /// Source element type.
        from: DType,
        /// Destination element type.
        to: DType,
    },
}

impl Builtin {
    /// How many buffers the operation takes.
    pub fn buffers(&self) -> usize {
        match self {
            Builtin::Fill { .. } => 1,
            Builtin::Binary { .. } => 3,
            Builtin::Accumulate { .. } | Builtin::Scale { .. } | Builtin::Cast { .. } => 2,
        }
    }

    /// The dtypes a device must support to run it.
    pub fn dtypes(&self) -> Vec<DType> {
        match *self {
            Builtin::Fill { value } => vec![value.dtype()],
            Builtin::Binary { dtype, .. } | Builtin::Accumulate { dtype, .. } => vec![dtype],
            Builtin::Scale { alpha } => vec![alpha.dtype()],
            Builtin::Cast { from, to } => vec![from, to],
        }
    }
}

/// How one kind of device computes a codelet.
#[derive(Clone)]
pub enum Implementation {
    /// A kernel: loaded on every device whose capabilities list its format.
    Kernel {
        /// The source (its format decides which devices load it).
        source: KernelSource,
        /// The entry point.
        entry: String,
        /// The declared parameters: the task's buffers, then its scalars.
        params: Vec<KernelParam>,
        /// The launch dimensions.
        dims: Arc<DimsFn>,
    },
    /// A builtin operation of the HAL, which every device runs for the dtypes its
    /// capabilities list.
    Builtin(Builtin),
    /// A standard operation of the HAL ([`xpu_hal::ops`]) with its tensors bound to the
    /// task's handles, which devices run when their capabilities list it (see
    /// [`crate::op`]).
    Op(Box<Op<OpSlot>>),
}

impl fmt::Debug for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Implementation::Kernel { source, entry, .. } => {
                write!(f, "Kernel({}, `{entry}`)", source.format())
            }
            Implementation::Builtin(b) => write!(f, "Builtin({b:?})"),
            Implementation::Op(op) => write!(f, "Op({})", op.kind()),
        }
    }
}

impl Implementation {
    /// Whether `device` can run this implementation.
    fn runs_on(&self, device: &Device) -> bool {
        let caps = device.capabilities();
        match self {
            Implementation::Kernel { source, .. } => caps.supports_kernel_format(source.format()),
            Implementation::Builtin(b) => b.dtypes().iter().all(|d| caps.supports_dtype(*d)),
            Implementation::Op(op) => {
                let (kind, dtype) = Implementation::op_support(op);
                caps.supports_op(kind, dtype)
            }
        }
    }

    /// The format, for messages (`builtin` for a builtin).
    fn label(&self) -> String {
        match self {
            Implementation::Kernel { source, .. } => source.format().to_string(),
            Implementation::Builtin(_) => "builtin".to_string(),
            Implementation::Op(op) => {
                let (kind, dtype) = Implementation::op_support(op);
                format!("standard operation {kind} on {dtype}")
            }
        }
    }
}

static NEXT_CODELET: AtomicU64 = AtomicU64::new(1);

struct Inner {
    id: u64,
    /// Shared with the labels of its tasks.
    name: Arc<str>,
    implementations: Vec<Implementation>,
    dtypes: Vec<DType>,
    /// Kernels loaded so far, by device uid and implementation index.
    kernels: Mutex<HashMap<(u64, usize), Kernel>>,
}

/// A kind of task (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Codelet {
    inner: Arc<Inner>,
}

impl fmt::Debug for Codelet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Codelet")
            .field("name", &self.inner.name)
            .field("implementations", &self.inner.implementations)
            .field("dtypes", &self.inner.dtypes)
            .finish()
    }
}

/// Builds a [`Codelet`].
pub struct CodeletBuilder {
    name: String,
    implementations: Vec<Implementation>,
    dtypes: Vec<DType>,
}

impl CodeletBuilder {
    /// A host-function implementation (host devices), with its declared parameters.
    pub fn host<F>(self, params: Vec<KernelParam>, f: F) -> Self
    where
        F: Fn(&mut xpu_hal::HostKernelContext<'_>) -> std::result::Result<(), String>
            + Send
            + Sync
            + 'static,
    {
        self.kernel(KernelSource::host_fn(f), "main", params, |_| {
            LaunchDims::linear(1, 1)
        })
    }

    /// A kernel implementation in any format: devices that list the format load it.
    pub fn kernel(
        mut self,
        source: KernelSource,
        entry: impl Into<String>,
        params: Vec<KernelParam>,
        dims: impl Fn(&[u64]) -> LaunchDims + Send + Sync + 'static,
    ) -> Self {
        self.implementations.push(Implementation::Kernel {
            source,
            entry: entry.into(),
            params,
            dims: Arc::new(dims),
        });
        self
    }

    /// A builtin-operation implementation, which every device runs.
    pub fn builtin(mut self, op: Builtin) -> Self {
        self.implementations.push(Implementation::Builtin(op));
        self
    }

    /// Dtypes the codelet computes in: a device must support all of them.
    pub fn dtypes(mut self, dtypes: &[DType]) -> Self {
        self.dtypes.extend_from_slice(dtypes);
        self
    }

    /// The codelet; fails if it has no implementation.
    pub fn build(self) -> Result<Codelet> {
        if self.implementations.is_empty() {
            return Err(Error::invalid(format!(
                "codelet `{}` has no implementation; add one with host(), kernel() or builtin()",
                self.name
            )));
        }
        Ok(Codelet {
            inner: Arc::new(Inner {
                id: NEXT_CODELET.fetch_add(1, Ordering::Relaxed),
                name: Arc::from(self.name),
                implementations: self.implementations,
                dtypes: self.dtypes,
                kernels: Mutex::new(HashMap::default()),
            }),
        })
    }
}

impl Codelet {
    /// Starts a codelet named `name` (for messages, traces and performance models: the
    /// name is the model's key, so give different computations different names).
    #[allow(clippy::new_ret_no_self)]
    pub fn new(name: impl Into<String>) -> CodeletBuilder {
        CodeletBuilder {
            name: name.into(),
            implementations: Vec::new(),
            dtypes: Vec::new(),
        }
    }

    /// The codelet with one builtin implementation, named after the operation. The same
    /// operation gives the same codelet each time (one model, one reduction key).
    pub fn from_builtin(op: Builtin) -> Codelet {
        static MADE: OnceLock<Mutex<Vec<(Builtin, Codelet)>>> = OnceLock::new();
        let made = MADE.get_or_init(|| Mutex::new(Vec::new()));
        let mut made = made.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, c)) = made.iter().find(|(b, _)| *b == op) {
            return c.clone();
        }
        let codelet = Codelet {
            inner: Arc::new(Inner {
                id: NEXT_CODELET.fetch_add(1, Ordering::Relaxed),
                name: format!("builtin.{op:?}").into(),
                implementations: vec![Implementation::Builtin(op)],
                dtypes: Vec::new(),
                kernels: Mutex::new(HashMap::default()),
            }),
        };
        made.push((op, codelet.clone()));
        codelet
    }

    /// The codelet running the standard operation `op` over its task's handles (see
    /// [`crate::Task::op`]), named `name`.
    pub(crate) fn from_op(name: String, op: Op<OpSlot>) -> Codelet {
        Codelet {
            inner: Arc::new(Inner {
                id: NEXT_CODELET.fetch_add(1, Ordering::Relaxed),
                name: Arc::from(name),
                implementations: vec![Implementation::Op(Box::new(op))],
                dtypes: Vec::new(),
                kernels: Mutex::new(HashMap::default()),
            }),
        }
    }

    /// A codelet with no implementation of its own, named `name`: the kind of a task the
    /// scheduler makes itself (a replayed run of a graph), so that it has a performance
    /// model and a label.
    pub(crate) fn internal(name: impl Into<Arc<str>>) -> Codelet {
        Codelet {
            inner: Arc::new(Inner {
                id: NEXT_CODELET.fetch_add(1, Ordering::Relaxed),
                name: name.into(),
                implementations: Vec::new(),
                dtypes: Vec::new(),
                kernels: Mutex::new(HashMap::default()),
            }),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its name, shared (a task's default label).
    pub(crate) fn shared_name(&self) -> Arc<str> {
        self.inner.name.clone()
    }

    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Its implementations.
    pub fn implementations(&self) -> &[Implementation] {
        &self.inner.implementations
    }

    /// The implementation `device` runs (the first that fits), or why none does.
    pub fn implementation_for(&self, device: &Device) -> std::result::Result<usize, String> {
        let caps = device.capabilities();
        if let Some(d) = self.inner.dtypes.iter().find(|d| !caps.supports_dtype(**d)) {
            return Err(format!("{} does not support {d}", device.id()));
        }
        self.inner
            .implementations
            .iter()
            .position(|i| i.runs_on(device))
            .ok_or_else(|| {
                let offered: Vec<String> = self
                    .inner
                    .implementations
                    .iter()
                    .map(Implementation::label)
                    .collect();
                format!(
                    "{} runs none of its implementations ({})",
                    device.id(),
                    offered.join(", ")
                )
            })
    }

    /// Implementation `index` loaded on `device` as a kernel (loaded once per device).
    pub(crate) fn kernel(&self, device: &Device, index: usize) -> Result<Option<Kernel>> {
        let Some(Implementation::Kernel {
            source,
            entry,
            params,
            ..
        }) = self.inner.implementations.get(index)
        else {
            return Ok(None);
        };
        let key = (device.uid(), index);
        let mut kernels = self.inner.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = kernels.get(&key) {
            return Ok(Some(k.clone()));
        }
        let kernel = device.load_kernel(KernelDesc {
            name: self.inner.name.to_string(),
            entry_point: entry.clone(),
            source: source.clone(),
            params: params.clone(),
        })?;
        kernels.insert(key, kernel.clone());
        Ok(Some(kernel))
    }
}
