//! One training worker; started by trainbook's launcher, one per device. It knows the recipes
//! of trainbook-recipes and, in `hpu` builds, Gaudi's bridge, and hands them to the engine's
//! worker loop.
fn main() {
    #[cfg(feature = "hpu")]
    let hpu: trainbook_engine::worker::Hpu = Some(&trainbook_hpu::BRIDGE);
    #[cfg(not(feature = "hpu"))]
    let hpu: trainbook_engine::worker::Hpu = None;
    std::process::exit(trainbook_engine::worker::main(
        &trainbook_recipes::REGISTRY,
        hpu,
    ));
}
