//! The header of a file about to be written: tensor order, data offsets and the JSON text,
//! byte for byte what `safetensors` writes for the same tensors. Pure; writing the bytes to a
//! file is the caller's job.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::dtype::Dtype;
use crate::{Error, Result};

/// A tensor to be written: what the header says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions (empty for a scalar).
    pub shape: Vec<u64>,
}

/// Where a tensor goes in the data section, in write order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The tensor's name.
    pub name: String,
    /// First byte, relative to the data section.
    pub begin: u64,
    /// One past the last byte, relative to the data section.
    pub end: u64,
}

/// The complete header of a new file: the 8-byte little-endian length, the JSON text padded
/// with spaces to a multiple of 8 bytes, and where each tensor's bytes go.
///
/// Tensors are placed as `safetensors` places them: by dtype, largest first in [`Dtype`]'s
/// order, then by name; the JSON is compact, `__metadata__` first when given. Metadata keys are
/// written in sorted order; `safetensors` itself writes them in hash-map order, so the two
/// files are byte-identical when the metadata has at most one key (and equal in content
/// always). A tensor the format cannot hold (a name given twice or named `__metadata__`, a size
/// past 64 bits, a dtype whose bits do not fill whole bytes) is an [`Error::Safetensors`]
/// naming it, as a file breaking the same rule would be.
pub fn header_bytes(
    tensors: &[TensorSpec],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<(Vec<u8>, Vec<Placement>)> {
    let mut order: Vec<&TensorSpec> = tensors.iter().collect();
    order.sort_by(|a, b| b.dtype.cmp(&a.dtype).then_with(|| a.name.cmp(&b.name)));
    let mut seen = std::collections::HashSet::with_capacity(order.len());
    let mut json = String::from("{");
    if let Some(meta) = metadata {
        json.push_str("\"__metadata__\":");
        json.push_str(&to_json(meta)?);
    }
    let mut at = 0u64;
    let mut placements = Vec::with_capacity(order.len());
    for t in order {
        let bad = |rule: String| Error::Safetensors {
            path: PathBuf::new(),
            tensor: Some(t.name.clone()),
            rule,
        };
        if t.name == "__metadata__" {
            return Err(bad("the name is reserved for the header's metadata".into()));
        }
        if !seen.insert(t.name.as_str()) {
            return Err(bad("name given twice".into()));
        }
        let elements = t
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad("shape overflows 64 bits".into()))?;
        let nbytes = t
            .dtype
            .bytes_for(elements)
            .ok_or_else(|| bad(t.dtype.why_no_bytes(elements)))?;
        let end = at
            .checked_add(nbytes)
            .ok_or_else(|| bad("data section overflows 64 bits".into()))?;
        if json.len() > 1 {
            json.push(',');
        }
        json.push_str(&to_json(&t.name)?);
        json.push_str(":{\"dtype\":\"");
        json.push_str(t.dtype.name());
        json.push_str("\",\"shape\":");
        json.push_str(&to_json(&t.shape)?);
        json.push_str(&format!(",\"data_offsets\":[{at},{end}]}}"));
        placements.push(Placement {
            name: t.name.clone(),
            begin: at,
            end,
        });
        at = end;
    }
    json.push('}');
    let padded = json.len().div_ceil(8) * 8;
    let mut out = Vec::with_capacity(8 + padded);
    out.extend_from_slice(&(padded as u64).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    out.resize(8 + padded, b' ');
    Ok((out, placements))
}

fn to_json<T: serde::Serialize + ?Sized>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Safetensors {
        path: PathBuf::new(),
        tensor: None,
        rule: format!("header JSON: {e}"),
    })
}
