//! The program's instruction vocabulary: what `ExBurn.Defn.Lower` emits and `Program` runs.

use burn::backend::Scalar;

use crate::dtype::NxType;
use crate::ops::conv::ConvSpec;
use crate::ops::linalg::DotSpec;
use crate::ops::vocab::{ArgReduceOp, BinaryOp, IndexedOp, ReduceOp, UnaryOp, WindowOp};
use crate::ops::window::WindowSpec;

/// One node of the expression. Operands are earlier instructions, named by position.
pub enum Op {
    /// The n-th run-time input (defn parameters first, then literal tensors of the graph).
    Input(usize),
    Full(Scalar),
    Iota(Option<usize>),
    Eye,
    Unary(UnaryOp),
    /// `compute` is the type the op computes in (Nx's out type, or the merged operand type
    /// for comparisons and logical ops).
    Binary { op: BinaryOp, compute: NxType },
    /// Float max/min against a non-NaN constant, rewritten from `Binary` by `Program::new`: one
    /// pass instead of a compare-and-select chain (ReLU is `max(x, 0)`).
    ClampScalar { max: bool, bound: f64, compute: NxType },
    /// Softmax over the last axis, fused by `fuse::softmax` from Nx's composition
    /// (`reduce_max`, `subtract`, `exp`, `sum`, then `divide`, or `multiply` by `1 / sum` with
    /// `recip`), with the same bits.
    Softmax { recip: bool },
    /// Layer norm over the last axis, fused by `fuse::layer_norm` from Nx's composition (a mean,
    /// subtract it, square, a mean, add `eps`, rsqrt, multiply; with `affine`, Axon's
    /// `(gamma * rsqrt(var + eps)) * (x - mean) + beta`), with the same bits. Operands: the
    /// tensor, then gamma and beta with `affine`. The constants as the composition's f32s.
    LayerNorm { eps: f32, mean_den: f32, var_den: f32, affine: bool },
    Select,
    Clip,
    AsType,
    Reduce { op: ReduceOp, axes: Option<Vec<usize>>, keep: bool },
    ArgReduce { op: ArgReduceOp, axis: Option<usize>, keep: bool, high: bool },
    Dot { a: DotSpec, b: DotSpec },
    Reshape,
    Transpose(Vec<usize>),
    Broadcast(Vec<usize>),
    /// Starts clamped as Nx does (`ops::indexing::clamp_starts`) when the op runs.
    Slice { starts: Vec<i64>, lengths: Vec<usize>, strides: Vec<usize> },
    Concatenate(usize),
    Stack(usize),
    Reverse(Vec<usize>),
    /// The operand, unchanged (Nx `metadata` nodes such as `stop_grad`'s).
    Alias,
    /// The operand's bytes read as the result type (same bit width), as the backend does.
    Bitcast,
    Conv(ConvSpec),
    Window { op: WindowOp, spec: WindowSpec },
    Sort { axis: usize, desc: bool },
    ArgSort { axis: usize, desc: bool },
    /// Nx.pad, `(lo, hi, interior)` per axis. Operands: tensor, one-element pad value.
    Pad(Vec<(i64, i64, usize)>),
    /// Operands: tensor, then one scalar start per axis, read at run time and clamped so the
    /// window fits (Nx's rule).
    DynSlice { lengths: Vec<usize>, strides: Vec<usize> },
    /// Operands: tensor, update, then one scalar start per axis.
    PutSlice,
    /// Operands: tensor, source, init value; the tensor is compared in `select`.
    WindowScatter { max: bool, dims: Vec<usize>, strides: Vec<usize>, padding: Vec<(i64, i64)>, select: NxType },
    /// Operands: tensor, index tensor (last axis: one coordinate per entry of `axes`).
    Gather(Vec<usize>),
    /// Operands: tensor, index tensor, updates. `add` is indexed_add, else indexed_put.
    Indexed { op: IndexedOp, axes: Vec<usize> },
    /// Nx `cond`: runs the clauses' predicate ranges in order and the body range of the first
    /// one that holds (else `last`). Range instructions run only from here, so an untaken
    /// branch costs nothing and cannot fail. Produces no value: `Pick`s read the outputs.
    Cond { clauses: Vec<(Branch, Branch)>, last: Branch },
    /// Output `out` of the branch its `Cond` (an instruction index) took, or of the final
    /// state of its `While`.
    Pick { cond: usize, out: usize },
    /// A `While`'s loop state slot: the initial operand, then each body result.
    LoopVar,
    /// Nx `while`: operands are the initial state; `vars` the `LoopVar` slots; `cond` and
    /// `body` ranges read the slots and run (only from here) until the predicate is false.
    While { vars: Vec<usize>, cond: Branch, body: Branch },
}

/// Instructions `start..end` (contiguous, before their `Cond`) and the values they yield.
pub struct Branch {
    pub start: usize,
    pub end: usize,
    pub outs: Vec<usize>,
}

pub struct Instr {
    pub op: Op,
    pub args: Vec<usize>,
    pub ty: NxType,
    pub shape: Vec<usize>,
}

/// Operand count, `None` where it varies (checked by `Program::new` per op).
pub(super) fn arity(op: &Op) -> Option<usize> {
    Some(match op {
        Op::Input(_) | Op::Full(_) | Op::Iota(_) | Op::Eye | Op::Cond { .. } | Op::Pick { .. } => 0,
        Op::LoopVar => 0,
        Op::While { .. } => return None,
        Op::Unary(_) | Op::Softmax { .. } | Op::AsType | Op::Reduce { .. } | Op::ArgReduce { .. } | Op::Reshape | Op::ClampScalar { .. } => 1,
        Op::Transpose(_) | Op::Broadcast(_) | Op::Slice { .. } | Op::Reverse(_) | Op::Alias | Op::Bitcast => 1,
        Op::Binary { .. } | Op::Dot { .. } => 2,
        Op::Select | Op::Clip => 3,
        Op::LayerNorm { affine, .. } => 1 + 2 * *affine as usize,
        Op::Conv(_) | Op::Pad(_) | Op::Gather(_) => 2,
        Op::Window { .. } | Op::Sort { .. } | Op::ArgSort { .. } => 1,
        Op::Indexed { .. } | Op::WindowScatter { .. } => 3,
        Op::Concatenate(_) | Op::Stack(_) | Op::DynSlice { .. } | Op::PutSlice => return None,
    })
}
