//! Builds the c10d shim against the same libtorch as torch-sys, and bakes an rpath to that
//! libtorch into the engine's own test binaries; packages with binaries get the same through
//! `link_binaries.rs`, from the directory exported here.

use std::env;
use std::path::PathBuf;

fn main() {
    // Every file under csrc/ (csrc/engine.cpp lists the ones compiled).
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=TRAINBOOK_GLOO_INCLUDE");

    // torch-sys declares `links = "tch"` and exports the library directory it linked against.
    let lib_dir = PathBuf::from(
        env::var("DEP_TCH_LIBTORCH_LIB")
            .expect("torch-sys did not export its libtorch directory (DEP_TCH_LIBTORCH_LIB)"),
    );
    let root = env::var("LIBTORCH").map(PathBuf::from).unwrap_or_else(|_| {
        lib_dir
            .parent()
            .expect("libtorch lib dir has a parent")
            .to_path_buf()
    });
    let include = root.join("include");
    let c10d = include.join("torch/csrc/distributed/c10d/ProcessGroupGloo.hpp");
    if !c10d.exists() {
        panic!(
            "{} is missing: trainbook needs the c10d headers of a libtorch built with distributed \
             support (the PyPI torch wheel has them); run `make setup`",
            c10d.display()
        );
    }
    // libtorch ships no gloo headers; Debian's libgloo-dev provides them. Only the headers are
    // used (gloo objects are held through shared_ptr): never link Debian's libgloo, which would
    // shadow the gloo compiled into libtorch_cpu.
    let gloo_include = env::var("TRAINBOOK_GLOO_INCLUDE").unwrap_or_else(|_| "/usr/include".into());
    if !PathBuf::from(&gloo_include)
        .join("gloo/algorithm.h")
        .exists()
    {
        panic!(
            "gloo headers not found under {gloo_include}: install them (`apt-get install \
             libgloo-dev`, which `make setup` does) or set TRAINBOOK_GLOO_INCLUDE"
        );
    }

    let cuda = env::var("CARGO_FEATURE_CUDA").is_ok();
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        // One translation unit that includes every csrc/*.cpp: libtorch's headers parsed once.
        .file("csrc/engine.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include(&gloo_include)
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DUSE_C10D_GLOO")
        .flag("-DUSE_DISTRIBUTED")
        .flag("-DGLOG_USE_GLOG_EXPORT");
    if cuda {
        // ProcessGroupNCCL.hpp includes nccl.h: the nvidia-nccl wheel ships it.
        build
            .flag("-DUSE_C10D_NCCL")
            .flag("-DUSE_CUDA")
            .define("TRAINBOOK_WITH_NCCL", None);
        // Colon-separated include directories (nccl.h, CUDA runtime, CCCL, cuSOLVER), from the
        // environment or from the list scripts/libtorch-layout.sh writes.
        let listed = root.join("cuda-includes");
        let dirs = env::var("TRAINBOOK_CUDA_INCLUDE")
            .ok()
            .or_else(|| std::fs::read_to_string(&listed).ok())
            .unwrap_or_default();
        for d in dirs.trim().split(':').filter(|d| !d.is_empty()) {
            build.include(d);
        }
        println!("cargo:rerun-if-env-changed=TRAINBOOK_CUDA_INCLUDE");
        println!("cargo:rerun-if-changed={}", listed.display());
    }
    build.compile("trainbook_c10d");

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    if cuda {
        // rustc links with --as-needed, which silently drops libtorch_cuda (nothing references
        // it directly) and CUDA then shows as unavailable; keep it.
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
        // The shim's CUDA memory query (CUDACachingAllocator) lives in libc10_cuda.
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    // errors.h, for the C++ of packages that extend the engine (trainbook-hpu).
    println!(
        "cargo:include={}",
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap())
            .join("csrc")
            .display()
    );
    // Read by link_binaries.rs in the packages that depend on this one.
    println!("cargo:libtorch_lib={}", lib_dir.display());
    println!("cargo:cuda={}", if cuda { 1 } else { 0 });
    println!(
        "cargo:rustc-env=TRAINBOOK_LIBTORCH_LIB={}",
        lib_dir.display()
    );
}
