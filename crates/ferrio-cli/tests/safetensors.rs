//! `ferrio safetensors inspect`: the table, `--json`, and exit status 2 naming the rule.

use std::process::Command;

fn inspect(path: &std::path::Path, json: bool) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrio"));
    c.args(["safetensors", "inspect"]).arg(path);
    if json {
        c.arg("--json");
    }
    c.output().expect("run ferrio")
}

fn file(json: &str, data: usize) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.resize(v.len() + data, 7);
    v
}

#[test]
fn inspect_lists_tensors_and_refuses_invalid_files() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let good = dir.path().join("good.safetensors");
    let header = r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}"#;
    std::fs::write(&good, file(header, 16)).expect("write");
    let o = inspect(&good, false);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(text.contains("BF16") && text.contains("[2, 3]") && text.contains("valid: 2 tensors"));
    let o = inspect(&good, true);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["valid"], true);
    assert_eq!(v["tensors"][1]["name"], "b");
    assert_eq!(v["tensors"][1]["offset"], 8 + header.len() as u64 + 12);
    assert_eq!(v["metadata"]["format"], "pt");

    let bad = dir.path().join("bad.safetensors");
    std::fs::write(&bad, file(header, 15)).expect("write");
    let o = inspect(&bad, false);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("tensor \"b\"") && err.contains("holds 15 bytes"),
        "{err}"
    );
    let o = inspect(&bad, true);
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["valid"], false);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
}

#[test]
fn names_and_metadata_cannot_break_the_table_or_drive_the_terminal() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let p = dir.path().join("odd.safetensors");
    let header = r#"{"__metadata__":{"note":"x\ny"},"a\nb\u001b[31m":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    std::fs::write(&p, file(header, 8)).expect("write");
    let o = inspect(&p, false);
    assert!(o.status.success(), "{o:?}");
    assert!(
        !o.stdout.contains(&0x1b),
        "an escape sequence reached stdout"
    );
    let text = String::from_utf8_lossy(&o.stdout);
    // The column titles, one tensor, one metadata line, the summary.
    assert_eq!(text.lines().count(), 4, "{text}");
    assert!(text.contains(r"a\nb\u{1b}[31m"), "{text}");
    assert!(text.contains(r"metadata note = x\ny"), "{text}");
    // JSON carries the names as they are.
    let v: serde_json::Value = serde_json::from_slice(&inspect(&p, true).stdout).expect("json");
    assert_eq!(v["tensors"][0]["name"], "a\nb\u{1b}[31m");
}

#[test]
fn a_name_longer_than_any_column_prints_whole() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let p = dir.path().join("long.safetensors");
    // Past what a format width can hold (65,535), and short names beside it.
    let long = "x".repeat(70_000);
    let header = format!(
        r#"{{"{long}":{{"dtype":"U8","shape":[1],"data_offsets":[0,1]}},"b":{{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}}}"#
    );
    std::fs::write(&p, file(&header, 2)).expect("write");
    let o = inspect(&p, false);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        text.lines().any(|l| l.starts_with(&long)),
        "the long name is cut"
    );
    // The short name's row pads to the column's cap, not to the long name.
    let b = text.lines().find(|l| l.starts_with("b ")).expect("row b");
    assert!(b.len() < 200, "{b}");
    assert!(text.contains("valid: 2 tensors"), "{text}");
}
