//! The types of a cell's new variables, when evcxr cannot find them.
//!
//! evcxr keeps a cell's variables for later cells and must write their types down. It asks
//! rust-analyzer, which cannot see into the prebuilt prelude, so for `let job = launch(spec)?;`
//! or `let (steps, status) = (r.steps, r.status);` it gives up. Then the compiler is asked
//! instead: a `cargo check` of the cell plus `let _: () = <the bound names>;`, whose
//! mismatched-types error names the type. The type is written into the `let` and the cell runs
//! again. Tuple and array patterns are typed as one unit (their names, read as an expression,
//! have the pattern's type), so one check types them all; since evcxr reads a type only from a
//! `let` of a single name, `let (a, b) = e;` becomes `let a: A; let b: B; (a, b) = e;`.

use crate::analysis::Analyzer;
use crate::scan::{self, SyntaxKind, T};
use evcxr::{CommandContext, EvalCallbacks};

/// Runs a cell, writing the types evcxr could not find into its `let`s (up to four rounds).
/// With `analyzer`, the cell's top-level `let`s are typed by it first, which costs no compile.
pub fn execute(
    ctx: &mut CommandContext,
    code: &str,
    analyzer: Option<&mut Analyzer>,
) -> Result<evcxr::EvalOutputs, evcxr::Error> {
    let mut code = match analyzer {
        Some(a) => typed_by_analyzer(ctx, a, code),
        None => code.to_string(),
    };
    let mut callbacks = EvalCallbacks::default();
    // The code before the last probes' types went in, and those types: rustc writes a type by
    // its shortest unambiguous name (`Tensor`, `PathBuf`), which the cell may not have in
    // scope; its "cannot find type" error then suggests the path, and the types are written
    // again with it.
    let mut last_probes: Option<(String, Vec<(UntypedLet, String)>)> = None;
    code = split_typed_patterns(&code);
    for _ in 0..4 {
        code = static_borrows(&code);
        let result = ctx.execute_with_callbacks(&code, &mut callbacks);
        if let (Err(evcxr::Error::CompilationErrors(errors)), Some((before, probes))) =
            (&result, &last_probes)
        {
            if let Some(qualified) = qualified(errors, probes) {
                note("writing the probe's types with their paths");
                code = annotate_all(before, &qualified);
                last_probes = Some((before.clone(), qualified));
                continue;
            }
            if let Some(message) = out_of_scope(errors, probes) {
                return Err(evcxr::Error::Message(message));
            }
        }
        let lets = match &result {
            Err(evcxr::Error::Message(msg)) => untyped_variable(msg)
                .and_then(|var| untyped_lets(&code).into_iter().find(|l| l.binds(&var)))
                .into_iter()
                .collect(),
            // rust-analyzer sometimes types an expression it cannot see into as `!`; and evcxr's
            // own typing compile fails with E0521 when an earlier cell kept a variable with a
            // borrowed type (`Option<&str>` parameters): its analysis function takes the
            // variables as arguments and demands `'static` of them. The probe needs neither.
            Err(evcxr::Error::CompilationErrors(errors))
                if errors.iter().any(|e| {
                    e.message().contains("`!` type is experimental") || e.code() == Some("E0521")
                }) =>
            {
                untyped_lets(&code)
            }
            _ => Vec::new(),
        };
        let mut probes = Vec::new();
        // Later bindings first, so earlier offsets stay valid.
        for binding in lets.into_iter().rev() {
            // In a block, so evcxr does not try to keep (and type) the cell's variables itself.
            let probe = format!("{{\n{code}\nlet _: () = {};\n}}", binding.expression());
            note(&format!("probe compile for `{}`", binding.expression()));
            let ty = ctx.check(&probe).ok().and_then(|errors| {
                if std::env::var_os("TRAINBOOK_KERNEL_TIMING").is_some() {
                    for e in &errors {
                        note(&format!("probe: {:?} {}", e.code(), e.message()));
                    }
                }
                errors.iter().find_map(found_type)
            });
            if let Some(ty) = ty {
                probes.push((binding, ty));
            }
        }
        let typed = annotate_all(&code, &probes);
        if typed == code {
            return result;
        }
        last_probes = Some((std::mem::replace(&mut code, typed), probes));
    }
    ctx.execute_with_callbacks(&static_borrows(&code), &mut callbacks)
}

/// The cell with the borrows in its top-level `let` types made `'static`
/// (`let preset: Option<&str>` → `Option<&'static str>`). A variable kept for later cells
/// must be `'static` anyway; written without the lifetime, evcxr keeps the type as written
/// and its analysis compile of every later cell that fails or needs typing stops at E0521
/// ("borrowed data escapes outside of function") instead of the cell's own error.
pub fn static_borrows(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut done = 0;
    for l in typed_lets(code) {
        if !matches!(
            Pattern::parse(&l.binding.pattern),
            Some(Pattern::Name { .. })
        ) {
            continue;
        }
        out.push_str(&code[done..l.ty.start]);
        let ty = scan::type_tokens(&code[l.ty.clone()]);
        for (j, t) in ty.iter().enumerate() {
            out.push_str(t.text);
            let next = ty[j + 1..]
                .iter()
                .find(|t| t.kind != SyntaxKind::WHITESPACE);
            if t.kind == T![&]
                && !next.is_some_and(|n| matches!(n.kind, T![&] | SyntaxKind::LIFETIME_IDENT))
            {
                out.push_str("'static ");
            }
        }
        done = l.ty.end;
    }
    out.push_str(&code[done..]);
    out
}

/// A top-level `let PATTERN: TYPE`.
struct TypedLet {
    binding: UntypedLet,
    /// Byte range of the type, up to the `=` or `;` that ends it.
    ty: std::ops::Range<usize>,
}

fn typed_lets(code: &str) -> Vec<TypedLet> {
    lets(code)
        .into_iter()
        .filter(|(l, then)| l.top_level && then.kind == T![:])
        .filter_map(|(binding, colon)| {
            let ty = colon.end()..type_end(code, colon.end())?;
            Some(TypedLet { binding, ty })
        })
        .collect()
}

/// Where a `let`'s type that starts at `from` ends: the first `=` or `;` outside brackets
/// (None at a brace or a string, which no type has).
fn type_end(code: &str, from: usize) -> Option<usize> {
    scan::type_tokens(&code[from..])
        .iter()
        .find(|t| {
            (t.depth == 0 && matches!(t.kind, T![=] | T![;]))
                || matches!(t.kind, T!['{'] | T!['}'] | SyntaxKind::EOF)
                || t.is_string()
                || t.depth < 0
        })
        .filter(|t| matches!(t.kind, T![=] | T![;]))
        .map(|t| from + t.at)
}

/// The cell with its top-level typed tuple and array `let`s split into one typed `let` per
/// name (`let (a, b): (A, B) = e;` → `let a: A; let b: B; (a, b) = e;`): evcxr reads a kept
/// variable's type only from a `let` of a single name.
pub fn split_typed_patterns(code: &str) -> String {
    let mut found: Vec<(UntypedLet, String)> = typed_lets(code)
        .into_iter()
        .filter(|l| l.binding.pattern.starts_with(['(', '[']) && code[l.ty.end..].starts_with('='))
        .map(|l| {
            let binding = UntypedLet {
                end: l.ty.end,
                ..l.binding
            };
            (binding, code[l.ty].trim().to_string())
        })
        .collect();
    found.reverse();
    annotate_all(code, &found)
}

/// `code` with each binding typed (bindings in reverse order of position, as probed).
fn annotate_all(code: &str, probes: &[(UntypedLet, String)]) -> String {
    probes.iter().fold(code.to_string(), |c, (binding, ty)| {
        binding.annotate(&c, ty)
    })
}

/// The probes' types with every type name rustc could not find replaced by the path its
/// help suggests (`use trainbook_torch::custom::Tensor;`); None if nothing changed.
fn qualified(
    errors: &[evcxr::CompilationError],
    probes: &[(UntypedLet, String)],
) -> Option<Vec<(UntypedLet, String)>> {
    let mut out: Vec<(UntypedLet, String)> = probes.to_vec();
    let mut changed = false;
    for e in errors {
        let msg = e.message();
        let Some(name) = msg
            .strip_prefix("cannot find type `")
            .and_then(|m| m.split('`').next())
        else {
            continue;
        };
        let help = e.help().join("\n") + "\n" + &e.rendered();
        let Some(path) = suggested_path(&help, name) else {
            continue;
        };
        for (_, ty) in out.iter_mut() {
            let q = replace_type_name(ty, name, &path);
            changed |= q != *ty;
            *ty = q;
        }
    }
    changed.then_some(out)
}

/// When a type the probe found names a type this cell cannot see (and rustc suggests no
/// path), what the user can do about it, instead of an error about a `let` they did not type.
fn out_of_scope(
    errors: &[evcxr::CompilationError],
    probes: &[(UntypedLet, String)],
) -> Option<String> {
    errors.iter().find_map(|e| {
        let msg = e.message();
        let name = msg.strip_prefix("cannot find type `")?.split('`').next()?;
        let (binding, ty) = probes
            .iter()
            .find(|(_, ty)| replace_type_name(ty, name, "\u{0}") != *ty)?;
        let var = binding.expression();
        Some(format!(
            "The type of `{var}` is `{ty}`, but `{name}` is not in scope in this cell, so the \
             variable cannot be kept for later cells. Import it (`use <path>::{name};`, e.g. \
             `use trainbook_torch::custom::*;` or `use trainbook_torch::custom::nn::{name};`) \
             or write `{var}`'s type yourself with the path of `{name}`; or keep the value \
             inside a block (`{{ ... }}`) if later cells do not need it."
        ))
    })
}

/// The first `use PATH::NAME;` in rustc's help text.
fn suggested_path(help: &str, name: &str) -> Option<String> {
    help.split("use ").skip(1).find_map(|rest| {
        let path = rest.split(';').next()?.trim();
        (path.ends_with(&format!("::{name}"))
            && path
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == ':'))
        .then(|| path.to_string())
    })
}

/// `ty` with the type name `name` (a whole word, not already a path's tail) replaced by `path`.
fn replace_type_name(ty: &str, name: &str, path: &str) -> String {
    let tokens = scan::type_tokens(ty);
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let tail = i > 0 && tokens[i - 1].kind == T![:];
            if t.kind == SyntaxKind::IDENT && t.text == name && !tail {
                path
            } else {
                t.text
            }
        })
        .collect()
}

/// The cell with its top-level untyped `let`s typed by the trainbook-aware analyzer, where it
/// can name the type. It reads the source evcxr writes for its own analysis of the cell (the
/// earlier cells' variables and items around it), so both see the same program.
fn typed_by_analyzer(ctx: &mut CommandContext, analyzer: &mut Analyzer, code: &str) -> String {
    let lets: Vec<UntypedLet> = untyped_lets(code)
        .into_iter()
        .filter(|l| l.top_level)
        .collect();
    if lets.is_empty() || ctx.completions(code, code.len()).is_err() {
        return code.to_string();
    }
    let Ok(source) = ctx.last_source() else {
        return code.to_string();
    };
    let mut typed = code.to_string();
    // Later bindings first, so earlier offsets stay valid.
    for (i, binding) in lets.iter().enumerate().rev() {
        let Some(name) = binding.names().first().map(|n| n.to_string()) else {
            continue;
        };
        let nth = lets[..i].iter().filter(|l| l.binds(&name)).count();
        // A type with holes (`_`, `Vec<_>`) is the analyzer not seeing into something (e.g. a
        // crate it was not given); the compiler probe finds those.
        if let Some(ty) = analyzer
            .let_type(&source, &name, nth)
            .filter(|t| is_complete(t))
        {
            note(&format!("typed `{name}` as `{ty}` by the analyzer"));
            typed = binding.annotate(&typed, &ty);
        }
    }
    typed
}

/// Whether a type names no placeholder (`_`) and nothing the analyzer could not resolve.
fn is_complete(ty: &str) -> bool {
    !ty.contains("{unknown}") && !scan::type_tokens(ty).iter().any(|t| t.kind == T![_])
}

/// With `TRAINBOOK_KERNEL_TIMING` set, says how a type was found (on stderr).
fn note(what: &str) {
    if std::env::var_os("TRAINBOOK_KERNEL_TIMING").is_some() {
        eprintln!("trainbook-kernel: {what}");
    }
}

/// A `let PATTERN = ...` without a type, where PATTERN is a name or a tuple or array of names
/// (`mut` allowed).
#[derive(Clone, Debug, PartialEq)]
pub struct UntypedLet {
    pattern: String,
    /// Byte offsets in the code of `let` and of the end of the pattern.
    start: usize,
    end: usize,
    /// Outside every block and bracket: a statement evcxr keeps variables from.
    top_level: bool,
}

impl UntypedLet {
    pub fn names(&self) -> Vec<&str> {
        scan::code(&self.pattern)
            .into_iter()
            .filter(|t| t.kind == SyntaxKind::IDENT)
            .map(|t| t.text)
            .collect()
    }

    fn binds(&self, var: &str) -> bool {
        self.names().contains(&var)
    }

    /// The pattern read as an expression (`(mut a, b)` → `(a, b)`): it has the pattern's type.
    fn expression(&self) -> String {
        let tokens = scan::code(&self.pattern);
        let mode = |i: usize| matches!(tokens[i].kind, SyntaxKind::MUT_KW | SyntaxKind::REF_KW);
        // `mut` and `ref` go with the space after them.
        let space_after_mode =
            |i: usize| i > 0 && mode(i - 1) && tokens[i].kind == SyntaxKind::WHITESPACE;
        (0..tokens.len())
            .filter(|&i| !mode(i) && !space_after_mode(i))
            .map(|i| tokens[i].text)
            .collect()
    }

    /// The code with this binding typed: `let x: T = e;`, or for a pattern one typed `let` per
    /// name followed by a destructuring assignment. Unchanged if the type does not fit the
    /// pattern.
    fn annotate(&self, code: &str, ty: &str) -> String {
        let pattern = Pattern::parse(&self.pattern);
        if let Some(Pattern::Name { .. }) = pattern {
            return format!("{}: {ty}{}", &code[..self.end], &code[self.end..]);
        }
        let mut decls = String::new();
        match pattern {
            Some(p) if p.declare(ty.trim(), &mut decls) => format!(
                "{}{decls}{}{}",
                &code[..self.start],
                self.expression(),
                &code[self.end..]
            ),
            _ => code.to_string(),
        }
    }
}

/// A `let` pattern made of names, `_`, tuples and arrays.
#[derive(Debug, PartialEq)]
enum Pattern {
    Name { name: String, mutable: bool },
    Wild,
    Tuple(Vec<Pattern>),
    Array(Vec<Pattern>),
}

impl Pattern {
    fn parse(text: &str) -> Option<Pattern> {
        let t = text.trim();
        let inner = |open: char, close: char| -> Option<Vec<Pattern>> {
            let body = t.strip_prefix(open)?.strip_suffix(close)?;
            split_top(body).into_iter().map(Pattern::parse).collect()
        };
        if t.starts_with('(') {
            return inner('(', ')').map(Pattern::Tuple);
        }
        if t.starts_with('[') {
            return inner('[', ']').map(Pattern::Array);
        }
        let words: Vec<&str> = t.split_whitespace().collect();
        match words[..] {
            ["_"] => Some(Pattern::Wild),
            [name] => Some(Pattern::Name {
                name: name.into(),
                mutable: false,
            }),
            ["mut", name] => Some(Pattern::Name {
                name: name.into(),
                mutable: true,
            }),
            _ => None,
        }
    }

    /// Appends `let [mut] name: T;` for every name, given the pattern's type; false if the
    /// type's shape does not match.
    fn declare(&self, ty: &str, out: &mut String) -> bool {
        match self {
            Pattern::Wild => true,
            Pattern::Name { name, mutable } => {
                let m = if *mutable { "mut " } else { "" };
                out.push_str(&format!("let {m}{name}: {ty}; "));
                true
            }
            Pattern::Tuple(parts) => {
                let Some(body) = ty.strip_prefix('(').and_then(|t| t.strip_suffix(')')) else {
                    return false;
                };
                let types = split_top(body);
                types.len() == parts.len()
                    && parts
                        .iter()
                        .zip(types)
                        .all(|(p, t)| p.declare(t.trim(), out))
            }
            Pattern::Array(parts) => {
                // `[T; N]`: every element has type T.
                let Some(body) = ty.strip_prefix('[').and_then(|t| t.strip_suffix(']')) else {
                    return false;
                };
                let Some((elem, _)) = body.rsplit_once(';') else {
                    return false;
                };
                parts.iter().all(|p| p.declare(elem.trim(), out))
            }
        }
    }
}

/// `a, (b, c), d<e, f>` → `["a", "(b, c)", "d<e, f>"]`: commas outside brackets; a trailing
/// comma (`(a,)`) ends the list.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut from = 0;
    for t in scan::type_tokens(s) {
        if t.depth == 0 && t.kind == T![,] {
            parts.push(&s[from..t.at]);
            from = t.end();
        }
    }
    if !s[from..].trim().is_empty() {
        parts.push(&s[from..]);
    }
    parts
}

/// Every `let` whose pattern is a name, or a tuple or array of names, and that has no type.
pub fn untyped_lets(code: &str) -> Vec<UntypedLet> {
    lets(code)
        .into_iter()
        .filter(|(l, then)| then.kind == T![=] && !l.names().is_empty())
        .map(|(l, _)| l)
        .collect()
}

/// Every `let` whose pattern is made of names, `_`, tuples and arrays (`mut`, `ref` allowed),
/// with the token after its pattern: the `:` of its type or the `=` of its value.
fn lets(code: &str) -> Vec<(UntypedLet, scan::Token<'_>)> {
    let tokens = scan::code(code);
    let mut out = Vec::new();
    for (i, l) in tokens.iter().enumerate() {
        if l.kind != SyntaxKind::LET_KW {
            continue;
        }
        let rest = &tokens[i + 1..];
        let Some(n) = rest.iter().position(|t| !in_pattern(t)) else {
            continue;
        };
        let (pattern, then) = (&rest[..n], rest[n]);
        // `Some(x)` is a variant, not a tuple of names.
        let variant = pattern
            .windows(2)
            .any(|w| w[0].kind == SyntaxKind::IDENT && matches!(w[1].kind, T!['('] | T!['[']));
        let mut words = pattern.iter().filter(|t| t.kind != SyntaxKind::WHITESPACE);
        let Some(first) = words.next() else {
            continue;
        };
        let last = words.next_back().unwrap_or(first);
        if variant || then.depth != l.depth || !matches!(then.kind, T![:] | T![=]) {
            continue;
        }
        let binding = UntypedLet {
            pattern: code[first.at..last.end()].to_string(),
            start: l.at,
            end: last.end(),
            top_level: l.depth == 0,
        };
        out.push((binding, then));
    }
    out
}

/// What a pattern of names is made of.
fn in_pattern(t: &scan::Token<'_>) -> bool {
    use SyntaxKind::*;
    matches!(
        t.kind,
        IDENT | UNDERSCORE | MUT_KW | REF_KW | WHITESPACE | COMMA
    ) || matches!(t.kind, L_PAREN | R_PAREN | L_BRACK | R_BRACK)
}

/// The variable named in evcxr's "Couldn't automatically determine type of variable `x`".
fn untyped_variable(msg: &str) -> Option<String> {
    let rest = msg.split("determine type of variable `").nth(1)?;
    let name = rest.split('`').next()?;
    (!name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_'))
        .then(|| name.to_string())
}

/// The type in rustc's "expected `()`, found `T`" for the probe's mismatched-types error.
fn found_type(error: &evcxr::CompilationError) -> Option<String> {
    if error.code() != Some("E0308") {
        return None;
    }
    let texts = error
        .spanned_messages()
        .iter()
        .map(|m| m.label.clone())
        .chain([error.rendered()]);
    for text in texts {
        if let Some(ty) = found_in(&text) {
            return Some(ty);
        }
    }
    None
}

fn found_in(text: &str) -> Option<String> {
    let i = text.rfind("found `")?;
    let ty = text[i + 7..].split('`').next()?;
    // Closures and opaque types cannot be written down.
    (!ty.is_empty() && ty != "!" && !ty.contains(['{', '_']) && !ty.starts_with("impl "))
        .then(|| ty.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotate(code: &str, var: &str, ty: &str) -> Option<String> {
        let l = untyped_lets(code).into_iter().find(|l| l.binds(var))?;
        Some(l.annotate(code, ty))
    }

    #[test]
    fn typed_patterns_become_one_let_per_name() {
        let code = "let (vs, m): (nn::VarStore, Model) = load(&t, &c)?;\nlet [a, b]: [u8; 2] = x;";
        let split = split_typed_patterns(code);
        assert_eq!(
            split,
            "let vs: nn::VarStore; let m: Model; (vs, m)= load(&t, &c)?;\nlet a: u8; let b: u8; [a, b]= x;"
        );
        let single = "let x: (u8, u8) = (1, 2); { let (a, b): (u8, u8) = x; }";
        assert_eq!(split_typed_patterns(single), single);
    }

    #[test]
    fn kept_variables_borrow_for_static() {
        assert_eq!(
            static_borrows("let preset: Option<&str> = None;\nlet n: usize = 2;"),
            "let preset: Option<&'static str> = None;\nlet n: usize = 2;"
        );
        assert_eq!(
            static_borrows("let mut v: Vec<&  [u8]> = vec![]; let s: &'static str = \"a\";"),
            "let mut v: Vec<&'static   [u8]> = vec![]; let s: &'static str = \"a\";"
        );
        assert_eq!(
            static_borrows("let f: Box<dyn Fn(&str) -> u8> = g; let x: &&str;"),
            "let f: Box<dyn Fn(&'static str) -> u8> = g; let x: &&'static str;"
        );
        // Not in a block, a closure's parameter or a string.
        let inner = "{ let s: &str = &t; }\nlet m = |x: &str| x.len();\nprintln!(\"let a: &b\");";
        assert_eq!(static_borrows(inner), inner);
    }

    #[test]
    fn probe_types_take_the_path_rustc_suggests() {
        let help = "consider importing one of these structs\n\nuse trainbook_torch::custom::Tensor;\nuse tch::Tensor;";
        assert_eq!(
            suggested_path(help, "Tensor").as_deref(),
            Some("trainbook_torch::custom::Tensor")
        );
        assert_eq!(suggested_path(help, "Kind"), None);
        let p = "std::path::PathBuf";
        assert_eq!(
            replace_type_name("(Vec<PathBuf>, MyPathBuf, x::PathBuf)", "PathBuf", p),
            "(Vec<std::path::PathBuf>, MyPathBuf, x::PathBuf)"
        );
        assert_eq!(replace_type_name("PathBuf", "PathBuf", p), p);
    }

    #[test]
    fn annotates_the_first_top_level_binding() {
        assert_eq!(
            annotate("let job = launch(s)?;\njob.wait()?;", "job", "Job").as_deref(),
            Some("let job: Job = launch(s)?;\njob.wait()?;")
        );
        assert_eq!(
            annotate("let mut  r = fit(x)?;", "r", "TrainResult").as_deref(),
            Some("let mut  r: TrainResult = fit(x)?;")
        );
        // Not a prefix of another name, not an existing annotation, not `outlet`.
        assert_eq!(
            annotate("let jobs = 1; let job = 2;", "job", "u8").as_deref(),
            Some("let jobs = 1; let job: u8 = 2;")
        );
        assert_eq!(annotate("let job: Job = x;", "job", "Job"), None);
        assert_eq!(annotate("outlet job = 1;", "job", "u8"), None);
        assert_eq!(
            annotate("let ok = a == b;", "ok", "bool").as_deref(),
            Some("let ok: bool = a == b;")
        );
    }

    #[test]
    fn tuple_and_array_patterns_are_typed_as_one() {
        let code = "let (steps, mut status) = (r.steps, r.status);";
        let [l] = &untyped_lets(code)[..] else {
            panic!()
        };
        assert_eq!(l.names(), ["steps", "status"]);
        assert_eq!(l.expression(), "(steps, status)");
        // evcxr reads types only from single-name lets.
        assert_eq!(
            annotate(code, "status", "(u64, JobStatus)").as_deref(),
            Some(
                "let steps: u64; let mut status: JobStatus; (steps, status) = (r.steps, r.status);"
            )
        );
        let code = "let [a, (b, _)] = x;";
        assert_eq!(untyped_lets(code)[0].expression(), "[a, (b, _)]");
        assert_eq!(
            annotate(code, "a", "[(u8, Vec<(u8, u16)>); 2]").as_deref(),
            Some("let a: (u8, Vec<(u8, u16)>); let b: u8; [a, (b, _)] = x;")
        );
        // A type that does not fit leaves the code as it was.
        assert_eq!(
            annotate("let (a, b) = x;", "a", "u8").as_deref(),
            Some("let (a, b) = x;")
        );
        assert_eq!(
            split_top("a, (b, c), HashMap<u8, u8>, fn(u8) -> u8,"),
            ["a", " (b, c)", " HashMap<u8, u8>", " fn(u8) -> u8"]
        );
    }

    /// The names each top-level untyped `let` binds.
    fn top_level_names(code: &str) -> Vec<Vec<String>> {
        untyped_lets(code)
            .iter()
            .filter(|l| l.top_level)
            .map(|l| l.names().into_iter().map(String::from).collect())
            .collect()
    }

    #[test]
    fn only_lets_outside_blocks_are_top_level() {
        let code = "let a = 1;\nlet s = \"{\"; // {\nlet b = { let c = 2; c };\nlet d = 3;";
        let tops = top_level_names(code);
        assert_eq!(tops, [vec!["a"], vec!["s"], vec!["b"], vec!["d"]]);
        // No `let` in a string or comment, and no brace in a char, raw string or comment.
        let code = "let c = '{';\nprintln!(\"let x = 1;\"); /* let y = 2; { */\nlet d = r#\"}\"#;";
        assert_eq!(top_level_names(code), [vec!["c"], vec!["d"]]);
        assert_eq!(untyped_lets(code).len(), 2);
    }

    #[test]
    fn finds_bindings_without_types() {
        let lets = untyped_lets(
            "let job = launch(s)?;\nlet mut n = 1; let t: u8 = 2; let (a, b) = p;\n\
             let Some(x) = y else { return };\nlet (c, d): (u8, u8) = q;\nlet _ = z;",
        );
        let names: Vec<Vec<&str>> = lets.iter().map(|l| l.names()).collect();
        assert_eq!(names, [vec!["job"], vec!["n"], vec!["a", "b"]]);
    }

    #[test]
    fn types_with_holes_are_left_to_the_compiler() {
        assert!(is_complete("trainbook_api::JobSpec"));
        assert!(is_complete("Vec<(String, f64)>"));
        assert!(!is_complete("_"));
        assert!(!is_complete("Vec<_>"));
        assert!(!is_complete("Option<{unknown}>"));
    }

    #[test]
    fn reads_the_variable_from_evcxrs_message() {
        assert_eq!(
            untyped_variable("Couldn't automatically determine type of variable `job`.\nPlease give it an explicit type.").as_deref(),
            Some("job")
        );
        assert_eq!(untyped_variable("something else"), None);
    }

    #[test]
    fn reads_the_type_from_rustcs_message() {
        assert_eq!(
            found_in("expected `()`, found `Job`").as_deref(),
            Some("Job")
        );
        assert_eq!(
            found_in("expected `()`, found `(u64, JobStatus)`").as_deref(),
            Some("(u64, JobStatus)")
        );
        assert_eq!(
            found_in("expected `()`, found `{closure@src/lib.rs:3:9}`"),
            None
        );
    }
}
