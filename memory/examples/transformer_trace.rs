//! Writes the tensor lifetimes of GPT-2-style decoder training steps as an allocsim trace
//! (`start_op end_op bytes` per tensor) for `xpu_memory::replay`.
//!
//! ```text
//! cargo run -p xpu-memory --example transformer_trace -- \
//!     [--layers 12] [--hidden 768] [--heads 12] [--seq 1024] [--batch 8] [--vocab 50257] \
//!     [--act-bytes 4] [--steps 3] [--format allocsim] \
//!     [--out memory/tests/data/transformer_train.log]
//! ```
//!
//! `--format xpu-json` writes the same trace as an xpu-json event log instead. Without
//! `--out` the trace goes to standard output. The number of requests (tensors) and
//! the peak of live bytes are printed on standard error.
//!
//! # What it models
//!
//! A nanoGPT-style GPT-2 (pre-layernorm blocks, attention written out as matmul, scale, causal
//! mask and softmax rather than a fused kernel, exact GELU MLP of 4× hidden, final layernorm,
//! language-model head tied to the token embedding, no dropout) trained with
//! `cross_entropy`, gradient-norm clipping and AdamW in PyTorch's `foreach` implementation,
//! following PyTorch autograd's lifetimes. Each kernel is one op; its outputs are allocated
//! when it starts and its inputs are freed when it ends if it was their last use.
//!
//! * **Once, kept to the end:** every parameter in fp32, in module order (token embedding
//!   `[vocab, hidden]`, position embedding `[seq, hidden]`, per layer two layernorms, the
//!   `qkv` `[3·hidden, hidden]`, attention output `[hidden, hidden]`, MLP `[4·hidden, hidden]`
//!   and `[hidden, 4·hidden]` weights with their biases, the final layernorm) and each layer's
//!   causal-mask buffer `[seq, seq]` fp32. Adam's two moment tensors per parameter are
//!   allocated by the first optimizer step and kept.
//! * **Forward, per step:** the token and target ids `[batch, seq]` int64, the position ids,
//!   the two embedding lookups (freed once summed). Per layer: layernorm output and its fp32
//!   mean and rstd `[batch·seq]`; the `qkv` projection `[batch·seq, 3·hidden]`, freed once the
//!   contiguous copies of q, k and v that the batched matmuls save are made; the attention
//!   scores `[batch, heads, seq, seq]`, the scaled and the masked scores (temporaries) and the
//!   softmax (saved); the attention output and its transposed contiguous copy (saved by the
//!   output projection); the projection and the residual sum; the second layernorm; the MLP
//!   input projection `[batch·seq, 4·hidden]` and its GELU (both saved); the MLP output and
//!   the residual sum that is the next layer's input. Then the final layernorm, the logits
//!   `[batch·seq, vocab]` (held by the caller until backward ends), the log-softmax (saved)
//!   and the loss scalars.
//! * **Backward:** the reverse, each saved activation freed by the backward op that last
//!   uses it: the gradient of the log-probabilities and of the logits `[batch·seq, vocab]`,
//!   the tied embedding's gradient `[vocab, hidden]` (from the head, kept until the embedding
//!   backward adds its own `[vocab, hidden]` part), per layer the input-gradient and
//!   weight-gradient matmuls, the GELU, softmax, mask and scale backward on
//!   `[batch, heads, seq, seq]`, the gradients of q, k and v concatenated into the `qkv`
//!   gradient, the layernorm backward and the residual gradient sums. Parameter gradients
//!   (fp32) are allocated when computed.
//! * **Optimizer:** gradient clipping (one norm scalar per parameter, their stack, the total
//!   norm and the clip coefficient), AdamW (in place except the per-parameter square roots of
//!   the second moments, freed at the end of the step), then `zero_grad(set_to_none=True)`
//!   frees every gradient; the caller then drops the loss.
//!
//! `--act-bytes 2` models bf16 activations: every activation is 2 bytes per element (the
//! layernorm statistics stay fp32), each linear layer's weight and bias get a 2-byte copy
//! when first used in the forward pass that lives until the layer's backward, and weight
//! gradients are computed in 2 bytes before being accumulated into the fp32 gradients.
//! Parameters, gradients and Adam states are fp32 in both cases.
//!
//! Not modelled: dropout, fused or flash attention kernels, the autocast casts of
//! layernorm and softmax inputs, CUDA-graph or cuBLAS workspaces, and the data loader's host
//! memory.

use std::process::ExitCode;

use xpu_memory::{Trace, TraceFormat};

/// The model and run shape.
#[derive(Debug, Clone)]
struct Shape {
    layers: u64,
    hidden: u64,
    heads: u64,
    seq: u64,
    batch: u64,
    vocab: u64,
    act_bytes: u64,
    steps: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            layers: 12,
            hidden: 768,
            heads: 12,
            seq: 1024,
            batch: 8,
            vocab: 50257,
            act_bytes: 4,
            steps: 3,
        }
    }
}

/// A tensor: its index in the trace.
type T = usize;

/// Bytes of an fp32 element.
const F32: u64 = 4;
/// Bytes of an int64 element.
const I64: u64 = 8;

/// Builds the trace: tensors are allocated at the current op's start and freed at its end.
#[derive(Default)]
struct Gen {
    op: u64,
    start: Vec<u64>,
    end: Vec<Option<u64>>,
    bytes: Vec<u64>,
    persistent: Vec<bool>,
    errors: Vec<String>,
}

impl Gen {
    /// A tensor of `bytes` produced by the current op.
    fn alloc(&mut self, bytes: u64) -> T {
        self.start.push(self.op);
        self.end.push(None);
        self.bytes.push(bytes);
        self.persistent.push(false);
        self.start.len() - 1
    }

    /// A tensor kept until the end of the trace.
    fn keep(&mut self, bytes: u64) -> T {
        let t = self.alloc(bytes);
        self.persistent[t] = true;
        t
    }

    /// Frees `t` at the end of the current op.
    fn free(&mut self, t: T) {
        match self.end.get_mut(t) {
            Some(end @ None) if !self.persistent[t] => *end = Some(self.op),
            _ => self
                .errors
                .push(format!("tensor {t} freed twice or kept (op {})", self.op)),
        }
    }

    /// Frees each of `ts` at the end of the current op.
    fn free_all(&mut self, ts: &[T]) {
        for &t in ts {
            self.free(t);
        }
    }

    /// A temporary allocated and freed by the current op.
    fn temp(&mut self, bytes: u64) {
        let t = self.alloc(bytes);
        self.free(t);
    }

    /// Ends the current op.
    fn next(&mut self) {
        self.op += 1;
    }

    /// The trace, with kept tensors freed at one final op.
    fn finish(self) -> Result<Trace, String> {
        if let Some(e) = self.errors.first() {
            return Err(e.clone());
        }
        let last = self.op;
        let mut entries = Vec::with_capacity(self.start.len());
        for t in 0..self.start.len() {
            let end = match self.end[t] {
                Some(end) => end,
                None if self.persistent[t] => last,
                None => return Err(format!("tensor {t} (op {}) is never freed", self.start[t])),
            };
            entries.push(xpu_memory::TraceEntry {
                start_op: self.start[t],
                end_op: end,
                bytes: self.bytes[t],
            });
        }
        Ok(Trace { entries })
    }
}

/// A linear layer's parameters: (weight index, bias index) into the parameter list.
#[derive(Clone, Copy)]
struct Linear {
    w: usize,
    b: usize,
}

/// One block's parameter indices.
struct BlockParams {
    ln1: Linear,
    qkv: Linear,
    proj: Linear,
    ln2: Linear,
    fc: Linear,
    proj2: Linear,
}

/// What a block's forward pass saves for its backward pass.
struct Saved {
    x_in: T,
    ln1: [T; 3],
    q: T,
    k: T,
    v: T,
    att: T,
    merged: T,
    x_mid: T,
    ln2: [T; 3],
    fc: T,
    gelu: T,
    /// 2-byte weight copies per linear (qkv, proj, fc, proj2): (weight, bias).
    casts: [Option<(T, T)>; 4],
}

/// The trace generator's state across steps.
struct Model {
    s: Shape,
    /// Parameter tensors and their element counts.
    params: Vec<(T, u64)>,
    wte: usize,
    wpe: usize,
    blocks: Vec<BlockParams>,
    ln_f: Linear,
    /// Adam's moments, allocated by the first step.
    adam: Vec<(T, T)>,
    /// Gradients of the current step, by parameter.
    grads: Vec<Option<T>>,
}

impl Model {
    fn new(g: &mut Gen, s: Shape) -> Model {
        let c = s.hidden;
        let mut params = Vec::new();
        let mut param = |g: &mut Gen, elems: u64| -> usize {
            let t = g.keep(elems * F32);
            g.next();
            params.push((t, elems));
            params.len() - 1
        };
        let wte = param(g, s.vocab * c);
        let wpe = param(g, s.seq * c);
        let mut blocks = Vec::new();
        for _ in 0..s.layers {
            let mut linear = |g: &mut Gen, out: u64, inp: u64| Linear {
                w: param(g, out * inp),
                b: param(g, out),
            };
            let ln1 = linear(g, c, 1);
            let qkv = linear(g, 3 * c, c);
            let proj = linear(g, c, c);
            let ln2 = linear(g, c, 1);
            let fc = linear(g, 4 * c, c);
            let proj2 = linear(g, c, 4 * c);
            blocks.push(BlockParams {
                ln1,
                qkv,
                proj,
                ln2,
                fc,
                proj2,
            });
        }
        let ln_f = Linear {
            w: param(g, c),
            b: param(g, c),
        };
        // The causal-mask buffer of each attention layer.
        for _ in 0..s.layers {
            g.keep(s.seq * s.seq * F32);
            g.next();
        }
        let n = params.len();
        Model {
            s,
            params,
            wte,
            wpe,
            blocks,
            ln_f,
            adam: Vec::new(),
            grads: vec![None; n],
        }
    }

    /// Bytes of an activation of `elems` elements.
    fn act(&self, elems: u64) -> u64 {
        elems * self.s.act_bytes
    }

    /// With 2-byte activations, the weight and bias copies of a linear layer.
    fn cast(&self, g: &mut Gen, l: Linear) -> Option<(T, T)> {
        if self.s.act_bytes == F32 {
            return None;
        }
        let w = g.alloc(self.act(self.params[l.w].1));
        let b = g.alloc(self.act(self.params[l.b].1));
        g.next();
        Some((w, b))
    }

    /// Allocates the fp32 gradient of parameter `p` in the current op; a matmul weight
    /// gradient (`matmul`) is first computed in 2 bytes when activations are 2 bytes.
    fn grad(&mut self, g: &mut Gen, p: usize, matmul: bool) {
        let elems = self.params[p].1;
        if matmul && self.s.act_bytes != F32 {
            g.temp(self.act(elems));
        }
        // Accumulation into an existing gradient happens in place.
        if self.grads[p].is_none() {
            self.grads[p] = Some(g.alloc(elems * F32));
        }
    }

    /// The weight-gradient op of a linear layer: weight and bias gradients, then the saved
    /// input and the layer's weight copies are freed.
    fn linear_wgrad(&mut self, g: &mut Gen, l: Linear, input: T, cast: Option<(T, T)>) {
        self.grad(g, l.w, true);
        self.grad(g, l.b, true);
        g.free(input);
        if let Some((w, b)) = cast {
            g.free_all(&[w, b]);
        }
        g.next();
    }

    /// A layernorm forward op: output, mean and rstd.
    fn layernorm(&self, g: &mut Gen) -> [T; 3] {
        let n = self.s.batch * self.s.seq;
        let out = g.alloc(self.act(n * self.s.hidden));
        let mean = g.alloc(n * F32);
        let rstd = g.alloc(n * F32);
        g.next();
        [out, mean, rstd]
    }

    /// A layernorm backward op: input gradient and parameter gradients; frees the output
    /// gradient, the saved input and the statistics.
    fn layernorm_back(&mut self, g: &mut Gen, l: Linear, grad_out: T, x: T, saved: [T; 3]) -> T {
        let n = self.s.batch * self.s.seq;
        let grad_in = g.alloc(self.act(n * self.s.hidden));
        self.grad(g, l.w, false);
        self.grad(g, l.b, false);
        g.free_all(&[grad_out, x, saved[1], saved[2]]);
        g.next();
        grad_in
    }

    /// A block's forward pass from `x`; returns its output and what it saves.
    fn block_forward(&self, g: &mut Gen, b: &BlockParams, x: T) -> (T, Saved) {
        let s = &self.s;
        let (n, c) = (s.batch * s.seq, s.hidden);
        let scores = s.batch * s.heads * s.seq * s.seq;
        let ln1 = self.layernorm(g);
        let qkv_cast = self.cast(g, b.qkv);
        let qkv = g.alloc(self.act(n * 3 * c));
        g.next();
        let q = g.alloc(self.act(n * c));
        g.next();
        let k = g.alloc(self.act(n * c));
        g.next();
        let raw = g.alloc(self.act(scores));
        g.next();
        let scaled = g.alloc(self.act(scores));
        g.free(raw);
        g.next();
        let masked = g.alloc(self.act(scores));
        g.free(scaled);
        g.next();
        let att = g.alloc(self.act(scores));
        g.free(masked);
        g.next();
        let v = g.alloc(self.act(n * c));
        g.free(qkv);
        g.next();
        let y = g.alloc(self.act(n * c));
        g.next();
        let merged = g.alloc(self.act(n * c));
        g.free(y);
        g.next();
        let proj_cast = self.cast(g, b.proj);
        let proj = g.alloc(self.act(n * c));
        g.next();
        let x_mid = g.alloc(self.act(n * c));
        g.free(proj);
        g.next();
        let ln2 = self.layernorm(g);
        let fc_cast = self.cast(g, b.fc);
        let fc = g.alloc(self.act(n * 4 * c));
        g.next();
        let gelu = g.alloc(self.act(n * 4 * c));
        g.next();
        let proj2_cast = self.cast(g, b.proj2);
        let mlp = g.alloc(self.act(n * c));
        g.next();
        let out = g.alloc(self.act(n * c));
        g.free(mlp);
        g.next();
        let saved = Saved {
            x_in: x,
            ln1,
            q,
            k,
            v,
            att,
            merged,
            x_mid,
            ln2,
            fc,
            gelu,
            casts: [qkv_cast, proj_cast, fc_cast, proj2_cast],
        };
        (out, saved)
    }

    /// A block's backward pass from the gradient of its output; returns the gradient of its
    /// input.
    fn block_backward(&mut self, g: &mut Gen, layer: usize, sv: Saved, grad: T) -> T {
        let (n, c) = (self.s.batch * self.s.seq, self.s.hidden);
        let scores = self.s.batch * self.s.heads * self.s.seq * self.s.seq;
        let (ln1, qkv, proj, ln2, fc, proj2) = {
            let b = &self.blocks[layer];
            (b.ln1, b.qkv, b.proj, b.ln2, b.fc, b.proj2)
        };
        // MLP output projection, GELU, input projection.
        let g_gelu = g.alloc(self.act(n * 4 * c));
        g.next();
        self.linear_wgrad(g, proj2, sv.gelu, sv.casts[3]);
        let g_fc = g.alloc(self.act(n * 4 * c));
        g.free_all(&[g_gelu, sv.fc]);
        g.next();
        let g_ln2 = g.alloc(self.act(n * c));
        g.next();
        g.free(g_fc);
        self.linear_wgrad(g, fc, sv.ln2[0], sv.casts[2]);
        let g_mid_part = self.layernorm_back(g, ln2, g_ln2, sv.x_mid, sv.ln2);
        // The residual: the output gradient plus the MLP branch's.
        let g_mid = g.alloc(self.act(n * c));
        g.free_all(&[grad, g_mid_part]);
        g.next();
        // Attention output projection and the head merge.
        let g_merged = g.alloc(self.act(n * c));
        g.next();
        self.linear_wgrad(g, proj, sv.merged, sv.casts[1]);
        let g_y = g.alloc(self.act(n * c));
        g.free(g_merged);
        g.next();
        // att @ v.
        let g_att = g.alloc(self.act(scores));
        g.next();
        let g_v = g.alloc(self.act(n * c));
        g.free_all(&[g_y, sv.v]);
        g.next();
        // Softmax, mask, scale.
        let g_masked = g.alloc(self.act(scores));
        g.free_all(&[g_att, sv.att]);
        g.next();
        let g_scaled = g.alloc(self.act(scores));
        g.free(g_masked);
        g.next();
        let g_raw = g.alloc(self.act(scores));
        g.free(g_scaled);
        g.next();
        // q @ k^T.
        let g_q = g.alloc(self.act(n * c));
        g.next();
        let g_k = g.alloc(self.act(n * c));
        g.free_all(&[g_raw, sv.q, sv.k]);
        g.next();
        // The split of qkv: its backward concatenates the three gradients.
        let g_qkv = g.alloc(self.act(n * 3 * c));
        g.free_all(&[g_q, g_k, g_v]);
        g.next();
        let g_ln1 = g.alloc(self.act(n * c));
        g.next();
        g.free(g_qkv);
        self.linear_wgrad(g, qkv, sv.ln1[0], sv.casts[0]);
        let g_in_part = self.layernorm_back(g, ln1, g_ln1, sv.x_in, sv.ln1);
        let g_in = g.alloc(self.act(n * c));
        g.free_all(&[g_mid, g_in_part]);
        g.next();
        g_in
    }

    /// One training step.
    fn step(&mut self, g: &mut Gen) {
        let s = self.s.clone();
        let (n, c, v) = (s.batch * s.seq, s.hidden, s.vocab);
        // Inputs.
        let idx = g.alloc(n * I64);
        g.next();
        let targets = g.alloc(n * I64);
        g.next();
        let pos = g.alloc(s.seq * I64);
        g.next();
        // Embeddings.
        let tok = g.alloc(self.act(n * c));
        g.next();
        let pe = g.alloc(self.act(s.seq * c));
        g.next();
        let mut x = g.alloc(self.act(n * c));
        g.free_all(&[tok, pe]);
        g.next();
        // Blocks.
        let mut saved = Vec::with_capacity(self.blocks.len());
        for layer in 0..self.blocks.len() {
            let (out, sv) = self.block_forward(g, &self.blocks[layer], x);
            saved.push(sv);
            x = out;
        }
        // Final layernorm, head, loss.
        let lnf = self.layernorm(g);
        let head_cast = (s.act_bytes != F32).then(|| {
            let t = g.alloc(self.act(v * c));
            g.next();
            t
        });
        let logits = g.alloc(self.act(n * v));
        g.next();
        let logp = g.alloc(self.act(n * v));
        g.next();
        let loss = g.alloc(F32);
        let total_weight = g.alloc(F32);
        g.next();

        // Backward: loss, log-softmax, head.
        let g_loss = g.alloc(F32);
        g.next();
        let g_logp = g.alloc(self.act(n * v));
        g.free_all(&[g_loss, targets, total_weight]);
        g.next();
        let g_logits = g.alloc(self.act(n * v));
        g.free_all(&[g_logp, logp]);
        g.next();
        let g_lnf = g.alloc(self.act(n * c));
        g.next();
        // The head's weight gradient is the tied embedding's, kept until the embedding adds
        // its part.
        self.grad(g, self.wte, true);
        g.free_all(&[g_logits, lnf[0]]);
        if let Some(t) = head_cast {
            g.free(t);
        }
        g.next();
        let ln_f = self.ln_f;
        let mut grad = self.layernorm_back(g, ln_f, g_lnf, x, lnf);
        // Blocks in reverse.
        for layer in (0..self.blocks.len()).rev() {
            if let Some(sv) = saved.pop() {
                grad = self.block_backward(g, layer, sv, grad);
            }
        }
        // Embeddings: the position gradient summed over the batch, then both lookups.
        let g_pe = g.alloc(self.act(s.seq * c));
        g.next();
        self.grad(g, self.wpe, false);
        g.free_all(&[g_pe, pos]);
        g.next();
        g.temp(v * c * F32);
        g.free_all(&[grad, idx]);
        g.next();
        // The caller's logits go once backward is done.
        g.free(logits);
        g.next();

        // Gradient clipping.
        let p = self.params.len() as u64;
        let norms: Vec<T> = (0..p).map(|_| g.alloc(F32)).collect();
        g.next();
        let stack = g.alloc(p * F32);
        g.free_all(&norms);
        g.next();
        let total = g.alloc(F32);
        g.free(stack);
        g.next();
        let sum = g.alloc(F32);
        g.next();
        let coef = g.alloc(F32);
        g.free(sum);
        g.next();
        let clamped = g.alloc(F32);
        g.free(coef);
        g.next();
        g.free_all(&[clamped, total]);
        g.next();

        // AdamW: moments on the first step, square roots of the second moments.
        if self.adam.is_empty() {
            for &(_, elems) in &self.params {
                let m = g.keep(elems * F32);
                let v2 = g.keep(elems * F32);
                self.adam.push((m, v2));
            }
            g.next();
        }
        let sqrt: Vec<T> = self
            .params
            .iter()
            .map(|&(_, elems)| g.alloc(elems * F32))
            .collect();
        g.next();
        g.free_all(&sqrt);
        g.next();

        // zero_grad(set_to_none=True), then the caller drops the loss.
        let grads: Vec<T> = self.grads.iter_mut().filter_map(Option::take).collect();
        g.free_all(&grads);
        g.free(loss);
        g.next();
    }
}

/// Parses `--name value` options into a shape and an output path.
fn parse_args() -> Result<(Shape, Option<String>, TraceFormat), String> {
    let mut shape = Shape::default();
    let mut out = None;
    let mut format = TraceFormat::Allocsim;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if flag == "--out" {
            out = Some(value);
            continue;
        }
        if flag == "--format" {
            format = match TraceFormat::from_name(&value) {
                Some(f @ (TraceFormat::Allocsim | TraceFormat::XpuJson)) => f,
                _ => return Err(format!("--format is allocsim or xpu-json, got `{value}`")),
            };
            continue;
        }
        let number: u64 = value
            .parse()
            .map_err(|_| format!("{flag} needs a positive integer, got `{value}`"))?;
        if number == 0 {
            return Err(format!("{flag} must be positive"));
        }
        match flag.as_str() {
            "--layers" => shape.layers = number,
            "--hidden" => shape.hidden = number,
            "--heads" => shape.heads = number,
            "--seq" => shape.seq = number,
            "--batch" => shape.batch = number,
            "--vocab" => shape.vocab = number,
            "--act-bytes" => shape.act_bytes = number,
            "--steps" => shape.steps = number,
            _ => {
                return Err(format!(
                    "unknown option {flag}; options: --layers --hidden --heads --seq --batch \
                     --vocab --act-bytes --steps --format --out"
                ))
            }
        }
    }
    if !shape.hidden.is_multiple_of(shape.heads) {
        return Err(format!(
            "--hidden {} is not a multiple of --heads {}",
            shape.hidden, shape.heads
        ));
    }
    Ok((shape, out, format))
}

fn run() -> Result<(), String> {
    let (shape, out, format) = parse_args()?;
    let mut g = Gen::default();
    let mut model = Model::new(&mut g, shape.clone());
    for _ in 0..shape.steps {
        model.step(&mut g);
    }
    let trace = g.finish()?;
    let peak = trace.peak_live();
    let header = format!(
        "# GPT-2-style training trace (memory/examples/transformer_trace.rs): layers {} \
         hidden {} heads {} seq {} batch {} vocab {} act-bytes {} steps {}\n\
         # requests {} peak_live_bytes {}\n",
        shape.layers,
        shape.hidden,
        shape.heads,
        shape.seq,
        shape.batch,
        shape.vocab,
        shape.act_bytes,
        shape.steps,
        trace.entries.len(),
        peak
    );
    let text = match format {
        TraceFormat::XpuJson => trace.to_xpu_json(),
        _ => header + &trace.to_allocsim(),
    };
    match &out {
        Some(path) => {
            std::fs::write(path, &text).map_err(|e| format!("cannot write {path}: {e}"))?
        }
        None => print!("{text}"),
    }
    eprintln!(
        "requests {} peak_live_bytes {} ({:.1} MiB)",
        trace.entries.len(),
        peak,
        peak as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transformer_trace: {e}");
            ExitCode::FAILURE
        }
    }
}
