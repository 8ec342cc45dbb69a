//! `trainbook check`: allreduce, broadcast and barrier across N worker processes, no training.

use clap::Args;
use trainbook_api::{Configure, DeviceRequest, JobKind, JobSpec};
use trainbook_engine::checkpoint::RunDir;

use super::args::parse_device;

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[arg(short = 'n', long, default_value_t = 2)]
    pub workers: usize,
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceRequest,
}

pub(super) fn run(args: &CheckArgs) -> i32 {
    let CheckArgs { workers, device } = *args;
    let spec = JobSpec::of_kind(JobKind::Check)
        .workers(workers)
        .device(device);
    match crate::fit(spec) {
        Ok(r) => {
            for l in job_logs(&r) {
                println!("{l}");
            }
            println!("trainbook check: {workers} workers on {} passed", r.device);
            0
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

fn job_logs(r: &trainbook_api::TrainResult) -> Vec<String> {
    std::fs::read_to_string(RunDir::new(&r.run_dir).rank_log(0))
        .map(|s| s.lines().map(String::from).collect())
        .unwrap_or_default()
}
