//! Rotation of whole per-layer activation tensors in decoder head layout.
//!
//! SWAN §4: each decode step rotates the RoPE'd query and key by `P_QK` (it cannot be
//! absorbed, RoPE being position-dependent); values and attention outputs are normally
//! handled by absorbing `P_VO` into `W_V`/`W_O` ([`crate::absorb`]), but runtimes that
//! cannot rewrite their weights (e.g. quantized ones) can rotate them here instead.
//!
//! Layouts (row-major f32): `[n_tokens, q_heads, head_dim]` for queries and attention
//! outputs, `[n_tokens, kv_heads, head_dim]` for keys and values. Query head `h` uses the
//! bases of kv-head `h / group`. Prefill-sized inputs (≥ [`GEMM_MIN_ROWS`] tokens) run one
//! SGEMM per head; decode-sized ones run the row kernel per GQA group, and
//! [`ProjectionSet::rotate_qk_into`] rotates a group's queries and key in one pass.

use crate::dims::Stream;
use crate::error::{Result, check_len, check_product};
use crate::rotate::{
    Direction, GEMM_MIN_ROWS, GROUP_ROWS, RotationKernel, Rows, rotate_group, rotate_strided,
};
use crate::set::ProjectionSet;

/// What to apply to a head-layout tensor.
#[derive(Clone, Copy)]
struct Plan {
    op: &'static str,
    stream: Stream,
    dir: Direction,
    /// `q_heads` or `kv_heads`: the tensor's head count.
    heads: usize,
}

impl ProjectionSet {
    /// `q̂ = RoPE(q)·P_QK` for one layer's queries `[n_tokens, q_heads, head_dim]` (after
    /// RoPE), written to `out` (same shape). One decode token is `n_tokens = 1`.
    ///
    /// # Errors
    /// [`crate::Error::OutOfRange`] for a bad layer; [`crate::Error::Shape`] for wrong lengths.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::random(ModelDims::new(1, 4, 2, 8)?, "toy", 3)?;
    /// let (q, k) = (vec![0.5f32; 4 * 8], vec![0.25f32; 2 * 8]);
    /// let (mut qh, mut kh) = (vec![0.0; q.len()], vec![0.0; k.len()]);
    /// set.rotate_queries_into(0, 1, &q, &mut qh)?;
    /// set.rotate_keys_into(0, 1, &k, &mut kh)?;
    /// // Lemma 1: head 3 (kv-head 1) scores are unchanged by the rotation.
    /// let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    /// assert!((dot(&qh[24..32], &kh[8..16]) - dot(&q[24..32], &k[8..16])).abs() < 1e-5);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn rotate_queries_into(
        &self,
        layer: usize,
        n_tokens: usize,
        q: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let plan = self.plan("ProjectionSet::rotate_queries", Stream::Qk, Direction::Forward, true);
        self.apply(plan, layer, n_tokens, q, out)
    }

    /// `k̂ = RoPE(k)·P_QK` for one layer's keys `[n_tokens, kv_heads, head_dim]` (after RoPE),
    /// written to `out` (same shape).
    ///
    /// # Errors
    /// [`crate::Error::OutOfRange`] for a bad layer; [`crate::Error::Shape`] for wrong lengths.
    ///
    /// # Examples
    /// See [`ProjectionSet::rotate_queries_into`].
    pub fn rotate_keys_into(
        &self,
        layer: usize,
        n_tokens: usize,
        k: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let plan = self.plan("ProjectionSet::rotate_keys", Stream::Qk, Direction::Forward, false);
        self.apply(plan, layer, n_tokens, k, out)
    }

    /// [`ProjectionSet::rotate_queries_into`] and [`ProjectionSet::rotate_keys_into`] in one
    /// call, with the same results bit for bit: decode-sized inputs rotate each GQA group's
    /// queries together with its key, so each kv-head's `P_QK` is read once per token
    /// (instead of once for the key and once per pair of queries). Prefill-sized inputs
    /// (≥ [`GEMM_MIN_ROWS`] tokens) and groups of ≥ [`GEMM_MIN_ROWS`] q-heads take the two
    /// separate (SGEMM) paths.
    ///
    /// # Errors
    /// As [`ProjectionSet::rotate_queries_into`], for either tensor.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::random(ModelDims::new(1, 4, 2, 8)?, "toy", 3)?;
    /// let q: Vec<f32> = (0..4 * 8).map(|i| i as f32 * 0.1).collect();
    /// let k: Vec<f32> = (0..2 * 8).map(|i| 1.0 - i as f32 * 0.05).collect();
    /// let (mut qa, mut ka) = (vec![0.0; q.len()], vec![0.0; k.len()]);
    /// set.rotate_qk_into(0, 1, &q, &k, &mut qa, &mut ka)?;
    /// let (mut qb, mut kb) = (vec![0.0; q.len()], vec![0.0; k.len()]);
    /// set.rotate_queries_into(0, 1, &q, &mut qb)?;
    /// set.rotate_keys_into(0, 1, &k, &mut kb)?;
    /// assert_eq!((qa, ka), (qb, kb));
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn rotate_qk_into(
        &self,
        layer: usize,
        n_tokens: usize,
        q: &[f32],
        k: &[f32],
        q_out: &mut [f32],
        k_out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "ProjectionSet::rotate_qk";
        let dims = self.dims();
        let (d, qh, kvh) = (dims.head_dim(), dims.q_heads(), dims.kv_heads());
        let per_kv = qh / kvh;
        if n_tokens >= GEMM_MIN_ROWS || per_kv >= GEMM_MIN_ROWS {
            // The separate calls run SGEMM here (packing `P` once pays off).
            self.rotate_queries_into(layer, n_tokens, q, q_out)?;
            return self.rotate_keys_into(layer, n_tokens, k, k_out);
        }
        dims.check_layer(OP, layer)?;
        check_product(OP, "queries", &[n_tokens, qh, d], q.len())?;
        check_product(OP, "keys", &[n_tokens, kvh, d], k.len())?;
        check_len(OP, "q_out", q.len(), q_out.len())?;
        check_len(OP, "k_out", k.len(), k_out.len())?;
        if d == 0 {
            return Ok(());
        }
        let bases = self.layer_bases(Stream::Qk, layer);
        let groups = q.chunks_exact(per_kv * d).zip(k.chunks_exact(d));
        let outs = q_out.chunks_exact_mut(per_kv * d).zip(k_out.chunks_exact_mut(d));
        for (g, ((qg, kg), (qo, ko))) in groups.zip(outs).enumerate() {
            let basis = bases[g % kvh].matrix();
            // Passes of up to GROUP_ROWS rows: the group's queries, then its key.
            let mut xs: [&[f32]; GROUP_ROWS] = [&[]; GROUP_ROWS];
            let mut os: [&mut [f32]; GROUP_ROWS] = Default::default();
            let mut n = 0;
            let rows = qg.chunks_exact(d).chain([kg]);
            for (x, o) in rows.zip(qo.chunks_exact_mut(d).chain([ko])) {
                (xs[n], os[n]) = (x, o);
                n += 1;
                if n == GROUP_ROWS {
                    rotate_group(&xs, basis, &mut os);
                    n = 0;
                }
            }
            rotate_group(&xs[..n], basis, &mut os[..n]);
        }
        Ok(())
    }

    /// In-place [`ProjectionSet::rotate_queries_into`] (allocates one scratch buffer).
    ///
    /// # Errors
    /// As [`ProjectionSet::rotate_queries_into`].
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::identity(ModelDims::new(1, 2, 1, 4)?, "toy")?;
    /// let mut q = vec![1.0f32; 8];
    /// set.rotate_queries(0, 1, &mut q)?;
    /// assert_eq!(q, vec![1.0; 8]);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn rotate_queries(&self, layer: usize, n_tokens: usize, q: &mut [f32]) -> Result<()> {
        let mut out = vec![0.0; q.len()];
        self.rotate_queries_into(layer, n_tokens, q, &mut out)?;
        q.copy_from_slice(&out);
        Ok(())
    }

    /// In-place [`ProjectionSet::rotate_keys_into`] (allocates one scratch buffer).
    ///
    /// # Errors
    /// As [`ProjectionSet::rotate_keys_into`].
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::random(ModelDims::new(1, 2, 1, 4)?, "toy", 0)?;
    /// let mut k = vec![1.0f32; 4];
    /// set.rotate_keys(0, 1, &mut k)?;
    /// let norm: f32 = k.iter().map(|x| x * x).sum();
    /// assert!((norm - 4.0).abs() < 1e-5); // rotations preserve norms
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn rotate_keys(&self, layer: usize, n_tokens: usize, k: &mut [f32]) -> Result<()> {
        let mut out = vec![0.0; k.len()];
        self.rotate_keys_into(layer, n_tokens, k, &mut out)?;
        k.copy_from_slice(&out);
        Ok(())
    }

    /// `v̂ = v·P_VO` for values `[n_tokens, kv_heads, head_dim]`: the run-time alternative to
    /// [`ProjectionSet::absorb_value`] (do not do both).
    ///
    /// # Errors
    /// [`crate::Error::OutOfRange`] for a bad layer; [`crate::Error::Shape`] for wrong lengths.
    ///
    /// # Examples
    /// See [`ProjectionSet::unrotate_outputs_into`].
    pub fn rotate_values_into(
        &self,
        layer: usize,
        n_tokens: usize,
        v: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let plan = self.plan("ProjectionSet::rotate_values", Stream::Vo, Direction::Forward, false);
        self.apply(plan, layer, n_tokens, v, out)
    }

    /// `o = ô·P_VOᵀ` for rotated attention outputs `[n_tokens, q_heads, head_dim]` (head `h`
    /// with kv-head `h / group`'s basis): the run-time alternative to
    /// [`ProjectionSet::absorb_output`] (do not do both).
    ///
    /// # Errors
    /// [`crate::Error::OutOfRange`] for a bad layer; [`crate::Error::Shape`] for wrong lengths.
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// // One q-head attending to a single value returns that value: ô = v̂, and o = v.
    /// let set = ProjectionSet::random(ModelDims::new(1, 2, 1, 4)?, "toy", 8)?;
    /// let v = [1.0f32, -2.0, 0.5, 3.0];
    /// let mut v_hat = [0.0f32; 4];
    /// set.rotate_values_into(0, 1, &v, &mut v_hat)?;
    /// let o_hat = [v_hat, v_hat].concat(); // both q-heads of the group
    /// let mut o = [0.0f32; 8];
    /// set.unrotate_outputs_into(0, 1, &o_hat, &mut o)?;
    /// assert!(o[4..].iter().zip(&v).all(|(a, b)| (a - b).abs() < 1e-5));
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn unrotate_outputs_into(
        &self,
        layer: usize,
        n_tokens: usize,
        o_hat: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let plan =
            self.plan("ProjectionSet::unrotate_outputs", Stream::Vo, Direction::Inverse, true);
        self.apply(plan, layer, n_tokens, o_hat, out)
    }

    fn plan(&self, op: &'static str, stream: Stream, dir: Direction, q_side: bool) -> Plan {
        let heads = if q_side { self.dims().q_heads() } else { self.dims().kv_heads() };
        Plan { op, stream, dir, heads }
    }

    /// Applies `plan` to `[n_tokens, plan.heads, d]`: per head (SGEMM) for prefill-sized
    /// inputs, per token and GQA group (row kernel) for decode-sized ones.
    fn apply(
        &self,
        plan: Plan,
        layer: usize,
        n_tokens: usize,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let dims = self.dims();
        dims.check_layer(plan.op, layer)?;
        let (d, heads) = (dims.head_dim(), plan.heads);
        check_product(plan.op, "input", &[n_tokens, heads, d], x.len())?;
        check_len(plan.op, "out", x.len(), out.len())?;
        let per_kv = heads / dims.kv_heads();
        let bases = self.layer_bases(plan.stream, layer);
        let run = |x: &[f32], rows: Rows, p, out: &mut [f32]| {
            rotate_strided(RotationKernel::Auto, plan.dir, x, rows, p, out, rows);
        };
        if n_tokens >= GEMM_MIN_ROWS {
            for h in 0..heads {
                run(
                    x,
                    Rows { offset: h * d, stride: heads * d, n: n_tokens },
                    bases[h / per_kv].matrix(),
                    out,
                );
            }
            return Ok(());
        }
        for t in 0..n_tokens {
            for (j, basis) in bases.iter().enumerate() {
                run(
                    x,
                    Rows { offset: (t * heads + j * per_kv) * d, stride: d, n: per_kv },
                    basis.matrix(),
                    out,
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{ModelDims, ProjectionSet};

    #[test]
    fn fused_qk_rotation_equals_the_separate_calls_bit_for_bit() {
        // Groups of 1..=7 queries (+ the key: passes of 6 rows and a remainder), a head
        // width that is not a multiple of the 16-column block, decode and prefill sizes,
        // and a group large enough for the SGEMM path.
        for (q_heads, kv_heads, d) in
            [(1, 1, 8), (4, 2, 16), (9, 3, 64), (12, 2, 24), (14, 2, 70), (32, 8, 128), (32, 2, 8)]
        {
            let dims = ModelDims::new(2, q_heads, kv_heads, d).unwrap();
            let set = ProjectionSet::random(dims, "m", 11).unwrap();
            for n in [1usize, 3, 17] {
                let q: Vec<f32> =
                    (0..n * q_heads * d).map(|i| ((i * 37) % 29) as f32 / 7.0 - 2.0).collect();
                let k: Vec<f32> =
                    (0..n * kv_heads * d).map(|i| ((i * 53) % 31) as f32 / 9.0 - 1.5).collect();
                let (mut qa, mut ka) = (vec![0.0; q.len()], vec![0.0; k.len()]);
                set.rotate_qk_into(1, n, &q, &k, &mut qa, &mut ka).unwrap();
                let (mut qb, mut kb) = (vec![0.0; q.len()], vec![0.0; k.len()]);
                set.rotate_queries_into(1, n, &q, &mut qb).unwrap();
                set.rotate_keys_into(1, n, &k, &mut kb).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let tag = format!("{q_heads}/{kv_heads} d {d} n {n}");
                assert_eq!(bits(&qa), bits(&qb), "queries, {tag}");
                assert_eq!(bits(&ka), bits(&kb), "keys, {tag}");
            }
        }
    }

    #[test]
    fn fused_qk_rotation_rejects_bad_shapes_and_layers() {
        let set = ProjectionSet::random(ModelDims::new(2, 4, 2, 8).unwrap(), "m", 1).unwrap();
        let (q, k) = (vec![0.5f32; 32], vec![0.5f32; 16]);
        let (mut qo, mut ko) = (vec![0.0f32; 32], vec![0.0f32; 16]);
        let err = |r: crate::Result<()>| r.unwrap_err().to_string();
        let e = err(set.rotate_qk_into(2, 1, &q, &k, &mut qo, &mut ko));
        assert!(e.contains("rotate_qk"), "{e}");
        assert!(set.rotate_qk_into(0, 1, &q[..31], &k, &mut qo, &mut ko).is_err());
        assert!(set.rotate_qk_into(0, 1, &q, &k[..8], &mut qo, &mut ko).is_err());
        assert!(set.rotate_qk_into(0, 1, &q, &k, &mut qo[..16], &mut ko).is_err());
        assert!(set.rotate_qk_into(0, 1, &q, &k, &mut qo, &mut ko[..15]).is_err());
        assert!(set.rotate_qk_into(0, 2, &q, &k, &mut qo, &mut ko).is_err());
    }

    #[test]
    fn prefill_and_decode_paths_agree_and_inverse_undoes_forward() {
        let dims = ModelDims::new(2, 6, 2, 16).unwrap();
        let set = ProjectionSet::random(dims, "m", 4).unwrap();
        let n = 20; // ≥ GEMM_MIN_ROWS: the prefill path
        let x: Vec<f32> = (0..n * 6 * 16).map(|i| ((i * 31) % 17) as f32 - 8.0).collect();
        let mut batch = vec![0.0; x.len()];
        set.rotate_queries_into(1, n, &x, &mut batch).unwrap();
        for t in 0..n {
            let one = &x[t * 96..(t + 1) * 96];
            let mut tok = vec![0.0; 96];
            set.rotate_queries_into(1, 1, one, &mut tok).unwrap();
            for (a, b) in tok.iter().zip(&batch[t * 96..]) {
                assert!((a - b).abs() < 1e-4, "token {t}: {a} vs {b}");
            }
        }
        // VO: rotate the q-layout tensor with the inverse and compare against P_VOᵀ per head.
        let mut back = vec![0.0; x.len()];
        set.unrotate_outputs_into(0, n, &x, &mut back).unwrap();
        let mut v_hat = vec![0.0; 16];
        let head = &back[(3 * 6 + 4) * 16..][..16]; // token 3, q-head 4 → kv-head 1
        crate::rotate_rows(head, set.vo(0, 1).unwrap(), &mut v_hat).unwrap();
        for (a, b) in v_hat.iter().zip(&x[(3 * 6 + 4) * 16..]) {
            assert!((a - b).abs() < 1e-4);
        }
    }
}
