//! Nx types and their Burn dtypes.
//!
//! Nx's `pred` is `{:u, 8}` and lives in Burn as an `U8` int tensor, not a Burn bool tensor: Burn's
//! bool storage differs per backend, while u8 is the same everywhere and is what Nx hands over.

use burn::backend::{DType, Scalar};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NxType {
    S(u8),
    U(u8),
    F(u8),
    BF16,
}

/// What kind of Burn primitive a type lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Float,
    Int,
}

pub const ALL_TYPES: [NxType; 12] = [
    NxType::S(8),
    NxType::S(16),
    NxType::S(32),
    NxType::S(64),
    NxType::U(8),
    NxType::U(16),
    NxType::U(32),
    NxType::U(64),
    NxType::F(16),
    NxType::BF16,
    NxType::F(32),
    NxType::F(64),
];

pub const PRED: NxType = NxType::U(8);

impl NxType {
    pub fn dtype(self) -> DType {
        match self {
            NxType::S(8) => DType::I8,
            NxType::S(16) => DType::I16,
            NxType::S(32) => DType::I32,
            NxType::S(64) => DType::I64,
            NxType::U(8) => DType::U8,
            NxType::U(16) => DType::U16,
            NxType::U(32) => DType::U32,
            NxType::U(64) => DType::U64,
            NxType::F(16) => DType::F16,
            NxType::BF16 => DType::BF16,
            NxType::F(32) => DType::F32,
            NxType::F(64) => DType::F64,
            other => unreachable!("constructed only through from_parts: {other:?}"),
        }
    }

    /// The Nx type of a Burn dtype, if Nx has one.
    pub fn from_dtype(dtype: DType) -> Option<Self> {
        ALL_TYPES.iter().copied().find(|t| t.dtype() == dtype)
    }

    pub fn from_parts(kind: &str, bits: u64) -> Option<Self> {
        let t = match (kind, bits) {
            ("s", 8 | 16 | 32 | 64) => NxType::S(bits as u8),
            ("u", 8 | 16 | 32 | 64) => NxType::U(bits as u8),
            ("f", 16 | 32 | 64) => NxType::F(bits as u8),
            ("bf", 16) => NxType::BF16,
            _ => return None,
        };
        Some(t)
    }

    pub fn kind(self) -> Kind {
        match self {
            NxType::F(_) | NxType::BF16 => Kind::Float,
            NxType::S(_) | NxType::U(_) => Kind::Int,
        }
    }

    pub fn is_float(self) -> bool {
        self.kind() == Kind::Float
    }

    pub fn is_unsigned(self) -> bool {
        matches!(self, NxType::U(_))
    }

    /// The type's lowest and highest values as Burn scalars (-inf and inf for floats): the
    /// identities of max and min reductions. Unsigned bounds are `Scalar::UInt`, which every
    /// backend converts to an unsigned element (an `Int` of -1 fails on the GPU backends).
    pub fn bounds(self) -> (Scalar, Scalar) {
        match self {
            t if t.is_float() => (Scalar::Float(f64::NEG_INFINITY), Scalar::Float(f64::INFINITY)),
            NxType::U(b) => (Scalar::UInt(0), Scalar::UInt(if b == 64 { u64::MAX } else { (1u64 << b) - 1 })),
            NxType::S(b) => (
                Scalar::Int(if b == 64 { i64::MIN } else { -(1i64 << (b - 1)) }),
                Scalar::Int(if b == 64 { i64::MAX } else { (1i64 << (b - 1)) - 1 }),
            ),
            _ => unreachable!("every Nx type is float, signed or unsigned"),
        }
    }

    /// `v` as a Burn scalar of this type's kind (float, signed or unsigned; `v` ≥ 0 for unsigned).
    pub fn scalar(self, v: i64) -> Scalar {
        if self.is_float() {
            Scalar::Float(v as f64)
        } else if self.is_unsigned() {
            Scalar::UInt(v as u64)
        } else {
            Scalar::Int(v)
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            NxType::S(b) | NxType::U(b) | NxType::F(b) => b as usize / 8,
            NxType::BF16 => 2,
        }
    }

    pub fn parts(self) -> (&'static str, u8) {
        match self {
            NxType::S(b) => ("s", b),
            NxType::U(b) => ("u", b),
            NxType::F(b) => ("f", b),
            NxType::BF16 => ("bf", 16),
        }
    }
}

impl std::fmt::Display for NxType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (k, b) = self.parts();
        write!(f, "{{:{k}, {b}}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_round_trips_through_burn_dtype() {
        for t in ALL_TYPES {
            assert_eq!(NxType::from_dtype(t.dtype()).unwrap(), t);
            assert_eq!(t.dtype().size(), t.bytes(), "{t}");
        }
    }

    #[test]
    fn parts_reject_unknown_widths() {
        assert_eq!(NxType::from_parts("f", 8), None);
        assert_eq!(NxType::from_parts("bf", 32), None);
        assert_eq!(NxType::from_parts("c", 64), None);
        assert_eq!(NxType::from_parts("u", 16), Some(NxType::U(16)));
    }
}
