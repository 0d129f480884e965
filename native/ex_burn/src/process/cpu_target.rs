//! The CPU features this library was compiled to assume, checked when the NIF loads.
//!
//! `.cargo/config.toml` builds x86-64 Linux for x86-64-v3, so the compiler may use AVX2, FMA,
//! F16C, BMI1/2, LZCNT and MOVBE anywhere. On a CPU without them the first such instruction
//! would kill the VM with SIGILL; the load callback asks the CPU first and refuses to load
//! instead (the Elixir side then raises `ExBurn.Error`, op `:nif_not_loaded`, on every call).

/// The features the build enabled that `has` (a CPU feature query) says are missing.
pub fn missing(has: impl Fn(&str) -> bool) -> Vec<&'static str> {
    compiled().into_iter().filter(|f| !has(f)).collect()
}

/// The x86-64-v3 features this build was compiled with (none on a baseline build or another
/// architecture).
fn compiled() -> Vec<&'static str> {
    let mut on = Vec::new();
    macro_rules! check {
        ($($f:tt),*) => {$(
            if cfg!(target_feature = $f) {
                on.push($f);
            }
        )*};
    }
    check!("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe");
    on
}

/// What this CPU lacks of the build's features.
pub fn missing_here() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        missing(|f| match f {
            "avx" => std::arch::is_x86_feature_detected!("avx"),
            "avx2" => std::arch::is_x86_feature_detected!("avx2"),
            "fma" => std::arch::is_x86_feature_detected!("fma"),
            "f16c" => std::arch::is_x86_feature_detected!("f16c"),
            "bmi1" => std::arch::is_x86_feature_detected!("bmi1"),
            "bmi2" => std::arch::is_x86_feature_detected!("bmi2"),
            "lzcnt" => std::arch::is_x86_feature_detected!("lzcnt"),
            "movbe" => std::arch::is_x86_feature_detected!("movbe"),
            _ => false,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_cpu_runs_this_build_and_a_cpu_without_avx2_would_be_refused() {
        assert_eq!(missing_here(), Vec::<&str>::new());
        let built = compiled();
        let without_avx2 = missing(|f| f != "avx2");
        assert_eq!(without_avx2, if built.contains(&"avx2") { vec!["avx2"] } else { vec![] });
    }
}
