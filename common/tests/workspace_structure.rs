//! The workspace's shape, checked on every run so it stays the shape DESIGN.md and README describe:
//! - no two source files of a crate import each other in a circle (a module may use its own parent or
//!   children: that is one module split over files, not a circle);
//! - no Slurm command under `cli/src/commands/` imports another command: what they share lives below them
//!   (`cli/src/slurm/`, `cli/src/command.rs`, `cli/src/format.rs`);
//! - the wall clock is read by one `now_ms` (`drover_common::wall`); the controllers' simulation-aware clock
//!   wraps it.
//!
//! It lives in the leaf crate because every crate's build reaches it; it reads the sources as text (`use` lines
//! and `crate::`/`super::` paths), which is all these rules need.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace holds common/").to_path_buf()
}

/// The crates of the workspace: folders with a Cargo.toml and a src/.
fn crates() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(workspace())
        .expect("the workspace is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
        .collect();
    out.sort();
    assert!(out.len() >= 10, "found only {out:?}");
    out
}

/// Every non-test source file of the workspace's crates (their `src/`).
fn source_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for krate in crates() {
        rust_files(&krate.join("src"), &mut files);
    }
    files
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).expect("readable").filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The library's (or, without one, the binary's) modules: module path -> file. `src/bin/` holds other crates.
fn modules(krate: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let src = krate.join("src");
    let root = if src.join("lib.rs").is_file() { "lib.rs" } else { "main.rs" };
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().to_string()).collect();
        if parts[0] == "bin"
            || (parts.len() == 1 && (parts[0] == "lib.rs" || parts[0] == "main.rs") && parts[0] != root)
        {
            continue;
        }
        let mut path: Vec<String> = parts.iter().map(|p| p.trim_end_matches(".rs").to_string()).collect();
        if path.last().is_some_and(|l| l == "mod") || (path.len() == 1 && path[0] == root.trim_end_matches(".rs")) {
            path.pop();
        }
        out.insert(path, f);
    }
    out
}

/// A file's code without its unit tests (they may use anything) and without comments (a doc link is no import).
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).expect("readable source");
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        // A `//` outside a string literal starts a comment (an even number of quotes before it).
        let cut = line.match_indices("//").map(|(i, _)| i).find(|&i| line[..i].matches('"').count() % 2 == 0);
        out.push_str(&line[..cut.unwrap_or(line.len())]);
        out.push('\n');
    }
    out
}

/// The module paths a file names: `crate::a::b...` and `super::...` (resolved from `me`), before the item.
fn references(code: &str, me: &[String], is_mod_file: bool) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut segments_after = |start: usize, mut base: Vec<String>| {
        let mut rest = &code[start..];
        loop {
            let name = ident(rest);
            if name.is_empty() {
                break;
            }
            base.push(name.clone());
            rest = &rest[name.len()..];
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => break,
            }
        }
        out.push(base);
    };
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `drover_crate::`, `$crate::`
        }
        segments_after(at + "crate::".len(), Vec::new());
    }
    for (at, _) in code.match_indices("super::") {
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // counted from the first `super::` of a chain
        }
        // A `mod.rs` or `x.rs` file is module `me`; `super` is its parent.
        let _ = is_mod_file;
        let mut base = me.to_vec();
        let mut pos = at;
        while code[pos..].starts_with("super::") {
            base.pop();
            pos += "super::".len();
        }
        segments_after(pos, base);
    }
    out
}

/// The deepest module of `mods` that `path` names.
fn resolve(mods: &BTreeMap<Vec<String>, PathBuf>, path: &[String]) -> Vec<String> {
    (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| mods.contains_key(p)).unwrap_or_default()
}

fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Each crate's file-to-file imports (between modules that are not one another's ancestors).
fn import_graph(krate: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mods = modules(krate);
    let mut graph = BTreeMap::new();
    for (me, file) in &mods {
        let is_mod = file.file_name().is_some_and(|n| n == "mod.rs");
        let mut to = BTreeSet::new();
        for r in references(&code_of(file), me, is_mod) {
            let target = resolve(&mods, &r);
            if !related(me, &target) {
                to.insert(target);
            }
        }
        graph.insert(me.clone(), to);
    }
    graph
}

/// Strongly connected components with more than one module (Tarjan's algorithm).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        out: Vec<Vec<Vec<String>>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a Vec<String>) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.graph.contains_key(w) {
                    continue;
                }
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut found = Vec::new();
    for krate in crates() {
        for c in circles(&import_graph(&krate)) {
            let graph = import_graph(&krate);
            let name = krate.file_name().unwrap().to_string_lossy().to_string();
            let mut edges = Vec::new();
            for a in &c {
                for b in graph[a].iter().filter(|b| c.contains(b)) {
                    edges.push(format!("  {name}: {} -> {}", a.join("::"), b.join("::")));
                }
            }
            found.push(format!(
                "{name}: {}\n{}",
                c.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(", "),
                edges.join("\n")
            ));
        }
    }
    assert!(found.is_empty(), "modules that import each other in a circle:\n{}", found.join("\n"));
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let m = |s: &str| s.split("::").map(str::to_string).collect::<Vec<String>>();
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    g.insert(m("a"), [m("b")].into());
    g.insert(m("b"), [m("c")].into());
    g.insert(m("c"), [m("a")].into());
    g.insert(m("d"), [m("a")].into());
    assert_eq!(circles(&g), vec![vec![m("a"), m("b"), m("c")]]);
    // And reads `super::` and `crate::` paths as a file names them.
    let refs = references("use super::x::Y;\nfn f() { crate::a::b::c(); drover_crate::q(); }", &m("p::q"), false);
    assert_eq!(refs, vec![m("a::b::c"), m("p::x::Y")]);
}

#[test]
fn no_slurm_command_imports_another() {
    let cli = workspace().join("cli");
    let graph = import_graph(&cli);
    let mut found = Vec::new();
    for (me, to) in &graph {
        let [first, command, ..] = me.as_slice() else { continue };
        if first != "commands" {
            continue;
        }
        for target in to {
            if target.len() >= 2 && target[0] == "commands" && &target[1] != command {
                found.push(format!("{} uses {}", me.join("::"), target.join("::")));
            }
        }
    }
    assert!(
        found.is_empty(),
        "commands that reach into other commands (move the shared part down):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_wall_clock_is_read_in_one_place() {
    let allowed = [workspace().join("common/src/wall.rs"), workspace().join("controller/src/runtime.rs")];
    let mut found = Vec::new();
    for f in source_files() {
        if code_of(&f).contains("fn now_ms() -> u64") && !allowed.contains(&f) {
            found.push(f.display().to_string());
        }
    }
    assert!(found.is_empty(), "use drover_common::wall::now_ms instead of another clock in: {found:?}");
}

/// Non-test functions longer than `limit` lines in `code`: (first line, name, lines). A function runs from its
/// `fn` line to the first line that closes at the `fn`'s own indentation.
fn long_functions(code: &str, limit: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let mut rest = line.trim_start();
        for prefix in ["pub(crate) ", "pub(super) ", "pub ", "async ", "const ", "unsafe "] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        let Some(after) = rest.strip_prefix("fn ") else {
            i += 1;
            continue;
        };
        let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // Its body starts on the line that ends with `{` (a declaration without a body ends with `;`).
        let mut open = i;
        while open < lines.len() && !lines[open].trim_end().ends_with('{') && !lines[open].trim_end().ends_with(';') {
            open += 1;
        }
        if open >= lines.len() || lines[open].trim_end().ends_with(';') {
            i = open + 1;
            continue;
        }
        let close = " ".repeat(indent) + "}";
        let end = (open + 1..lines.len()).find(|&k| lines[k].trim_end() == close).unwrap_or(lines.len() - 1);
        let count = end - i + 1;
        if count > limit {
            out.push((i + 1, name, count));
        }
        i = end + 1;
    }
    out
}

/// What the structure issue asked: no function over ~120 lines, so each reads as one step with a name.
#[test]
fn no_function_is_longer_than_120_lines() {
    let mut found = Vec::new();
    for f in source_files() {
        for (line, name, count) in long_functions(&code_of(&f), 120) {
            found.push(format!("{}:{line} fn {name}: {count} lines", f.display()));
        }
    }
    assert!(found.is_empty(), "split these into named steps:\n{}", found.join("\n"));
}

#[test]
fn the_length_finder_counts_a_function_to_its_closing_brace() {
    let body: String = (0..130).map(|i| format!("    let x{i} = {i};\n")).collect();
    let code = format!("fn short() {{\n}}\n\npub async fn long(\n    a: u32,\n) -> u32 {{\n{body}    a\n}}\n");
    assert_eq!(long_functions(&code, 120), vec![(4, "long".to_string(), 135)]);
    assert_eq!(long_functions("trait T {\n    fn f(&self);\n}\n", 0), Vec::new());
}

/// Slurm's time forms are read in one place, `cli/src/slurm/time.rs` (issue 29 found three readers).
#[test]
fn slurms_time_forms_are_read_in_one_place() {
    let allowed = workspace().join("cli/src/slurm/time.rs");
    let mut found = Vec::new();
    for f in source_files() {
        let code = code_of(&f);
        let defines = ["fn parse_time(", "struct TimeSpec", "enum TimeSpec"].iter().any(|d| code.contains(d));
        if defines && f != allowed {
            found.push(f.display().to_string());
        }
    }
    assert!(found.is_empty(), "read Slurm's time forms with crate::slurm::time, not in: {found:?}");
}

/// Errors are types, not sentences (issue 29): no non-test function answers `Result<_, String>`, so a caller
/// decides by the kind of failure and a user still reads the message the type's `Display` gives.
#[test]
fn no_function_returns_a_string_as_its_error() {
    let mut found = Vec::new();
    for f in source_files() {
        for (n, line) in code_of(&f).lines().enumerate() {
            let returns = line.split_once("-> ").map(|(_, r)| r.replace(' ', ""));
            if returns.is_some_and(|r| r.starts_with("Result<") && r.contains(",String>")) {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "give these a thiserror type (or anyhow in a binary):\n{}", found.join("\n"));
}
