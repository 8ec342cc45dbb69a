//! One training worker; started by trainbook's launcher, one per device. It knows the recipes
//! of trainbook-recipes and, in `hpu` builds, Gaudi's bridge, and hands them to the engine's
//! worker loop.
fn main() {
    std::process::exit(trainbook_recipes::worker_main());
}
