//! The README's settings table against [`ferrio::config::SETTINGS`]: same settings, same order,
//! same variables and defaults. Users read the README; the table is what the code does.

use ferrio::config::SETTINGS;

/// `(name, variable, default)` of each row of the table under `## Settings`, backticks removed.
fn readme_rows(readme: &str) -> Vec<(String, String, String)> {
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Settings\n"))
        .unwrap_or_else(|| panic!("README.md has no `## Settings` section"));
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in section.lines() {
        if !line.starts_with('|') {
            if in_table {
                break; // the first table only: the `ferrio cp` options follow
            }
            continue;
        }
        in_table = true;
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // Header and separator rows have no backticked setting name.
        if cells.len() < 5 || !cells[1].starts_with('`') {
            continue;
        }
        let plain = |c: &str| c.trim_matches('`').to_string();
        rows.push((plain(cells[1]), plain(cells[2]), plain(cells[3])));
    }
    rows
}

/// How the README writes a default: an empty list is "empty".
fn shown(default: &str) -> &str {
    if default.is_empty() {
        "empty"
    } else {
        default
    }
}

#[test]
fn readme_settings_table_matches_the_settings() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let readme = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let rows = readme_rows(&readme);
    let expected: Vec<(String, String, String)> = SETTINGS
        .iter()
        .map(|i| (i.name.into(), i.env.into(), shown(i.default).into()))
        .collect();
    let mut problems = Vec::new();
    for e in &expected {
        match rows.iter().find(|r| r.0 == e.0) {
            None => problems.push(format!("missing row for `{}`", e.0)),
            Some(r) if r != e => problems.push(format!(
                "row `{}`: README says variable `{}`, default `{}`; the code says `{}`, `{}`",
                e.0, r.1, r.2, e.1, e.2
            )),
            Some(_) => {}
        }
    }
    for r in &rows {
        if !expected.iter().any(|e| e.0 == r.0) {
            problems.push(format!("row `{}` is not a setting", r.0));
        }
    }
    if problems.is_empty() {
        let names = |v: &[(String, String, String)]| v.iter().map(|r| r.0.clone()).collect();
        let (got, want): (Vec<String>, Vec<String>) = (names(&rows), names(&expected));
        assert_eq!(got, want, "README rows are not in the order of SETTINGS");
    }
    assert!(
        problems.is_empty(),
        "README.md's settings table disagrees with ferrio::config::SETTINGS:\n  {}",
        problems.join("\n  ")
    );
}
