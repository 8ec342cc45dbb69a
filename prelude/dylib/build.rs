//! The dylib links libtorch (through the trainbook crate); bake in an rpath to the same
//! libtorch the rest of trainbook uses, so the kernel's child process needs no LD_LIBRARY_PATH.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Ok(root) = std::env::var("LIBTORCH") {
        let lib = std::path::Path::new(&root).join("lib");
        let lib = lib.canonicalize().unwrap_or(lib);
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    }
}
