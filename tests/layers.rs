//! src/ is cut by concern, and dependencies run one way: a module may use
//! the modules below it in LAYERS (and its own folder), never those above.
//! Test code (`#[cfg(test)] mod tests`) may read templates of any layer.

use std::path::Path;

/// Top to bottom; modules on one line do not use each other.
const LAYERS: &[&[&str]] = &[
    &["command_tracer"],
    &["stages", "freeze", "states", "submit"],
    &["start"],
    &["bpf"],
    &["iscsi"],
    &["kernel"],
    &["cli"],
    &["error"],
];

fn layer(m: &str) -> usize {
    LAYERS.iter().position(|l| l.contains(&m)).unwrap_or_else(|| panic!("module {m} is in no layer of tests/layers.rs"))
}

/// The code of a file before its `#[cfg(test)]` module.
fn non_test(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests").map_or(text, |i| &text[..i])
}

fn visit(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            visit(&p, files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
}

#[test]
fn imports_run_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    visit(&src, &mut files);
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let own = rel.components().next().unwrap().as_os_str().to_str().unwrap().trim_end_matches(".rs");
        if own == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in non_test(&text).lines().enumerate() {
            for (i, _) in line.match_indices("crate::") {
                let used: String =
                    line[i + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if used.is_empty() || used == own || matches!(used.as_str(), "Error" | "Result") {
                    continue;
                }
                if layer(&used) <= layer(own) {
                    wrong.push(format!("{}:{}: {own} uses {used}: {}", rel.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "imports that run up or sideways:\n{}", wrong.join("\n"));
}

#[test]
fn every_module_is_in_a_layer() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let mods: Vec<&str> =
        lib.lines().filter_map(|l| l.strip_prefix("pub mod ")).map(|m| m.trim_end_matches(';')).collect();
    assert!(mods.len() >= 10, "{mods:?}");
    for m in mods {
        layer(m);
    }
}
