//! The one dispatch layer: kind-generic operations on Burn's rank-less primitives.
//!
//! Burn splits its backend API into float, int and bool families. Everything above this module
//! works on `DispatchTensor` without caring which family a dtype belongs to; the macros here pick
//! the family from the primitive's dtype.

use burn::backend::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn::backend::{BoolStore, DType, Dispatch, DispatchTensor, Scalar, Shape, Slice, TensorData, TensorMetadata};
use burn::tensor::Device;

use crate::error::{ExError, ExResult};

pub type Prim = DispatchTensor;

/// Calls the float or int variant of a Burn op depending on the first operand's dtype.
macro_rules! by_kind {
    ($t:expr, $float:ident, $int:ident $(, $arg:expr)*) => {{
        let t = $t;
        if burn::backend::TensorMetadata::dtype(&t).is_float() {
            Dispatch::$float(t $(, $arg)*)
        } else {
            Dispatch::$int(t $(, $arg)*)
        }
    }};
}
pub(crate) use by_kind;

/// Same as `by_kind!` for ops with two tensor operands of the same family.
macro_rules! by_kind2 {
    ($a:expr, $b:expr, $float:ident, $int:ident $(, $arg:expr)*) => {{
        let (a, b) = ($a, $b);
        if burn::backend::TensorMetadata::dtype(&a).is_float() {
            Dispatch::$float(a, b $(, $arg)*)
        } else {
            Dispatch::$int(a, b $(, $arg)*)
        }
    }};
}
pub(crate) use by_kind2;

pub const BOOL: BoolStore = BoolStore::U8;

/// Burn's shape for an Nx shape (Burn has no rank 0: a scalar is stored as `[1]`).
pub fn burn_shape(shape: &[usize]) -> Vec<usize> {
    if shape.is_empty() {
        vec![1]
    } else {
        shape.to_vec()
    }
}

pub fn is_float(t: &Prim) -> bool {
    t.dtype().is_float()
}

pub fn dtype(t: &Prim) -> DType {
    t.dtype()
}

pub fn dims(t: &Prim) -> Vec<usize> {
    t.shape().to_vec()
}

pub fn from_data(data: TensorData, device: &Device) -> Prim {
    let d = device.as_dispatch();
    if data.dtype().is_float() {
        Dispatch::float_from_data(data, d)
    } else {
        Dispatch::int_from_data(data, d)
    }
}

pub fn into_data(t: Prim) -> ExResult<TensorData> {
    let read = if t.dtype().is_float() {
        burn::tensor::try_read_sync(Dispatch::float_into_data(t))
    } else if t.dtype().is_bool() {
        burn::tensor::try_read_sync(Dispatch::bool_into_data(t))
    } else {
        burn::tensor::try_read_sync(Dispatch::int_into_data(t))
    };
    match read {
        Some(Ok(data)) => Ok(data),
        Some(Err(e)) => Err(ExError::Execution(format!("{e:?}"))),
        None => Err(ExError::Execution("synchronous read is not supported on this platform".into())),
    }
}

/// Converts between any two dtypes. Float to int truncates toward zero (Nx's `as_type`).
pub fn cast(t: Prim, to: DType) -> Prim {
    let from = t.dtype();
    if from == to {
        return t;
    }
    match (from.is_float(), to.is_float()) {
        (true, true) => Dispatch::float_cast(t, to.into()),
        (true, false) => Dispatch::float_into_int(t, to.into()),
        (false, true) if from.is_bool() => Dispatch::bool_into_float(t, to.into()),
        (false, false) if from.is_bool() => Dispatch::bool_into_int(t, to.into()),
        (false, true) => Dispatch::int_into_float(t, to.into()),
        (false, false) => Dispatch::int_cast(t, to.into()),
    }
}

pub fn reshape(t: Prim, shape: &[usize]) -> Prim {
    let shape = burn_shape(shape);
    if dims(&t) == shape {
        return t;
    }
    let shape = Shape::from(shape);
    if t.dtype().is_bool() {
        Dispatch::bool_reshape(t, shape)
    } else {
        by_kind!(t, float_reshape, int_reshape, shape)
    }
}

pub fn permute(t: Prim, axes: &[usize]) -> Prim {
    if axes.iter().enumerate().all(|(i, a)| i == *a) {
        return t;
    }
    by_kind!(t, float_permute, int_permute, axes)
}

/// Broadcasts `t` to the Nx `shape`; like `reshape` and `full`, it applies the burn-shape rule
/// itself (`burn_shape`: rank 0 is stored as `[1]`), so callers pass Nx shapes.
pub fn expand(t: Prim, shape: &[usize]) -> Prim {
    let shape = burn_shape(shape);
    if dims(&t) == shape {
        return t;
    }
    let shape = Shape::from(shape);
    if t.dtype().is_bool() {
        Dispatch::bool_expand(t, shape)
    } else {
        by_kind!(t, float_expand, int_expand, shape)
    }
}

pub fn flip(t: Prim, axes: &[usize]) -> Prim {
    by_kind!(t, float_flip, int_flip, axes)
}

pub fn slice(t: Prim, slices: &[Slice]) -> Prim {
    by_kind!(t, float_slice, int_slice, slices)
}

pub fn cat(ts: Vec<Prim>, dim: usize) -> Prim {
    if ts[0].dtype().is_float() {
        Dispatch::float_cat(ts, dim)
    } else {
        Dispatch::int_cat(ts, dim)
    }
}

pub fn full(shape: &[usize], value: Scalar, dtype: DType, device: &Device) -> Prim {
    match value {
        // Flex reads an integer fill as an i64, the GPU backends as the element type: a u64 above
        // i64::MAX is made as the complement of one that both read.
        Scalar::UInt(v) if v > i64::MAX as u64 => return Dispatch::bitwise_not(full(shape, Scalar::UInt(!v), dtype, device)),
        _ => {}
    }
    let shape = Shape::from(burn_shape(shape));
    let d = device.as_dispatch();
    if dtype.is_float() {
        Dispatch::float_full(shape, value, d, dtype.into())
    } else {
        Dispatch::int_full(shape, value, d, dtype.into())
    }
}

/// Non-zero test, giving a Burn bool primitive.
pub fn to_bool(t: Prim) -> Prim {
    if t.dtype().is_bool() {
        return t;
    }
    let zero = zero_of(t.dtype());
    by_kind!(t, float_not_equal_elem, int_not_equal_elem, zero, BOOL)
}

/// Bool primitive to Nx's pred (u8).
pub fn pred(b: Prim) -> Prim {
    Dispatch::bool_into_int(b, burn::backend::IntDType::U8)
}

pub fn zero_of(dtype: DType) -> Scalar {
    if dtype.is_float() {
        Scalar::Float(0.0)
    } else if dtype.is_uint() {
        Scalar::UInt(0)
    } else {
        Scalar::Int(0)
    }
}

/// `where(mask, on_true, on_false)` with all three already broadcast to one shape.
pub fn select(mask: Prim, on_true: Prim, on_false: Prim) -> Prim {
    let mask = to_bool(mask);
    by_kind!(on_false, float_mask_where, int_mask_where, mask, on_true)
}
