//! `trainbook-cell-worker`: the worker process of tasks defined in notebook cells. Built by
//! `scripts/build-torch-library.sh` against the trainbook_torch library (linked dynamically, as the cells link
//! it), so the cell library a worker loads shares this process's one copy of trainbook.
fn main() {
    std::process::exit(trainbook_torch::recipes::worker_main());
}
