//! Every training option is declared once, with [`options!`]: one line (name, type, doc, resolved
//! type) becomes the field users set (`None` = "the preset decides"), its `--flag` in the CLI
//! (clap reads the same doc comment as its help), its builder method, its field in the resolved
//! hyper-parameters and the rule that puts the user's value over the preset's. Adding an option
//! is one line here (or beside its recipe) plus the code that uses it.
//!
//! The shared options are declared in `spec.rs`; a recipe's own options beside the recipe. A
//! job carries recipe options by name ([`crate::spec::JobSpec::options`]), so the engine needs
//! no recipe's types, and reads them back typed with `recipe_options::<T>()`, which rejects an
//! option the recipe does not have.

/// Declares a group of options. For
///
/// ```ignore
/// options! {
///     /// Options of text recipes.
///     struct TextOptions => TextSettings, trait ConfigureText(text_options) {
///         /// Tokens per text after truncation.
///         #[arg(value_name = "N")]
///         max_length: usize => usize,
///         /// Name of the text column.
///         text_column: String [into] => String,
///     }
/// }
/// ```
///
/// it defines `TextOptions` (every field an `Option`, a `clap::Args` with one `--long` flag per
/// field, serde with missing fields as `None`), `TextSettings` (the resolved values, the right
/// side of `=>`; `Option<T>` there means "may stay unset") with
/// `with_overrides(&TextOptions)`, and the builder trait `ConfigureText`, whose implementors
/// give access to their `TextOptions` through `text_options`. `[into]` makes the builder
/// method take `impl Into<T>` (for strings and paths). `extra { ... }` adds resolved fields that
/// are not options (set by whoever resolves; `Default` when absent from a file).
#[doc(hidden)]
#[macro_export]
macro_rules! options {
    (
        $(#[doc = $sdoc:literal])*
        struct $opts:ident => $resolved:ident, trait $setters:ident($acc:ident) {
            $(
                $(#[doc = $doc:literal])*
                $(#[arg($($arg:tt)*)])*
                $name:ident : $ty:ty $([$into:ident])? => $res:ty,
            )*
        }
        $(extra {
            $(
                $(#[doc = $xdoc:literal])*
                $xname:ident : $xty:ty,
            )*
        })?
    ) => {
        $(#[doc = $sdoc])*
        ///
        /// Every field is optional: `None` leaves the value to the recipe's preset.
        #[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize, clap::Args)]
        #[serde(default)]
        pub struct $opts {
            $(
                $(#[doc = $doc])*
                #[arg(long)]
                $(#[arg($($arg)*)])*
                pub $name: Option<$ty>,
            )*
        }

        #[doc = concat!("The resolved values of [`", stringify!($opts), "`]: the preset's, with the job's options on top.")]
        #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        pub struct $resolved {
            $(
                $(#[doc = $doc])*
                // Missing in files written before the option existed: the type's default.
                #[serde(default)]
                pub $name: $res,
            )*
            $($(
                $(#[doc = $xdoc])*
                #[serde(default)]
                pub $xname: $xty,
            )*)?
        }

        impl $resolved {
            /// These values with every option the job sets put over them.
            pub fn with_overrides(mut self, options: &$opts) -> Self {
                $(
                    if let ::std::option::Option::Some(v) = &options.$name {
                        self.$name = ::std::convert::From::from(::std::clone::Clone::clone(v));
                    }
                )*
                self
            }
        }

        #[doc = concat!("Builder methods for [`", stringify!($opts), "`], one per option.")]
        pub trait $setters: Sized {
            #[doc = concat!("Lets `edit` change this builder's [`", stringify!($opts), "`].")]
            fn $acc(&mut self, edit: impl FnOnce(&mut $opts));
            $(
                $crate::options!(@setter $opts $acc [$(#[doc = $doc])*] $name $ty $([$into])?);
            )*
        }
    };
    (@setter $opts:ident $acc:ident [$($doc:tt)*] $name:ident $ty:ty [into]) => {
        $($doc)*
        fn $name(mut self, value: impl ::std::convert::Into<$ty>) -> Self {
            let value: $ty = value.into();
            self.$acc(move |o: &mut $opts| o.$name = ::std::option::Option::Some(value));
            self
        }
    };
    (@setter $opts:ident $acc:ident [$($doc:tt)*] $name:ident $ty:ty) => {
        $($doc)*
        fn $name(mut self, value: $ty) -> Self {
            self.$acc(move |o: &mut $opts| o.$name = ::std::option::Option::Some(value));
            self
        }
    };
}

/// The names of `T`'s options (the keys of its serialised default).
pub fn names<T: serde::Serialize + Default>() -> Vec<String> {
    match serde_json::to_value(T::default()) {
        Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    // The macro makes its items `pub`, as the real options need; this toy is reached from here only.
    #![allow(unreachable_pub)]
    use std::path::PathBuf;

    crate::options! {
        /// Options of this test.
        struct ToyOptions => ToySettings, trait ConfigureToy(toy_options) {
            /// Steps to run.
            #[arg(value_name = "N")]
            steps: u64 => u64,
            /// An optional limit.
            limit: f64 => Option<f64>,
            /// Where to read from.
            path: PathBuf [into] => Option<PathBuf>,
        }
        extra {
            /// Not an option: set by the resolver.
            note: String,
        }
    }

    #[derive(Default)]
    struct Builder(ToyOptions);
    impl ConfigureToy for Builder {
        fn toy_options(&mut self, edit: impl FnOnce(&mut ToyOptions)) {
            edit(&mut self.0)
        }
    }

    fn preset() -> ToySettings {
        ToySettings {
            steps: 10,
            limit: None,
            path: Some("preset".into()),
            note: "n".into(),
        }
    }

    #[test]
    fn builder_methods_set_options_and_overrides_win_over_the_preset() {
        let b = Builder::default().steps(3).path("mine");
        assert_eq!(b.0.steps, Some(3));
        assert_eq!(b.0.limit, None);
        let r = preset().with_overrides(&b.0);
        assert_eq!(r.steps, 3);
        assert_eq!(r.limit, None, "an unset option keeps the preset's value");
        assert_eq!(r.path, Some(PathBuf::from("mine")));
        assert_eq!(r.note, "n");
        let r = preset().with_overrides(&Builder::default().limit(0.5).0);
        assert_eq!((r.steps, r.limit), (10, Some(0.5)));
    }

    #[test]
    fn the_same_declaration_is_the_command_line() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            toy: ToyOptions,
        }
        let cli = Cli::try_parse_from(["x", "--steps", "7", "--path", "p"]).unwrap();
        assert_eq!(cli.toy.steps, Some(7));
        assert_eq!(cli.toy.path, Some(PathBuf::from("p")));
        let help = <Cli as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        assert!(
            help.contains("--steps <N>") && help.contains("Steps to run"),
            "{help}"
        );
        assert!(Cli::try_parse_from(["x", "--steps", "many"]).is_err());
    }

    #[test]
    fn options_read_from_files_may_leave_fields_out() {
        let o: ToyOptions = serde_json::from_str(r#"{"steps": 2}"#).unwrap();
        assert_eq!(o.steps, Some(2));
        assert_eq!(o.path, None);
        let r: ToySettings =
            serde_json::from_str(r#"{"steps": 1, "limit": null, "path": null}"#).unwrap();
        assert_eq!(r.note, "", "extra fields default when absent");
        assert_eq!(super::names::<ToyOptions>(), ["limit", "path", "steps"]);
    }
}
