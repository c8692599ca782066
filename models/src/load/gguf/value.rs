//! GGUF metadata values: the thirteen value types of the format, parsed with every count
//! checked against the bytes that remain before anything is allocated, and nested arrays
//! limited in depth, so a corrupt or hostile header cannot exhaust memory or the stack.

use super::cursor::Cursor;
use super::error::{GgufError, Result};

/// Arrays may nest (an array of arrays); real files use one level. Deeper is rejected.
const MAX_ARRAY_DEPTH: usize = 4;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// `UINT8`
    U8(u8),
    /// `INT8`
    I8(i8),
    /// `UINT16`
    U16(u16),
    /// `INT16`
    I16(i16),
    /// `UINT32`
    U32(u32),
    /// `INT32`
    I32(i32),
    /// `FLOAT32`
    F32(f32),
    /// `BOOL` (a byte that must be 0 or 1)
    Bool(bool),
    /// `STRING`
    String(String),
    /// `ARRAY` of values of one type
    Array(Vec<MetaValue>),
    /// `UINT64`
    U64(u64),
    /// `INT64`
    I64(i64),
    /// `FLOAT64`
    F64(f64),
}

impl MetaValue {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, when it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float (either float width, or any integer).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Self::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(v) => Some(v),
            _ => None,
        }
    }

    /// A short type name for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::F32(_) => "f32",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F64(_) => "f64",
        }
    }
}

/// The smallest encoding of one value of type `ty` (a string is at least its length).
fn min_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

/// Reads one value of type `ty` (the u32 type tag already consumed).
pub(crate) fn read_value(c: &mut Cursor<'_>, ty: u32, depth: usize) -> Result<MetaValue> {
    let at = c.pos() as u64;
    Ok(match ty {
        0 => MetaValue::U8(c.u8("u8 value")?),
        1 => MetaValue::I8(c.u8("i8 value")? as i8),
        2 => MetaValue::U16(c.u16("u16 value")?),
        3 => MetaValue::I16(c.u16("i16 value")? as i16),
        4 => MetaValue::U32(c.u32("u32 value")?),
        5 => MetaValue::I32(c.u32("i32 value")? as i32),
        6 => MetaValue::F32(c.f32("f32 value")?),
        7 => match c.u8("bool value")? {
            0 => MetaValue::Bool(false),
            1 => MetaValue::Bool(true),
            b => return Err(invalid("bool value", at, format!("byte {b} is neither 0 nor 1"))),
        },
        8 => MetaValue::String(c.string("string value")?),
        9 => read_array(c, depth)?,
        10 => MetaValue::U64(c.u64("u64 value")?),
        11 => MetaValue::I64(c.u64("i64 value")? as i64),
        12 => MetaValue::F64(c.f64("f64 value")?),
        other => {
            return Err(invalid("metadata value type", at, format!("unknown type tag {other}")));
        }
    })
}

fn read_array(c: &mut Cursor<'_>, depth: usize) -> Result<MetaValue> {
    let at = c.pos() as u64;
    if depth >= MAX_ARRAY_DEPTH {
        return Err(invalid("array", at, format!("nested deeper than {MAX_ARRAY_DEPTH} levels")));
    }
    let ty = c.u32("array element type")?;
    let len = c.u64("array length")?;
    let min = min_size(ty)
        .ok_or_else(|| invalid("array element type", at, format!("unknown type tag {ty}")))?;
    // Bound the allocation by what the file can hold before reserving anything.
    if len.checked_mul(min).is_none_or(|need| need > c.remaining() as u64) {
        return Err(GgufError::Truncated {
            what: "array elements",
            offset: c.pos() as u64,
            needed: len.saturating_mul(min),
            available: c.remaining() as u64,
        });
    }
    let mut items = Vec::with_capacity(len as usize);
    for _ in 0..len {
        items.push(read_value(c, ty, depth + 1)?);
    }
    Ok(MetaValue::Array(items))
}

fn invalid(what: &str, offset: u64, reason: String) -> GgufError {
    GgufError::Invalid { what: what.to_string(), offset, reason }
}
