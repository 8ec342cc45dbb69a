//! The notebook side of the kernel link, against a Unix socket standing in for the kernel:
//! launched jobs draw a live view, and an interrupt stops them while the process lives on.
//! (The real kernel is driven through Jupyter in tests/kernel/.)

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use trainbook::engine::testing::process_alive;
use trainbook::{Configure, ConfigureTraining, JobSpec, JobStatus, Train};
use trainbook_channel::{decode, ToKernel};

fn tiny() -> JobSpec {
    let runs = crate::common::scratch("notebook-runs");
    JobSpec::new("synthetic")
        .workers(2)
        .preset("tiny")
        .device(trainbook::DeviceRequest::Cpu)
        .runs_root(runs)
}

fn plain(data: &serde_json::Map<String, serde_json::Value>) -> String {
    data["text/plain"].as_str().unwrap_or_default().to_string()
}

// One test: the link is process-wide, like in the kernel's cell process.
#[test]
fn jobs_draw_live_views_and_an_interrupt_stops_them() {
    let dir = crate::common::scratch("notebook-socket");
    let path = dir.join("k.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    trainbook::notebook::attach_to(&path).unwrap();
    let (conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut writer = conn.try_clone().unwrap();
    let mut lines = BufReader::new(conn).lines();
    let mut next = move || -> ToKernel {
        let line = lines.next().expect("kernel link closed").expect("read");
        decode(&line).expect("a channel message")
    };
    assert!(matches!(next(), ToKernel::Hello { .. }));

    // A job that finishes: its display appears at once, updates follow, the last one is final.
    let job = tiny().launch().unwrap();
    let ToKernel::Display {
        display_id, data, ..
    } = next()
    else {
        panic!("the first message after launch is not a display")
    };
    assert!(plain(&data).contains("synthetic"), "{}", plain(&data));
    let result = job.wait().unwrap();
    assert_eq!(result.status, JobStatus::Succeeded);
    let mut updates = 0;
    let last = loop {
        match next() {
            ToKernel::Update {
                display_id: id,
                data,
                ..
            } if id == display_id => {
                updates += 1;
                let text = plain(&data);
                if text.contains("succeeded") {
                    break text;
                }
            }
            _ => {}
        }
    };
    assert!(updates >= 2, "only {updates} updates");
    assert!(last.contains("run directory:"), "{last}");
    assert!(
        last.contains("val loss") && last.contains("val acc"),
        "final metrics missing: {last}"
    );
    assert!(last.contains("checkpoint: "), "{last}");

    // A long job, interrupted from the "kernel": stopped within 5 s, workers gone, and this
    // process (the notebook's state) carries on.
    let job = tiny()
        .max_steps(1_000_000)
        .epochs(100_000)
        .launch()
        .unwrap();
    let ToKernel::Display { display_id, .. } = next() else {
        panic!("no display for the second job")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.progress().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let pids = job.pids();
    assert_eq!(pids.len(), 2);
    let t0 = Instant::now();
    writer.write_all(b"{\"op\":\"interrupt\"}\n").unwrap();
    let err = job.wait().unwrap_err();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert!(format!("{err:#}").contains("stopped"), "{err:#}");
    assert_eq!(job.status(), JobStatus::Stopped);
    assert!(pids.iter().all(|p| !process_alive(*p)), "workers survived");
    loop {
        if let ToKernel::Update {
            display_id: id,
            data,
            ..
        } = next()
        {
            if id == display_id && plain(&data).contains("stopped") {
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
