//! Parsing and validating a safetensors header: the 8-byte length, the JSON object and every
//! rule the format sets on it. [`Header::parse`] is pure and allocation-bounded (the length is
//! checked against the limit and the file size before anything is allocated); [`Header::read`]
//! is the one place that reads a header from a file. Reading tensor bytes is not done here.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::dtype::Dtype;
use crate::{Error, File, Result};

/// The largest header the format allows, in bytes (safetensors' own limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Where one tensor's bytes are, and what they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions (empty for a scalar).
    pub shape: Vec<u64>,
    /// First byte, relative to the start of the data section.
    pub begin: u64,
    /// One past the last byte, relative to the start of the data section.
    pub end: u64,
}

impl TensorInfo {
    /// Bytes the tensor occupies.
    pub fn nbytes(&self) -> u64 {
        self.end - self.begin
    }
}

/// A validated safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Length of the JSON text (the 8-byte prefix's value), padding included.
    pub json_len: u64,
    /// The `__metadata__` strings, `None` when the header has none.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Every tensor, in data-offset order (ties, i.e. empty tensors, by name).
    pub tensors: Vec<TensorInfo>,
}

/// Builds the error for a broken rule; the path is filled in by whoever knows it.
fn invalid(tensor: Option<&str>, rule: impl Into<String>) -> Error {
    Error::Safetensors {
        path: PathBuf::new(),
        tensor: tensor.map(str::to_string),
        rule: rule.into(),
    }
}

/// The JSON text's top-level entries in file order, duplicates kept so they can be refused
/// (`serde_json`'s own maps keep the last value of a repeated key silently).
struct Entries(Vec<(String, Entry)>);

/// One top-level value: an object with its fields in order, repeated ones kept (a tensor's
/// `dtype` given twice is refused, as safetensors refuses it), `null`, or anything else.
enum Entry {
    Object(Vec<(String, serde_json::Value)>),
    Null,
    Other,
}

impl Entry {
    /// The first of a tensor's fields (`dtype`, `shape`, `data_offsets`) given twice, if one
    /// is (safetensors refuses those, and ignores other fields, repeated or not).
    fn repeated(&self) -> Option<&str> {
        let Entry::Object(fields) = self else {
            return None;
        };
        let mut seen = std::collections::HashSet::with_capacity(fields.len());
        fields
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| matches!(*k, "dtype" | "shape" | "data_offsets"))
            .find(|k| !seen.insert(*k))
    }

    /// As a JSON value (a repeated field's last value wins, as in a JSON map). What was
    /// neither an object nor null becomes `false`: the rules that read it (`parse_tensor`,
    /// `parse_metadata`) refuse any value that is not an object, whatever it was.
    fn into_value(self) -> serde_json::Value {
        match self {
            Entry::Object(fields) => serde_json::Value::Object(fields.into_iter().collect()),
            Entry::Null => serde_json::Value::Null,
            Entry::Other => serde_json::Value::Bool(false),
        }
    }
}

impl<'de> de::Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = Entry;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entry, A::Error> {
                let mut fields = Vec::new();
                while let Some(field) = map.next_entry::<String, serde_json::Value>()? {
                    fields.push(field);
                }
                Ok(Entry::Object(fields))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Entry, E> {
                Ok(Entry::Null)
            }
            fn visit_none<E: de::Error>(self) -> std::result::Result<Entry, E> {
                Ok(Entry::Null)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Entry, E> {
                Ok(Entry::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Entry, E> {
                Ok(Entry::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Entry, E> {
                Ok(Entry::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Entry, E> {
                Ok(Entry::Other)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Entry, E> {
                Ok(Entry::Other)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Entry, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(Entry::Other)
            }
        }
        d.deserialize_any(EntryVisitor)
    }
}

impl<'de> de::Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entries, A::Error> {
                // No size hint is trusted: the JSON text itself bounds the allocation.
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, Entry>()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(EntriesVisitor)
    }
}

impl Header {
    /// Bytes before the data section: the 8-byte length and the JSON text.
    pub fn data_start(&self) -> u64 {
        8 + self.json_len
    }

    /// Bytes of the data section (the sum of every tensor's size).
    pub fn data_len(&self) -> u64 {
        self.tensors.last().map_or(0, |t| t.end)
    }

    /// The JSON length announced by the first 8 bytes of a file of `file_len` bytes, checked
    /// against the limit and the file size so that a caller may allocate that much.
    pub fn json_len(first8: &[u8], file_len: u64) -> Result<u64> {
        let Some(bytes) = first8.get(..8) else {
            return Err(invalid(
                None,
                format!(
                    "file is {} bytes, shorter than the 8-byte header length",
                    first8
                        .len()
                        .min(usize::try_from(file_len).unwrap_or(usize::MAX))
                ),
            ));
        };
        let mut le = [0u8; 8];
        le.copy_from_slice(bytes);
        let n = u64::from_le_bytes(le);
        if n > MAX_HEADER_BYTES {
            return Err(invalid(
                None,
                format!("header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes"),
            ));
        }
        if n.saturating_add(8) > file_len {
            return Err(invalid(
                None,
                format!("header length {n} runs past the end of the file ({file_len} bytes)"),
            ));
        }
        Ok(n)
    }

    /// Parses and validates a header from `prefix`, the first bytes of a file of `file_len`
    /// bytes (at least the 8-byte length and the JSON text; more is ignored).
    pub fn parse(prefix: &[u8], file_len: u64) -> Result<Header> {
        let n = Header::json_len(prefix, file_len)?;
        let json_end =
            usize::try_from(8 + n).map_err(|_| invalid(None, "header does not fit in memory"))?;
        let Some(text) = prefix.get(8..json_end) else {
            return Err(invalid(
                None,
                format!(
                    "header is truncated: {} of its {n} bytes given",
                    prefix.len() - 8
                ),
            ));
        };
        let entries: Entries = serde_json::from_slice(text)
            .map_err(|e| invalid(None, format!("header is not a JSON object: {e}")))?;
        let mut metadata = None;
        let mut tensors = Vec::with_capacity(entries.0.len());
        let mut seen = std::collections::HashSet::with_capacity(entries.0.len());
        for (name, value) in entries.0 {
            if !seen.insert(name.clone()) {
                return Err(invalid(Some(&name), "name appears twice in the header"));
            }
            if name == "__metadata__" {
                metadata = parse_metadata(value.into_value())?;
            } else {
                if let Some(field) = value.repeated() {
                    return Err(invalid(
                        Some(&name),
                        format!("field {field:?} appears twice"),
                    ));
                }
                tensors.push(parse_tensor(name, value.into_value())?);
            }
        }
        tensors.sort_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
        let mut at = 0u64;
        for t in &tensors {
            if t.begin != at {
                let what = if t.begin > at { "a hole" } else { "an overlap" };
                return Err(invalid(
                    Some(&t.name),
                    format!(
                        "data_offsets [{}, {}] leave {what} in the data section: \
                         the previous tensor ends at {at}",
                        t.begin, t.end
                    ),
                ));
            }
            at = t.end;
        }
        let data_len = file_len - 8 - n;
        if at != data_len {
            return Err(invalid(
                tensors.last().map(|t| t.name.as_str()),
                format!(
                    "the tensors' data ends at byte {at} of the data section but the file \
                     holds {data_len} bytes after the header"
                ),
            ));
        }
        Ok(Header {
            json_len: n,
            metadata,
            tensors,
        })
    }

    /// Reads and validates the header of `file` (8 bytes, then exactly the announced length).
    pub fn read(file: &File) -> Result<Header> {
        let file_len = file.len()?;
        let path = file.path();
        let mut first8 = [0u8; 8];
        let got = file.read_at(&mut first8, 0)?;
        let n = Header::json_len(&first8[..got], file_len).map_err(|e| at_path(e, path))?;
        let total = usize::try_from(8 + n)
            .map_err(|_| at_path(invalid(None, "header does not fit in memory"), path))?;
        let mut prefix = vec![0u8; total];
        let got = file.read_at(&mut prefix, 0)?;
        prefix.truncate(got);
        Header::parse(&prefix, file_len).map_err(|e| at_path(e, path))
    }

    /// Opens `path` and reads its header.
    pub fn read_path(path: impl AsRef<Path>) -> Result<Header> {
        Header::read(&File::open(path, "r")?)
    }
}

/// Puts `path` into a safetensors error (other errors pass unchanged).
pub(crate) fn at_path(e: Error, at: &Path) -> Error {
    match e {
        Error::Safetensors { tensor, rule, .. } => Error::Safetensors {
            path: at.to_path_buf(),
            tensor,
            rule,
        },
        other => other,
    }
}

/// The `__metadata__` strings; `null` is no metadata, as `safetensors` reads it.
fn parse_metadata(value: serde_json::Value) -> Result<Option<BTreeMap<String, String>>> {
    let map = match value {
        serde_json::Value::Object(map) => map,
        serde_json::Value::Null => return Ok(None),
        _ => {
            return Err(invalid(
                Some("__metadata__"),
                "__metadata__ must be a JSON object of strings (or null)",
            ))
        }
    };
    map.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s)),
            _ => Err(invalid(
                Some("__metadata__"),
                format!("__metadata__ value of {k:?} is not a string"),
            )),
        })
        .collect::<Result<_>>()
        .map(Some)
}

fn parse_tensor(name: String, value: serde_json::Value) -> Result<TensorInfo> {
    let bad = |rule: String| invalid(Some(&name), rule);
    let serde_json::Value::Object(map) = value else {
        return Err(bad("entry must be a JSON object".into()));
    };
    let dtype = match map.get("dtype") {
        Some(serde_json::Value::String(s)) => s.parse::<Dtype>().map_err(|e| bad(e.to_string()))?,
        _ => return Err(bad("dtype is missing or not a string".into())),
    };
    let shape = match map.get("shape") {
        Some(serde_json::Value::Array(dims)) => dims
            .iter()
            .map(|d| d.as_u64())
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| bad("shape must be a list of non-negative integers".into()))?,
        _ => return Err(bad("shape is missing or not a list".into())),
    };
    let (begin, end) = match map.get("data_offsets") {
        Some(serde_json::Value::Array(o)) if o.len() == 2 => match (o[0].as_u64(), o[1].as_u64()) {
            (Some(b), Some(e)) => (b, e),
            _ => return Err(bad("data_offsets must be two non-negative integers".into())),
        },
        _ => return Err(bad("data_offsets is missing or not [begin, end]".into())),
    };
    if end < begin {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] end before they begin"
        )));
    }
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            bad(format!(
                "shape {shape:?} has more elements than fit in 64 bits"
            ))
        })?;
    let Some(nbytes) = dtype.bytes_for(elements) else {
        return Err(bad(format!(
            "shape {shape:?} is {}",
            dtype.why_no_bytes(elements)
        )));
    };
    if nbytes != end - begin {
        return Err(bad(format!(
            "size: shape {shape:?} of {dtype} needs {nbytes} bytes but data_offsets \
             [{begin}, {end}] hold {}",
            end - begin
        )));
    }
    Ok(TensorInfo {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}
