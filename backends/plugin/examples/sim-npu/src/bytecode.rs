//! `simnpu-bytecode`: the simulated NPU's native kernel format.
//!
//! A module holds named functions; each is a straight-line program over `f32` lanes,
//! run once per element. It is deliberately small — enough to write `axpy`, a scaled
//! sum or a clamp, and to exercise loading, argument checking and launch failures
//! through the plugin ABI.
//!
//! ## Execution model
//!
//! A launch runs invocations `i = 0 .. n`, where `n` is the launch's total number of
//! invocations (`grid` × `block`, all three dimensions) capped by the element count
//! (`length / 4`) of every buffer the function loads or stores. Each invocation starts
//! with its 16 registers `r0`–`r15` at 0.0 and runs the function's instructions in
//! order, touching only element `i` of each buffer. Arithmetic is IEEE `f32`; `min`
//! and `max` ignore a NaN operand.
//!
//! ## Encoding (all integers little-endian)
//!
//! ```text
//! module   := "SNPU" version:u8(=1) count:u8 function*count
//! function := name_len:u8 name:[u8; name_len] (UTF-8)
//!             params:u8 (number of launch arguments)
//!             code_len:u16 code:[u8; code_len]
//! code     := instruction*
//! ```
//!
//! | opcode | operands | effect |
//! |---|---|---|
//! | `0x01 LOAD`  | `rd, arg` | `rd = arg[i]` (a buffer argument the kernel may read) |
//! | `0x02 STORE` | `arg, rs` | `arg[i] = rs` (a buffer argument the kernel may write) |
//! | `0x03 PARAM` | `rd, arg` | `rd =` the `f32` scalar argument `arg` |
//! | `0x04 CONST` | `rd, imm:f32` | `rd = imm` |
//! | `0x05 INDEX` | `rd` | `rd = i as f32` |
//! | `0x10 ADD` `0x11 SUB` `0x12 MUL` `0x13 DIV` `0x14 MIN` `0x15 MAX` | `rd, ra, rb` | `rd = ra op rb` |
//! | `0x16 FMA`   | `rd, ra, rb, rc` | `rd = ra * rb + rc`, rounded once |
//! | `0x17 MOV`   | `rd, ra` | `rd = ra` |
//! | `0x20 TRAP`  | `code:u8` | the launch fails with "trap `code`" (reported by the next synchronize) |
//!
//! Registers are bytes 0–15; `arg` is a launch argument's index (below `params`). A
//! module is checked entirely when it is loaded; a launch checks that every argument
//! the function uses has the right kind and access.
//!
//! [`Module`] builds modules from Rust; [`axpy`] is the canonical example.

use std::fmt;
use std::sync::Arc;

use xpu_plugin_sdk::{Access, Error, Result};

/// The format's name, as `kernel_format` and `kernel_load` spell it.
pub const FORMAT: &str = "simnpu-bytecode";

/// The module header's magic bytes.
pub const MAGIC: &[u8; 4] = b"SNPU";

/// The encoding version this crate reads and writes.
pub const VERSION: u8 = 1;

/// Registers per invocation.
pub const REGISTERS: u8 = 16;

/// One instruction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Instr {
    /// `rd = arg[i]`.
    Load {
        /// Destination register.
        rd: u8,
        /// Buffer argument.
        arg: u8,
    },
    /// `arg[i] = rs`.
    Store {
        /// Buffer argument.
        arg: u8,
        /// Source register.
        rs: u8,
    },
    /// `rd = scalar argument arg`.
    Param {
        /// Destination register.
        rd: u8,
        /// Scalar argument.
        arg: u8,
    },
    /// `rd = value`.
    Const {
        /// Destination register.
        rd: u8,
        /// The value.
        value: f32,
    },
    /// `rd = i as f32`.
    Index {
        /// Destination register.
        rd: u8,
    },
    /// `rd = ra op rb`.
    Binary {
        /// The operator.
        op: BinOp,
        /// Destination register.
        rd: u8,
        /// Left operand.
        ra: u8,
        /// Right operand.
        rb: u8,
    },
    /// `rd = ra * rb + rc`, fused.
    Fma {
        /// Destination register.
        rd: u8,
        /// Factor.
        ra: u8,
        /// Factor.
        rb: u8,
        /// Addend.
        rc: u8,
    },
    /// `rd = ra`.
    Mov {
        /// Destination register.
        rd: u8,
        /// Source register.
        ra: u8,
    },
    /// Fails the launch.
    Trap {
        /// Reported in the error.
        code: u8,
    },
}

/// The two-operand arithmetic instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// The smaller, ignoring a NaN operand.
    Min,
    /// The larger, ignoring a NaN operand.
    Max,
}

impl BinOp {
    const ALL: [BinOp; 6] = [
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::Div,
        BinOp::Min,
        BinOp::Max,
    ];

    fn opcode(self) -> u8 {
        match self {
            BinOp::Add => 0x10,
            BinOp::Sub => 0x11,
            BinOp::Mul => 0x12,
            BinOp::Div => 0x13,
            BinOp::Min => 0x14,
            BinOp::Max => 0x15,
        }
    }

    /// Applies the operator.
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
            BinOp::Min => a.min(b),
            BinOp::Max => a.max(b),
        }
    }
}

impl Instr {
    fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Instr::Load { rd, arg } => out.extend([0x01, rd, arg]),
            Instr::Store { arg, rs } => out.extend([0x02, arg, rs]),
            Instr::Param { rd, arg } => out.extend([0x03, rd, arg]),
            Instr::Const { rd, value } => {
                out.extend([0x04, rd]);
                out.extend(value.to_le_bytes());
            }
            Instr::Index { rd } => out.extend([0x05, rd]),
            Instr::Binary { op, rd, ra, rb } => out.extend([op.opcode(), rd, ra, rb]),
            Instr::Fma { rd, ra, rb, rc } => out.extend([0x16, rd, ra, rb, rc]),
            Instr::Mov { rd, ra } => out.extend([0x17, rd, ra]),
            Instr::Trap { code } => out.extend([0x20, code]),
        }
    }

    fn registers(&self) -> Vec<u8> {
        match *self {
            Instr::Load { rd, .. } | Instr::Param { rd, .. } | Instr::Const { rd, .. } => vec![rd],
            Instr::Index { rd } => vec![rd],
            Instr::Store { rs, .. } => vec![rs],
            Instr::Binary { rd, ra, rb, .. } => vec![rd, ra, rb],
            Instr::Fma { rd, ra, rb, rc } => vec![rd, ra, rb, rc],
            Instr::Mov { rd, ra } => vec![rd, ra],
            Instr::Trap { .. } => vec![],
        }
    }

    fn argument(&self) -> Option<(u8, Use)> {
        match *self {
            Instr::Load { arg, .. } => Some((arg, Use::Read)),
            Instr::Store { arg, .. } => Some((arg, Use::Write)),
            Instr::Param { arg, .. } => Some((arg, Use::Scalar)),
            _ => None,
        }
    }
}

/// How a function uses one of its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Not at all.
    None,
    /// Loads from the buffer.
    Read,
    /// Stores to the buffer.
    Write,
    /// Loads from and stores to the buffer.
    ReadWrite,
    /// Reads it as an `f32` scalar.
    Scalar,
    /// Both as a buffer and as a scalar (which no launch can satisfy).
    Conflict,
}

impl Use {
    fn merge(self, other: Use) -> Use {
        match (self, other) {
            (Use::None, x) | (x, Use::None) => x,
            (a, b) if a == b => a,
            (Use::Scalar, _) | (_, Use::Scalar) | (Use::Conflict, _) | (_, Use::Conflict) => {
                Use::Conflict
            }
            _ => Use::ReadWrite,
        }
    }

    /// Whether a buffer argument with `access` allows this use.
    pub fn allowed_by(self, access: Access) -> bool {
        match self {
            Use::None => true,
            Use::Read => access.reads(),
            Use::Write => access.writes(),
            Use::ReadWrite => access.reads() && access.writes(),
            Use::Scalar | Use::Conflict => false,
        }
    }

    /// Whether the function touches the argument as a buffer.
    pub fn is_buffer(self) -> bool {
        matches!(self, Use::Read | Use::Write | Use::ReadWrite)
    }
}

/// A checked function, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// How many launch arguments it takes.
    pub params: u8,
    /// Its instructions.
    pub code: Vec<Instr>,
    /// How it uses each argument (`params` entries).
    pub uses: Vec<Use>,
}

impl Function {
    /// A function from its parts, checking registers and argument indexes.
    pub fn new(name: impl Into<String>, params: u8, code: Vec<Instr>) -> Result<Function> {
        let name = name.into();
        let mut uses = vec![Use::None; usize::from(params)];
        for (at, instr) in code.iter().enumerate() {
            if let Some(r) = instr.registers().into_iter().find(|&r| r >= REGISTERS) {
                return Err(Error::invalid_argument(format!(
                    "{FORMAT}: function `{name}`, instruction {at} ({instr:?}): register r{r} does not exist (r0 to r{})",
                    REGISTERS - 1
                )));
            }
            if let Some((arg, usage)) = instr.argument() {
                let Some(slot) = uses.get_mut(usize::from(arg)) else {
                    return Err(Error::invalid_argument(format!(
                        "{FORMAT}: function `{name}`, instruction {at} ({instr:?}): argument {arg} does not exist; the function takes {params}"
                    )));
                };
                *slot = slot.merge(usage);
                if *slot == Use::Conflict {
                    return Err(Error::invalid_argument(format!(
                        "{FORMAT}: function `{name}` uses argument {arg} both as a buffer and as a scalar"
                    )));
                }
            }
        }
        Ok(Function {
            name,
            params,
            code,
            uses,
        })
    }
}

/// A module under construction, or a parsed one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Module {
    /// Its functions.
    pub functions: Vec<Function>,
}

impl Module {
    /// An empty module.
    pub fn new() -> Self {
        Module::default()
    }

    /// Adds a function (checked as [`Function::new`] does).
    pub fn function(mut self, name: &str, params: u8, code: Vec<Instr>) -> Result<Self> {
        self.functions.push(Function::new(name, params, code)?);
        Ok(self)
    }

    /// The module's bytes.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut out = MAGIC.to_vec();
        out.push(VERSION);
        out.push(u8::try_from(self.functions.len()).map_err(|_| {
            Error::invalid_argument(format!("{FORMAT}: a module holds at most 255 functions"))
        })?);
        for f in &self.functions {
            let name = f.name.as_bytes();
            out.push(u8::try_from(name.len()).map_err(|_| {
                Error::invalid_argument(format!(
                    "{FORMAT}: function name `{}` is longer than 255 bytes",
                    f.name
                ))
            })?);
            out.extend(name);
            out.push(f.params);
            let mut code = Vec::new();
            for instr in &f.code {
                instr.encode(&mut code);
            }
            let len = u16::try_from(code.len()).map_err(|_| {
                Error::invalid_argument(format!(
                    "{FORMAT}: function `{}` is longer than 65535 bytes",
                    f.name
                ))
            })?;
            out.extend(len.to_le_bytes());
            out.extend(code);
        }
        Ok(out)
    }

    /// Parses and checks a module.
    pub fn decode(bytes: &[u8]) -> Result<Module> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != MAGIC {
            return Err(r.error("the module does not start with the magic bytes `SNPU`"));
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(r.error(&format!(
                "encoding version {version} is not supported; this device reads version {VERSION}"
            )));
        }
        let count = r.u8()?;
        let mut functions = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let name_len = r.u8()?;
            let name = std::str::from_utf8(r.take(usize::from(name_len))?)
                .map_err(|_| r.error("a function name is not UTF-8"))?
                .to_string();
            let params = r.u8()?;
            let code_len = u16::from_le_bytes([r.u8()?, r.u8()?]);
            let code = decode_code(r.take(usize::from(code_len))?, &name)?;
            if functions.iter().any(|f: &Function| f.name == name) {
                return Err(r.error(&format!("function `{name}` is defined twice")));
            }
            functions.push(Function::new(name, params, code)?);
        }
        if r.at != bytes.len() {
            return Err(r.error(&format!(
                "{} bytes follow the last function",
                bytes.len() - r.at
            )));
        }
        Ok(Module { functions })
    }

    /// The function named `name`.
    pub fn entry(&self, name: &str) -> Result<&Function> {
        self.functions
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.functions.iter().map(|f| f.name.as_str()).collect();
                Error::invalid_argument(format!(
                    "{FORMAT}: the module has no function `{name}`; it defines: {}",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ))
            })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn error(&self, what: &str) -> Error {
        Error::invalid_argument(format!("{FORMAT}: at byte {}: {what}", self.at))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end.and_then(|e| self.bytes.get(self.at..e)) {
            Some(s) => {
                self.at += n;
                Ok(s)
            }
            None => Err(self.error(&format!(
                "the module ends early (needed {n} more bytes, {} left)",
                self.bytes.len().saturating_sub(self.at)
            ))),
        }
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?.first().copied().unwrap_or(0))
    }
}

fn decode_code(code: &[u8], name: &str) -> Result<Vec<Instr>> {
    let mut r = Reader { bytes: code, at: 0 };
    let mut out = Vec::new();
    while r.at < code.len() {
        let op = r.u8()?;
        let instr = match op {
            0x01 => Instr::Load {
                rd: r.u8()?,
                arg: r.u8()?,
            },
            0x02 => Instr::Store {
                arg: r.u8()?,
                rs: r.u8()?,
            },
            0x03 => Instr::Param {
                rd: r.u8()?,
                arg: r.u8()?,
            },
            0x04 => {
                let rd = r.u8()?;
                let b = r.take(4)?;
                Instr::Const {
                    rd,
                    value: f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                }
            }
            0x05 => Instr::Index { rd: r.u8()? },
            0x16 => Instr::Fma {
                rd: r.u8()?,
                ra: r.u8()?,
                rb: r.u8()?,
                rc: r.u8()?,
            },
            0x17 => Instr::Mov {
                rd: r.u8()?,
                ra: r.u8()?,
            },
            0x20 => Instr::Trap { code: r.u8()? },
            other => match BinOp::ALL.into_iter().find(|b| b.opcode() == other) {
                Some(op) => Instr::Binary {
                    op,
                    rd: r.u8()?,
                    ra: r.u8()?,
                    rb: r.u8()?,
                },
                None => {
                    return Err(Error::invalid_argument(format!(
                        "{FORMAT}: function `{name}`, code byte {}: unknown opcode {other:#04x}",
                        r.at - 1
                    )))
                }
            },
        };
        out.push(instr);
    }
    Ok(out)
}

/// The canonical example: `axpy(a, x, y)` computes `y[i] = a * x[i] + y[i]` (multiply,
/// then add: two roundings), with `a` an `f32` scalar, `x` read and `y` read-write.
pub fn axpy() -> Module {
    let code = vec![
        Instr::Param { rd: 0, arg: 0 },
        Instr::Load { rd: 1, arg: 1 },
        Instr::Load { rd: 2, arg: 2 },
        Instr::Binary {
            op: BinOp::Mul,
            rd: 3,
            ra: 0,
            rb: 1,
        },
        Instr::Binary {
            op: BinOp::Add,
            rd: 3,
            ra: 3,
            rb: 2,
        },
        Instr::Store { arg: 2, rs: 3 },
    ];
    let uses = vec![Use::Scalar, Use::Read, Use::ReadWrite];
    Module {
        functions: vec![Function {
            name: "axpy".to_string(),
            params: 3,
            code,
            uses,
        }],
    }
}

/// A loaded kernel: one checked function.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) function: Arc<Function>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kernel({})", self.function.name)
    }
}

/// Lanes run per pass over the instructions.
const CHUNK: usize = 1024;

/// The buffers and scalars of one launch, as the interpreter sees them.
pub(crate) struct Frame<'a> {
    /// Buffer arguments by index (`None` for scalars and unused ones).
    pub(crate) buffers: Vec<Option<Lanes<'a>>>,
    /// Scalar arguments by index (0.0 for buffers).
    pub(crate) scalars: Vec<f32>,
}

/// One buffer argument's elements.
pub(crate) enum Lanes<'a> {
    /// Only loaded.
    Read(&'a [f32]),
    /// Stored (and maybe loaded).
    Write(&'a mut [f32]),
}

impl Lanes<'_> {
    fn len(&self) -> usize {
        match self {
            Lanes::Read(s) => s.len(),
            Lanes::Write(s) => s.len(),
        }
    }

    fn get(&self, i: usize) -> f32 {
        let v = match self {
            Lanes::Read(s) => s.get(i),
            Lanes::Write(s) => s.get(i),
        };
        v.copied().unwrap_or(0.0)
    }
}

/// Runs `f` for invocations `0 .. invocations` (capped by the buffers it touches).
pub(crate) fn run(f: &Function, invocations: u64, frame: &mut Frame<'_>) -> Result<()> {
    let mut n = usize::try_from(invocations).unwrap_or(usize::MAX);
    for (use_, buffer) in f.uses.iter().zip(&frame.buffers) {
        if use_.is_buffer() {
            n = n.min(buffer.as_ref().map_or(0, Lanes::len));
        }
    }
    let mut regs = vec![[0f32; CHUNK]; usize::from(REGISTERS)];
    let mut start = 0;
    while start < n {
        let len = CHUNK.min(n - start);
        for r in regs.iter_mut() {
            r[..len].fill(0.0);
        }
        for instr in &f.code {
            step(instr, start, len, &mut regs, frame)?;
        }
        start += len;
    }
    Ok(())
}

fn reg(regs: &[[f32; CHUNK]], r: u8) -> [f32; CHUNK] {
    regs.get(usize::from(r)).copied().unwrap_or([0.0; CHUNK])
}

fn step(
    instr: &Instr,
    start: usize,
    len: usize,
    regs: &mut [[f32; CHUNK]],
    frame: &mut Frame<'_>,
) -> Result<()> {
    let missing = || {
        Error::internal(format!(
            "{FORMAT}: {instr:?} refers to an argument the launch did not bind"
        ))
    };
    match *instr {
        Instr::Load { rd, arg } => {
            let src = frame
                .buffers
                .get(usize::from(arg))
                .and_then(Option::as_ref)
                .ok_or_else(missing)?;
            let d = regs.get_mut(usize::from(rd)).ok_or_else(missing)?;
            for (k, v) in d[..len].iter_mut().enumerate() {
                *v = src.get(start + k);
            }
        }
        Instr::Store { arg, rs } => {
            let s = reg(regs, rs);
            match frame
                .buffers
                .get_mut(usize::from(arg))
                .and_then(Option::as_mut)
            {
                Some(Lanes::Write(dst)) => {
                    if let Some(out) = dst.get_mut(start..start + len) {
                        out.copy_from_slice(&s[..len]);
                    }
                }
                _ => return Err(missing()),
            }
        }
        Instr::Param { rd, arg } => {
            let v = frame
                .scalars
                .get(usize::from(arg))
                .copied()
                .ok_or_else(missing)?;
            if let Some(d) = regs.get_mut(usize::from(rd)) {
                d[..len].fill(v);
            }
        }
        Instr::Const { rd, value } => {
            if let Some(d) = regs.get_mut(usize::from(rd)) {
                d[..len].fill(value);
            }
        }
        Instr::Index { rd } => {
            if let Some(d) = regs.get_mut(usize::from(rd)) {
                for (k, v) in d[..len].iter_mut().enumerate() {
                    *v = (start + k) as f32;
                }
            }
        }
        Instr::Binary { op, rd, ra, rb } => {
            let (a, b) = (reg(regs, ra), reg(regs, rb));
            if let Some(d) = regs.get_mut(usize::from(rd)) {
                for k in 0..len {
                    d[k] = op.apply(a[k], b[k]);
                }
            }
        }
        Instr::Fma { rd, ra, rb, rc } => {
            let (a, b, c) = (reg(regs, ra), reg(regs, rb), reg(regs, rc));
            if let Some(d) = regs.get_mut(usize::from(rd)) {
                for k in 0..len {
                    d[k] = a[k].mul_add(b[k], c[k]);
                }
            }
        }
        Instr::Mov { rd, ra } => {
            let a = reg(regs, ra);
            if let Some(d) = regs.get_mut(usize::from(rd)) {
                d[..len].copy_from_slice(&a[..len]);
            }
        }
        Instr::Trap { code } => {
            return Err(Error::aborted(format!(
                "{FORMAT} kernel trapped with code {code} at element {start} or later"
            )))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_round_trip_through_bytes() {
        let m = axpy()
            .function(
                "everything",
                2,
                vec![
                    Instr::Index { rd: 0 },
                    Instr::Const { rd: 1, value: -2.5 },
                    Instr::Param { rd: 2, arg: 1 },
                    Instr::Binary {
                        op: BinOp::Max,
                        rd: 3,
                        ra: 0,
                        rb: 1,
                    },
                    Instr::Fma {
                        rd: 4,
                        ra: 3,
                        rb: 2,
                        rc: 1,
                    },
                    Instr::Mov { rd: 15, ra: 4 },
                    Instr::Store { arg: 0, rs: 15 },
                    Instr::Trap { code: 9 },
                ],
            )
            .unwrap();
        let bytes = m.encode().unwrap();
        assert_eq!(&bytes[..6], b"SNPU\x01\x02");
        let back = Module::decode(&bytes).unwrap();
        assert_eq!(back, m);
        assert_eq!(
            back.entry("axpy").unwrap().uses,
            [Use::Scalar, Use::Read, Use::ReadWrite]
        );
        assert_eq!(
            back.entry("everything").unwrap().uses,
            [Use::Write, Use::Scalar]
        );
    }

    #[test]
    fn bad_modules_are_refused_with_the_place() {
        let good = axpy().encode().unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"ELF!".to_vec(), "magic bytes"),
            (
                [&good[..4], &[2u8][..], &good[5..]].concat(),
                "encoding version 2",
            ),
            (good[..good.len() - 1].to_vec(), "ends early"),
            ([&good[..], &[0u8][..]].concat(), "1 bytes follow"),
            (
                b"SNPU\x01\x01\x01f\x01\x02\x00\x30\x00".to_vec(),
                "unknown opcode 0x30",
            ),
            (
                b"SNPU\x01\x01\x01f\x01\x03\x00\x01\x10\x00".to_vec(),
                "register r16",
            ),
            (
                b"SNPU\x01\x01\x01f\x01\x03\x00\x01\x00\x01".to_vec(),
                "argument 1 does not exist",
            ),
            (
                b"SNPU\x01\x01\x01f\x01\x06\x00\x01\x00\x00\x03\x00\x00".to_vec(),
                "both as a buffer and as a scalar",
            ),
        ];
        for (bytes, needle) in cases {
            let e = Module::decode(&bytes).unwrap_err();
            assert!(e.message().contains(needle), "`{needle}` not in: {e}");
        }
        let e = Module::decode(&good)
            .unwrap()
            .entry("gemm")
            .map(|_| ())
            .unwrap_err();
        assert!(e.message().contains("defines: axpy"), "{e}");
    }

    #[test]
    fn the_interpreter_runs_axpy_over_the_shortest_buffer() {
        let m = axpy();
        let f = m.entry("axpy").unwrap();
        let x: Vec<f32> = (0..3000).map(|i| i as f32).collect();
        let mut y = vec![1f32; 2500];
        let mut frame = Frame {
            buffers: vec![None, Some(Lanes::Read(&x)), Some(Lanes::Write(&mut y))],
            scalars: vec![2.0, 0.0, 0.0],
        };
        run(f, 10_000, &mut frame).unwrap();
        assert_eq!(y[0], 1.0);
        assert_eq!(y[2499], 2.0 * 2499.0 + 1.0);
        // Fewer invocations than elements: the rest stays untouched.
        let mut y = vec![1f32; 2500];
        let mut frame = Frame {
            buffers: vec![None, Some(Lanes::Read(&x)), Some(Lanes::Write(&mut y))],
            scalars: vec![2.0, 0.0, 0.0],
        };
        run(f, 1500, &mut frame).unwrap();
        assert_eq!((y[1499], y[1500]), (2999.0, 1.0));
    }
}
