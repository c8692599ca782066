//! Memory-bandwidth measurement for `kvtide bench-attn`: the roofline every decode kernel
//! is judged against.
//!
//! A decode step reads the whole KV cache once and does little arithmetic per byte, so
//! on a CPU its speed limit is memory bandwidth (the target: every kernel at L ≥ 16k
//! reaches ≥ 50% of measured bandwidth; SWAN's compute break-even, Appendix A.2, only
//! turns into wall-clock savings where the bytes it saves were the bottleneck). Two
//! figures, both over buffers far larger than the last-level cache, best of several runs,
//! on a chosen number of threads (each thread streams its own slice):
//! * **copy** — `memcpy` of a large buffer, counting bytes read + bytes written (the STREAM
//!   convention); the figure that target refers to;
//! * **read** — a vectorisable sum over a large buffer, bytes read: the pattern of a
//!   decode kernel, which only reads.

use std::time::Instant;

use attn_kernels::ThreadPool;

use crate::error::{Result, invalid};

/// Measured memory bandwidth of this machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bandwidth {
    /// Threads that streamed concurrently.
    pub threads: usize,
    /// Buffer size per measurement, bytes.
    pub bytes: usize,
    /// Large-copy bandwidth, (read + written) bytes per second.
    pub copy_bytes_per_s: f64,
    /// Read-only bandwidth, bytes per second.
    pub read_bytes_per_s: f64,
}

/// Measures copy and read bandwidth with `buffer_bytes`-sized buffers on `pool`'s threads,
/// keeping the best of `repeats` runs each.
///
/// # Errors
/// [`crate::Error::InvalidInput`] if `buffer_bytes < 1 MiB` or `repeats == 0`.
///
/// # Examples
/// ```
/// let pool = attn_kernels::ThreadPool::new(1)?;
/// let bw = kvtide::bandwidth::measure(&pool, 4 << 20, 2)?;
/// assert!(bw.copy_bytes_per_s > 0.0 && bw.read_bytes_per_s > 0.0);
/// # Ok::<(), kvtide::Error>(())
/// ```
pub fn measure(pool: &ThreadPool, buffer_bytes: usize, repeats: usize) -> Result<Bandwidth> {
    const OP: &str = "bandwidth::measure";
    if buffer_bytes < 1 << 20 {
        return Err(invalid(OP, format!("buffer_bytes {buffer_bytes}: need ≥ 1 MiB")));
    }
    if repeats == 0 {
        return Err(invalid(OP, "repeats 0: need ≥ 1"));
    }
    let threads = pool.threads();
    let words = buffer_bytes / 8 / threads;
    let src: Vec<u64> = (0..words * threads).map(|i| i as u64).collect();
    let mut dst = vec![0u64; words * threads];
    let copy = best_of(repeats, || parallel_copy(pool, &src, &mut dst, words));
    let read = best_of(repeats, || parallel_read(pool, &src, words));
    let bytes = words * threads * 8;
    Ok(Bandwidth {
        threads,
        bytes,
        copy_bytes_per_s: 2.0 * bytes as f64 / copy,
        read_bytes_per_s: bytes as f64 / read,
    })
}

fn best_of(repeats: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm-up: fault in the pages, wake up the cores
    (0..repeats)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
        .max(1e-9)
}

fn parallel_copy(pool: &ThreadPool, src: &[u64], dst: &mut [u64], words: usize) {
    let parts: Vec<std::sync::Mutex<&mut [u64]>> =
        dst.chunks_mut(words).map(std::sync::Mutex::new).collect();
    pool.broadcast(&|t| {
        let mut d = parts[t].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        d.copy_from_slice(&src[t * words..(t + 1) * words]);
    });
    std::hint::black_box(dst);
}

fn parallel_read(pool: &ThreadPool, src: &[u64], words: usize) {
    pool.broadcast(&|t| {
        std::hint::black_box(sum_words(&src[t * words..(t + 1) * words]));
    });
}

/// Wrapping sum with eight independent lanes, which the compiler vectorises.
fn sum_words(x: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let chunks = x.chunks_exact(8);
    let tail: u64 = chunks.remainder().iter().fold(0, |a, &b| a.wrapping_add(b));
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = l.wrapping_add(*v);
        }
    }
    lanes.iter().fold(tail, |a, &b| a.wrapping_add(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn sum_words_matches_iterator_sum() {
        let x: Vec<u64> = (0..1003).collect();
        assert_eq!(sum_words(&x), x.iter().sum::<u64>());
    }

    #[test]
    fn rejects_tiny_buffers_and_zero_repeats() {
        let pool = ThreadPool::new(1).unwrap();
        assert!(
            matches!(measure(&pool, 1000, 1), Err(Error::InvalidInput { ref reason, .. }) if reason.contains("buffer_bytes"))
        );
        assert!(
            matches!(measure(&pool, 1 << 20, 0), Err(Error::InvalidInput { ref reason, .. }) if reason.contains("repeats"))
        );
    }

    #[test]
    fn two_threads_measure_positive_rates() {
        let pool = ThreadPool::new(2).unwrap();
        let bw = measure(&pool, 2 << 20, 1).unwrap();
        assert_eq!(bw.threads, 2);
        assert!(bw.copy_bytes_per_s.is_finite() && bw.copy_bytes_per_s > 0.0);
        assert!(bw.read_bytes_per_s.is_finite() && bw.read_bytes_per_s > 0.0);
    }
}
