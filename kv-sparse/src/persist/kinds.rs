//! Run-time dispatch from a file's [`super::CacheLayout`] codes to the row types they
//! name, so validation runs the same typed validators ([`crate::coded::CodedView::from_parts`],
//! [`crate::quant::QuantView::from_bytes`], the CSR checks) an in-memory cache uses.
//! Part of the persisted SWAN cache (method section, hybrid KV-cache; row encodings of
//! "Memory footprint").

/// Calls `$func::<X, Y>($args…)` with the coded index and value types that `$index`
/// ([`crate::coded::IndexKind`]) and `$value` ([`crate::coded::ValueKind`]) name.
macro_rules! with_coded {
    ($index:expr, $value:expr, $func:ident ( $($arg:expr),* )) => {{
        use $crate::coded::{Bitmask, IndexKind, List};
        match $index {
            IndexKind::ListU8 => with_coded!(@value List<u8>, $value, $func ($($arg),*)),
            IndexKind::ListU16 => with_coded!(@value List<u16>, $value, $func ($($arg),*)),
            IndexKind::Bitmask => with_coded!(@value Bitmask, $value, $func ($($arg),*)),
        }
    }};
    (@value $x:ty, $value:expr, $func:ident ( $($arg:expr),* )) => {{
        use $crate::coded::{Elems, Int4Values, Int8Values, ValueKind};
        use $crate::ValueFormat;
        match $value {
            ValueKind::Elems(ValueFormat::F32) => $func::<$x, Elems<f32>>($($arg),*),
            ValueKind::Elems(ValueFormat::F16) => $func::<$x, Elems<half::f16>>($($arg),*),
            ValueKind::Elems(ValueFormat::Bf16) => $func::<$x, Elems<half::bf16>>($($arg),*),
            ValueKind::Elems(ValueFormat::Fp8E4M3) => {
                $func::<$x, Elems<$crate::fp8::Fp8E4M3>>($($arg),*)
            }
            ValueKind::Int8 => $func::<$x, Int8Values>($($arg),*),
            ValueKind::Int4 => $func::<$x, Int4Values>($($arg),*),
        }
    }};
}

/// Calls `$func::<D>($args…)` with the [`crate::Value`] type `$format`
/// ([`crate::ValueFormat`]) names.
macro_rules! with_value {
    ($format:expr, $func:ident ( $($arg:expr),* )) => {{
        use $crate::ValueFormat;
        match $format {
            ValueFormat::F32 => $func::<f32>($($arg),*),
            ValueFormat::F16 => $func::<half::f16>($($arg),*),
            ValueFormat::Bf16 => $func::<half::bf16>($($arg),*),
            ValueFormat::Fp8E4M3 => $func::<$crate::fp8::Fp8E4M3>($($arg),*),
        }
    }};
}

/// Calls `$func::<C>($args…)` with the [`crate::quant::DenseCodec`] `$format`
/// ([`crate::quant::DenseFormat`]) names.
macro_rules! with_codec {
    ($format:expr, $func:ident ( $($arg:expr),* )) => {{
        use $crate::quant::{DenseFormat, Fp8Rows, Int4Blocks, Int8Blocks};
        match $format {
            DenseFormat::Int8 => $func::<Int8Blocks>($($arg),*),
            DenseFormat::Int4 => $func::<Int4Blocks>($($arg),*),
            DenseFormat::Fp8 => $func::<Fp8Rows>($($arg),*),
        }
    }};
}

/// Calls `$func::<S>($args…)` with the [`crate::hybrid::WholeRowStore`] `$history`
/// ([`crate::hybrid::HistoryFormat`]) names; bits outside a family's set are
/// [`crate::Error::Corrupt`] (the header parser admits none).
macro_rules! with_history {
    ($history:expr, $func:ident ( $($arg:expr),* )) => {{
        use $crate::hybrid::HistoryFormat;
        use $crate::kivi::KiviRows;
        use $crate::quant::{DenseFormat, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};
        use $crate::turbo::{TurboQjlRows, TurboRows};
        match $history {
            HistoryFormat::Quant(DenseFormat::Int8) => $func::<QuantRows<Int8Blocks>>($($arg),*),
            HistoryFormat::Quant(DenseFormat::Int4) => $func::<QuantRows<Int4Blocks>>($($arg),*),
            HistoryFormat::Quant(DenseFormat::Fp8) => $func::<QuantRows<Fp8Rows>>($($arg),*),
            HistoryFormat::Kivi { bits: 2 } => $func::<KiviRows<2>>($($arg),*),
            HistoryFormat::Kivi { bits: 4 } => $func::<KiviRows<4>>($($arg),*),
            HistoryFormat::Turbo { bits: 2 } => $func::<TurboRows<2>>($($arg),*),
            HistoryFormat::Turbo { bits: 3 } => $func::<TurboRows<3>>($($arg),*),
            HistoryFormat::Turbo { bits: 4 } => $func::<TurboRows<4>>($($arg),*),
            HistoryFormat::TurboQjl { bits: 2 } => $func::<TurboQjlRows<2>>($($arg),*),
            HistoryFormat::TurboQjl { bits: 3 } => $func::<TurboQjlRows<3>>($($arg),*),
            HistoryFormat::TurboQjl { bits: 4 } => $func::<TurboQjlRows<4>>($($arg),*),
            other => Err($crate::Error::Corrupt { reason: format!("unknown history {other}") }),
        }
    }};
}

pub(crate) use {with_codec, with_coded, with_history, with_value};
