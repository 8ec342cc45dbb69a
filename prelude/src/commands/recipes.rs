//! `trainbook recipes`: the recipes and their presets.

pub(super) fn run() -> i32 {
    for r in crate::recipes::REGISTRY.entries() {
        println!("{:<12} {}", r.name, r.description);
        for (p, about) in r.presets {
            println!("  --preset {p:<10} {about}");
        }
    }
    0
}
