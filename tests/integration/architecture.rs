//! The layering of `src/` held to docs/architecture.md: every top-level
//! module is in exactly one layer of the page's "Layers" list, imports go
//! only to its own layer or lower ones, and no two modules import each
//! other through any chain. A failure names both modules and the line that
//! imports upward.
//!
//! `cargo test --test integration architecture -- --nocapture` prints the
//! graph: each module, its layer and the modules it imports.
//!
//! Imports are read from the source text: every `crate::` path (in `use`
//! lines, `use crate::{a, b::c}` groups and paths written inline) and every
//! `super::` chain that climbs out of a top-level module, outside comments
//! and string literals.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::repo_root;

/// One import of another top-level module: where it is written.
#[derive(Debug, Clone)]
struct Import {
    to: String,
    file: String,
    line: usize,
}

/// The layers as docs/architecture.md lists them, bottom first: each
/// line `N. name: `a`, `b` — what they are` under `## Layers`.
fn documented_layers(page: &str) -> Vec<(usize, Vec<String>)> {
    let mut layers = Vec::new();
    let mut inside = false;
    for line in page.lines() {
        if line.starts_with("## ") {
            inside = line.trim() == "## Layers";
            continue;
        }
        if !inside {
            continue;
        }
        let Some((number, rest)) = line.split_once(". ") else {
            continue;
        };
        let Ok(number) = number.trim().parse::<usize>() else {
            continue;
        };
        let Some((_, modules)) = rest.split_once(": ") else {
            continue;
        };
        let modules = modules.split(" — ").next().unwrap_or_default();
        let names: Vec<String> = modules
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        layers.push((number, names));
    }
    layers
}

/// The source text with comments, string and character literals blanked
/// (newlines kept, so line numbers stay right).
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let closing: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body_start = j + 1;
            let rest: String = chars[body_start..].iter().collect();
            let end = rest.find(&closing).map_or(chars.len(), |at| {
                body_start + rest[..at].chars().count() + closing.len()
            });
            for &skipped in &chars[i..end] {
                out.push(blank(skipped));
            }
            i = end;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && (chars.get(i + 2) == Some(&'\'') || (next == Some('\\'))) {
            // A character literal ('x', '\n', '\''), not a lifetime.
            out.push(' ');
            i += 1;
            if chars.get(i) == Some(&'\\') {
                out.push(' ');
                i += 1;
            }
            while i < chars.len() && chars[i] != '\'' {
                out.push(blank(chars[i]));
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The first segments of the paths in a `{...}` group starting at `at`
/// (just after the `{`): `{a, b::c, d::{e, f}}` gives a, b, d.
fn group_heads(code: &str, at: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 1;
    let mut expecting = true;
    let mut current = String::new();
    for c in code[at..].chars() {
        match c {
            '{' => {
                depth += 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                expecting = true;
                continue;
            }
            _ => {}
        }
        if depth != 1 {
            continue;
        }
        if expecting {
            if c.is_alphanumeric() || c == '_' {
                current.push(c);
            } else if !current.is_empty() {
                heads.push(std::mem::take(&mut current));
                expecting = false;
            }
        }
    }
    if !current.is_empty() {
        heads.push(current);
    }
    heads
}

fn identifier_at(code: &str, at: usize) -> String {
    code[at..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The top-level modules `code` (of a file whose module path is `path`,
/// e.g. `["grpc", "call"]`) refers to, with their line.
fn references(code: &str, path: &[String]) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let bytes = code.as_bytes();
    let boundary = |at: usize| {
        at == 0 || {
            let p = bytes[at - 1] as char;
            !(p.is_alphanumeric() || p == '_' || p == ':' || p == '$')
        }
    };
    for (at, _) in code.match_indices("crate::") {
        if !boundary(at) {
            continue;
        }
        let after = at + "crate::".len();
        if code[after..].starts_with('{') {
            for head in group_heads(code, after + 1) {
                found.push((head, line_of(at)));
            }
        } else {
            found.push((identifier_at(code, after), line_of(at)));
        }
    }
    for (at, _) in code.match_indices("super::") {
        if !boundary(at) {
            continue;
        }
        let mut climbs = 1;
        let mut next = at + "super::".len();
        while code[next..].starts_with("super::") {
            climbs += 1;
            next += "super::".len();
        }
        if climbs < path.len() {
            continue;
        }
        // Climbed to the crate root: the next segment is a top module.
        if code[next..].starts_with('{') {
            for head in group_heads(code, next + 1) {
                found.push((head, line_of(at)));
            }
        } else {
            found.push((identifier_at(code, next), line_of(at)));
        }
    }
    found
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// Every import from one top-level module to another, by importing module.
fn imports(src: &Path) -> BTreeMap<String, Vec<Import>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, Vec<Import>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let mut path: Vec<String> = relative
            .iter()
            .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_owned())
            .collect();
        // Binaries stand above the library; the crate root is no room.
        if path[0] == "bin" || path == ["lib"] || path == ["main"] {
            continue;
        }
        if path.last().is_some_and(|last| last == "mod") {
            path.pop();
        }
        let top = path[0].clone();
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        for (to, line) in references(&code, &path) {
            if to != top && !to.is_empty() && to != "self" {
                graph.entry(top.clone()).or_default().push(Import {
                    to,
                    file: format!("src/{}", relative.display()),
                    line,
                });
            }
        }
        graph.entry(top).or_default();
    }
    graph
}

/// The top-level modules `lib.rs` declares (and `pb`, which it defines).
fn declared_modules(lib: &str) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for line in code_only(lib).lines() {
        // Only the crate's own top-level modules: not those nested in
        // `pb` (`pb::admin`, `pb::guard::server`).
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let line = line.trim();
        let line = line.strip_prefix("pub ").unwrap_or(line);
        if let Some(rest) = line.strip_prefix("mod ") {
            let name = identifier_at(rest, 0);
            if !name.is_empty() {
                modules.insert(name);
            }
        }
    }
    modules
}

/// A cycle through the graph, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_owned(), 1);
        stack.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|n| n == next).unwrap();
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(cycle) = visit(next, edges, state, stack) {
                        return Some(cycle);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        if state.get(node.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(cycle) = visit(node, edges, &mut state, &mut stack) {
                return Some(cycle);
            }
        }
    }
    None
}

#[test]
fn imports_go_one_way_as_the_architecture_page_lists_the_layers() {
    let root = repo_root();
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let layers = documented_layers(&page);
    assert!(
        layers.len() >= 5,
        "docs/architecture.md: the `## Layers` list (lines `N. name: `module`, ...`) has {} layers",
        layers.len()
    );
    let mut layer_of = BTreeMap::new();
    for (number, modules) in &layers {
        for module in modules {
            if let Some(earlier) = layer_of.insert(module.clone(), *number) {
                panic!("docs/architecture.md lists `{module}` in layers {earlier} and {number}");
            }
        }
    }
    let declared = declared_modules(&std::fs::read_to_string(root.join("src/lib.rs")).unwrap());
    let listed: BTreeSet<String> = layer_of.keys().cloned().collect();
    assert_eq!(
        declared, listed,
        "the modules src/lib.rs declares and those docs/architecture.md's layers list differ"
    );

    let graph = imports(&root.join("src"));
    let mut upward = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, found) in &graph {
        let Some(&from_layer) = layer_of.get(from) else {
            upward.push(format!("`{from}` is in no layer of docs/architecture.md"));
            continue;
        };
        for import in found {
            // Paths to items of the crate root that are not modules
            // (none today) are not rooms.
            let Some(&to_layer) = layer_of.get(&import.to) else {
                continue;
            };
            edges
                .entry(from.clone())
                .or_default()
                .insert(import.to.clone());
            if to_layer > from_layer {
                upward.push(format!(
                    "{}:{}: `{from}` (layer {from_layer}) imports `{}` (layer {to_layer}), a layer above it",
                    import.file, import.line, import.to
                ));
            }
        }
    }
    // The module graph, for `cargo test --test integration architecture --
    // --nocapture`: each module, its layer and the modules it imports.
    for (from, to) in &edges {
        let to: Vec<&str> = to.iter().map(String::as_str).collect();
        println!("{from} ({}) -> {}", layer_of[from], to.join(" "));
    }
    assert!(
        upward.is_empty(),
        "imports against the layering:\n{}",
        upward.join("\n")
    );
    if let Some(cycle) = find_cycle(&edges) {
        panic!(
            "top-level modules import each other in a cycle: {}",
            cycle.join(" → ")
        );
    }
}

#[test]
fn the_import_reader_sees_every_form_of_path() {
    let code = code_only(
        "use crate::config::Config;\n\
         use crate::{registry::Registry, state};\n\
         // use crate::grpc::Gateway;\n\
         let s = \"crate::app::run\";\n\
         let c = '\"'; fn f<'a>(x: &'a crate::audit::Audit) {}\n\
         let p = super::super::upstream::Session::new();\n\
         let r = r#\"crate::cli\"#; /* crate::consent */\n",
    );
    let path = vec!["grpc".to_owned(), "call".to_owned()];
    let found: Vec<(String, usize)> = references(&code, &path);
    let names: Vec<&str> = found.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["config", "registry", "state", "audit", "upstream"]);
    assert_eq!(found[3].1, 5, "the line of the inline path");
    // One `super::` from src/grpc/call.rs stays inside `grpc`.
    let inside = references(&code_only("use super::status;"), &path);
    assert!(inside.is_empty(), "{inside:?}");
}

#[test]
fn an_upward_import_and_a_cycle_are_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/mod.rs"),
        "use crate::registry::Registry;\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("registry.rs"),
        "use crate::config::Config;\n",
    )
    .unwrap();
    let graph = imports(dir.path());
    let config = &graph["config"];
    assert_eq!(config.len(), 1);
    assert_eq!(config[0].to, "registry");
    assert_eq!(config[0].file, "src/config/mod.rs");
    let edges: BTreeMap<String, BTreeSet<String>> = graph
        .iter()
        .map(|(from, found)| (from.clone(), found.iter().map(|i| i.to.clone()).collect()))
        .collect();
    let cycle = find_cycle(&edges).expect("config and registry import each other");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 3);
}
