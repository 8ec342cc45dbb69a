//! Compiles the helper that takes the C++ c10d backend out of a Python backend object, against
//! the headers of the libtorch the engine links and of the Python pyo3 embeds (the same one:
//! `PYO3_PYTHON`, which `make setup` points at the Python whose torch trainbook is built with).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn python() -> String {
    env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn config_var(python: &str, name: &str) -> String {
    let out = Command::new(python)
        .args([
            "-c",
            &format!("import sysconfig; print(sysconfig.get_config_var('{name}') or '')"),
        ])
        .output()
        .unwrap_or_else(|e| panic!("running {python} (PYO3_PYTHON) failed: {e}"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn main() {
    println!("cargo:rerun-if-changed=csrc/backend_from_python.cpp");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let lib_dir = PathBuf::from(
        env::var("DEP_TRAINBOOK_C10D_LIBTORCH_LIB")
            .expect("trainbook-engine did not export its libtorch directory"),
    );
    let root = env::var("LIBTORCH")
        .map(PathBuf::from)
        .unwrap_or_else(|_| lib_dir.parent().expect("libtorch lib dir").to_path_buf());
    let include = root.join("include");
    let python = python();
    let py_include = config_var(&python, "INCLUDEPY");
    if !PathBuf::from(&py_include).join("Python.h").exists() {
        panic!(
            "Python.h not found in {py_include:?} (from {python}): the hpu build needs the headers \
             of the Python it embeds (Debian: python3-dev; the Gaudi container has them)"
        );
    }
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .file("csrc/backend_from_python.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include(&py_include)
        .include(env::var("DEP_TRAINBOOK_C10D_INCLUDE").expect("trainbook-engine exports csrc/"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DUSE_DISTRIBUTED")
        .flag("-DUSE_C10D_GLOO")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .compile("trainbook_hpu");
    let executable = Command::new(&python)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| python.clone());
    println!("cargo:rustc-env=TRAINBOOK_HPU_PYTHON={executable}");
    // libpythonX.Y.so lives outside the loader's default path in venvs built on pyenv and the
    // like; the worker gets an rpath to it.
    println!("cargo:python_libdir={}", config_var(&python, "LIBDIR"));
}
