//! `cfg(cube)`: one of the cube GPU backends (cuda, rocm, vulkan, metal) is compiled in, the
//! condition the crate's own GPU kernels (src/gpu) build under, named once here.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(cube)");
    if ["CUDA", "ROCM", "VULKAN", "METAL"].iter().any(|f| std::env::var_os(format!("CARGO_FEATURE_{f}")).is_some()) {
        println!("cargo::rustc-cfg=cube");
    }
}
