//! Bench output: markdown tables (printed too), `docs/benchmarks.md` sections replaced on
//! rerun, the machine description, and SVG plots drawn with `plotters` into `docs/`.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result, anyhow};
use plotters::prelude::*;

use crate::build::workspace_root;

/// One bench's section of `docs/benchmarks.md`.
pub struct Section {
    pub title: String,
    /// Markdown: tables, notes, targets, plot links.
    pub body: String,
}

/// A named line of a plot.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn docs() -> PathBuf {
    workspace_root().join("docs")
}

/// A markdown table; also printed to stdout.
pub fn table(headers: &[String], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n|", headers.join(" | "));
    for _ in headers {
        s.push_str("---|");
    }
    s.push('\n');
    for r in rows {
        s.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    println!("{s}");
    s
}

fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Cores, kernel, CPU model and memory of this machine, as one markdown line.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|x| x.1.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    format!(
        "{cores} cores ({model}), {mem_gib:.0} GiB, kernel `{}`",
        first_line("uname", &["-r"])
    )
}

/// Replaces (or appends) bench `name`'s section in `docs/benchmarks.md`.
pub fn write_section(name: &str, command: &str, section: &Section) -> Result<()> {
    let path = docs().join("benchmarks.md");
    let old = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        "# Benchmarks\n\nWritten by `cargo xtask bench NAME` (`datapath`, `sync`, `memory`, or `all`); each \
         section is replaced when its bench runs again. Numbers are medians over repeated trials with [min–max]; \
         every ratio is computed from numbers measured in the same run.\n"
            .to_string()
    });
    let begin = format!("<!-- bench:{name}:begin -->");
    let end = format!("<!-- bench:{name}:end -->");
    let text = format!(
        "{begin}\n## {}\n\nMachine: {}. Command: `{command}` (release build). Run at {}.\n\n{}\n{end}",
        section.title,
        machine(),
        first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        section.body.trim_end(),
    );
    let new = match (old.find(&begin), old.find(&end)) {
        (Some(b), Some(e)) if e > b => format!("{}{text}{}", &old[..b], &old[e + end.len()..]),
        _ => format!(
            "{}\n{text}\n",
            old.trim_end_matches('\n').to_string() + "\n"
        ),
    };
    std::fs::create_dir_all(docs())?;
    std::fs::write(&path, new).with_context(|| format!("write {}", path.display()))
}

const COLORS: [RGBColor; 9] = [
    RGBColor(0x44, 0x44, 0x44),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0xbc, 0xbd, 0x22),
];

/// A plotting error as anyhow (plotters' errors borrow the backend).
fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plot: {e:?}")
}

/// Lines over a log-scaled x axis (and a linear y axis from 0), as `docs/FILE` (SVG).
pub fn line_plot(
    file: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<()> {
    line_plot_scaled(file, title, x_label, y_label, series, false)
}

/// As [`line_plot`]; `log_y` makes the y axis logarithmic too.
pub fn line_plot_scaled(
    file: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_y: bool,
) -> Result<()> {
    let path = docs().join(file);
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let x_range = (x0 / 2.0).max(0.5)..x1 * 2.0;
    let root = SVGBackend::new(&path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70);
    if log_y {
        let y_range = (y0 / 2.0).max(1e-6)..y1 * 2.0;
        let mut chart = builder
            .build_cartesian_2d(x_range.log_scale(), y_range.log_scale())
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(plot_err)?;
        draw_series(&mut chart, series)?;
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(plot_err)?;
    } else {
        let mut chart = builder
            .build_cartesian_2d(x_range.log_scale(), 0.0..y1 * 1.15)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(plot_err)?;
        draw_series(&mut chart, series)?;
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    println!("plot: {}", path.display());
    Ok(())
}

fn draw_series<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    series: &[Series],
) -> Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(plot_err)?;
    }
    Ok(())
}

/// Horizontal bars (label, value), as `docs/FILE` (SVG).
pub fn bar_plot(file: &str, title: &str, x_label: &str, bars: &[(String, f64)]) -> Result<()> {
    let path = docs().join(file);
    let max = bars.iter().map(|b| b.1).fold(0.0f64, f64::max);
    let n = bars.len();
    let root = SVGBackend::new(&path, (900, 80 + 34 * n as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(260)
        .build_cartesian_2d(0.0..max * 1.15, 0.0..n as f64)
        .map_err(plot_err)?;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(x_label)
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|y: &f64| {
            let i = (n as f64 - *y - 0.5).round();
            if (n as f64 - *y - 0.5 - i).abs() < 0.01 && i >= 0.0 && (i as usize) < n {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let top = n as f64 - i as f64 - 0.15;
            Rectangle::new([(0.0, top - 0.7), (*v, top)], COLORS[1].filled())
        }))
        .map_err(plot_err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let y = n as f64 - i as f64 - 0.35;
            Text::new(format!("{v:.0}"), (*v, y), ("sans-serif", 14))
        }))
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    println!("plot: {}", path.display());
    Ok(())
}
