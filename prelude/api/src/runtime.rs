//! How this crate reaches the engine that runs jobs, without naming it.
//!
//! Why: every notebook cell is compiled against the crate it calls, and rustc reads the
//! metadata of that crate's whole dependency graph for every cell. The engine's graph (libtorch
//! bindings, polars, tokenizers, ~300 crates) made each cell cost ~0.3 s more than this crate's
//! small one. So cells compile against this crate only, and the operations that need the
//! engine go through *ports*: small traits, each declared next to what it serves (`Jobs` in
//! `job`, `Sweeps` in `sweep`, ...), implemented once by the `trainbook` crate and found here
//! at run time by their type. This module knows none of them, so no module of this crate
//! depends on the modules that call the engine:
//!
//! - In a program that depends on `trainbook` (the CLI, tests, a user's own binary), the
//!   `trainbook` crate registers its ports before `main` ([`register`]).
//! - In the trainbook kernel, cells link their own copy of this crate, while the engine lives in
//!   the trainbook_torch library (`TRAINBOOK_TORCH_DYLIB`, loaded into the cell process on
//!   first use). That library exports two symbols: the fingerprint of the copy of this crate it
//!   was built with, and its [`Ports`]. A cell checks the fingerprint before it takes
//!   them, because values cross between the two copies and both must be the same build
//!   of this crate: the same layouts, and the same `TypeId`s, by which ports are found and the
//!   engine's displays downcast. The fingerprint is a `TypeId` of this crate, so it tells builds
//!   apart, not only sources.

use std::any::{Any, TypeId};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::sync::{OnceLock, RwLock};

use anyhow::{anyhow, Result};

/// The ports one process has registered (its table of port implementations, not the
/// engine's registry of recipes): each a `&'static dyn Port` of one port trait, kept
/// as `Any` and found by the `TypeId` of that reference type.
pub struct Ports(RwLock<Vec<(TypeId, &'static (dyn Any + Send + Sync))>>);

impl Ports {
    const fn new() -> Self {
        Ports(RwLock::new(Vec::new()))
    }

    fn insert<P: ?Sized + Send + Sync + 'static>(&self, port: &'static P) {
        let key = TypeId::of::<&'static P>();
        let boxed: &'static (dyn Any + Send + Sync) = Box::leak(Box::new(port));
        let mut ports = self.0.write().unwrap_or_else(|e| e.into_inner());
        // The first registration of a port wins (a program that links trainbook twice keeps one).
        if !ports.iter().any(|(k, _)| *k == key) {
            ports.push((key, boxed));
        }
    }

    fn get<P: ?Sized + Send + Sync + 'static>(&self) -> Option<&'static P> {
        let key = TypeId::of::<&'static P>();
        let ports = self.0.read().unwrap_or_else(|e| e.into_inner());
        ports
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, any)| any.downcast_ref::<&'static P>().copied())
    }
}

static REGISTERED: Ports = Ports::new();
static FROM_LIBRARY: OnceLock<std::result::Result<&'static Ports, String>> = OnceLock::new();

/// Makes `port` this process's implementation of the port trait `P` (the first registration
/// wins). The `trainbook` crate calls it before `main`, once per port:
/// `register::<dyn Jobs>(&TRAINBOOK)`.
pub fn register<P: ?Sized + Send + Sync + 'static>(port: &'static P) {
    REGISTERED.insert(port);
}

/// This process's registered ports (what the trainbook_torch library exports to cells).
pub fn registered() -> &'static Ports {
    &REGISTERED
}

/// This process's implementation of the port trait `P`: the registered one, else the
/// trainbook_torch library's.
pub fn port<P: ?Sized + Send + Sync + 'static>() -> Result<&'static P> {
    if let Some(p) = REGISTERED.get::<P>() {
        return Ok(p);
    }
    let library = FROM_LIBRARY
        .get_or_init(from_library)
        .as_ref()
        .map_err(|e| anyhow!("{e}"))?;
    library.get::<P>().ok_or_else(|| {
        anyhow!(
            "trainbook's engine has no {}: the trainbook_torch library is from another version \
             of trainbook; rebuild it with `make build` and restart the kernel",
            std::any::type_name::<P>()
        )
    })
}

/// The fingerprint of this build of the crate (see the module docs), as a C string.
pub fn fingerprint() -> &'static CStr {
    struct Marker;
    static FINGERPRINT: OnceLock<CString> = OnceLock::new();
    FINGERPRINT.get_or_init(|| {
        CString::new(format!("{:?}", std::any::TypeId::of::<Marker>()))
            .expect("a TypeId's Debug form has no NUL")
    })
}

/// `extern "C" fn() -> *const c_char`: the fingerprint of the trainbook_torch library's copy.
pub const FINGERPRINT_SYMBOL: &str = "trainbook_api_fingerprint";
/// `extern "Rust" fn() -> &'static Ports`: the trainbook_torch library's ports.
pub const PORTS_SYMBOL: &str = "trainbook_ports";
/// Where the kernel tells cell processes the trainbook_torch library is.
pub const DYLIB_ENV: &str = "TRAINBOOK_TORCH_DYLIB";

const RTLD_NOW: c_int = 2;
const RTLD_GLOBAL: c_int = 0x100;

extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}

/// The dynamic loader's last error message.
pub fn last_dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc.
    unsafe {
        let e = dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn from_library() -> std::result::Result<&'static Ports, String> {
    let Some(path) = std::env::var_os(DYLIB_ENV) else {
        return Err(format!(
            "trainbook's engine is not loaded in this process. In a program, depend on the \
             `trainbook` crate (not only `trainbook-api`) and use it; in a notebook, use the \
             trainbook kernel (it sets {DYLIB_ENV})"
        ));
    };
    let shown = Path::new(&path).display().to_string();
    let c_path =
        CString::new(path.as_encoded_bytes()).map_err(|_| format!("{DYLIB_ENV} has a NUL byte"))?;
    // SAFETY: loading the trainbook_torch library runs its initialisers, which only register
    // its ports; the symbols are checked below before use.
    unsafe {
        let handle = dlopen(c_path.as_ptr(), RTLD_NOW | RTLD_GLOBAL);
        if handle.is_null() {
            return Err(format!(
                "cannot load the trainbook_torch library {shown}: {}. Rebuild it with `make \
                 build` and restart the kernel",
                last_dl_error()
            ));
        }
        let sym = |name: &str| {
            let c = CString::new(name).expect("symbol names have no NUL");
            let p = dlsym(handle, c.as_ptr());
            if p.is_null() {
                Err(format!(
                    "the trainbook_torch library {shown} has no symbol {name} ({}): it is \
                     from another version of trainbook; rebuild it with `make build` and \
                     restart the kernel",
                    last_dl_error()
                ))
            } else {
                Ok(p)
            }
        };
        let fingerprint: extern "C" fn() -> *const c_char =
            std::mem::transmute(sym(FINGERPRINT_SYMBOL)?);
        let theirs = CStr::from_ptr(fingerprint());
        let ours = self::fingerprint();
        if theirs != ours {
            return Err(format!(
                "the trainbook_torch library {shown} was built with another build of \
                 trainbook-api than this kernel's cells compile against ({theirs:?} vs \
                 {ours:?}): rebuild with `make build` and restart the kernel"
            ));
        }
        let get: fn() -> &'static Ports = std::mem::transmute(sym(PORTS_SYMBOL)?);
        Ok(get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    trait Greets: Send + Sync {
        fn hello(&self) -> &'static str;
    }
    trait Counts: Send + Sync {}
    struct En;
    struct Fr;
    impl Greets for En {
        fn hello(&self) -> &'static str {
            "hello"
        }
    }
    impl Greets for Fr {
        fn hello(&self) -> &'static str {
            "bonjour"
        }
    }

    #[test]
    fn a_port_is_found_by_its_trait_and_the_first_registration_wins() {
        let ports = Ports::new();
        assert!(ports.get::<dyn Greets>().is_none());
        ports.insert::<dyn Greets>(&En);
        ports.insert::<dyn Greets>(&Fr);
        assert_eq!(ports.get::<dyn Greets>().map(|g| g.hello()), Some("hello"));
        // Another trait is another port, even when the same value implements it.
        assert!(ports.get::<dyn Counts>().is_none());
    }

    #[test]
    fn without_the_engine_a_port_names_what_to_do() {
        // This test binary registers no port and its environment names no library.
        if std::env::var_os(DYLIB_ENV).is_some() {
            return;
        }
        let err = port::<dyn Counts>()
            .err()
            .expect("no engine here")
            .to_string();
        assert!(
            err.contains("depend on the `trainbook` crate") && err.contains(DYLIB_ENV),
            "{err}"
        );
    }
}
