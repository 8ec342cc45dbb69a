//! One training worker; started by trainbook's launcher, one per device.
fn main() {
    std::process::exit(trainbook::worker::main());
}
