//! Build script of the packages with binaries that link the engine: an rpath to the libtorch
//! the c10d shim was built against (nothing needs LD_LIBRARY_PATH), and on CUDA builds
//! libtorch_cuda kept against rustc's --as-needed (nothing references it directly, so it would
//! be dropped and CUDA would show as unavailable). Link arguments do not travel from a
//! dependency's build script to another package's binaries, so each such package runs this.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TRAINBOOK_C10D_LIBTORCH_LIB");
    let lib = std::env::var("DEP_TRAINBOOK_C10D_LIBTORCH_LIB")
        .expect("trainbook-engine did not export its libtorch directory");
    if std::env::var("DEP_TRAINBOOK_C10D_CUDA").as_deref() == Ok("1") {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
    // hpu builds: the Python the worker embeds may live outside the loader's default path.
    println!("cargo:rerun-if-env-changed=DEP_TRAINBOOK_HPU_PYTHON_LIBDIR");
    if let Ok(py) = std::env::var("DEP_TRAINBOOK_HPU_PYTHON_LIBDIR") {
        if !py.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{py}");
        }
    }
    println!("cargo:rustc-link-search=native={lib}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
}
