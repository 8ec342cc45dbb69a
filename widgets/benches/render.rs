//! Render costs of the live dashboard: `cargo bench -p trainbook-widgets --bench render`.
//! Prints one table (median of repeated runs); figures go to docs/benchmarks.md.

use std::time::Instant;
use trainbook_api::JobStatus;
use trainbook_widgets::{
    downsample_minmax, loss_svg, svg_to_png, Curves, Dashboard, DashboardOptions, LogLine,
    PlotOptions,
};

/// Median seconds of `f` over `n` runs.
fn median(n: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[n / 2]
}

fn curves(steps: u64, ranks: usize) -> Curves {
    let mut c = Curves::new(ranks);
    for s in 1..=steps {
        for r in 0..ranks {
            let noise = ((s * 7 + r as u64 * 13) % 17) as f64 / 100.0;
            c.train_loss(r, s, 2.0 / (1.0 + s as f64 / 1e4) + noise);
        }
        if s % (steps / 10).max(1) == 0 {
            c.validation(s, Some(1.0 / (1.0 + s as f64 / 1e4)), Some(0.9));
        }
    }
    c.flush();
    c
}

fn main() {
    let ms = |s: f64| format!("{:.2} ms", s * 1e3);
    println!("| what | median |");
    println!("|---|---|");

    let raw: Vec<(f64, f64)> = (0..1_000_000)
        .map(|i| (i as f64, ((i * 7919) % 1000) as f64))
        .collect();
    println!(
        "| down-sample 10^6 points → 2,000 | {} |",
        ms(median(21, || {
            std::hint::black_box(downsample_minmax(&raw, 2000));
        }))
    );

    // A 10^6-point series, as a single-rank run stores it (no compaction: capacity raised).
    let mut one = Curves::new(1);
    one.train = trainbook_widgets::Series::with_capacity(2_000_000);
    for (x, y) in &raw {
        one.train.push(*x, *y);
    }
    println!(
        "| loss plot SVG, 10^6 raw points | {} |",
        ms(median(21, || {
            std::hint::black_box(loss_svg(&one, &PlotOptions::default()));
        }))
    );

    let big = curves(1_000_000 / 8, 8);
    println!(
        "| loss plot SVG, 10^6 losses (8 ranks × 125k steps, band + val) | {} |",
        ms(median(21, || {
            std::hint::black_box(loss_svg(&big, &PlotOptions::default()));
        }))
    );
    let svg = loss_svg(&big, &PlotOptions::default());
    println!("| SVG size | {} KiB |", svg.len() / 1024);
    let _ = svg_to_png(&svg); // loads system fonts once
    println!(
        "| PNG from that SVG (final view only) | {} |",
        ms(median(11, || {
            std::hint::black_box(svg_to_png(&svg).unwrap());
        }))
    );

    let mut dash = Dashboard::new(
        "bench · 8 workers on cpu",
        8,
        "/tmp/runs/bench",
        DashboardOptions::default(),
    );
    dash.curves = big.clone();
    dash.progress.status = JobStatus::Running;
    for i in 0..20 {
        dash.logs.push(LogLine {
            rank: Some(i % 8),
            text: format!("step {i} loss 0.5"),
            repeats: None,
            is_error: false,
        });
    }
    println!(
        "| live dashboard bundle (HTML + SVG + text) | {} |",
        ms(median(21, || {
            std::hint::black_box(dash.bundle());
        }))
    );
    let live_bytes = serde_json::to_vec(&dash.bundle()).unwrap().len();
    println!("| live dashboard bundle size | {} KiB |", live_bytes / 1024);
    dash.progress.status = JobStatus::Succeeded;
    println!(
        "| final dashboard bundle (+ PNG) | {} |",
        ms(median(11, || {
            std::hint::black_box(dash.bundle());
        }))
    );

    // Per-event cost of keeping the state (what every update costs between redraws).
    let n = 1_000_000u64;
    let mut c = Curves::new(8);
    let t0 = Instant::now();
    for i in 0..n {
        c.train_loss((i % 8) as usize, i / 8 + 1, 0.5);
    }
    let per_loss = t0.elapsed().as_secs_f64() / n as f64;
    let mut logs = trainbook_widgets::LogPanel::new(trainbook_widgets::LogLevel::Info, 10);
    let line = LogLine {
        rank: Some(0),
        text: "train epoch:[0]\tloss:0.123456".into(),
        repeats: None,
        is_error: false,
    };
    let t0 = Instant::now();
    for _ in 0..n {
        logs.push(line.clone());
    }
    let per_log = t0.elapsed().as_secs_f64() / n as f64;
    println!("| per loss event (8 ranks) | {:.0} ns |", per_loss * 1e9);
    println!("| per log line | {:.0} ns |", per_log * 1e9);
}
