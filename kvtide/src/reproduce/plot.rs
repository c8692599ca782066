//! Line plots for `kvtide reproduce`, drawn with plotters to SVG from one
//! description ([`Plot`]): series of `(x, y)` points with markers, optional dashed
//! horizontal references (the dense / full-cache baseline the papers draw dashed), linear or
//! logarithmic y.

use std::path::Path;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use serde::Serialize;

use crate::error::{Error, Result};

/// One named series.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// Points, drawn in the given order.
    pub points: Vec<(f64, f64)>,
}

/// A line plot.
#[derive(Clone, Debug, Serialize)]
pub struct Plot {
    /// File stem (`<stem>.svg`).
    pub stem: String,
    /// Caption.
    pub title: String,
    /// X-axis label.
    pub x_label: String,
    /// Y-axis label.
    pub y_label: String,
    /// Data.
    pub series: Vec<Series>,
    /// Dashed horizontal lines `(label, y)`.
    pub references: Vec<(String, f64)>,
    /// Logarithmic y axis.
    pub log_y: bool,
}

impl Plot {
    /// An empty plot.
    pub fn new(stem: &str, title: &str, x_label: &str, y_label: &str) -> Self {
        Self {
            stem: stem.to_owned(),
            title: title.to_owned(),
            x_label: x_label.to_owned(),
            y_label: y_label.to_owned(),
            series: Vec::new(),
            references: Vec::new(),
            log_y: false,
        }
    }

    /// Adds a series (points with a non-finite coordinate are dropped).
    pub fn series(mut self, name: &str, points: Vec<(f64, f64)>) -> Self {
        let points = points.into_iter().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
        self.series.push(Series { name: name.to_owned(), points });
        self
    }

    /// Adds a dashed horizontal reference line.
    pub fn reference(mut self, label: &str, y: f64) -> Self {
        if y.is_finite() {
            self.references.push((label.to_owned(), y));
        }
        self
    }

    /// Uses a logarithmic y axis.
    pub fn log_y(mut self, on: bool) -> Self {
        self.log_y = on;
        self
    }

    /// Number of drawn points over all series.
    pub fn num_points(&self) -> usize {
        self.series.iter().map(|s| s.points.len()).sum()
    }

    /// The data ranges, padded by 5 % (log y: padded multiplicatively, kept positive).
    fn ranges(&self) -> Option<((f64, f64), (f64, f64))> {
        let xs = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let ys = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .chain(self.references.iter().map(|r| r.1));
        let (x0, x1) = min_max(xs)?;
        let ys: Vec<f64> = ys.filter(|&y| !self.log_y || y > 0.0).collect();
        let (y0, y1) = min_max(ys.into_iter())?;
        let pad = |a: f64, b: f64| {
            let w = if b > a { (b - a) * 0.05 } else { a.abs().max(1.0) * 0.05 };
            (a - w, b + w)
        };
        let y = if self.log_y { (y0 / 1.15, y1 * 1.15) } else { pad(y0, y1) };
        Some((pad(x0, x1), y))
    }

    /// Writes `<dir>/<stem>.svg` (one figure format: vector, small, embedded by the reports).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a plot without finite points; [`Error::InvalidInput`]
    /// naming the backend when drawing or writing fails.
    pub fn render(&self, dir: &Path) -> Result<()> {
        let ranges =
            self.ranges().ok_or_else(|| plot_err(&self.stem, "no finite points to draw"))?;
        let svg = dir.join(format!("{}.svg", self.stem));
        let size = (900, 600);
        draw(SVGBackend::new(&svg, size).into_drawing_area(), self, ranges)
            .map_err(|e| plot_err(&self.stem, format!("svg: {e}")))
    }
}

fn plot_err(stem: &str, reason: impl Into<String>) -> Error {
    Error::InvalidInput { op: "plot", reason: format!("{stem}: {}", reason.into()) }
}

fn min_max(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((a, b)) => Some((a.min(v), b.max(v))),
    })
}

type Ranges = ((f64, f64), (f64, f64));

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    plot: &Plot,
    r: Ranges,
) -> std::result::Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let ((x0, x1), (y0, y1)) = r;
    if plot.log_y {
        chart(&root, plot, x0..x1, (y0..y1).log_scale())?;
    } else {
        chart(&root, plot, x0..x1, y0..y1)?;
    }
    root.present().map_err(|e| e.to_string())
}

fn chart<DB, X, Y>(
    root: &DrawingArea<DB, Shift>,
    plot: &Plot,
    x: X,
    y: Y,
) -> std::result::Result<(), String>
where
    DB: DrawingBackend,
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut chart = ChartBuilder::on(root)
        .caption(&plot.title, ("sans-serif", 22))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(plot.x_label.as_str())
        .y_desc(plot.y_label.as_str())
        .draw()
        .map_err(|e| err(&e))?;
    let (x_lo, x_hi) = (chart.x_range().start, chart.x_range().end);
    for (i, (label, y)) in plot.references.iter().enumerate() {
        let style = BLACK.mix(0.6).stroke_width(2);
        let color = Palette99::pick(i + 20).mix(0.9);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x_lo, *y), (x_hi, *y)],
                8,
                6,
                ShapeStyle { color, ..style },
            ))
            .map_err(|e| err(&e))?
            .label(label.as_str())
            .legend(move |(px, py)| PathElement::new(vec![(px, py), (px + 20, py)], color));
    }
    for (i, s) in plot.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(s.name.as_str())
            .legend(move |(px, py)| {
                PathElement::new(vec![(px, py), (px + 20, py)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_svg_linear_and_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        let p = Plot::new("t", "test", "x", "y")
            .series("a", vec![(0.2, 3.0), (0.5, 2.0), (1.0, f64::NAN)])
            .series("b", vec![(0.3, 30.0)])
            .reference("dense", 1.5);
        assert_eq!(p.num_points(), 3);
        p.render(dir.path()).expect("linear");
        let svg = std::fs::read_to_string(dir.path().join("t.svg")).expect("svg");
        assert!(svg.contains("<svg") && svg.contains("dense"));
        assert!(!dir.path().join("t.png").exists(), "one figure format");
        let mut log = p.log_y(true);
        log.stem = "l".into();
        log.render(dir.path()).expect("log");
        assert!(Plot::new("e", "empty", "x", "y").render(dir.path()).is_err());
    }
}
