//! Unit and property tests of the format code: every validation rule, and write-then-parse
//! round trips.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::Error;

/// A whole file: `json` as the header (padded as given), then `data_len` zero bytes.
fn file(json: &str, data_len: usize) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.resize(v.len() + data_len, 0);
    v
}

fn rule_of(bytes: &[u8]) -> (Option<String>, String) {
    match Header::parse(bytes, bytes.len() as u64) {
        Err(Error::Safetensors { tensor, rule, .. }) => (tensor, rule),
        other => panic!("expected a safetensors error, got {other:?}"),
    }
}

#[test]
fn a_valid_file_parses_in_offset_order() {
    let json = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}}"#;
    let h = Header::parse(&file(json, 12), 8 + json.len() as u64 + 12).unwrap();
    assert_eq!(h.data_start(), 8 + json.len() as u64);
    assert_eq!(h.tensors[0].name, "b");
    assert_eq!(h.tensors[1].dtype, Dtype::BF16);
    assert_eq!(h.tensors[1].shape, vec![1, 2]);
    assert_eq!(h.metadata.unwrap()["k"], "v");
}

#[test]
fn null_metadata_is_no_metadata_as_in_safetensors() {
    let json = r#"{"__metadata__":null,"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    let h = Header::parse(&file(json, 1), 8 + json.len() as u64 + 1).unwrap();
    assert_eq!(h.metadata, None);
    assert_eq!(h.tensors.len(), 1);
}

#[test]
fn each_rule_is_named() {
    let t = |j: &str, n: usize| rule_of(&file(j, n));
    let (_, r) = rule_of(&[1, 2, 3]);
    assert!(r.contains("shorter than the 8-byte"), "{r}");
    let mut huge = (MAX_HEADER_BYTES + 1).to_le_bytes().to_vec();
    huge.resize(64, b' ');
    assert!(rule_of(&huge).1.contains("exceeds the limit"));
    let mut past = 1000u64.to_le_bytes().to_vec();
    past.extend_from_slice(b"{}");
    assert!(rule_of(&past).1.contains("runs past the end"));
    assert!(t("[1,2]", 0).1.contains("not a JSON object"));
    assert!(t("{\"a\":", 0).1.contains("not a JSON object"));
    let (name, r) = t(
        r#"{"a":{"dtype":"F31","shape":[],"data_offsets":[0,4]}}"#,
        4,
    );
    assert_eq!(name.as_deref(), Some("a"));
    assert!(r.contains("unknown dtype"), "{r}");
    let (_, r) = t(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
        4,
    );
    assert!(r.starts_with("size:"), "{r}");
    let (name, r) = t(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#,
        3,
    );
    assert_eq!(name.as_deref(), Some("b"));
    assert!(r.contains("overlap"), "{r}");
    let (_, r) = t(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}"#,
        5,
    );
    assert!(r.contains("hole"), "{r}");
    let (_, r) = t(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
        3,
    );
    assert!(r.contains("file holds 3 bytes"), "{r}");
    let (name, r) = t(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
        2,
    );
    assert_eq!(name.as_deref(), Some("a"));
    assert!(r.contains("twice"), "{r}");
    // A field given twice in one entry is refused too, as safetensors refuses it (the last
    // `dtype` was read): "field \"dtype\" appears twice".
    let (name, r) = t(
        r#"{"a":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}}"#,
        4,
    );
    assert_eq!(name.as_deref(), Some("a"));
    assert!(r.contains("\"dtype\" appears twice"), "{r}");
    // Other fields are ignored, repeated or not, as safetensors ignores them.
    let extra = file(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1,"x":2}}"#,
        1,
    );
    assert!(Header::parse(&extra, extra.len() as u64).is_ok());
    // Non-object entries still say so.
    assert!(t(r#"{"a":[1,2]}"#, 0)
        .1
        .contains("entry must be a JSON object"));
    assert!(t(r#"{"a":7}"#, 0).1.contains("entry must be a JSON object"));
    assert!(t(r#"{"__metadata__":{"k":1}}"#, 0)
        .1
        .contains("not a string"));
    assert!(t(r#"{"__metadata__":[]}"#, 0).1.contains("JSON object"));
    let (_, r) = t(
        r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}"#,
        1,
    );
    assert!(r.contains("whole bytes"), "{r}");
    // 2^61 elements fit in 64 bits, their bits do not: said so, not "whole bytes".
    let (_, r) = t(
        r#"{"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}}"#,
        0,
    );
    assert!(r.contains("more bits than fit in 64 bits"), "{r}");
    let (_, r) = t(
        r#"{"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]}}"#,
        1,
    );
    assert!(r.contains("64 bits"), "{r}");
}

#[test]
fn written_headers_parse_back_and_sort_like_safetensors() {
    let specs = vec![
        TensorSpec {
            name: "z".into(),
            dtype: Dtype::U8,
            shape: vec![3],
        },
        TensorSpec {
            name: "a".into(),
            dtype: Dtype::F32,
            shape: vec![2, 2],
        },
        TensorSpec {
            name: "b".into(),
            dtype: Dtype::F32,
            shape: vec![],
        },
    ];
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let (bytes, places) = header_bytes(&specs, Some(&meta)).unwrap();
    assert_eq!((bytes.len() - 8) % 8, 0);
    let names: Vec<&str> = places.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "z"]);
    let json = std::str::from_utf8(&bytes[8..]).unwrap();
    assert!(json.starts_with(
        r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}"#
    ));
    let mut f = bytes.clone();
    f.resize(bytes.len() + 23, 0);
    let h = Header::parse(&f, f.len() as u64).unwrap();
    assert_eq!(h.metadata, Some(meta));
    assert_eq!(h.tensors.len(), 3);
    assert!(header_bytes(&[specs[0].clone(), specs[0].clone()], None).is_err());
}

fn any_dtype() -> impl Strategy<Value = Dtype> {
    (0..Dtype::ALL.len()).prop_map(|i| Dtype::ALL[i])
}

proptest! {
    #[test]
    fn write_then_parse_gives_the_same_entries(
        entries in proptest::collection::btree_map(
            "[a-zA-Z0-9._\u{e9}\"\\\\]{1,12}",
            (any_dtype(), proptest::collection::vec(0u64..5, 0..4)),
            0..8,
        ),
        meta in proptest::option::of(proptest::collection::btree_map("[a-z]{1,4}", ".{0,8}", 0..3)),
    ) {
        let specs: Vec<TensorSpec> = entries
            .into_iter()
            .filter(|(n, _)| n != "__metadata__")
            .map(|(name, (dtype, mut shape))| {
                // Packed dtypes need whole bytes: give them an even multiple of 4 elements.
                if dtype.bits() < 8 { shape.push(4); }
                TensorSpec { name, dtype, shape }
            })
            .collect();
        let (bytes, places) = header_bytes(&specs, meta.as_ref()).unwrap();
        let data_len = places.last().map_or(0, |p| p.end);
        let mut f = bytes.clone();
        f.resize(bytes.len() + data_len as usize, 0);
        let h = Header::parse(&f, f.len() as u64).unwrap();
        prop_assert_eq!(&h.metadata, &meta);
        for p in &places {
            let t = h.tensors.iter().find(|t| t.name == p.name).unwrap();
            let s = specs.iter().find(|s| s.name == p.name).unwrap();
            prop_assert_eq!((t.begin, t.end, t.dtype, &t.shape), (p.begin, p.end, s.dtype, &s.shape));
        }
        prop_assert_eq!(h.tensors.len(), specs.len());
    }

    #[test]
    fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), extra in 0u64..1000) {
        let _ = Header::parse(&bytes, bytes.len() as u64 + extra);
        let _ = Header::parse(&bytes, bytes.len() as u64);
    }

    #[test]
    fn json_like_headers_never_panic(json in r#"\{("[a-c_]{1,3}":\{("dtype":"[A-Z0-9_]{1,4}"|"shape":\[[0-9,]{0,6}\]|"data_offsets":\[[0-9,]{0,6}\]|,){0,5}\}|,){0,4}\}"#, data in 0usize..64) {
        let f = file(&json, data);
        let _ = Header::parse(&f, f.len() as u64);
    }
}
