//! The results writer of `kvtide reproduce`: a [`Report`] collects sections of prose,
//! Markdown [`Table`]s and [`Plot`]s plus machine-readable JSON records, and writes them as
//! `report.md`, `results.json` and `figures/<stem>.svg` into one output directory.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use super::plot::Plot;
use crate::error::{Error, Result};

/// A Markdown table with a stable name (used by the completeness check).
#[derive(Clone, Debug, Serialize)]
pub struct Table {
    /// Identifier (`swan_main`, `wnw_main`, …).
    pub name: String,
    /// Caption.
    pub title: String,
    /// Column headers.
    pub headers: Vec<String>,
    /// Rows of cells (each as long as `headers`).
    pub rows: Vec<Vec<String>>,
    /// Notes printed under the table.
    pub notes: Vec<String>,
}

impl Table {
    /// An empty table.
    pub fn new(name: &str, title: &str, headers: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            title: title.to_owned(),
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Appends a row, padded or cut to the number of columns.
    pub fn row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// Appends a note.
    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    /// The table as GitHub-flavoured Markdown (`|` in cells escaped).
    ///
    /// # Examples
    /// ```
    /// use kvtide::reproduce::report::Table;
    /// let mut t = Table::new("t", "Demo", &["a", "b"]);
    /// t.row(vec!["1".into(), "x|y".into()]);
    /// assert!(t.to_markdown().contains("| 1 | x\\|y |"));
    /// ```
    pub fn to_markdown(&self) -> String {
        let cell = |s: &str| s.replace('|', "\\|");
        let mut out = format!(
            "**{}**\n\n| {} |\n|{}\n",
            self.title,
            self.headers.iter().map(|h| cell(h)).collect::<Vec<_>>().join(" | "),
            "---|".repeat(self.headers.len())
        );
        for row in &self.rows {
            let _ = writeln!(
                out,
                "| {} |",
                row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")
            );
        }
        for n in &self.notes {
            let _ = write!(out, "\n{n}\n");
        }
        out
    }
}

/// One element of a report section, in order.
#[derive(Clone, Debug)]
enum Item {
    Text(String),
    Table(Table),
    Plot(Plot),
}

/// A titled part of the report.
#[derive(Clone, Debug)]
pub struct Section {
    title: String,
    items: Vec<Item>,
}

impl Section {
    /// Adds a paragraph.
    pub fn text(&mut self, text: impl Into<String>) -> &mut Self {
        self.items.push(Item::Text(text.into()));
        self
    }

    /// Adds a table.
    pub fn table(&mut self, table: Table) -> &mut Self {
        self.items.push(Item::Table(table));
        self
    }

    /// Adds a plot.
    pub fn plot(&mut self, plot: Plot) -> &mut Self {
        self.items.push(Item::Plot(plot));
        self
    }
}

/// Everything one `kvtide reproduce` run reports.
#[derive(Clone, Debug, Default)]
pub struct Report {
    sections: Vec<Section>,
    json: Map<String, Value>,
}

/// The files a [`Report::write`] produced.
#[derive(Clone, Debug, Default)]
pub struct Written {
    /// Every file written.
    pub files: Vec<PathBuf>,
}

impl Report {
    /// A new section (appended at the end).
    pub fn section(&mut self, title: &str) -> &mut Section {
        self.sections.push(Section { title: title.to_owned(), items: Vec::new() });
        self.sections.last_mut().expect("just pushed")
    }

    /// Stores a JSON record under `key` of `results.json` (replacing an earlier one).
    ///
    /// # Errors
    /// [`Error::Json`] if `value` does not serialise.
    pub fn record(&mut self, key: &str, value: &impl Serialize) -> Result<()> {
        let v = serde_json::to_value(value)
            .map_err(|source| Error::Json { what: format!("results record `{key}`"), source })?;
        self.json.insert(key.to_owned(), v);
        Ok(())
    }

    /// The JSON record under `key`, if any.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.json.get(key)
    }

    /// All tables, in report order.
    pub fn tables(&self) -> impl Iterator<Item = &Table> {
        self.sections.iter().flat_map(|s| s.items.iter()).filter_map(|i| match i {
            Item::Table(t) => Some(t),
            _ => None,
        })
    }

    /// All plots, in report order.
    pub fn plots(&self) -> impl Iterator<Item = &Plot> {
        self.sections.iter().flat_map(|s| s.items.iter()).filter_map(|i| match i {
            Item::Plot(p) => Some(p),
            _ => None,
        })
    }

    /// The Markdown report (plots linked from `figures/`).
    pub fn to_markdown(&self, heading: &str) -> String {
        let mut out = format!("# {heading}\n");
        for s in &self.sections {
            let _ = write!(out, "\n## {}\n", s.title);
            for item in &s.items {
                match item {
                    Item::Text(t) => {
                        let _ = write!(out, "\n{t}\n");
                    }
                    Item::Table(t) => {
                        let _ = write!(out, "\n{}", t.to_markdown());
                    }
                    Item::Plot(p) => {
                        let _ = write!(out, "\n![{}](figures/{}.svg)\n", p.title, p.stem);
                    }
                }
            }
        }
        out
    }

    /// Writes `report.md`, `results.json` (records plus every table) and the figures.
    ///
    /// # Errors
    /// [`Error::Io`] if the directory or a file cannot be written; plot errors.
    pub fn write(&self, dir: &Path, heading: &str) -> Result<Written> {
        let figures = dir.join("figures");
        create_dir(&figures)?;
        let mut written = Written::default();
        for p in self.plots() {
            p.render(&figures)?;
            written.files.push(figures.join(format!("{}.svg", p.stem)));
        }
        let mut json = self.json.clone();
        let tables: Vec<&Table> = self.tables().collect();
        json.insert(
            "tables".into(),
            serde_json::to_value(&tables)
                .map_err(|source| Error::Json { what: "tables".into(), source })?,
        );
        let text = serde_json::to_string_pretty(&json)
            .map_err(|source| Error::Json { what: "results.json".into(), source })?;
        written.files.push(write_file(&dir.join("results.json"), &text)?);
        written.files.push(write_file(&dir.join("report.md"), &self.to_markdown(heading))?);
        Ok(written)
    }
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        op: "create directory",
        path: dir.to_path_buf(),
        source,
    })
}

fn write_file(path: &Path, text: &str) -> Result<PathBuf> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        op: "write",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(path.to_path_buf())
}

/// `x` with `digits` decimals (`—` for non-finite values).
pub fn num(x: f64, digits: usize) -> String {
    if x.is_finite() { format!("{x:.digits$}") } else { "—".to_owned() }
}

/// `x` as a percentage with `digits` decimals.
pub fn pct(x: f64, digits: usize) -> String {
    if x.is_finite() { format!("{:.digits$} %", 100.0 * x) } else { "—".to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_markdown_json_and_figures() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut r = Report::default();
        let mut t = Table::new("demo", "Demo table", &["x", "y"]);
        t.row(vec!["1".into()]);
        t.note("a note");
        r.section("First")
            .text("hello")
            .table(t)
            .plot(Plot::new("p", "A plot", "x", "y").series("s", vec![(1.0, 2.0), (2.0, 3.0)]));
        r.record("numbers", &[1, 2, 3]).expect("record");
        let w = r.write(dir.path(), "Heading").expect("write");
        assert_eq!(w.files.len(), 3);
        let md = std::fs::read_to_string(dir.path().join("report.md")).expect("md");
        assert!(
            md.starts_with("# Heading")
                && md.contains("## First")
                && md.contains("| 1 |  |")
                && md.contains("figures/p.svg")
        );
        let json: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("results.json")).expect("json"),
        )
        .expect("parse");
        assert_eq!(json["numbers"], serde_json::json!([1, 2, 3]));
        assert_eq!(json["tables"][0]["name"], "demo");
        assert_eq!(
            (num(f64::NAN, 2), pct(0.1234, 1), num(2.0, 1)),
            ("—".to_owned(), "12.3 %".to_owned(), "2.0".to_owned())
        );
    }
}
