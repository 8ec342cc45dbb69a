//! `trainbook-cell-worker`: the worker process of tasks defined in notebook cells. Built by
//! `scripts/build-prelude.sh` against the prelude library (linked dynamically, as the cells link
//! it), so the cell library a worker loads shares this process's one copy of trainbook.
fn main() {
    std::process::exit(trainbook_prelude::recipes::worker_main());
}
