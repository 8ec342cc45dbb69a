//! The loss plot against real SVG parsing and real rasterisation.

use trainbook_widgets::{
    downsample_minmax, loss_svg, svg_to_png, Curves, PlotOptions, MAX_PLOT_POINTS,
};

/// A two-rank run: losses falling with noise and one spike, three validation epochs.
fn run(steps: u64) -> Curves {
    let mut c = Curves::new(2);
    for s in 1..=steps {
        let base = 2.0 * (-(s as f64) / (steps as f64 / 3.0)).exp() + 0.1;
        let spike = if s == steps / 2 { 5.0 } else { 0.0 };
        for r in 0..2 {
            let noise = ((s * 7 + r * 13) % 17) as f64 / 100.0;
            c.train_loss(r as usize, s, base + noise + spike);
        }
        if steps >= 3 && s % (steps / 3).max(1) == 0 {
            c.validation(s, Some(base + 0.05), Some(1.0 - base / 2.2));
        }
    }
    c.flush();
    c
}

/// (stroke colour, number of points) of every polyline in the document.
fn polylines(svg: &str) -> Vec<(String, usize)> {
    let doc = roxmltree::Document::parse(svg).expect("the plot is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.tag_name().name() == "polyline")
        .map(|n| {
            (
                n.attribute("stroke").unwrap_or("").to_string(),
                n.attribute("points")
                    .unwrap_or("")
                    .split_whitespace()
                    .count(),
            )
        })
        .collect()
}

fn texts(svg: &str) -> String {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants()
        .filter(|n| n.tag_name().name() == "text")
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join("|")
}

#[test]
fn svg_parses_and_holds_train_val_and_accuracy_series() {
    let svg = loss_svg(&run(300), &PlotOptions::default());
    let lines = polylines(&svg);
    let train: Vec<_> = lines.iter().filter(|(c, _)| c == "#1565C0").collect();
    let val: Vec<_> = lines.iter().filter(|(c, _)| c == "#C62828").collect();
    let acc: Vec<_> = lines.iter().filter(|(c, _)| c == "#2E7D32").collect();
    assert!(
        train.iter().any(|(_, n)| *n == 300),
        "train line with 300 points: {lines:?}"
    );
    assert!(
        val.iter().any(|(_, n)| *n == 3),
        "val loss with 3 epochs: {lines:?}"
    );
    assert!(
        acc.iter().any(|(_, n)| *n == 3),
        "val accuracy with 3 epochs: {lines:?}"
    );
    let t = texts(&svg);
    for label in [
        "step",
        "loss",
        "val accuracy",
        "train loss (mean of 2 ranks)",
        "val loss",
    ] {
        assert!(t.contains(label), "label {label:?} missing from {t}");
    }
    assert!(
        svg.contains("<polygon"),
        "the min–max band across ranks is drawn"
    );
}

#[test]
fn zero_one_and_a_million_points_render() {
    let empty = loss_svg(&Curves::new(2), &PlotOptions::default());
    assert!(texts(&empty).contains("waiting for the first training step"));
    let mut one = Curves::new(1);
    one.train_loss(0, 1, 0.7);
    let svg = loss_svg(&one, &PlotOptions::default());
    assert!(
        polylines(&svg)
            .iter()
            .any(|(c, n)| c == "#1565C0" && *n == 1),
        "{svg}"
    );

    let big = run(1_000_000);
    assert!(big.train.points().len() <= trainbook_widgets::series::DEFAULT_SERIES_CAPACITY);
    let svg = loss_svg(&big, &PlotOptions::default());
    let lines = polylines(&svg);
    let longest = lines.iter().map(|(_, n)| *n).max().unwrap();
    assert!(longest <= MAX_PLOT_POINTS, "{longest} points drawn");
    assert!(
        svg.len() < 200_000,
        "SVG of a 10^6-step run is {} bytes",
        svg.len()
    );
    // The spike at step 500,000 (loss > 5) survives storage compaction and down-sampling.
    let max = big
        .train
        .for_plot()
        .iter()
        .map(|p| p.1)
        .fold(f64::MIN, f64::max);
    assert!(max > 5.0, "spike lost: max drawn loss {max}");
}

#[test]
fn non_finite_losses_are_flagged_not_drawn() {
    let mut c = Curves::new(2);
    c.train_loss(0, 1, 0.9);
    c.train_loss(1, 1, 0.8);
    c.train_loss(0, 2, f64::NAN);
    c.train_loss(1, 2, 0.7);
    c.train_loss(0, 3, f64::INFINITY);
    c.train_loss(1, 3, f64::INFINITY);
    c.train_loss(0, 4, 0.5);
    c.train_loss(1, 4, 0.5);
    c.validation(4, Some(f64::NEG_INFINITY), Some(0.5));
    c.flush();
    assert_eq!(c.non_finite().0, 3);
    let svg = loss_svg(&c, &PlotOptions::default());
    assert!(
        !svg.contains("NaN") || texts(&svg).contains("NaN"),
        "no NaN coordinates"
    );
    let t = texts(&svg);
    assert!(
        t.contains("3 non-finite loss values (first: NaN at step 2)"),
        "{t}"
    );
    assert!(trainbook_widgets::plot::summary(&c).contains("⚠ 3 non-finite"));
    let log = loss_svg(
        &c,
        &PlotOptions {
            log_y: true,
            ..PlotOptions::default()
        },
    );
    assert!(texts(&log).contains("loss (log scale)"));
}

#[test]
fn downsampling_keeps_each_buckets_min_and_max() {
    let points: Vec<(f64, f64)> = (0..10_000)
        .map(|i| {
            (
                i as f64,
                ((i * 7919) % 1000) as f64 + if i == 4321 { 1e6 } else { 0.0 },
            )
        })
        .collect();
    let max_points = 100;
    let out = downsample_minmax(&points, max_points);
    assert!(out.len() <= max_points);
    assert_eq!(out.first(), points.first());
    assert_eq!(out.last(), points.last());
    assert!(out.windows(2).all(|w| w[0].0 < w[1].0), "x order kept");
    let inner = &points[1..points.len() - 1];
    let buckets = (max_points - 2) / 2;
    for b in 0..buckets {
        let bucket = &inner[b * inner.len() / buckets..(b + 1) * inner.len() / buckets];
        let lo = bucket.iter().map(|p| p.1).fold(f64::MAX, f64::min);
        let hi = bucket.iter().map(|p| p.1).fold(f64::MIN, f64::max);
        let x0 = bucket[0].0;
        let x1 = bucket[bucket.len() - 1].0;
        let kept: Vec<f64> = out
            .iter()
            .filter(|p| p.0 >= x0 && p.0 <= x1)
            .map(|p| p.1)
            .collect();
        assert!(
            kept.contains(&lo) && kept.contains(&hi),
            "bucket {b}: {kept:?} lacks {lo} or {hi}"
        );
    }
    assert!(out.iter().any(|p| p.1 >= 1e6), "the spike survives");
    assert_eq!(downsample_minmax(&points[..5], max_points).len(), 5);
}

#[test]
fn png_fallback_is_a_real_image_of_the_plot() {
    let svg = loss_svg(&run(200), &PlotOptions::default());
    let png = svg_to_png(&svg).expect("rasterises");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let img = image_size(&png);
    assert_eq!(img, (720, 300));
    if let Ok(dir) = std::env::var("TRAINBOOK_WIDGET_ARTIFACTS") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(format!("{dir}/loss.png"), &png).unwrap();
        std::fs::write(format!("{dir}/loss.svg"), &svg).unwrap();
    }
}

/// Width and height from a PNG's IHDR chunk.
fn image_size(png: &[u8]) -> (u32, u32) {
    let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
    (w, h)
}

/// x pixel of every point of every polyline stroked in `colour`.
fn polyline_xs(svg: &str, colour: &str) -> Vec<Vec<i64>> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants()
        .filter(|n| n.tag_name().name() == "polyline" && n.attribute("stroke") == Some(colour))
        .map(|n| {
            n.attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .map(|p| p.split(',').next().unwrap().parse().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn a_restart_is_a_dashed_line_where_the_replay_began() {
    let plain = run(40);
    let svg = loss_svg(&plain, &PlotOptions::default());
    assert!(polyline_xs(&svg, "#EF6C00").is_empty());
    assert!(!texts(&svg).contains("restart"));
    assert!(!trainbook_widgets::plot::summary(&plain).contains("restart"));

    let mut c = Curves::new(2);
    for s in 1..=25 {
        c.train_loss(0, s, 1.0);
        c.train_loss(1, s, 1.0);
    }
    c.restart(20);
    for s in 21..=40 {
        c.train_loss(0, s, 0.5);
        c.train_loss(1, s, 0.5);
    }
    c.flush();
    let svg = loss_svg(&c, &PlotOptions::default());
    let dashes = polyline_xs(&svg, "#EF6C00");
    assert!(dashes.len() > 3, "a dashed line: {dashes:?}");
    let train = &polyline_xs(&svg, "#1565C0")[0];
    assert_eq!(train.len(), 40, "each step drawn once");
    let at_step_20 = train[19];
    assert!(
        dashes.iter().flatten().all(|&x| x == at_step_20),
        "vertical at step 20 (x = {at_step_20}): {dashes:?}"
    );
    assert!(texts(&svg).contains("restart"), "{}", texts(&svg));
    let summary = trainbook_widgets::plot::summary(&c);
    assert!(
        summary.ends_with(" · 1 restart (resumed at step 20)"),
        "{summary}"
    );
    c.restart(30);
    assert!(
        trainbook_widgets::plot::summary(&c).ends_with(" · 2 restarts (last resumed at step 30)")
    );
    assert_eq!(
        polyline_xs(&loss_svg(&c, &PlotOptions::default()), "#EF6C00")
            .iter()
            .flatten()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        2,
        "two markers"
    );
}
