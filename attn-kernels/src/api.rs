//! [`DecodeAttention`]: the one signature every decode-attention implementation shares —
//! the plain reference ([`crate::Reference`]), the optimized CPU kernels
//! ([`crate::CpuAttention`]) and, behind feature `cuda`, the GPU kernels — so one test body
//! runs against all of them.
//!
//! Each method runs one decode step of *all* heads of a layer (GQA: q-head `h` reads kv-head
//! `h / group`): `q` and `out` are `q_heads × head_dim`, head-major, and the caches come
//! one per kv-head. The logits are `scale · q·k` ([`AttnConfig::scale`], default `1/√d_h`)
//! over every cached row (decode is causal by construction); softmax; output `Σ a_j v_j`.
//!
//! Paper map: `dense` is the baseline; `sparse` and `hybrid` are SWAN's decode step
//! (method section, sparse-dense products over CSR rows, one softmax over sparse history
//! and dense buffer); `gathered` is WnW's decode over resident positions with the
//! anchor-head importance signal (§2.3, Eq. 2). [`GatheredSparseAttention`] extends the
//! gathered kernel to a tiered store holding SWAN's sparse fp8 rows next to dense ones.

use kv_sparse::coded::{IndexCode, ValueCode};
use kv_sparse::decoded::DecodeRows;
use kv_sparse::quant::DenseCodec;
use kv_sparse::{SparseIndex, Value};

use crate::config::AttnConfig;
use crate::error::Result;
use crate::views::{
    CodedHybridSource, DecodedKv, DenseKv, GatheredCodedKv, GatheredKv, GatheredSparseKv,
    HybridSource, QuantKv, SparseKv,
};

/// One decode step of a layer's attention over each kind of KV cache.
///
/// # Errors (every method)
/// [`crate::Error::LengthMismatch`] for `q`/`out`/`weights` lengths or a cache count
/// other than `kv_heads`; [`crate::Error::NonFiniteQuery`] for NaN/∞ in `q`;
/// [`crate::Error::HeadDimMismatch`], [`crate::Error::RaggedRows`],
/// [`crate::Error::RowCountMismatch`] for malformed caches;
/// [`crate::Error::EmptyCache`] when a kv-head has no rows at all (one empty *part* — no
/// sparse history yet, or `b = 0` — is fine); [`crate::Error::InvalidValueScale`] for a
/// non-finite or non-positive sparse scale; for `gathered` also
/// [`crate::Error::PositionsNotAscending`] and [`crate::Error::SlotOutOfRange`].
/// Nothing is written to `out` when an error is returned.
pub trait DecodeAttention {
    /// Attention over dense K/V rows (`f32`, `f16`, `bf16` or fp8).
    fn dense<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[DenseKv<'_, D>],
        out: &mut [f32],
    ) -> Result<()>;

    /// Attention over CSR K/V rows only (scores `q·k_j` gathered at each row's indices;
    /// output scattered into the `d_h`-wide accumulator; no row is densified).
    fn sparse<I: SparseIndex, V: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[SparseKv<'_, I, V>],
        out: &mut [f32],
    ) -> Result<()>;

    /// SWAN's hybrid cache: the CSR history then the dense buffer, under one softmax.
    fn hybrid<I: SparseIndex, V: Value, D: Value, H: HybridSource<I, V, D>>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[H],
        out: &mut [f32],
    ) -> Result<()>;

    /// Attention over each kv-head's resident rows (WnW tiered store). With `weights`
    /// (length = total resident rows over all kv-heads, kv-head after kv-head, in
    /// position-list order), also writes each row's softmax weight summed over the q-heads
    /// of its group — the anchor signal of WnW Eq. 2 for that (layer, kv-head).
    fn gathered<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[GatheredKv<'_, D>],
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()>;
}

/// WnW's gathered decode over a tiered store that keeps some rows as SWAN sparse rows:
/// per kv-head, dense resident rows ([`GatheredKv`]) and sparse resident rows
/// ([`GatheredSparseKv`], fixed-width `u8` + fp8 rows in a slab) under ONE softmax. The
/// sparse rows are read where they lie (scores gathered at their indices, outputs
/// scattered), never densified. A separate trait from [`DecodeAttention`] so that
/// implementations without this kernel (the GPU path) need not provide it.
pub trait GatheredSparseAttention {
    /// Attention over each kv-head's dense rows `dense[h]` and sparse rows `sparse[h]`
    /// (disjoint positions; either part may be empty, not both). With `weights` (length =
    /// Σ over kv-heads of dense + sparse rows), writes each row's softmax weight summed over
    /// the q-heads of its group, per kv-head: its dense rows in list order, then its sparse
    /// rows in list order (WnW Eq. 2's anchor signal).
    ///
    /// # Errors
    /// As [`DecodeAttention::gathered`], plus [`crate::Error::LengthMismatch`] when
    /// `sparse` does not hold one entry per kv-head, [`crate::Error::InvalidSlab`] for a
    /// slab that is not whole rows, a `k` above `head_dim` or a `head_dim` above 256,
    /// [`crate::Error::InvalidValueScale`] for a bad slab scale and
    /// [`crate::Error::PositionsOverlap`] when a position is both dense and sparse.
    fn gathered_sparse<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        dense: &[GatheredKv<'_, D>],
        sparse: &[GatheredSparseKv<'_>],
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()>;
}

/// Gathered attention over each kv-head's resident dense rows and resident rows of a
/// per-row code ([`GatheredCodedKv`]: TurboQuant-style codebook rows, QJL-sketched keys,
/// per-token channel groups) — a WnW store whose offloadable rows are coded, read where
/// they lie, scores and value sums formed from the codes as
/// [`EncodedAttention::decoded`] forms them. The tiered analogue of
/// [`GatheredSparseAttention`], with the same conventions.
pub trait GatheredCodedAttention {
    /// Attention over each kv-head's dense rows `dense[h]` and coded rows `coded[h]`
    /// (disjoint positions; either part may be empty, not both). With `weights` (length =
    /// Σ over kv-heads of dense + coded rows), writes each row's softmax weight summed over
    /// the q-heads of its group, per kv-head: its dense rows in list order, then its coded
    /// rows in list order.
    ///
    /// # Errors
    /// As [`GatheredSparseAttention::gathered_sparse`] for the dense part, the lists and the
    /// positions; [`crate::Error::Sparse`] ([`kv_sparse::Error::InvalidCodeLayout`]) for a
    /// layout whose rows do not stand alone (token groups), a value layout the kernels do
    /// not read in place (sketched rows), or slabs that are not whole rows of the layout.
    fn gathered_coded<D: Value>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        dense: &[GatheredKv<'_, D>],
        coded: &[GatheredCodedKv<'_>],
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) -> Result<()>;
}

/// Decode attention over the encodings a runtime compares SWAN with and the encodings
/// that make SWAN rows small: dense quantized rows (int8 / int4 blocks, scaled fp8) and the
/// hybrid cache over coded rows (index list or bitmask × f16/bf16/fp8/int8/int4 values).
/// Rows are read as stored — a tile of rows is decoded into registers-sized scratch as it
/// is streamed, the cache itself never is. Same conventions and errors as
/// [`DecodeAttention`].
pub trait EncodedAttention {
    /// Attention over dense quantized K/V rows, keys and values each in its own codec.
    ///
    /// # Errors
    /// As [`DecodeAttention::dense`].
    fn quantized<K: DenseCodec, V: DenseCodec>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[QuantKv<'_, K, V>],
        out: &mut [f32],
    ) -> Result<()>;

    /// Histories of coded rows ([`DecodedKv`]: KIVI, the TurboQuant-style codes): sink rows,
    /// the coded rows, then the recent-token buffer, under one softmax. Rows whose decoder
    /// names its layout ([`DecodeRows::codes`]) are read in place, scores and value sums
    /// formed from the codes; others through [`DecodeRows::decode_row`].
    ///
    /// # Errors
    /// As [`DecodeAttention::dense`]; a keys / values row-count mismatch or a malformed
    /// sink or buffer is [`crate::Error::RowCountMismatch`] / [`crate::Error::RaggedRows`];
    /// a named layout that does not describe the rows is [`crate::Error::Sparse`]
    /// ([`kv_sparse::Error::InvalidCodeLayout`]).
    fn decoded<K: DecodeRows, V: DecodeRows>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[DecodedKv<'_, K, V>],
        out: &mut [f32],
    ) -> Result<()>;

    /// SWAN's hybrid cache over coded rows: the coded history then the dense buffer, under
    /// one softmax.
    ///
    /// # Errors
    /// As [`DecodeAttention::hybrid`].
    fn coded_hybrid<X: IndexCode, Y: ValueCode, D: Value, H: CodedHybridSource<X, Y, D>>(
        &mut self,
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[H],
        out: &mut [f32],
    ) -> Result<()>;
}
