//! The op vocabulary: every op the NIFs and compiled programs name, as enums decoded once at the
//! NIF boundary (from Nx's atom names), so an unknown op is a decode error and the ops match on
//! types. The names are Nx's callback names.

/// What the NIF boundary needs to decode any op family by name.
pub trait Vocabulary: Sized + Copy + 'static {
    /// The family's name in errors ("unary op", ...).
    const FAMILY: &'static str;
    fn from_name(name: &str) -> Option<Self>;
}

macro_rules! vocabulary {
    ($(#[$doc:meta])* $name:ident ($family:literal) { $($variant:ident = $text:literal),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant),*
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// Nx's name of the op.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text),*
                }
            }

            /// The op Nx calls `name`, if this family has it.
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl Vocabulary for $name {
            const FAMILY: &'static str = $family;
            fn from_name(name: &str) -> Option<Self> {
                $name::from_name(name)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

vocabulary! {
    /// Element-wise ops of one operand.
    UnaryOp ("unary op") {
        Exp = "exp", Expm1 = "expm1", Log = "log", Log1p = "log1p", Sqrt = "sqrt", Rsqrt = "rsqrt",
        Cbrt = "cbrt", Sin = "sin", Cos = "cos", Tan = "tan", Asin = "asin", Acos = "acos",
        Atan = "atan", Sinh = "sinh", Cosh = "cosh", Tanh = "tanh", Asinh = "asinh",
        Acosh = "acosh", Atanh = "atanh", Sigmoid = "sigmoid", Erf = "erf", Erfc = "erfc",
        ErfInv = "erf_inv", Abs = "abs", Negate = "negate", Sign = "sign", Floor = "floor",
        Ceil = "ceil", Round = "round", Square = "square", BitwiseNot = "bitwise_not",
        CountLeadingZeros = "count_leading_zeros", PopulationCount = "population_count",
        LogicalNot = "logical_not", IsNan = "is_nan", IsInfinity = "is_infinity",
    }
}

vocabulary! {
    /// Element-wise ops of two broadcast operands.
    BinaryOp ("binary op") {
        Add = "add", Subtract = "subtract", Multiply = "multiply", Pow = "pow",
        Remainder = "remainder", Max = "max", Min = "min", Divide = "divide", Atan2 = "atan2",
        Quotient = "quotient", BitwiseAnd = "bitwise_and", BitwiseOr = "bitwise_or",
        BitwiseXor = "bitwise_xor", LeftShift = "left_shift", RightShift = "right_shift",
        Equal = "equal", NotEqual = "not_equal", Greater = "greater", Less = "less",
        GreaterEqual = "greater_equal", LessEqual = "less_equal", LogicalAnd = "logical_and",
        LogicalOr = "logical_or", LogicalXor = "logical_xor",
    }
}

vocabulary! {
    /// Reductions over axes.
    ReduceOp ("reduction") {
        Sum = "sum", Product = "product", Mean = "mean", ReduceMax = "reduce_max",
        ReduceMin = "reduce_min", All = "all", Any = "any",
    }
}

vocabulary! {
    /// Index of the extreme along an axis.
    ArgReduceOp ("arg reduction") { Argmax = "argmax", Argmin = "argmin" }
}

vocabulary! {
    /// Window reductions (named as Nx's callbacks).
    WindowOp ("window op") {
        WindowSum = "window_sum", WindowProduct = "window_product", WindowMax = "window_max",
        WindowMin = "window_min",
    }
}

vocabulary! {
    /// Scans along an axis.
    CumulativeOp ("cumulative op") {
        CumulativeSum = "cumulative_sum", CumulativeProduct = "cumulative_product",
        CumulativeMin = "cumulative_min", CumulativeMax = "cumulative_max",
    }
}

vocabulary! {
    /// What an indexed update does with each update row (`Nx.indexed_add` / `indexed_put`).
    IndexedOp ("indexed op") { Add = "add", Put = "put" }
}

impl UnaryOp {
    /// The ops that look at their input as it is and answer u8 (Nx's predicates).
    pub fn is_predicate(self) -> bool {
        matches!(self, UnaryOp::LogicalNot | UnaryOp::IsNan | UnaryOp::IsInfinity)
    }

    /// Float ops that need no transcendental function, so they run in f64 wherever f64 is
    /// stored (see `DeviceRef::f64_math`).
    pub fn f64_exact(self) -> bool {
        use UnaryOp::*;
        matches!(self, Abs | Negate | Sign | Floor | Ceil | Round | Square | Sqrt | Rsqrt | IsNan | IsInfinity | LogicalNot)
    }
}

impl BinaryOp {
    pub fn is_comparison(self) -> bool {
        use BinaryOp::*;
        matches!(self, Equal | NotEqual | Greater | Less | GreaterEqual | LessEqual)
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::LogicalAnd | BinaryOp::LogicalOr | BinaryOp::LogicalXor)
    }

    /// See `UnaryOp::f64_exact`.
    pub fn f64_exact(self) -> bool {
        use BinaryOp::*;
        matches!(self, Add | Subtract | Multiply | Divide | Remainder | Max | Min) || self.is_comparison() || self.is_logical()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_none() {
        for op in UnaryOp::ALL {
            assert_eq!(UnaryOp::from_name(op.name()), Some(*op));
        }
        for op in BinaryOp::ALL {
            assert_eq!(BinaryOp::from_name(op.name()), Some(*op));
        }
        for op in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_name(op.name()), Some(*op));
        }
        assert_eq!(UnaryOp::from_name("frobnicate"), None);
        assert_eq!(BinaryOp::from_name("exp"), None);
    }
}
