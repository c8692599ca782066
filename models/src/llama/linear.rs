//! The linear layers of the decode step: `y = x·Wᵀ + b` for one row `x`, computed by the
//! `gemm` crate's matrix–vector kernel straight from the weight's libtorch storage.
//!
//! A decode step of one sequence (`papers/swan.txt`, "decode step") multiplies one row by
//! every weight matrix of the model, so its time is the time to stream the weights from
//! memory. libtorch's CPU path for that product (MKL's `sgemv`) reads them at about half
//! the bandwidth the `gemm` crate's kernel reaches (`cargo bench -p models --bench
//! decode_linear`: 1.8–2.1× on SmolLM2-shaped weights, 2 cores). With several rows the
//! `gemm` crate packs the weights and is slower than libtorch (0.7–0.85× at 4–16 rows, same
//! bench), so batched decodes, prefill, tensors that take part in autograd, and anything
//! not a contiguous f32 CPU matrix go to libtorch's `linear` unchanged.

use attn_kernels::ThreadPool;
use tch::{Device, Kind, Tensor};

use crate::error::{Result, TorchOp};

/// Output rows are shared out in groups of this many (each thread's rows then start on a
/// cache line of the output and keep the kernel's row tiles full).
const GROUP: usize = 16;
/// Fewest groups in a thread's share: more than 256 rows. The `gemm` crate computes a
/// product of at most 16 × 16 outputs with another kernel than its matrix–vector one, whose
/// rows are each one dot product whatever their number; shares above that size are thus
/// computed bit for bit as the whole product is.
const GROUPS_PER_THREAD: usize = 17;

/// `x·wᵀ (+ bias)` for `x` `[rows, in]` and `w` `[out, in]`, as libtorch's `linear`
/// (which it calls for inputs that do not take the `gemm` path).
///
/// # Examples
/// ```
/// use tch::{Device, Kind, Tensor};
/// let opts = (Kind::Float, Device::Cpu);
/// let (x, w) = (Tensor::randn([1, 64], opts), Tensor::randn([32, 64], opts));
/// let y = models::llama::linear::linear(&x, &w, None, "example")?;
/// let want = x.linear(&w, None::<Tensor>);
/// assert!((y - want).abs().max().double_value(&[]) < 1e-4);
/// # Ok::<(), models::Error>(())
/// ```
///
/// # Errors
/// [`crate::Error::Torch`] (named by `op`) on a shape mismatch or allocation failure.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, op: &'static str) -> Result<Tensor> {
    linear_on(None, x, w, bias, op)
}

/// [`linear`] with a one-row product's output rows split among the threads of `pool`
/// (`None`, or a one-thread pool: the calling thread alone), each thread taking more than
/// 256 rows or none. Every output is the same dot product whichever thread computes it, so
/// the result is bit for bit that of one thread.
///
/// # Examples
/// ```
/// use tch::{Device, Kind, Tensor};
/// let opts = (Kind::Float, Device::Cpu);
/// let (x, w) = (Tensor::randn([1, 64], opts), Tensor::randn([1024, 64], opts));
/// let pool = attn_kernels::ThreadPool::new(2)?;
/// let split = models::llama::linear::linear_on(Some(&pool), &x, &w, None, "example")?;
/// let alone = models::llama::linear::linear(&x, &w, None, "example")?;
/// assert!(split.equal(&alone));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`linear`].
pub fn linear_on(
    pool: Option<&ThreadPool>,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    op: &'static str,
) -> Result<Tensor> {
    let Some((out, inner)) = one_row_shape(x, w) else {
        return x.f_linear(w, bias).op(op);
    };
    let x = x.f_contiguous().op(op)?;
    let y = Tensor::f_empty([1, out as i64], (Kind::Float, Device::Cpu)).op(op)?;
    let (yp, xp, wp) = (y.data_ptr() as usize, x.data_ptr() as usize, w.data_ptr() as usize);
    // Rows `rows` of the product: `y[rows] = x · w[rows]ᵀ`.
    let part = |rows: std::ops::Range<usize>| {
        if rows.is_empty() {
            return;
        }
        // SAFETY: `x` is a contiguous f32 CPU tensor `[1, inner]` (checked by
        // `one_row_shape`, and `f_contiguous` keeps the layout), `w` a contiguous f32 CPU
        // tensor `[out, inner]`, and `y` a fresh contiguous f32 tensor `[1, out]` that no
        // other handle shares; `rows` lies inside `0..out`. So the pointers cover what their
        // strides address: `x[0, j]` at `j`, `w[rows.start + i, j]` — read as the
        // `[inner, rows.len()]` matrix `w[rows]ᵀ` — at `(rows.start + i)·inner + j`,
        // `y[0, rows.start + i]` at `rows.start + i`. Nothing writes to `x` or `w` during
        // the call (model weights are never modified in place; `x` is borrowed for the
        // call), and each call writes only its own rows of `y` (the threads of a pool get
        // disjoint ranges). `read_dst = false` with `alpha = 0`, `beta = 1` stores the product
        // without reading `y`.
        unsafe {
            gemm::gemm(
                1,
                rows.len(),
                inner,
                (yp as *mut f32).add(rows.start),
                1,
                out as isize,
                false,
                xp as *const f32,
                1,
                inner as isize,
                (wp as *const f32).add(rows.start * inner),
                inner as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    };
    let groups = out.div_ceil(GROUP);
    let threads = pool.map_or(1, |p| p.threads()).min(groups / GROUPS_PER_THREAD).max(1);
    match pool {
        Some(pool) if threads > 1 => {
            // Thread `t` takes groups `t·groups/threads ..`: at least `GROUPS_PER_THREAD`
            // each, the last group possibly short.
            let edge = |t: usize| (t * groups / threads * GROUP).min(out);
            pool.broadcast(&|t| {
                if t < threads {
                    part(edge(t)..edge(t + 1));
                }
            });
        }
        _ => part(0..out),
    }
    match bias {
        Some(b) => y.f_add(b).op(op),
        None => Ok(y),
    }
}

/// `(out, in)` when `x · wᵀ` can take the `gemm` path: both f32 on the CPU, `w` a
/// contiguous `[out, in]` matrix, `x` one row `[1, in]`, neither needing grad.
fn one_row_shape(x: &Tensor, w: &Tensor) -> Option<(usize, usize)> {
    let (xs, ws) = (x.size(), w.size());
    let ([rows, inner], [out, w_inner]) = (xs.as_slice(), ws.as_slice()) else {
        return None;
    };
    let plain =
        |t: &Tensor| t.kind() == Kind::Float && t.device() == Device::Cpu && !t.requires_grad();
    let fits = *rows == 1
        && *inner > 0
        && *out > 0
        && inner == w_inner
        && plain(x)
        && plain(w)
        && w.is_contiguous();
    fits.then_some((*out as usize, *inner as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal up to f32 summation order: within 1e-5 of the largest output.
    fn close(a: &Tensor, b: &Tensor) -> bool {
        let scale = b.abs().max().double_value(&[]).max(1.0);
        let diff = (a - b).abs().max().double_value(&[]);
        a.size() == b.size() && diff <= 1e-5 * scale
    }

    #[test]
    fn inputs_of_any_row_count_match_libtorch_linear() {
        tch::manual_seed(7);
        let opts = (Kind::Float, Device::Cpu);
        let shapes = [(1, 1, 1), (1, 576, 576), (1, 1728, 576), (1, 7, 33), (1, 65, 130)];
        let several = [(2, 1728, 576), (3, 7, 33), (16, 65, 130)];
        for (rows, out, inner) in shapes.into_iter().chain(several) {
            let x = Tensor::randn([rows, inner], opts);
            let w = Tensor::randn([out, inner], opts);
            assert_eq!(one_row_shape(&x, &w).is_some(), rows == 1);
            let b = Tensor::randn([out], opts);
            let want = x.linear(&w, None::<Tensor>);
            assert!(close(&linear(&x, &w, None, "t").unwrap(), &want), "{rows}×{inner}·{out}");
            let want_b = x.linear(&w, Some(&b));
            assert!(close(&linear(&x, &w, Some(&b), "t").unwrap(), &want_b));
        }
    }

    #[test]
    fn rows_split_among_threads_equal_the_product_on_one_thread() {
        tch::manual_seed(11);
        let opts = (Kind::Float, Device::Cpu);
        let pools: Vec<ThreadPool> = (1..=3).map(|t| ThreadPool::new(t).unwrap()).collect();
        // Too few rows to split (up to 256 rows a product takes another kernel in the gemm
        // crate), shares just above that, uneven shares, a last group cut short, and
        // SmolLM2's shapes.
        let shapes = [(1, 5), (100, 33), (130, 65), (512, 64), (544, 9), (545, 9), (1000, 7)];
        for (out, inner) in shapes.into_iter().chain([(576, 576), (1728, 576), (3072, 576)]) {
            let x = Tensor::randn([1, inner], opts);
            let w = Tensor::randn([out, inner], opts);
            let b = Tensor::randn([out], opts);
            let alone = linear(&x, &w, Some(&b), "t").unwrap();
            assert!(close(&alone, &x.linear(&w, Some(&b))), "{out}×{inner}");
            for pool in &pools {
                let split = linear_on(Some(pool), &x, &w, Some(&b), "t").unwrap();
                assert!(split.equal(&alone), "{out}×{inner} on {} threads", pool.threads());
            }
        }
        // Several rows take libtorch's path whatever the pool.
        let (x, w) = (Tensor::randn([3, 40], opts), Tensor::randn([300, 40], opts));
        let split = linear_on(Some(&pools[1]), &x, &w, None, "t").unwrap();
        assert!(close(&split, &x.linear(&w, None::<Tensor>)));
    }

    #[test]
    fn other_inputs_fall_back_to_libtorch() {
        let opts = (Kind::Float, Device::Cpu);
        let w = Tensor::randn([8, 4], opts);
        // A strided input is made contiguous; a strided weight, many rows, a 3-D input,
        // f64 and autograd take libtorch's path; every result equals libtorch's.
        let x = Tensor::randn([4, 2], opts).transpose(0, 1).narrow(0, 0, 1);
        assert!(!x.is_contiguous());
        assert!(one_row_shape(&x, &w).is_some());
        assert!(close(&linear(&x, &w, None, "t").unwrap(), &x.linear(&w, None::<Tensor>)));
        let strided = Tensor::randn([4, 8], opts).transpose(0, 1);
        assert!(one_row_shape(&x, &strided).is_none());
        let want = x.linear(&strided, None::<Tensor>);
        assert!(close(&linear(&x, &strided, None, "t").unwrap(), &want));
        let tracked = w.copy().set_requires_grad(true);
        assert!(one_row_shape(&x, &tracked).is_none());
        let many = Tensor::randn([2, 4], opts);
        assert!(one_row_shape(&many, &w).is_none());
        let cube = Tensor::randn([2, 1, 4], opts);
        assert!(close(&linear(&cube, &w, None, "t").unwrap(), &cube.linear(&w, None::<Tensor>)));
        let f64x = Tensor::randn([1, 4], (Kind::Double, Device::Cpu));
        assert!(one_row_shape(&f64x, &w).is_none());
        let bad = Tensor::randn([1, 5], opts);
        assert!(linear(&bad, &w, None, "t").is_err());
    }
}
