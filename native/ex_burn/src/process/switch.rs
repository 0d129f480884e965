//! Environment switches that turn an optimisation off for comparison (`EXBURN_CUBLAS=0`,
//! `EXBURN_BF16_GEMM=0`, ...): on unless the variable is exactly `0`. Each call site reads its
//! variable once per process, since these are checked on hot paths.

/// Whether the switch `name` is on: unset or anything but `0`.
pub fn on(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v != "0")
}

/// `on(name)`, read the first time this call site runs and remembered for the process.
// Only the cuda-only modules use it so far.
#[cfg_attr(not(feature = "cuda"), allow(unused_macros))]
macro_rules! on_once {
    ($name:literal) => {{
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| $crate::process::switch::on($name))
    }};
}
#[cfg_attr(not(feature = "cuda"), allow(unused_imports))]
pub(crate) use on_once;

#[cfg(test)]
mod tests {
    #[test]
    fn on_unless_exactly_zero() {
        // variables of this test's own, so no other test reads them while they are set
        assert!(super::on("EXBURN_TEST_SWITCH_UNSET"));
        std::env::set_var("EXBURN_TEST_SWITCH_ZERO", "0");
        std::env::set_var("EXBURN_TEST_SWITCH_ONE", "1");
        std::env::set_var("EXBURN_TEST_SWITCH_EMPTY", "");
        assert!(!super::on("EXBURN_TEST_SWITCH_ZERO"));
        assert!(super::on("EXBURN_TEST_SWITCH_ONE"));
        assert!(super::on("EXBURN_TEST_SWITCH_EMPTY"));
    }
}
