//! Embeds an rpath to libtorch in every binary of this package (the CLI, tests,
//! benches), so they run without `LD_LIBRARY_PATH`. torch-sys exports the
//! directory as `DEP_TCH_LIBTORCH_LIB` to packages that depend on it directly.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
