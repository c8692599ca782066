//! The `kvtide` command-line interface.
use clap::Parser;

/// kvtide: KV-cache toolkit for LLM inference (SWAN sparse caches, WnW tiered caches).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
    // Touch libtorch so the loaded library is mapped and proven to work.
    let t = tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0]).sum(tch::Kind::Float);
    let sum = t.double_value(&[]);
    println!("kvtide {}", env!("CARGO_PKG_VERSION"));
    match models::loaded_libtorch() {
        Some(p) => println!("libtorch: {} (1+2+3 = {sum})", p.display()),
        None => println!("libtorch: not found in process maps (1+2+3 = {sum})"),
    }
}
