//! `trainbook plan`: what each device would hold for `train` with the same options.

use anyhow::Result;
use trainbook_api::DeviceRequest;

use super::args::TrainArgs;

/// The memory plan on stdout (or as JSON); 3 when the job does not fit.
pub(super) fn run(args: &TrainArgs) -> Result<i32> {
    use trainbook_api::Train;
    let spec = args.to_spec()?;
    let plan = spec.plan()?;
    let Some(memory) = plan.memory else {
        anyhow::bail!(
            "recipe {} reports no model shapes, so it has no memory plan (bert, bert-mlm and synthetic have one)",
            args.recipe
        );
    };
    if args.json {
        println!("{}", serde_json::to_string(&memory)?);
    } else {
        print!("{memory}");
    }
    if spec.device == DeviceRequest::Auto && spec.device_memory.is_some() {
        eprintln!(
            "note: planned for {} workers, what --device auto picks on this machine; to plan for another machine's accelerators name them (--device hpu or --device cuda)",
            memory.device.name()
        );
    }
    Ok(if memory.fits() == Some(false) { 3 } else { 0 })
}
