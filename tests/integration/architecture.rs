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
//!
//! Inside a room, the files import each other without cycles too
//! (`the_files_of_a_room_import_each_other_without_cycles`). A file imports
//! the file of the module a path it writes names: `crate::room::a::b::Item`,
//! `super::b::Item` and `self::…` (groups expanded) lead to the file of the
//! longest module prefix, `room/a/b.rs` or `room/a/b/mod.rs`, as written (a
//! name a parent re-exports is the parent's). A file's paths into its own
//! module's files are not counted: a `mod.rs` (or `a.rs` beside `a/`)
//! declares its files, re-exports them and is built from them, the normal
//! Rust pattern. A file's paths to its parents' modules are counted, so
//! no chain of imports leaves a module's files and comes back into them
//! except through that module's own file. Test modules (`#[cfg(test)]`)
//! are not read. Cycles are found as strongly connected components
//! (Tarjan); a cycle allowed for now is listed below with its reason.

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
    let mut graph: BTreeMap<String, Vec<Import>> = BTreeMap::new();
    for (path, name, source) in library_files(src) {
        let top = path[0].clone();
        let code = code_only(&source);
        for (to, line) in references(&code, &path) {
            if to != top && !to.is_empty() && to != "self" {
                graph.entry(top.clone()).or_default().push(Import {
                    to,
                    file: name.clone(),
                    line,
                });
            }
        }
        graph.entry(top).or_default();
    }
    graph
}

/// Each file of the library below `src` with its module path (`["registry",
/// "slot"]`; a `mod.rs` is its folder's module), its name (`src/…`) and its
/// text. Binaries stand above the library, and the crate root is no room:
/// neither is listed.
fn library_files(src: &Path) -> Vec<(Vec<String>, String, String)> {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    let mut files = Vec::new();
    for file in paths {
        let relative = file.strip_prefix(src).unwrap();
        let mut module: Vec<String> = relative
            .iter()
            .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_owned())
            .collect();
        if module[0] == "bin" || module == ["lib"] || module == ["main"] {
            continue;
        }
        if module.last().is_some_and(|last| last == "mod") {
            module.pop();
        }
        let name = format!("src/{}", relative.display());
        files.push((module, name, std::fs::read_to_string(&file).unwrap()));
    }
    files
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

/// The cycles between the files of a room allowed for now: the files of
/// each and why. A cycle found must lie within one entry, and each entry
/// must still hold one.
const ALLOWED_FILE_CYCLES: &[(&[&str], &str)] = &[(
    &[
        "src/config/admin.rs",
        "src/config/approvals.rs",
        "src/config/audit.rs",
        "src/config/callers.rs",
        "src/config/fields.rs",
        "src/config/guards.rs",
        "src/config/input.rs",
        "src/config/listener_tls.rs",
        "src/config/policy.rs",
        "src/config/raw.rs",
        "src/config/sources.rs",
        "src/config/tls.rs",
    ],
    "the raw serde tree (raw.rs) names each section's raw type, which the \
     section's file defines beside its validation, and the sections come \
     back to raw.rs through the field checks (fields.rs reads \
     raw::RawValue, fields.rs and sources.rs use each other); not in issue \
     40's scope: the raw types go below the sections' validation",
)];

/// The source text with its `#[cfg(test)]` modules blanked (lines kept),
/// and the names of the child modules declared only for tests
/// (`#[cfg(test)] mod testing;`).
fn without_test_modules(code: &str) -> (String, Vec<String>) {
    let mut out = code.to_owned();
    let mut test_files = Vec::new();
    let mut from = 0;
    while let Some(found) = out[from..].find("#[cfg(test)]") {
        let start = from + found;
        let mut at = start + "#[cfg(test)]".len();
        let rest = &out[at..];
        let trimmed = rest.trim_start();
        at += rest.len() - trimmed.len();
        let mut item = trimmed;
        if let Some(visible) = item.strip_prefix("pub") {
            let skipped = visible.find(' ').map_or(0, |space| space + 1);
            at += 3 + skipped;
            item = &out[at..];
        }
        let Some(declared) = item.strip_prefix("mod ") else {
            from = at;
            continue;
        };
        let name = identifier_at(declared, 0);
        let after = at + "mod ".len() + name.len();
        let next = out[after..].trim_start();
        if next.starts_with(';') {
            test_files.push(name);
            from = after;
            continue;
        }
        if !next.starts_with('{') {
            from = after;
            continue;
        }
        let open = after + (out[after..].len() - next.len());
        let mut depth = 0;
        let mut end = out.len();
        for (offset, c) in out[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + offset + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        let blanked: String = out[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..end, &blanked);
        from = start + blanked.len();
    }
    (out, test_files)
}

/// The paths of the use tree or path written at `at` (just after `crate::`
/// or a `super::` chain), each as its segments: `a::{b, c::{d, e}}` gives
/// `a::b`, `a::c::d` and `a::c::e`; `a::B::new` gives `a::B::new`.
fn tree_paths(code: &str, at: usize) -> Vec<Vec<String>> {
    fn skip(code: &str, mut at: usize, also: u8) -> usize {
        let bytes = code.as_bytes();
        while at < bytes.len() && (bytes[at].is_ascii_whitespace() || bytes[at] == also) {
            at += 1;
        }
        at
    }
    fn tree(code: &str, mut at: usize, mut segments: Vec<String>) -> (Vec<Vec<String>>, usize) {
        loop {
            at = skip(code, at, b' ');
            if code[at..].starts_with('{') {
                at += 1;
                let mut paths = Vec::new();
                loop {
                    at = skip(code, at, b',');
                    if at >= code.len() || code[at..].starts_with('}') {
                        return (paths, at + 1);
                    }
                    let (found, next) = tree(code, at, segments.clone());
                    paths.extend(found);
                    at = if next > at { next } else { at + 1 };
                }
            }
            let name = identifier_at(code, at);
            if name.is_empty() {
                return (vec![segments], at);
            }
            at += name.len();
            segments.push(name);
            let next = skip(code, at, b' ');
            if !code[next..].starts_with("::") {
                return (vec![segments], at);
            }
            at = next + 2;
        }
    }
    tree(code, at, Vec::new()).0
}

/// The items `code` (of the file of module `module`, e.g. `["registry",
/// "slot"]`) names through `crate::` and `super::` paths, each as its path
/// from the crate root, with its line.
fn item_paths(code: &str, module: &[String]) -> Vec<(Vec<String>, usize)> {
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
        if boundary(at) {
            for path in tree_paths(code, at + "crate::".len()) {
                found.push((path, line_of(at)));
            }
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
        let Some(kept) = module.len().checked_sub(climbs) else {
            continue;
        };
        for path in tree_paths(code, next) {
            let mut absolute = module[..kept].to_vec();
            absolute.extend(path);
            found.push((absolute, line_of(at)));
        }
    }
    found
}

/// One import between two files of a room.
#[derive(Debug, Clone)]
struct FileImport {
    from: String,
    to: String,
    line: usize,
}

/// The imports between the files of each room, as the module docs above
/// count them, and every file read.
fn file_imports(src: &Path) -> (BTreeSet<String>, Vec<FileImport>) {
    let sources = library_files(src);
    // Module path → file (`src/…`).
    let modules: BTreeMap<Vec<String>, String> = sources
        .iter()
        .map(|(module, name, _)| (module.clone(), name.clone()))
        .collect();
    let mut test_only = BTreeSet::new();
    let mut read = Vec::new();
    for (module, name, source) in sources {
        let (code, test_files) = without_test_modules(&code_only(&source));
        for child in test_files {
            let mut path = module.clone();
            path.push(child);
            test_only.insert(path);
        }
        read.push((module, name, code));
    }
    let mut files = BTreeSet::new();
    let mut imports = Vec::new();
    for (module, name, code) in read {
        if test_only.iter().any(|t| module.starts_with(t)) {
            continue;
        }
        files.insert(name.clone());
        for (path, line) in item_paths(&code, &module) {
            let Some(target) = (1..=path.len())
                .rev()
                .map(|length| &path[..length])
                .find(|prefix| modules.contains_key(*prefix))
            else {
                continue;
            };
            // Another room (the layering's business), the file itself, or
            // a file of its own module's.
            if target[0] != module[0] || target.starts_with(&module) {
                continue;
            }
            imports.push(FileImport {
                from: name.clone(),
                to: modules[target].clone(),
                line,
            });
        }
    }
    (files, imports)
}

/// The strongly connected components of more than one node (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a str) {
            let index = self.index.len();
            self.index.insert(node, index);
            self.low.insert(node, index);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.edges.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = BTreeSet::new();
                loop {
                    let member = self.stack.pop().unwrap();
                    self.on_stack.remove(member);
                    component.insert(member.to_owned());
                    if member == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found
}

/// The cycles between files `imports` make, each with the imports that
/// close it (`file:line → file`).
fn file_cycles(imports: &[FileImport]) -> Vec<(BTreeSet<String>, Vec<String>)> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for import in imports {
        edges
            .entry(import.from.clone())
            .or_default()
            .insert(import.to.clone());
    }
    cycles(&edges)
        .into_iter()
        .map(|component| {
            let mut within: Vec<String> = imports
                .iter()
                .filter(|i| component.contains(&i.from) && component.contains(&i.to))
                .map(|i| format!("{}:{} → {}", i.from, i.line, i.to))
                .collect();
            within.dedup();
            (component, within)
        })
        .collect()
}

#[test]
fn the_files_of_a_room_import_each_other_without_cycles() {
    let root = repo_root();
    let (files, imports) = file_imports(&root.join("src"));
    let allowed: Vec<(BTreeSet<String>, &str)> = ALLOWED_FILE_CYCLES
        .iter()
        .copied()
        .map(|(files, why)| (files.iter().map(|f| (*f).to_owned()).collect(), why))
        .collect();
    for (entry, why) in &allowed {
        assert!(!why.is_empty(), "an allowed cycle without a reason");
        for file in entry {
            assert!(
                files.contains(file),
                "an allowed cycle names `{file}`, which is not a file of src/ any more: update the list"
            );
        }
    }
    let found = file_cycles(&imports);
    let mut problems = Vec::new();
    for (component, within) in &found {
        let names: Vec<&str> = component.iter().map(String::as_str).collect();
        match allowed.iter().find(|(entry, _)| component.is_subset(entry)) {
            Some((_, why)) => println!("allowed file cycle ({why}): {}", names.join(", ")),
            None => problems.push(format!(
                "files of a room import each other in a cycle: {}\n  {}",
                names.join(", "),
                within.join("\n  ")
            )),
        }
    }
    for (entry, _) in &allowed {
        if !found
            .iter()
            .any(|(component, _)| component.is_subset(entry))
        {
            problems.push(format!(
                "an allowed cycle is no longer one: remove it from the list ({})",
                entry
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_cycle_between_the_files_of_a_room_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    // The normal pattern: a mod.rs declares, re-exports and uses its files,
    // which use its items: no cycle.
    write(
        "room/mod.rs",
        "mod a;\nmod b;\npub use a::A;\nuse b::B;\npub struct Root(B);\n",
    );
    write("room/a.rs", "use super::Root;\npub struct A;\n");
    write(
        "room/b.rs",
        "use super::{a::A, Root};\npub struct B(A);\n#[cfg(test)]\nmod tests {\n    use crate::room::c::C;\n}\n",
    );
    write("room/c.rs", "use crate::room::b::B;\npub struct C;\n");
    // Another room's files are the layering's business.
    write("other/mod.rs", "use crate::room::c::C;\n");
    let (files, imports) = file_imports(dir.path());
    assert_eq!(files.len(), 5);
    assert!(file_cycles(&imports).is_empty(), "{imports:?}");
    // a.rs and c.rs each through the other's sibling: a → c → b → a.
    write(
        "room/a.rs",
        "use super::Root;\npub struct A;\nfn f() -> crate::room::c::C { todo!() }\n",
    );
    write("room/b.rs", "use super::{a::A, Root};\npub struct B(A);\n");
    let (_, imports) = file_imports(dir.path());
    let found = file_cycles(&imports);
    assert_eq!(found.len(), 1, "{found:?}");
    let (component, within) = &found[0];
    let names: Vec<&str> = component.iter().map(String::as_str).collect();
    assert_eq!(names, ["src/room/a.rs", "src/room/b.rs", "src/room/c.rs"]);
    assert!(
        within.contains(&"src/room/a.rs:3 → src/room/c.rs".to_owned()),
        "{within:?}"
    );
    // A nested module's file that comes back to its parent's sibling
    // through the parent: d/e.rs → d/mod.rs → c.rs → d/e.rs.
    write("room/a.rs", "use super::Root;\npub struct A;\n");
    write("room/d/mod.rs", "mod e;\nuse super::c::C;\n");
    write("room/d/e.rs", "use super::X;\n");
    write("room/c.rs", "use crate::room::d::e::E;\npub struct C;\n");
    let (_, imports) = file_imports(dir.path());
    let found = file_cycles(&imports);
    assert_eq!(found.len(), 1, "{found:?}");
    let names: Vec<&str> = found[0].0.iter().map(String::as_str).collect();
    assert_eq!(
        names,
        ["src/room/c.rs", "src/room/d/e.rs", "src/room/d/mod.rs"]
    );
}

#[test]
fn the_path_reader_expands_groups_and_climbs() {
    let code = code_only(
        "use super::{slot::{Slot, SlotState}, Spawner};\n\
         use crate::registry::limits::Concurrency;\n\
         let x = super::super::catalog::Catalog::default();\n\
         // use crate::grpc::Gateway;\n",
    );
    let module = vec![
        "registry".to_owned(),
        "tenant".to_owned(),
        "catalog".to_owned(),
    ];
    let found: Vec<String> = item_paths(&code, &module)
        .into_iter()
        .map(|(path, line)| format!("{}@{line}", path.join("::")))
        .collect();
    assert_eq!(
        found,
        [
            "registry::limits::Concurrency@2",
            "registry::tenant::slot::Slot@1",
            "registry::tenant::slot::SlotState@1",
            "registry::tenant::Spawner@1",
            "registry::catalog::Catalog::default@3",
        ]
    );
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
