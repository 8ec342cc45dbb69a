//! The `trainbook` command line.
fn main() {
    std::process::exit(trainbook::cli::main());
}
