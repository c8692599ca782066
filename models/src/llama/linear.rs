//! The linear layers of the decode step: `y = x·Wᵀ + b` for one row `x` (one sequence) or
//! a few (a batch of sequences), computed where libtorch's CPU path is slow.
//!
//! A decode step of one sequence (`papers/swan.txt`, "decode step") multiplies one row by
//! every weight matrix of the model, so its time is the time to stream the weights from
//! memory. libtorch's CPU path for that product (MKL's `sgemv`) reads them at about half
//! the bandwidth the `gemm` crate's matrix–vector kernel reaches (`cargo bench -p models
//! --bench decode_linear`: 1.8–2.1× on SmolLM2-shaped weights, 2 cores), so one row takes
//! the `gemm` crate, straight from the weight's libtorch storage. A batched step (2–64
//! rows) computed as libtorch's `x · Wᵀ` has MKL pack a copy of the whole weight per call;
//! with the weight as the left operand, `(W · xᵀ)ᵀ`, it is read in place. Output layers
//! (16 384 rows and more: vocabularies) with 12 rows or more take the `gemm` crate that way
//! too when a pool of two threads or more is given, split among its threads; other products
//! of several rows take libtorch's `(W · xᵀ)ᵀ`. Prefill, tensors that
//! take part in autograd, and anything not a contiguous f32 CPU matrix go to libtorch's
//! `linear` unchanged.

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
/// Most rows of an input taken as a batched decode step's; more rows (prefill) go to
/// libtorch's `linear` unchanged.
const FEW_ROWS: i64 = 64;
/// Fewest outputs for which a product of [`WIDE_ROWS`] rows or more takes the `gemm`
/// crate's kernel (an output layer); narrower products of several rows go to libtorch with
/// the weight as the left operand.
const WIDE_OUT: usize = 16_384;
/// Fewest rows for which an output layer's product takes the `gemm` crate's kernel: with
/// fewer, libtorch's `(w · xᵀ)ᵀ` reads the weight once at close to the memory bandwidth
/// and is faster (`cargo bench -p models --bench decode_linear -- output_layer`, SmolLM2's
/// head on 2 cores: 7.4 against 11.5 ms at 8 rows, 17.2 against 13.4 ms at 16).
const WIDE_ROWS: usize = 12;

/// `x·wᵀ (+ bias)` for `x` `[rows, in]` and `w` `[out, in]`, as libtorch's `linear`
/// (which it calls for inputs that take neither the `gemm` crate nor `(w · xᵀ)ᵀ`; see the
/// module note).
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

/// [`linear`] with the output columns of a product on the `gemm` crate's path split among
/// the threads of `pool`, each thread taking more than 256 columns or none: one row
/// (`None`, or a one-thread pool: the calling thread alone), or 12–64 rows through an
/// output layer of 16 384 columns or more (with a pool of two threads or more; otherwise
/// libtorch, on its own threads). Every output is the same dot product whichever thread
/// computes it, so the result is bit for bit the same for any split.
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
    let Some((rows, out, inner)) = gemm_shape(x, w) else {
        return x.f_linear(w, bias).op(op);
    };
    let threads = pool.map_or(1, ThreadPool::threads);
    let y = if rows > 1 && (out < WIDE_OUT || rows < WIDE_ROWS || threads < 2) {
        // `(w · xᵀ)ᵀ`: with the weight as the left operand MKL streams it in place instead
        // of packing a copy of all of it per call, as it does for `x · wᵀ`.
        w.f_matmul(&x.tr()).op(op)?.tr().f_contiguous().op(op)?
    } else {
        gemm_on(pool, x, w, (rows, out, inner), op)?
    };
    match bias {
        Some(b) => y.f_add(b).op(op),
        None => Ok(y),
    }
}

/// `x · wᵀ` `[rows, out]` by the `gemm` crate, its columns split among `pool`'s threads.
fn gemm_on(
    pool: Option<&ThreadPool>,
    x: &Tensor,
    w: &Tensor,
    (rows, out, inner): (usize, usize, usize),
    op: &'static str,
) -> Result<Tensor> {
    let x = x.f_contiguous().op(op)?;
    let y = Tensor::f_empty([rows as i64, out as i64], (Kind::Float, Device::Cpu)).op(op)?;
    let (yp, xp, wp) = (y.data_ptr() as usize, x.data_ptr() as usize, w.data_ptr() as usize);
    // Columns `cols` of the product: `y[:, cols] = x · w[cols]ᵀ`.
    let part = |cols: std::ops::Range<usize>| {
        if cols.is_empty() {
            return;
        }
        let (y0, w0) = (
            (yp as *mut f32).wrapping_add(cols.start),
            (wp as *const f32).wrapping_add(cols.start * inner),
        );
        // One row as `x · w[cols]ᵀ` (`m = 1`: the crate's matrix–vector kernel), several as
        // `w[cols] · xᵀ` stored transposed (`m = cols.len()`: the weight is the left
        // operand, read in place). Either way the left operand has strides `(1, inner)`,
        // the right one `(inner, 1)`; `(dst_cs, dst_rs)` place the result in `y`.
        let (m, n, dst_cs, dst_rs, lhs, rhs) = if rows == 1 {
            (1, cols.len(), 1, out as isize, xp as *const f32, w0)
        } else {
            (cols.len(), rows, out as isize, 1, w0, xp as *const f32)
        };
        // SAFETY: `x` is a contiguous f32 CPU tensor `[rows, inner]` (checked by
        // `gemm_shape`, and `f_contiguous` keeps the layout), `w` a contiguous f32 CPU
        // tensor `[out, inner]`, and `y` a fresh contiguous f32 tensor `[rows, out]` that no
        // other handle shares; `cols` lies inside `0..out`, so `y0` and `w0` point inside
        // their tensors. The pointers cover what their strides address: `x[r, j]` at
        // `r·inner + j`, `w[cols.start + i, j]` at `w0 + i·inner + j`, `y[r, cols.start + i]`
        // at `y0 + r·out + i`, for `r < rows`, `i < cols.len()`, `j < inner`. Nothing writes
        // to `x` or `w` during the call (model weights are never modified in place; `x` is
        // borrowed for the call), and each call writes only its own columns of `y` (the
        // threads of a pool get disjoint ranges). `read_dst = false` with `alpha = 0`,
        // `beta = 1` stores the product without reading `y`.
        unsafe {
            gemm::gemm(
                m,
                n,
                inner,
                y0,
                dst_cs,
                dst_rs,
                false,
                lhs,
                1,
                inner as isize,
                rhs,
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
    let threads = pool.map_or(1, ThreadPool::threads).min(groups / GROUPS_PER_THREAD).max(1);
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
    Ok(y)
}

/// `(rows, out, in)` when `x · wᵀ` can take the `gemm` path: both f32 on the CPU, `w` a
/// contiguous `[out, in]` matrix, `x` `[rows, in]` with `1 ..= FEW_ROWS` rows (one
/// sequence's decode step or a batch's), neither needing grad.
fn gemm_shape(x: &Tensor, w: &Tensor) -> Option<(usize, usize, usize)> {
    let (xs, ws) = (x.size(), w.size());
    let ([rows, inner], [out, w_inner]) = (xs.as_slice(), ws.as_slice()) else {
        return None;
    };
    let plain =
        |t: &Tensor| t.kind() == Kind::Float && t.device() == Device::Cpu && !t.requires_grad();
    let fits = (1..=FEW_ROWS).contains(rows)
        && *inner > 0
        && *out > 0
        && inner == w_inner
        && plain(x)
        && plain(w)
        && w.is_contiguous();
    fits.then_some((*rows as usize, *out as usize, *inner as usize))
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
        // Batched decode rows (narrow products: libtorch with the weight on the left), one
        // past them (libtorch's `linear`), and output layers as wide as SmolLM2's and Gemma
        // 3's (the gemm crate's kernel).
        let several = [
            (2, 1728, 576),
            (3, 7, 33),
            (16, 65, 130),
            (64, 300, 64),
            (65, 300, 64),
            (3, 49_152, 16),
            (4, 262_144, 8),
        ];
        for (rows, out, inner) in shapes.into_iter().chain(several) {
            let x = Tensor::randn([rows, inner], opts);
            let w = Tensor::randn([out, inner], opts);
            assert_eq!(gemm_shape(&x, &w).is_some(), rows <= 64);
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
        // Several rows: a narrow product takes libtorch's path whatever the pool; a wide
        // one (an output layer) on a pool of two threads or more is split as one row is,
        // bit for bit the same for any split — whole groups, uneven shares, a last group
        // cut short.
        let (x, w) = (Tensor::randn([3, 40], opts), Tensor::randn([300, 40], opts));
        let split = linear_on(Some(&pools[1]), &x, &w, None, "t").unwrap();
        assert!(close(&split, &x.linear(&w, None::<Tensor>)));
        for (rows, out, inner) in
            [(12, 16_384, 24), (15, 20_001, 40), (64, 49_152, 8), (13, 16_400, 640)]
        {
            let x = Tensor::randn([rows, inner], opts);
            let w = Tensor::randn([out, inner], opts);
            let b = Tensor::randn([out], opts);
            let want = x.linear(&w, Some(&b));
            assert!(close(&linear(&x, &w, Some(&b), "t").unwrap(), &want), "{rows}×{inner}·{out}");
            let two = linear_on(Some(&pools[1]), &x, &w, Some(&b), "t").unwrap();
            assert!(close(&two, &want), "{rows}×{inner}·{out} on 2 threads");
            let three = linear_on(Some(&pools[2]), &x, &w, Some(&b), "t").unwrap();
            assert!(three.equal(&two), "{rows}×{inner}·{out} on 3 threads");
        }
    }

    #[test]
    fn other_inputs_fall_back_to_libtorch() {
        let opts = (Kind::Float, Device::Cpu);
        let w = Tensor::randn([8, 4], opts);
        // A strided input is made contiguous; a strided weight, many rows, a 3-D input,
        // f64 and autograd take libtorch's path; every result equals libtorch's.
        let x = Tensor::randn([4, 2], opts).transpose(0, 1).narrow(0, 0, 1);
        assert!(!x.is_contiguous());
        assert!(gemm_shape(&x, &w).is_some());
        assert!(close(&linear(&x, &w, None, "t").unwrap(), &x.linear(&w, None::<Tensor>)));
        let strided = Tensor::randn([4, 8], opts).transpose(0, 1);
        assert!(gemm_shape(&x, &strided).is_none());
        let want = x.linear(&strided, None::<Tensor>);
        assert!(close(&linear(&x, &strided, None, "t").unwrap(), &want));
        let tracked = w.copy().set_requires_grad(true);
        assert!(gemm_shape(&x, &tracked).is_none());
        let many = Tensor::randn([65, 4], opts);
        assert!(gemm_shape(&many, &w).is_none());
        assert!(close(&linear(&many, &w, None, "t").unwrap(), &many.linear(&w, None::<Tensor>)));
        let cube = Tensor::randn([2, 1, 4], opts);
        assert!(close(&linear(&cube, &w, None, "t").unwrap(), &cube.linear(&w, None::<Tensor>)));
        let f64x = Tensor::randn([1, 4], (Kind::Double, Device::Cpu));
        assert!(gemm_shape(&f64x, &w).is_none());
        let bad = Tensor::randn([1, 5], opts);
        assert!(linear(&bad, &w, None, "t").is_err());
    }
}
