//! `models`: thin libtorch-backed model forwards that plug kvtide's caches into a real
//! runtime, and the `kvtide` command-line interface.

/// The libtorch shared library this process loaded, read from `/proc/self/maps`
/// (Linux only; `None` elsewhere or when libtorch is not mapped yet).
pub fn loaded_libtorch() -> Option<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("libtorch_cpu.so"))
        .map(std::path::PathBuf::from)
}
