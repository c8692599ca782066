//! Structured edits of JSON documents for the in-tree property fuzzing: byte mutations
//! rarely keep JSON parseable, so these replace one value (depth-first index) with a
//! boundary value of another type or size, or remove one key — the edits that reach a
//! parser's validation of safetensors headers and `config.json` files.

use serde_json::Value as Json;

/// Replacement values tried at one JSON location.
pub fn replacements(choice: u64) -> Json {
    let n = |x: u64| Json::from(x);
    let options = [
        n(0),
        n(1),
        n(3),
        n(u64::from(u32::MAX)),
        n(u64::MAX),
        n(1 << 62),
        Json::from(1e300),
        Json::from(-0.0),
        Json::from("llama"),
        Json::from(-1),
        Json::from(1.5),
        Json::from("F64"),
        Json::from("U8"),
        Json::from("999999999999"),
        Json::from("NaN"),
        Json::from(""),
        Json::Null,
        serde_json::json!([]),
        serde_json::json!([0, 0]),
        serde_json::json!([1, 1, 4, 4]),
        serde_json::json!([u64::MAX, 2]),
        serde_json::json!({}),
    ];
    options[(choice % options.len() as u64) as usize].clone()
}

/// Visits every value of `v` (depth first) and replaces the `target`-th one.
pub fn replace_nth(v: &mut Json, target: &mut u64, with: &Json) -> bool {
    if *target == 0 {
        *v = with.clone();
        return true;
    }
    *target -= 1;
    match v {
        Json::Array(items) => items.iter_mut().any(|x| replace_nth(x, target, with)),
        Json::Object(map) => map.values_mut().any(|x| replace_nth(x, target, with)),
        _ => false,
    }
}

/// Replaces the `at`-th value of `doc` (depth first) with [`replacements`]`(choice)`, or —
/// with `remove` — removes one key (of the `__metadata__` object on even `at` if present,
/// else of the top level).
pub fn edit(doc: &mut Json, at: u64, choice: u64, remove: bool) {
    if !remove {
        let mut target = at;
        replace_nth(doc, &mut target, &replacements(choice));
        return;
    }
    if let Some(m) = doc.get_mut("__metadata__").and_then(Json::as_object_mut)
        && at.is_multiple_of(2)
        && !m.is_empty()
    {
        let key = m.keys().nth((at / 2 % m.len() as u64) as usize).cloned();
        key.map(|k| m.remove(&k));
        return;
    }
    if let Some(top) = doc.as_object_mut()
        && !top.is_empty()
    {
        let key = top.keys().nth((at % top.len() as u64) as usize).cloned();
        key.map(|k| top.remove(&k));
    }
}
