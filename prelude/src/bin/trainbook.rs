//! The `trainbook` command line.
fn main() {
    std::process::exit(trainbook::commands::main());
}
