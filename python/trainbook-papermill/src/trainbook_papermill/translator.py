"""The papermill translator for trainbook's Rust notebooks.

papermill hands a translator only the parameters (`codify(parameters, comment)`), never the
notebook, so the Rust it writes cannot name the types the `parameters` cell declares. Each value
goes in as JSON instead, and `trainbook::param!` (trainbook-api's `params` module) converts it to
the declared type when the cell runs:

    // Parameters
    let preset = trainbook::param!(preset = "tiny")?;
    let epochs = trainbook::param!(epochs = 1)?;

The value is written as `json.dumps` writes it (null, true/false, numbers, strings, [lists],
{dicts}) with two Rust-isms: strings are Rust string literals (`\\u{e9}`, not `\\u00e9`), and an
integer outside the i32 range carries an `i64`/`u64` suffix (rustc would read a bare one as i32).
What JSON (serde_json) cannot hold is refused here: NaN and infinities, integers outside
-2**63..2**64-1, strings that are not valid Unicode.
"""

import math
import numbers
import re

from papermill.exceptions import PapermillException
from papermill.models import Parameter
from papermill.translators import Translator

#: The kernelspec name the translator is registered for (`trainbook kernel install`'s default).
KERNEL_NAME = "trainbook"

I64_MIN, I64_MAX, U64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1

# Rust's strict and reserved keywords: no `let` can bind them.
RUST_KEYWORDS = frozenset(
    """as async await break const continue crate dyn else enum extern false fn for if impl in let
    loop match mod move mut pub ref return self Self static struct super trait true type unsafe use
    where while abstract become box do final gen macro override priv try typeof unsized virtual
    yield""".split()
)

# `let NAME: TYPE = DEFAULT; // help`, one line.
LET = re.compile(
    r"^\s*let\s+(?:mut\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?::\s*(?P<type>[^=]+?))?\s*="
    r"\s*(?P<default>.+?)\s*;\s*(?://+\s*(?P<help>.*?))?\s*$"
)


class UntranslatableParameter(PapermillException):
    """A parameter value (or name) a Rust notebook cannot receive."""


def rust_string(s):
    """`s` as a Rust string literal (which is also what `serde_json::json!` reads)."""
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif 0xD800 <= code <= 0xDFFF:
            raise UntranslatableParameter(
                f"the string {s!r} holds the lone surrogate {ch!r}, which is not valid Unicode "
                "(often a byte that is not UTF-8); Rust strings hold only valid Unicode"
            )
        elif not ch.isprintable():
            out.append(f"\\u{{{code:x}}}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


class RustTranslator(Translator):
    """papermill's `Translator` for notebooks on the trainbook kernel: JSON values, rebound by
    `trainbook::param!` to the types of the notebook's `parameters` cell."""

    @classmethod
    def translate_none(cls, val):
        return "null"

    @classmethod
    def translate_bool(cls, val):
        return "true" if val else "false"

    @classmethod
    def translate_int(cls, val):
        val = int(val)
        if not I64_MIN <= val <= U64_MAX:
            raise UntranslatableParameter(
                f"{val} is outside the whole numbers a Rust notebook's parameters can hold "
                f"({I64_MIN} to {U64_MAX}: 64-bit JSON numbers)"
            )
        if I32_MIN <= val <= I32_MAX:
            return str(val)
        return f"{val}{'i64' if val <= I64_MAX else 'u64'}"

    @classmethod
    def translate_float(cls, val):
        val = float(val)
        if not math.isfinite(val):
            raise UntranslatableParameter(
                f"{val} cannot be passed to a Rust notebook: its parameters travel as JSON, "
                "which has no NaN or infinity; pass a finite number"
            )
        # repr() always has a '.' or an exponent ('1.0', '1e-05', '1e+16'): a Rust float literal.
        return repr(val)

    @classmethod
    def translate_str(cls, val):
        return rust_string(val)

    @classmethod
    def translate_escaped_str(cls, str_val):
        return rust_string(str(str_val))

    @classmethod
    def translate_list(cls, val):
        return "[" + ", ".join(cls.translate(v) for v in val) + "]"

    @classmethod
    def translate_dict(cls, val):
        return "{" + ", ".join(f"{rust_string(cls.key(k))}: {cls.translate(v)}" for k, v in val.items()) + "}"

    @classmethod
    def key(cls, k):
        """A dict key as JSON has it: a string (`json.dumps` turns numbers, bools and None into
        their JSON text too)."""
        if isinstance(k, str):
            return k
        if k is None or isinstance(k, (bool, numbers.Integral, numbers.Real)):
            return cls.translate(k).removesuffix("i64").removesuffix("u64")
        raise UntranslatableParameter(f"the dict key {k!r} is a {type(k).__name__}; JSON keys are strings")

    @classmethod
    def translate(cls, val):
        if val is None:
            return cls.translate_none(val)
        if isinstance(val, str):
            return cls.translate_str(val)
        if isinstance(val, bool):
            return cls.translate_bool(val)
        if isinstance(val, numbers.Integral):
            return cls.translate_int(val)
        if isinstance(val, numbers.Real):
            return cls.translate_float(val)
        if isinstance(val, dict):
            return cls.translate_dict(val)
        if isinstance(val, (list, tuple)):
            return cls.translate_list(val)
        raise UntranslatableParameter(
            f"a {type(val).__name__} ({val!r}) cannot be passed to a Rust notebook: pass None, a "
            "bool, a number, a string, a list or a dict (a YAML date is a date: quote it for a string)"
        )

    @classmethod
    def comment(cls, cmt_str):
        return f"// {' '.join(str(cmt_str).splitlines())}".strip()

    @classmethod
    def assign(cls, name, str_val):
        return f"let {name} = trainbook::param!({name} = {str_val})?;"

    @classmethod
    def codify(cls, parameters, comment="Parameters"):
        lines = [cls.comment(comment)]
        for name, val in parameters.items():
            if not (isinstance(name, str) and name.isidentifier() and name != "_") or name in RUST_KEYWORDS:
                raise UntranslatableParameter(
                    f"parameter name {name!r} is not a Rust variable name, so no notebook can declare it"
                )
            try:
                lines.append(cls.assign(name, cls.translate(val)))
            except UntranslatableParameter as e:
                raise UntranslatableParameter(f"parameter `{name}`: {e}") from None
        return "\n".join(lines) + "\n"

    @classmethod
    def inspect(cls, parameters_cell):
        """The parameters a `parameters` cell declares, one `let NAME: TYPE = DEFAULT; // help`
        line each (what `papermill --help-notebook` lists); other lines are skipped."""
        source = parameters_cell.source
        if isinstance(source, list):
            source = "".join(source)
        params = []
        for line in source.splitlines():
            m = LET.match(line)
            if m:
                params.append(
                    Parameter(
                        name=m["name"],
                        inferred_type_name=(m["type"] or "None").strip(),
                        default=m["default"],
                        help=m["help"] or "",
                    )
                )
        return params
