//! A rust-analyzer that can see trainbook, for completion, hover docs and variable types.
//!
//! evcxr's own rust-analyzer only knows the crates in the `Cargo.toml` it writes for the cells
//! (and rewrites before every cell), while cells reach trainbook through `--extern` flags, so
//! it completes nothing after `BertTrainer::new().` and cannot type `let job = ...launch()?;`.
//! This second analyzer loads a small crate of its own (never built) whose one dependency is
//! the source of `trainbook-api`, under the name cells use, `trainbook`. It analyses the very
//! source evcxr writes for a cell (its variables, items and the cell, in `src/lib.rs` of the
//! cell crate), so it knows everything evcxr's does, plus trainbook.
//!
//! Loading takes a few seconds (the standard library's sources and trainbook's), so it happens
//! on its own thread after the kernel is ready; whoever needs it first waits for the rest.

use crate::completion::Match;
use anyhow::{Context, Result, bail};
use ra_ap_hir as hir;
use ra_ap_hir::HirDisplay;
use ra_ap_ide as ide;
use ra_ap_ide::{AnalysisHost, CompletionFieldsToResolve, FilePosition, FileRange, TextRange};
use ra_ap_ide_db::SnippetCap;
use ra_ap_ide_db::imports::insert_use::{ImportGranularity, InsertUseConfig};
use ra_ap_load_cargo::{LoadCargoConfig, ProcMacroServerChoice};
use ra_ap_paths::AbsPathBuf;
use ra_ap_project_model::{CargoConfig, RustLibSource};
use ra_ap_syntax::AstNode;
use ra_ap_syntax::ast::{self, HasModuleItem, HasName};
use ra_ap_vfs::{FileId, VfsPath};
use std::path::{Path, PathBuf};

/// evcxr's edition for the cells' crate.
pub const EDITION: ide::Edition = ide::Edition::Edition2024;
/// The function evcxr wraps a cell in for analysis.
const WRAPPER: &str = "evcxr_analysis_wrapper";

pub struct Analyzer {
    host: AnalysisHost,
    file: FileId,
    text: String,
}

/// Completions in the coordinates of the analysed source.
pub struct Completions {
    pub matches: Vec<Match>,
    pub start: usize,
    pub end: usize,
}

impl Analyzer {
    /// Writes the analysis crate into `dir` (depending on the `trainbook-api` sources at
    /// `api_src`) and loads it with the standard library's sources. `lock`: a `Cargo.lock`
    /// that pins the api's dependencies to versions in cargo's cache (the analysis runs
    /// offline).
    pub fn load(dir: &Path, api_src: &Path, lock: Option<&Path>) -> Result<Analyzer> {
        let src = dir.join("src");
        std::fs::create_dir_all(&src).with_context(|| format!("creating {}", src.display()))?;
        let manifest = format!(
            "[package]\nname = \"trainbook_cells\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\n\
             [lib]\npath = \"src/lib.rs\"\n\n[dependencies]\n\
             trainbook = {{ package = \"trainbook-api\", path = {:?} }}\n\n[workspace]\n",
            api_src.display().to_string()
        );
        std::fs::write(dir.join("Cargo.toml"), manifest)?;
        std::fs::write(src.join("lib.rs"), "")?;
        if let Some(lock) = lock {
            // Best effort: without it cargo picks the newest cached versions.
            let _ = std::fs::copy(lock, dir.join("Cargo.lock"));
        }
        let cargo = CargoConfig {
            sysroot: Some(RustLibSource::Discover),
            metadata_extra_args: vec!["--offline".into()],
            ..CargoConfig::default()
        };
        let load = LoadCargoConfig {
            load_out_dirs_from_check: false,
            // trainbook's API needs no procedural macro to be understood (its derives are
            // std's, which rust-analyzer knows, or serde's, which completion does not need).
            with_proc_macro_server: ProcMacroServerChoice::None,
            prefill_caches: false,
            num_worker_threads: 1,
            proc_macro_processes: 0,
        };
        let (db, vfs, _) = ra_ap_load_cargo::load_workspace_at(dir, &cargo, &load, &|_| {})
            .context("rust-analyzer could not load the analysis crate")?;
        let path = AbsPathBuf::try_from(src.join("lib.rs").to_string_lossy().as_ref())
            .map_err(|p| anyhow::anyhow!("not an absolute path: {p}"))?;
        let Some((file, _)) = vfs.file_id(&VfsPath::from(path)) else {
            bail!(
                "rust-analyzer did not load {}",
                src.join("lib.rs").display()
            );
        };
        let mut me = Analyzer {
            host: AnalysisHost::with_database(db),
            file,
            text: String::new(),
        };
        // The first question resolves the standard library's and trainbook's names (seconds);
        // ask it here, off the critical path, rather than in the user's first completion.
        let warm = "fn f() { let v: Vec<String> = Vec::new(); v. }";
        let _ = me.completions(warm, warm.len() - 2);
        let _ = me.completions(
            "fn f() { trainbook::prelude::BertTrainer::new(). }",
            "fn f() { trainbook::prelude::BertTrainer::new().".len(),
        );
        Ok(me)
    }

    fn set_source(&mut self, text: &str) {
        if self.text == text {
            return;
        }
        self.text = text.to_string();
        let mut change = hir::ChangeWithProcMacros::default();
        change.change_file(self.file, Some(self.text.clone()));
        self.host.apply_change(change);
    }

    /// Completions at byte `offset` of `source`: rust-analyzer's items whose name starts with
    /// the text they would replace (it offers every member and leaves the filtering to us),
    /// with snippet placeholders reduced to their default text.
    pub fn completions(&mut self, source: &str, offset: usize) -> Result<Completions> {
        self.set_source(source);
        let config = completion_config();
        let position = FilePosition {
            file_id: self.file,
            offset: (offset as u32).into(),
        };
        let items = match self.host.analysis().completions(&config, position, None) {
            Ok(Some(items)) => items,
            Ok(None) => Vec::new(),
            Err(_) => bail!("rust-analyzer was cancelled"),
        };
        let mut matches = Vec::new();
        let mut range: Option<TextRange> = None;
        for item in items {
            let mut edits = item.text_edit.iter();
            let (Some(edit), None) = (edits.next(), edits.next()) else {
                continue;
            };
            if range.is_some_and(|r| r != edit.delete) {
                continue;
            }
            let typed = &source[edit.delete];
            if !item.lookup().starts_with(typed) {
                continue;
            }
            range = Some(edit.delete);
            let text = without_placeholders(&edit.insert);
            if !matches.iter().any(|m: &Match| m.text == text) && !text.starts_with("evcxr_") {
                matches.push(Match {
                    text,
                    kind: jupyter_kind(item.kind),
                    signature: item.detail.clone().unwrap_or_default(),
                });
            }
        }
        let (start, end) = match range {
            Some(r) => (r.start().into(), r.end().into()),
            None => (offset, offset),
        };
        Ok(Completions {
            matches,
            start,
            end,
        })
    }

    /// Documentation of what is at `offset`: (plain text, markdown).
    pub fn hover(&mut self, source: &str, offset: usize) -> Option<(String, String)> {
        self.set_source(source);
        let range = FileRange {
            file_id: self.file,
            range: TextRange::empty((offset as u32).into()),
        };
        let mut out = Vec::new();
        for format in [
            ide::HoverDocFormat::PlainText,
            ide::HoverDocFormat::Markdown,
        ] {
            let config = hover_config(format);
            let info = self.host.analysis().hover(&config, range).ok()??;
            out.push(info.info.markup.to_string());
        }
        let markdown = out.pop()?;
        Some((out.pop()?, markdown))
    }

    /// The type of the `nth` (from 0) untyped `let` that binds `name` at the top of evcxr's
    /// analysis wrapper (which holds the cell), for the whole pattern (a tuple's type for
    /// `let (a, b) = ...`), written as code that names it from the cell (`Job`,
    /// `std::path::PathBuf`). None when rust-analyzer cannot tell.
    pub fn let_type(&mut self, source: &str, name: &str, nth: usize) -> Option<String> {
        self.set_source(source);
        let db = self.host.raw_database();
        let sema = hir::Semantics::new(db);
        let file = sema.parse(ra_ap_base_db::EditionedFileId::new(db, self.file, EDITION));
        hir::attach_db(db, || {
            let wrapper = file.items().find_map(|item| match item {
                ast::Item::Fn(f) if f.name().is_some_and(|n| n.text() == WRAPPER) => Some(f),
                _ => None,
            })?;
            let module = sema.scope(wrapper.syntax())?.module();
            let body = wrapper.body()?;
            let pat = body
                .statements()
                .filter_map(|s| match s {
                    ast::Stmt::LetStmt(l) if l.ty().is_none() => {
                        let pat = l.pat()?;
                        binds(&pat, name).then_some(pat)
                    }
                    _ => None,
                })
                .nth(nth)?;
            let ty = sema.type_of_pat(&pat)?.original();
            if ty.is_closure() {
                return None;
            }
            let written = ty.display_source_code(db, module.into(), true).ok()?;
            nameable(&written).then_some(written)
        })
    }
}

/// Whether `pat` binds `name` (directly or inside a tuple, array or other pattern).
fn binds(pat: &ast::Pat, name: &str) -> bool {
    pat.syntax()
        .descendants()
        .filter_map(ast::IdentPat::cast)
        .any(|p| p.name().is_some_and(|n| n.text() == name))
}

/// A type written as rust-analyzer could not name it is no use in a `let`.
fn nameable(ty: &str) -> bool {
    !ty.is_empty()
        && ![
            "{unknown}",
            "impl ",
            "{closure",
            "dyn ",
            "'_",
            "{error}",
            "!",
        ]
        .iter()
        .any(|bad| ty.contains(bad))
}

/// `foo(${1:a}, ${2:b})$0` → `foo(a, b)`.
/// The kinds JupyterLab shows beside a match (as ipykernel names them).
fn jupyter_kind(kind: ide::CompletionItemKind) -> &'static str {
    use ide::CompletionItemKind as K;
    use ra_ap_ide_db::SymbolKind as S;
    match kind {
        K::SymbolKind(S::Function | S::Method | S::Macro | S::ProcMacro) => "function",
        K::SymbolKind(
            S::Struct | S::Enum | S::Union | S::Trait | S::TypeAlias | S::TypeParam | S::SelfType,
        )
        | K::BuiltinType => "class",
        K::SymbolKind(S::Module | S::CrateRoot | S::ToolModule) => "module",
        K::Keyword => "keyword",
        K::Snippet => "snippet",
        _ => "instance",
    }
}

fn without_placeholders(snippet: &str) -> String {
    let mut out = String::with_capacity(snippet.len());
    let mut rest = snippet;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(body) = after.strip_prefix('{') {
            let Some(close) = body.find('}') else {
                out.push_str(&rest[i..]);
                return out;
            };
            let inner = &body[..close];
            out.push_str(inner.split_once(':').map_or("", |(_, text)| text));
            rest = &body[close + 1..];
        } else {
            rest = after.trim_start_matches(|c: char| c.is_ascii_digit());
        }
    }
    out.push_str(rest);
    out
}

fn completion_config() -> ide::CompletionConfig<'static> {
    ide::CompletionConfig {
        enable_postfix_completions: true,
        enable_imports_on_the_fly: false,
        enable_self_on_the_fly: true,
        enable_private_editable: false,
        enable_term_search: false,
        term_search_fuel: 0,
        full_function_signatures: false,
        // A client inserts a match as it is: `push`, not `push(value)` with a placeholder
        // typed into the cell. The signature travels beside it (`Match::signature`).
        callable: None,
        add_semicolon_to_unit: false,
        snippet_cap: SnippetCap::new(true),
        insert_use: InsertUseConfig {
            granularity: ImportGranularity::Item,
            enforce_granularity: false,
            prefix_kind: hir::PrefixKind::ByCrate,
            group: false,
            skip_glob_imports: false,
        },
        prefer_no_std: false,
        prefer_prelude: true,
        prefer_absolute: false,
        snippets: Vec::new(),
        limit: None,
        fields_to_resolve: CompletionFieldsToResolve::empty(),
        exclude_flyimport: Vec::new(),
        exclude_traits: &[],
        enable_auto_iter: true,
        enable_auto_await: false,
        ra_fixture: ide::RaFixtureConfig::default(),
        add_colons_to_module: true,
    }
}

fn hover_config(format: ide::HoverDocFormat) -> ide::HoverConfig<'static> {
    ide::HoverConfig {
        links_in_hover: false,
        memory_layout: None,
        documentation: true,
        keywords: true,
        format,
        max_trait_assoc_items_count: None,
        max_fields_count: Some(8),
        max_enum_variants_count: Some(8),
        max_subst_ty_len: ide::SubstTyLen::Unlimited,
        show_drop_glue: false,
        ra_fixture: ide::RaFixtureConfig::default(),
    }
}

/// Where the `trainbook-api` sources are: `TRAINBOOK_API_SRC`, else the checkout this kernel
/// was built from (the prelude must stay in its target directory anyway).
pub fn api_sources() -> Option<PathBuf> {
    let dir = match std::env::var_os("TRAINBOOK_API_SRC") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../prelude/api"),
    };
    let dir = dir.canonicalize().ok()?;
    dir.join("Cargo.toml").is_file().then_some(dir)
}

/// The checkout's `Cargo.lock` next to the api sources' workspace.
pub fn lock_file(api_src: &Path) -> Option<PathBuf> {
    let lock = api_src.parent()?.parent()?.join("Cargo.lock");
    lock.is_file().then_some(lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_their_default_text() {
        assert_eq!(without_placeholders("foo(${1:a}, ${2:b})$0"), "foo(a, b)");
        assert_eq!(without_placeholders("epochs(${1:n})"), "epochs(n)");
        assert_eq!(without_placeholders("len()$0"), "len()");
        assert_eq!(without_placeholders("cost is $5"), "cost is ");
    }

    #[test]
    fn types_rust_analyzer_could_not_name_are_refused() {
        assert!(nameable("Job"));
        assert!(nameable("(u64, JobStatus)"));
        assert!(nameable("std::path::PathBuf"));
        assert!(!nameable("{unknown}"));
        assert!(!nameable("Vec<{unknown}>"));
        assert!(!nameable("impl Fn()"));
        assert!(!nameable("!"));
    }
}
