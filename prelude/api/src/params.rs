//! Notebook parameters as papermill injects them.
//!
//! A notebook's cell tagged `parameters` declares each parameter with its type
//! (`let epochs: Option<u64> = None;`). papermill (with the `trainbook-papermill` translator) and
//! `scripts/notebook.py` add a cell after it that rebinds the names they were given, one line
//! each, with the value in JSON syntax:
//!
//! ```text
//! // Parameters
//! let preset = trainbook::param!(preset = "tiny")?;
//! let epochs = trainbook::param!(epochs = 1)?;
//! ```
//!
//! [`param!`](crate::param) converts the value to the type the parameters cell declared (the
//! translator never sees that cell): `Option<T>` takes `None` from `null` and `Some(v)` from
//! anything `T` takes, so `-p preset tiny` gives an `Option<&str>` parameter `Some("tiny")`.
//! A value that does not fit is a [`ParamError`] that names the parameter, its type, the value
//! and what to pass instead. A name the parameters cell does not declare fails to compile
//! (rustc: "cannot find value `nope` in this scope").

use std::any::type_name;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;

use serde_json::Value;

/// `serde_json::json!`, for [`param!`](crate::param): the cell crate has no serde_json of its own.
#[doc(hidden)]
pub use serde_json::json as __json;

/// Rebinds a parameter to a value written in JSON syntax, with the type it already has:
/// `let NAME = trainbook::param!(NAME = JSON)?;` (papermill's injected cell is made of these).
///
/// ```
/// # use trainbook_api as trainbook;
/// # fn main() -> Result<(), trainbook::ParamError> {
/// let epochs: Option<u64> = None;
/// let preset: Option<&str> = None;
/// let epochs = trainbook::param!(epochs = 2)?;
/// let preset = trainbook::param!(preset = "tiny")?;
/// assert_eq!((epochs, preset), (Some(2), Some("tiny")));
///
/// let num_workers: usize = 2;
/// let err = trainbook::param!(num_workers = 1.5).unwrap_err();
/// assert!(err.to_string().contains("pass a whole number ≥ 0 (papermill: -p num_workers 2)"));
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! param {
    ($name:ident = $($json:tt)+) => {
        $crate::plumbing::macros::rebind(
            ::core::stringify!($name),
            &$name,
            $crate::plumbing::macros::__json!($($json)+),
        )
    };
}

/// `value` converted to `T`, the type of `current` (the parameter as the parameters cell declared
/// it; only its type is used), or an error that says what to pass instead.
pub fn rebind<T: Param>(name: &str, current: &T, value: Value) -> Result<T, ParamError> {
    let _ = current;
    convert(name, value)
}

/// `value` as parameter `name` of type `T`.
fn convert<T: Param>(name: &str, value: Value) -> Result<T, ParamError> {
    T::from_param(&value).map_err(|reason| {
        let mut fix = format!("pass {}", T::expected());
        if let Some(args) = papermill_args(name, &value, T::example()) {
            fix += &format!(" (papermill: {args})");
        }
        ParamError {
            name: name.to_string(),
            declared: short_type_name(type_name::<T>()),
            given: python_repr(&value),
            reason,
            fix,
        }
    })
}

/// A type a notebook parameter can have.
pub trait Param: Sized {
    /// The parameter's value from JSON, or why it does not fit, as a short phrase
    /// ("not a whole number", "item 1 (-2): less than 0").
    fn from_param(v: &Value) -> Result<Self, String>;

    /// What fits, for error messages ("a whole number ≥ 0").
    fn expected() -> String {
        format!("a `{}`", short_type_name(type_name::<Self>()))
    }

    /// A value that fits, for the papermill arguments suggested in error messages.
    fn example() -> Option<Value> {
        None
    }
}

/// A parameter's value that does not fit the type its notebook declares.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct ParamError {
    /// The parameter.
    pub name: String,
    /// Its type in the parameters cell, without module paths (`Option<u64>`).
    pub declared: String,
    /// The value given, as papermill's (Python) side writes it (`None`, `True`, `1.5`, `"tiny"`).
    pub given: String,
    /// Why it does not fit.
    pub reason: String,
    /// What fits, and the papermill arguments that pass it when there is an example
    /// ("pass a whole number ≥ 0 (papermill: -p num_workers 2)").
    pub fix: String,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "parameter `{}` is declared `{}` in the notebook's parameters cell, so it cannot take {} ({}): {}",
            self.name, self.declared, self.given, self.reason, self.fix
        )
    }
}

/// `core::option::Option<alloc::string::String>` → `Option<String>`.
fn short_type_name(full: &str) -> String {
    let mut out = String::with_capacity(full.len());
    // Where the path being read began in `out`: a `::` drops it.
    let mut path_start = 0;
    let mut chars = full.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.truncate(path_start);
            continue;
        }
        out.push(c);
        if !(c.is_alphanumeric() || c == '_') {
            path_start = out.len();
        }
    }
    out
}

/// A JSON value as Python writes it, cut short when long.
fn python_repr(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Null => out.push_str("None"),
            Value::Bool(true) => out.push_str("True"),
            Value::Bool(false) => out.push_str("False"),
            Value::Number(n) => out.push_str(&n.to_string()),
            Value::String(s) => out.push_str(&Value::from(s.as_str()).to_string()),
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write(item, out);
                }
                out.push(']');
            }
            Value::Object(map) => {
                out.push('{');
                for (i, (k, item)) in map.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&Value::from(k.as_str()).to_string());
                    out.push_str(": ");
                    write(item, out);
                }
                out.push('}');
            }
        }
    }
    const MAX: usize = 80;
    let mut out = String::new();
    write(v, &mut out);
    if out.chars().count() > MAX {
        out = out.chars().take(MAX).collect::<String>() + "…";
    }
    out
}

/// papermill command-line arguments that pass `example` as parameter `name`: `-p` for a number,
/// bool or None, and for a word; `-r` (verbatim) when a string parameter was given what `-p`
/// reads as a number or bool; `-y` (YAML, of which JSON is a subset) for lists and dicts.
fn papermill_args(name: &str, given: &Value, example: Option<Value>) -> Option<String> {
    let example = example?;
    Some(match (&example, given) {
        (Value::String(_), Value::Number(_) | Value::Bool(_)) => {
            format!("-r {name} {}", python_repr(given))
        }
        (Value::String(s), _) => format!("-p {name} {s}"),
        (Value::Array(_) | Value::Object(_), _) => {
            let mut yaml = serde_json::Map::new();
            yaml.insert(name.to_string(), example);
            format!("-y '{}'", Value::Object(yaml))
        }
        _ => format!("-p {name} {}", python_repr(&example)),
    })
}

/// Why `v` is not `wanted` ("a string, not a number").
fn mismatch(v: &Value, wanted: &str) -> String {
    let kind = match v {
        Value::Null => return "only an `Option` parameter takes None".to_string(),
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a dict",
    };
    format!("{kind}, not {wanted}")
}

/// `v` as a whole number: an integer, or a float with no fractional part.
fn whole_number(v: &Value) -> Result<i128, String> {
    let Value::Number(n) = v else {
        return Err(mismatch(v, "a whole number"));
    };
    if let Some(u) = n.as_u64() {
        return Ok(u.into());
    }
    if let Some(i) = n.as_i64() {
        return Ok(i.into());
    }
    match n.as_f64() {
        // Whole floats below 2^127 convert exactly.
        Some(x) if x.fract() == 0.0 && x.abs() < 1.7e38 => Ok(x as i128),
        _ => Err("not a whole number".to_string()),
    }
}

/// "a whole number ≥ 0", "a whole number from 0 to 255", "a whole number".
fn whole_numbers(min: i128, max: u128) -> String {
    if min == 0 && max >= u128::from(u32::MAX) {
        "a whole number ≥ 0".to_string()
    } else if min < 0 && max >= i64::MAX as u128 {
        "a whole number".to_string()
    } else {
        format!("a whole number from {min} to {max}")
    }
}

macro_rules! integer_params {
    ($($t:ty),*) => {$(
        impl Param for $t {
            fn from_param(v: &Value) -> Result<Self, String> {
                let n = whole_number(v)?;
                <$t>::try_from(n).map_err(|_| {
                    if n < 0 {
                        format!("less than {}", <$t>::MIN)
                    } else {
                        format!("more than {}", <$t>::MAX)
                    }
                })
            }
            fn expected() -> String {
                whole_numbers(<$t>::MIN as i128, <$t>::MAX as u128)
            }
            fn example() -> Option<Value> {
                Some(Value::from(2))
            }
        }
    )*};
}

integer_params!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

/// `impl Param for TYPE`: what fits, an example, and the conversion of `v`.
macro_rules! param_impl {
    ($t:ty, $expected:expr, $example:expr, |$v:ident| $convert:expr) => {
        impl Param for $t {
            fn from_param($v: &Value) -> Result<Self, String> {
                $convert
            }
            fn expected() -> String {
                $expected
            }
            fn example() -> Option<Value> {
                $example
            }
        }
    };
}

param_impl!(f64, "a number".into(), Some(Value::from(0.5)), |v| v
    .as_f64()
    .ok_or_else(|| mismatch(v, "a number")));

param_impl!(f32, f64::expected(), f64::example(), |v| {
    let x = f64::from_param(v)? as f32;
    if x.is_infinite() {
        return Err(format!("more than an `f32` holds ({:e})", f32::MAX));
    }
    Ok(x)
});

param_impl!(bool, "True or False".into(), Some(Value::Bool(true)), |v| v
    .as_bool()
    .ok_or_else(|| mismatch(v, "True or False")));

param_impl!(String, "a string".into(), Some(Value::from("text")), |v| v
    .as_str()
    .map(String::from)
    .ok_or_else(|| mismatch(v, "a string")));

// Leaks the string: a notebook has few parameters, each set once.
param_impl!(&'static str, String::expected(), String::example(), |v| {
    String::from_param(v).map(|s| &*Box::leak(s.into_boxed_str()))
});

param_impl!(
    PathBuf,
    "a path".into(),
    Some(Value::from("data/train.csv")),
    |v| v
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| mismatch(v, "a path"))
);

param_impl!(Value, "any value".into(), None, |v| Ok(v.clone()));

impl<T: Param> Param for Option<T> {
    fn from_param(v: &Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(None),
            _ => T::from_param(v).map(Some),
        }
    }
    fn expected() -> String {
        format!("{}, or None", T::expected())
    }
    fn example() -> Option<Value> {
        T::example()
    }
}

impl<T: Param> Param for Vec<T> {
    fn from_param(v: &Value) -> Result<Self, String> {
        let Value::Array(items) = v else {
            return Err(mismatch(v, "a list"));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                T::from_param(item).map_err(|e| format!("item {i} ({}): {e}", python_repr(item)))
            })
            .collect()
    }
    fn expected() -> String {
        format!("a list whose items are each {}", T::expected())
    }
    fn example() -> Option<Value> {
        Some(Value::Array(vec![T::example()?]))
    }
}

/// `impl Param for MAP<String, T>`: JSON objects, each value converted.
macro_rules! dict_params {
    ($($map:ident),*) => {$(
        impl<T: Param> Param for $map<String, T> {
            fn from_param(v: &Value) -> Result<Self, String> {
                let Value::Object(map) = v else {
                    return Err(mismatch(v, "a dict"));
                };
                map.iter()
                    .map(|(k, item)| {
                        let key = || format!("key {} ({})", Value::from(k.as_str()), python_repr(item));
                        T::from_param(item)
                            .map(|x| (k.clone(), x))
                            .map_err(|e| format!("{}: {e}", key()))
                    })
                    .collect()
            }
            fn expected() -> String {
                format!("a dict whose values are each {}", T::expected())
            }
            fn example() -> Option<Value> {
                let mut map = serde_json::Map::new();
                map.insert("key".to_string(), T::example()?);
                Some(Value::Object(map))
            }
        }
    )*};
}

dict_params!(BTreeMap, HashMap);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `v` as a `T`, as `param!` converts it.
    fn to<T: Param>(v: Value) -> Result<T, ParamError> {
        convert("x", v)
    }

    fn refusal<T: Param + fmt::Debug>(v: Value) -> String {
        to::<T>(v).unwrap_err().to_string()
    }

    #[test]
    fn the_macro_rebinds_with_the_declared_type() {
        let num_workers: usize = 2;
        let preset: Option<&str> = None;
        let epochs: Option<u64> = None;
        let lr: f64 = 1e-3;
        let runs_root: Option<&str> = None;
        let num_workers = crate::param!(num_workers = 3).unwrap();
        let preset = crate::param!(preset = "tiny").unwrap();
        let epochs = crate::param!(epochs = 1).unwrap();
        let lr = crate::param!(lr = 1e-05).unwrap();
        let runs_root = crate::param!(runs_root = null).unwrap();
        assert_eq!(num_workers, 3usize);
        assert_eq!(preset, Some("tiny"));
        assert_eq!(epochs, Some(1u64));
        assert_eq!(lr, 1e-5);
        assert_eq!(runs_root, None);

        let sizes: Vec<usize> = vec![];
        let sizes = crate::param!(sizes = [1, 2, 3]).unwrap();
        assert_eq!(sizes, [1, 2, 3]);
        let weights: BTreeMap<String, f64> = BTreeMap::new();
        let weights = crate::param!(weights = {"a": 1, "b": 0.5}).unwrap();
        assert_eq!(
            weights,
            BTreeMap::from([("a".into(), 1.0), ("b".into(), 0.5)])
        );
        // What the translator writes beyond i32 (a bare literal would be an overflowing i32).
        let big: u64 = 0;
        let big = crate::param!(big = 18446744073709551615u64).unwrap();
        assert_eq!(big, u64::MAX);
        let small: i64 = 0;
        let small = crate::param!(small = -9223372036854775808i64).unwrap();
        assert_eq!(small, i64::MIN);
        let mixed: Vec<Option<i64>> = vec![];
        let mixed = crate::param!(mixed = [2147483648i64, null, -3]).unwrap();
        assert_eq!(mixed, [Some(2_147_483_648), None, Some(-3)]);
        let scale: f32 = 1.0;
        let scale = crate::param!(scale = 1e+16).unwrap();
        assert_eq!(scale, 1e16);
        let nested: HashMap<String, Vec<Option<&str>>> = HashMap::new();
        let nested = crate::param!(nested = {"a": ["x", null], "b": []}).unwrap();
        assert_eq!(nested["a"], [Some("x"), None]);
        assert!(nested["b"].is_empty());
        let text: String = String::new();
        let text = crate::param!(text = "a \"quoted\"\n\\ \u{e9} \u{1f600}").unwrap();
        assert_eq!(text, "a \"quoted\"\n\\ é 😀");
    }

    #[test]
    fn the_macro_names_the_parameter_in_its_error() {
        let num_workers: usize = 2;
        let err = crate::param!(num_workers = 1.5).unwrap_err();
        assert_eq!(
            err.to_string(),
            "parameter `num_workers` is declared `usize` in the notebook's parameters cell, so it \
             cannot take 1.5 (not a whole number): pass a whole number ≥ 0 \
             (papermill: -p num_workers 2)"
        );
        assert_eq!(
            (err.given.as_str(), err.reason.as_str()),
            ("1.5", "not a whole number")
        );
    }

    #[test]
    fn integers_are_range_checked() {
        assert_eq!(to::<usize>(json!(7)).unwrap(), 7);
        assert_eq!(to::<u8>(json!(255)).unwrap(), 255);
        assert_eq!(to::<u16>(json!(65535)).unwrap(), 65535);
        assert_eq!(to::<u32>(json!(4294967295u64)).unwrap(), u32::MAX);
        assert_eq!(to::<u64>(json!(u64::MAX)).unwrap(), u64::MAX);
        assert_eq!(to::<u128>(json!(u64::MAX)).unwrap(), u128::from(u64::MAX));
        assert_eq!(to::<i8>(json!(-128)).unwrap(), -128);
        assert_eq!(to::<i16>(json!(-3)).unwrap(), -3);
        assert_eq!(to::<i32>(json!(-3)).unwrap(), -3);
        assert_eq!(to::<i64>(json!(i64::MIN)).unwrap(), i64::MIN);
        assert_eq!(to::<i128>(json!(-1)).unwrap(), -1);
        assert_eq!(to::<isize>(json!(-1)).unwrap(), -1);
        // A float with no fractional part is a whole number.
        assert_eq!(to::<u64>(json!(2.0)).unwrap(), 2);

        let e = refusal::<usize>(json!(-1));
        assert!(
            e.contains("cannot take -1 (less than 0): pass a whole number ≥ 0"),
            "{e}"
        );
        let e = refusal::<u8>(json!(256));
        assert!(
            e.contains("(more than 255): pass a whole number from 0 to 255"),
            "{e}"
        );
        let e = refusal::<i8>(json!(-129));
        assert!(
            e.contains("(less than -128): pass a whole number from -128 to 127"),
            "{e}"
        );
        let e = refusal::<i64>(json!(u64::MAX));
        assert!(e.contains("(more than 9223372036854775807): pass a whole number (papermill"));
        let e = refusal::<usize>(json!(1.5));
        assert!(e.contains("cannot take 1.5 (not a whole number)"), "{e}");
        let e = refusal::<u64>(json!(1e300));
        assert!(e.contains("(not a whole number)"), "{e}");
        let e = refusal::<u32>(json!("2"));
        assert!(
            e.contains("cannot take \"2\" (a string, not a whole number)"),
            "{e}"
        );
        let e = refusal::<u32>(json!(true));
        assert!(
            e.contains("cannot take True (a bool, not a whole number)"),
            "{e}"
        );
        let e = refusal::<u32>(json!(null));
        assert!(e.contains("cannot take None (only an `Option` parameter takes None)"));
        assert!(e.ends_with("(papermill: -p x 2)"), "{e}");
    }

    #[test]
    fn floats_take_any_number() {
        assert_eq!(to::<f64>(json!(0.25)).unwrap(), 0.25);
        assert_eq!(to::<f64>(json!(3)).unwrap(), 3.0);
        assert_eq!(to::<f64>(json!(-1e-300)).unwrap(), -1e-300);
        assert_eq!(to::<f32>(json!(0.5)).unwrap(), 0.5f32);
        assert_eq!(to::<f32>(json!(-2)).unwrap(), -2.0f32);
        let e = refusal::<f32>(json!(1e300));
        assert!(e.contains("(more than an `f32` holds (3.4028235e38)): pass a number"));
        let e = refusal::<f64>(json!("0.1"));
        assert!(e.contains("(a string, not a number): pass a number (papermill: -p x 0.5)"));
    }

    #[test]
    fn bools_take_only_bools() {
        assert!(to::<bool>(json!(true)).unwrap());
        assert!(!to::<bool>(json!(false)).unwrap());
        let e = refusal::<bool>(json!(1));
        assert!(e.contains("cannot take 1 (a number, not True or False): pass True or False"));
        assert!(e.ends_with("(papermill: -p x True)"), "{e}");
        let e = refusal::<bool>(json!("true"));
        assert!(e.contains("(a string, not True or False)"), "{e}");
    }

    #[test]
    fn strings_and_paths_take_strings() {
        assert_eq!(to::<String>(json!("tiny")).unwrap(), "tiny");
        assert_eq!(to::<&str>(json!("tiny")).unwrap(), "tiny");
        assert_eq!(to::<&str>(json!("")).unwrap(), "");
        assert_eq!(
            to::<PathBuf>(json!("runs/a b")).unwrap(),
            PathBuf::from("runs/a b")
        );
        // What papermill's -p reads as a number is refused, with -r (verbatim) as the fix.
        let e = refusal::<String>(json!(2));
        assert!(e.contains("is declared `String`"), "{e}");
        assert!(e.contains("cannot take 2 (a number, not a string): pass a string"));
        assert!(e.ends_with("(papermill: -r x 2)"), "{e}");
        let e = refusal::<&str>(json!(false));
        assert!(e.contains("is declared `&str`") && e.ends_with("(papermill: -r x False)"));
        let e = refusal::<PathBuf>(json!(["a"]));
        assert!(e.contains("is declared `PathBuf`"), "{e}");
        assert!(e.contains("cannot take [\"a\"] (a list, not a path): pass a path"));
        assert!(e.ends_with("(papermill: -p x data/train.csv)"), "{e}");
    }

    #[test]
    fn options_take_none_or_what_their_type_takes() {
        assert_eq!(to::<Option<u64>>(json!(null)).unwrap(), None);
        assert_eq!(to::<Option<u64>>(json!(3)).unwrap(), Some(3));
        assert_eq!(to::<Option<&str>>(json!("tiny")).unwrap(), Some("tiny"));
        assert_eq!(to::<Option<String>>(json!(null)).unwrap(), None);
        assert_eq!(to::<Option<bool>>(json!(false)).unwrap(), Some(false));
        assert_eq!(to::<Option<f64>>(json!(1)).unwrap(), Some(1.0));
        assert_eq!(to::<Option<Option<u8>>>(json!(4)).unwrap(), Some(Some(4)));
        assert_eq!(to::<Option<Vec<u8>>>(json!([1])).unwrap(), Some(vec![1]));
        assert_eq!(to::<Option<Vec<u8>>>(json!(null)).unwrap(), None);
        let e = refusal::<Option<u64>>(json!(-2));
        assert!(e.contains("is declared `Option<u64>`"), "{e}");
        assert!(e.contains("cannot take -2 (less than 0): pass a whole number ≥ 0, or None"));
        assert!(e.ends_with("(papermill: -p x 2)"), "{e}");
        let e = refusal::<Option<&str>>(json!(2));
        assert!(
            e.contains("`Option<&str>`") && e.ends_with("(papermill: -r x 2)"),
            "{e}"
        );
    }

    #[test]
    fn lists_convert_every_item() {
        assert_eq!(to::<Vec<u8>>(json!([])).unwrap(), Vec::<u8>::new());
        assert_eq!(to::<Vec<String>>(json!(["a", "b"])).unwrap(), ["a", "b"]);
        assert_eq!(
            to::<Vec<Option<f64>>>(json!([1, null, 2.5])).unwrap(),
            [Some(1.0), None, Some(2.5)]
        );
        assert_eq!(
            to::<Vec<Vec<i32>>>(json!([[1], [], [-2, 3]])).unwrap(),
            [vec![1], vec![], vec![-2, 3]]
        );
        let e = refusal::<Vec<usize>>(json!([1, -2]));
        assert!(e.contains("is declared `Vec<usize>`"), "{e}");
        assert!(
            e.contains("cannot take [1, -2] (item 1 (-2): less than 0): pass a list whose items are each a whole number ≥ 0"),
            "{e}"
        );
        assert!(e.ends_with("(papermill: -y '{\"x\":[2]}')"), "{e}");
        let e = refusal::<Vec<Vec<u8>>>(json!([[1], [2, "3"]]));
        assert!(e.contains("(item 1 ([2, \"3\"]): item 1 (\"3\"): a string, not a whole number)"));
        let e = refusal::<Vec<u8>>(json!(3));
        assert!(e.contains("(a number, not a list)"), "{e}");
    }

    #[test]
    fn dicts_convert_every_value() {
        assert_eq!(
            to::<BTreeMap<String, u8>>(json!({"a": 1, "b": 2})).unwrap(),
            BTreeMap::from([("a".to_string(), 1), ("b".to_string(), 2)])
        );
        assert_eq!(
            to::<HashMap<String, Option<&str>>>(json!({"a": null, "b": "x"})).unwrap(),
            HashMap::from([("a".to_string(), None), ("b".to_string(), Some("x"))])
        );
        assert_eq!(
            to::<BTreeMap<String, Vec<f64>>>(json!({"w": [1, 0.5]})).unwrap()["w"],
            [1.0, 0.5]
        );
        let e = refusal::<BTreeMap<String, u8>>(json!({"a": 1, "b": "x"}));
        assert!(e.contains("is declared `BTreeMap<String, u8>`"), "{e}");
        assert!(
            e.contains("(key \"b\" (\"x\"): a string, not a whole number)"),
            "{e}"
        );
        assert!(e.contains("pass a dict whose values are each a whole number from 0 to 255"));
        assert!(e.ends_with("(papermill: -y '{\"x\":{\"key\":2}}')"), "{e}");
        let e = refusal::<HashMap<String, u8>>(json!([1]));
        assert!(e.contains("is declared `HashMap<String, u8>`"), "{e}");
        assert!(e.contains("(a list, not a dict)"), "{e}");
    }

    #[test]
    fn a_json_value_takes_anything() {
        for v in [
            json!(null),
            json!(true),
            json!(1),
            json!(-1.5),
            json!("s"),
            json!([1, "a", null]),
            json!({"k": {"n": [1]}}),
        ] {
            assert_eq!(to::<Value>(v.clone()).unwrap(), v);
        }
        assert_eq!(
            to::<Option<Value>>(json!(null)).unwrap(),
            None,
            "null is None for an Option"
        );
    }

    #[test]
    fn errors_without_an_example_suggest_no_arguments() {
        #[derive(Debug)]
        struct Odd;
        impl Param for Odd {
            fn from_param(_: &Value) -> Result<Self, String> {
                Err("never".into())
            }
        }
        let e = refusal::<Odd>(json!(1));
        assert!(e.ends_with("cannot take 1 (never): pass a `Odd`"), "{e}");
    }

    #[test]
    fn type_names_lose_their_paths() {
        assert_eq!(short_type_name(type_name::<Option<&str>>()), "Option<&str>");
        assert_eq!(
            short_type_name(type_name::<HashMap<String, Vec<PathBuf>>>()),
            "HashMap<String, Vec<PathBuf>>"
        );
        assert_eq!(short_type_name(type_name::<Value>()), "Value");
        assert_eq!(short_type_name("(u8, a::b::C)"), "(u8, C)");
    }

    #[test]
    fn long_values_are_cut_short_in_messages() {
        let long: Vec<u32> = (0..100).collect();
        let e = refusal::<u8>(json!(long));
        assert!(e.contains("cannot take [0, 1, 2,"), "{e}");
        assert!(e.contains("…"), "{e}");
    }
}
